"""Benchmark GEMM + communication: ours (overlapped) vs the GEMM alone vs torch.matmul and NCCL
back to back vs ``torch.ops.symm_mem``'s fused ops (where this torch has them).

    torchrun --nproc-per-node 4 -m collectives.tools.gemm_overlap_bench [--shapes 4096x4096,16384x8192]
        [--variants side,carve16,side+carve16,alternate] [--comm-priority 0] [--no-graph] [--no-host] [--out DIR]

Shapes are ``MxN`` with K = N, bf16 (tensor-parallel layers).  gemm_reduce_scatter: each rank's
``a`` is M x K, the output M/W x N; all_gather_gemm: each rank's shard is M/W x K, the output
M x N.  Per shape, op and mode (eager calls, CUDA-graph replays; slowest rank's time, best of
3, ``collectives.tools.bench.time_op``):

- ``gemm`` (chunks 1): one GEMM of the whole shape (``a`` or the gathered shards, times ``b``),
  no communication: the limit of an overlap;
- ``gemm_chunked`` (chunks W): the GEMMs ours launches, one per rank's block of rows in ours'
  order, on one stream, no communication (:func:`gemm_chunked`): what the blocks cost;
  ``gemm_alternate`` (where a variant has ``alternate``): the same GEMMs on two streams in turn,
  as that schedule runs them: what two GEMMs at once gain or lose without the communication;
- ``ours`` (chunks W, or 1 where an eager call runs one GEMM and one collective:
  :func:`collectives.overlap.eager_blocks`): as the library runs it (its side stream of the
  communicator's priority, :func:`collectives.algorithms.tuning.overlap_side_priority`), and
  ``ours_prioP`` for every other ``--comm-priority`` P (a side stream of CUDA priority P: 0 the
  default, -1..-5 higher);
- ``ours_<variant>`` for every ``--variants`` entry, run in the same call: a start,
  ``side`` or ``first`` (:data:`~collectives.config.OVERLAP_START`: the all-gather's start on the
  side stream beside the own GEMM, or on the current stream before it, the default;
  all_gather_gemm only), ``carve<N>`` (cuBLAS told to leave N SMs free during our GEMMs,
  ``torch._C._set_sm_carveout_experimental``), an eager path, ``blocks`` or ``one``
  (:data:`~collectives.config.OVERLAP_EAGER_HOST_US_PER_BLOCK` 0 or inf: eager calls run the
  blocks, or one GEMM and one collective, whatever the shape; graphs always run the blocks, so
  those variants have no graph row), ``engine`` (:data:`~collectives.config.OVERLAP_COPY`: the
  peer copies by ``cuMemcpyBatchAsync`` hinted to a copy engine; eager only, as the library
  runs it; timed as a baseline is: where the driver refuses it, skipped with the reason),
  ``alternate`` (:data:`~collectives.config.OVERLAP_SCHEDULE`: torch's fused ops' decomposition,
  each peer block's copy and GEMM on one stream, the side and the current one alternating, so
  two blocks' GEMMs may run at once; graph and eager rows), ``comm`` (the other schedule: every
  GEMM on the current stream; the default ``"auto"`` picks one by op and size), or these joined by ``+``;
- ``mm_nccl`` (chunks 1) and ``torch_fused`` (chunks 0: its own) baselines; a baseline that
  raises is skipped with its reason, never the run.

Modes: ``eager`` and ``graph`` (GPU time per call), and ``host`` (unless ``--no-host``): the host's
time per eager call (:func:`collectives.tools.host_time.host_us`, ``--iters`` calls, fewer
launches than the GPU's queue holds), which says whether an eager row is the host's.

Rank 0 prints every row against the GEMM alone and the baselines; ``--out DIR`` writes
``DIR/gemm-overlap-<device>.json`` (records: op, impl, M, N, K, chunks, mode, us).  NVLink
multicast stays off.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .. import config, overlap  # noqa: E402
from .bench import time_op  # noqa: E402
from .host_time import host_us  # noqa: E402
from .records import Recorder  # noqa: E402

SHAPES = "4096x4096,4096x8192,16384x4096,16384x8192"
#: The fields of a record, before ``us``.
FIELDS = ("op", "impl", "M", "N", "K", "chunks", "mode")


def fused(name: str):
    """``torch.ops.symm_mem.<name>``, or None where this torch lacks it."""
    return getattr(getattr(torch.ops, "symm_mem", None), name, None)


def variant(priority: int | None) -> str:
    """Our implementation's name for a side-stream priority (None: the library's, ``ours``)."""
    return "ours" if priority is None else f"ours_prio{priority}"


def gemm_chunked(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, world: int,
                 rank: int, side: torch.cuda.Stream | None = None) -> Callable[[], None]:
    """The GEMMs ours (``collectives.<op>``) launches, in its order, without the communication:
    one per rank's block of M/W rows, for the peers (:func:`collectives.overlap.peer_order`) and
    this rank's own (gemm_reduce_scatter: own last, ``a``: M x K; all_gather_gemm: own first,
    ``a``: the M/W x K shard standing for every rank's); ``out``: M x N, block q for rank q.  On
    the current stream, or given ``side``, as ``OVERLAP_SCHEDULE = "alternate"`` runs them: the
    peers' blocks on ``side`` and the current stream in turn (``side`` first), the own block on
    the current one, ``side`` forked from it and joined back."""
    m = out.shape[0] // world
    peers = overlap.peer_order(world, rank)
    rows = (lambda q: a[q * m:(q + 1) * m]) if op == "gemm_reduce_scatter" else (lambda q: a)

    def block(q: int, stream: torch.cuda.Stream | None) -> None:
        with nullcontext() if stream is None else torch.cuda.stream(stream):
            torch.mm(rows(q), b, out=out[q * m:(q + 1) * m])

    def run() -> None:
        main = None if side is None else torch.cuda.current_stream()
        if side is not None:
            side.wait_stream(main)
        if op == "all_gather_gemm":
            block(rank, None)
        for step, q in enumerate(peers):
            block(q, side if side is not None and step % 2 == 0 else None)
        if op == "gemm_reduce_scatter":
            block(rank, None)
        if side is not None:
            main.wait_stream(side)
    return run


@contextmanager
def applied(variant: str) -> Iterator[None]:
    """Our overlap set up as ``variant`` (a start, ``"side"`` or ``"first"``, ``"carve<N>"``, an
    eager path of :data:`collectives.overlap.EAGER_PATHS`, or these joined by ``+``; ``""``: the library's defaults)
    inside; the defaults restored after."""
    carving = hasattr(torch._C, "_set_sm_carveout_experimental")
    start, carveout = config.OVERLAP_START, torch._C._get_sm_carveout_experimental() if carving else None
    host_us, copy, schedule = config.OVERLAP_EAGER_HOST_US_PER_BLOCK, config.OVERLAP_COPY, config.OVERLAP_SCHEDULE
    try:
        for part in filter(None, variant.split("+")):
            if part in config.OVERLAP_STARTS:
                config.OVERLAP_START = part
            elif part == "engine":
                config.OVERLAP_COPY = part
            elif part in config.OVERLAP_SCHEDULES:
                config.OVERLAP_SCHEDULE = part
            elif part in overlap.EAGER_PATHS:
                config.OVERLAP_EAGER_HOST_US_PER_BLOCK = overlap.EAGER_PATHS[part]
            elif part.startswith("carve") and part[5:].isdigit():
                if not carving:
                    raise ValueError(f"variant {part!r}: this torch has no torch._C._set_sm_carveout_experimental")
                torch._C._set_sm_carveout_experimental(int(part[5:]))
            else:
                raise ValueError(f"unknown variant {part!r} (side, first, carve<N>, blocks, one, engine, comm, "
                                 "alternate)")
        yield
    finally:
        config.OVERLAP_START, config.OVERLAP_EAGER_HOST_US_PER_BLOCK, config.OVERLAP_COPY = start, host_us, copy
        config.OVERLAP_SCHEDULE = schedule
        if carving:
            torch._C._set_sm_carveout_experimental(carveout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.gemm_overlap_bench", description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--comm-priority", default="",
                        help="comma-separated CUDA priorities of the communication stream to time besides the "
                             "library's (0: default; lower: higher)")
    parser.add_argument("--variants", default="side,carve16,side+carve16,blocks,one",
                        help="comma-separated variants of ours to time besides the library's (side, first, carve<N>, "
                             "blocks, one, engine, alternate, joined by +; empty: none)")
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--no-host", action="store_true", help="skip the host time per eager call")
    parser.add_argument("--out", help="write DIR/gemm-overlap-<device>.json")
    args = parser.parse_args(argv)

    import collectives
    from collectives.runtime.communicator import communicator

    from .records import all_ranks_agree

    comm = communicator()
    world, rank = comm.world, comm.rank
    group = dist.group.WORLD.group_name
    try:  # older torch needs the group registered for symmetric memory
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001 (absent or not needed in this torch)
        pass
    priorities = [int(p) for p in args.comm_priority.split(",") if p]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:  # (an unknown variant fails here, before any timing)
        with applied(v):
            pass
    modes = ["eager"] + ([] if args.no_graph else ["graph"]) + ([] if args.no_host else ["host"])
    rec = Recorder("gemm-overlap", FIELDS, all_ranks_agree(), rank, column=("op", "impl", "mode"))
    default_side = comm.stream_flags.side()
    side_streams = {None: default_side} | {p: torch.cuda.Stream(priority=p) for p in priorities
                                           if p != comm.stream_flags.priority}  # (not the default's again)
    if rank == 0:
        print(f"bf16, {world} GPUs, {comm.sms} SMs; us per call; /gemm: over one GEMM of the whole shape, "
              "/base: over the fastest of torch.mm + NCCL and torch's fused op; stream priorities "
              f"{torch.cuda.Stream.priority_range()}")
        print(f"{'op':20} {'mode':5} {'M':>6} {'N=K':>6} {'impl':>22} {'chunks':>6} {'us':>9} {'/gemm':>6} {'/base':>6}")
    try:
        for shape in args.shapes.split(","):
            m, n = (int(x) for x in shape.split("x"))
            k = n
            a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            b = torch.randn(k, n, device="cuda").to(torch.bfloat16) / 64
            rs_out = torch.empty(m // world, n, dtype=torch.bfloat16, device="cuda")
            shard = a[: m // world]
            gathered = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
            ag_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            whole = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

            def mm_nccl_rs() -> None:
                dist.reduce_scatter_tensor(rs_out, torch.mm(a, b))

            def nccl_ag_mm() -> None:
                dist.all_gather_into_tensor(gathered, shard)
                torch.mm(gathered, b, out=ag_out)

            rs_fused, ag_fused = fused("fused_matmul_reduce_scatter"), fused("fused_all_gather_matmul")
            ops = [
                ("gemm_reduce_scatter", a, a, lambda: collectives.gemm_reduce_scatter(a, b, out=rs_out),
                 mm_nccl_rs, rs_fused and (lambda: rs_fused(a, b, "sum", 0, group))),
                ("all_gather_gemm", shard, gathered, lambda: collectives.all_gather_gemm(shard, b, out=ag_out),
                 nccl_ag_mm, ag_fused and (lambda: ag_fused(shard, [b], 0, group))),
            ]
            for op, gemm_in, gemm_whole, ours, baseline, theirs in ops:
                for mode in modes:
                    graph = mode == "graph"
                    row = dict(op=op, M=m, N=n, K=k, mode=mode)

                    def timed(fn: Callable[[], object]) -> Callable[[], float]:
                        if mode == "host":
                            return lambda: host_us(lambda: [fn] * args.iters)
                        return lambda: time_op(fn, args.iters, graph)

                    base = [rec.baseline(timed(baseline), impl="mm_nccl", chunks=1, **row)]
                    if theirs is None:
                        rec.skipped.append({**row, "impl": "torch_fused", "chunks": 0,
                                            "reason": "this torch has no torch.ops.symm_mem fused op"})
                    else:
                        base.append(rec.baseline(timed(theirs), impl="torch_fused", chunks=0, **row))
                    best = min((t for t in base if t is not None), default=None)
                    alone = rec.ours(timed(lambda: torch.mm(gemm_whole, b, out=whole)), impl="gemm", chunks=1, **row)
                    _line(rank, op, mode, m, n, "gemm", 1, alone, alone, best)
                    chunked = rec.ours(timed(gemm_chunked(op, gemm_in, b, whole, world, rank)), impl="gemm_chunked",
                                       chunks=world, **row)
                    _line(rank, op, mode, m, n, "gemm_chunked", world, chunked, alone, best)
                    if any("alternate" in v.split("+") for v in variants):
                        two = rec.ours(timed(gemm_chunked(op, gemm_in, b, whole, world, rank, default_side)),
                                       impl="gemm_alternate", chunks=world, **row)
                        _line(rank, op, mode, m, n, "gemm_alternate", world, two, alone, best)

                    def chunks() -> int:
                        """Ours' blocks in this mode, as the knobs are now."""
                        return world if graph or overlap.eager_blocks(world, m, k, n) else 1

                    for priority in side_streams:
                        comm.stream_flags.use_side(side_streams[priority])
                        us = rec.ours(timed(ours), impl=variant(priority), chunks=chunks(), **row)
                        collectives.synchronize()
                        _line(rank, op, mode, m, n, variant(priority), chunks(), us, alone, best)
                    comm.stream_flags.use_side(default_side)
                    for v in variants:
                        parts = set(v.split("+"))
                        if op != "all_gather_gemm" and parts & set(config.OVERLAP_STARTS):
                            continue  # (the start is the all-gather's: the reduce-scatter would repeat a row)
                        if graph and parts & {*overlap.EAGER_PATHS, "engine"}:
                            continue  # (a captured call runs the blocks, copying with copy_: the row would repeat ours)
                        with applied(v):
                            time_it = rec.baseline if "engine" in parts else rec.ours
                            us = time_it(timed(ours), impl=f"ours_{v}", chunks=chunks(), **row)
                            collectives.synchronize()
                            if us is not None:
                                _line(rank, op, mode, m, n, f"ours_{v}", chunks(), us, alone, best)
                    for impl, t in zip(("mm_nccl", "torch_fused"), base):
                        if t is not None:
                            _line(rank, op, mode, m, n, impl, 0, t, None, best)
    finally:
        comm.stream_flags.use_side(default_side)
        if rank == 0 and args.out:
            print(f"wrote {rec.write(args.out, world, torch.cuda.get_device_name(), sms=comm.sms)}")
    torch.cuda.synchronize()
    dist.barrier()
    collectives.current().close()


def _line(rank: int, op: str, mode: str, m: int, n: int, impl: str, chunks: int, us: float,
          alone: float | None, best: float | None) -> None:
    if rank == 0:
        ratio = [f"{us / t:6.2f}" if t else f"{'-':>6}" for t in (alone, best)]
        print(f"{op:20} {mode:5} {m:6} {n:6} {impl:>22} {chunks or '-':>6} {us:9.1f} {' '.join(ratio)}", flush=True)


if __name__ == "__main__":
    main()
