"""Benchmark GEMM + communication: ours (overlapped) vs the GEMM alone vs torch.matmul and NCCL
back to back vs ``torch.ops.symm_mem``'s fused ops (where this torch has them).

    torchrun --nproc-per-node 4 -m collectives.tools.gemm_overlap_bench [--shapes 4096x4096,16384x8192]
        [--chunks 4,8] [--comm-blocks 0,16] [--comm-priority 0,-1] [--gather-ce 0,1] [--no-graph] [--out DIR]

Shapes are ``MxN`` with K = N, bf16 (tensor-parallel layers).  gemm_reduce_scatter: each rank's
``a`` is M x K, the output M/W x N; all_gather_gemm: each rank's shard is M/W x K, the output
M x N.  Per shape, op and mode (eager calls, CUDA-graph replays; slowest rank's time, best of
3, ``collectives.tools.bench.time_op``):

- ``gemm``: the GEMM alone, exactly the launches ours makes (same shape, same chunks:
  :func:`gemm_alone`), no communication: the limit of an overlap, one per chunk count;
- ``ours``: for every setting of ``--chunks`` x ``--comm-blocks`` (a cap on the communication
  kernel's grid, 0: its own, :data:`collectives.overlap.COMM_BLOCKS`) x ``--comm-priority`` (the
  side stream's CUDA priority, 0: default, -1..-5: higher than the GEMM's) x ``--gather-ce``
  (all_gather_gemm only, with no grid cap: 1 gathers with copy engines,
  :data:`collectives.overlap.GATHER_COPY_ENGINE`),
  named ``ours`` with ``_blocksB``, ``_prioP``, ``_ce`` for what differs from the default;
- ``mm_nccl`` (chunks 1) and ``torch_fused`` (chunks 0: its own) baselines; a baseline that
  raises is skipped with its reason, never the run.

Rank 0 prints every row against the GEMM alone and the baselines; ``--out DIR`` writes
``DIR/gemm-overlap-<device>.json`` (records: op, impl, M, N, K, chunks, mode, us).  NVLink
multicast stays off.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .. import overlap  # noqa: E402
from .bench import time_op  # noqa: E402
from .records import Recorder  # noqa: E402

SHAPES = "4096x4096,4096x8192,16384x4096,16384x8192"
#: The fields of a record, before ``us``.
FIELDS = ("op", "impl", "M", "N", "K", "chunks", "mode")


def fused(name: str):
    """``torch.ops.symm_mem.<name>``, or None where this torch lacks it."""
    return getattr(getattr(torch.ops, "symm_mem", None), name, None)


def variant(blocks: int, priority: int, copy_engine: bool) -> str:
    """Our implementation's name for a setting (``ours`` for the defaults)."""
    return "ours" + (f"_blocks{blocks}" if blocks else "") + (f"_prio{priority}" if priority else "") + (
        "_ce" if copy_engine else "")


def gemm_alone(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, world: int,
               rank: int) -> Callable[[], None]:
    """The GEMM launches of ``op`` (``collectives.<op>``) at the current
    :data:`~collectives.overlap.CHUNKS`, on the current stream, without the communication:
    gemm_reduce_scatter: one batched GEMM over the W owners per chunk of ``a``'s rows
    (``out``: a workspace of M x N elements, flat); all_gather_gemm: the own rows' GEMM, then W - 1 GEMMs per
    chunk (``a``: the M/W x K shard, ``out``: M x N)."""
    bounds = overlap._bounds(a.shape[0] // world if op == "gemm_reduce_scatter" else a.shape[0])
    if op == "gemm_reduce_scatter":
        m, n = a.shape[0] // world, b.shape[1]
        owners, shared_b = a.view(world, m, a.shape[1]), b.expand(world, *b.shape)
        chunks, at = [], 0
        for r0, r1 in bounds:  # chunk c's products: the next W x (r1 - r0) x N of the workspace
            chunks.append((owners[:, r0:r1], out[at:at + world * (r1 - r0) * n].view(world, r1 - r0, n)))
            at += world * (r1 - r0) * n

        def run() -> None:
            for rows, p in chunks:
                torch.bmm(rows, shared_b, out=p)
        return run
    m = a.shape[0]

    def run_gather() -> None:
        torch.mm(a, b, out=out[rank * m:(rank + 1) * m])
        for r0, r1 in bounds:
            for q in range(world):
                if q != rank:
                    torch.mm(a[r0:r1], b, out=out[q * m + r0:q * m + r1])
    return run_gather


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.gemm_overlap_bench", description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--chunks", default=str(overlap.CHUNKS), help="comma-separated chunk counts")
    parser.add_argument("--comm-blocks", default="0", help="comma-separated caps on the communication grid (0: none)")
    parser.add_argument("--comm-priority", default="0",
                        help="comma-separated CUDA priorities of the communication stream (0: default; lower: higher)")
    parser.add_argument("--gather-ce", default="0", help="comma-separated 0/1: all_gather_gemm gathers by copy engines")
    parser.add_argument("--no-graph", action="store_true")
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
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    settings = [(int(b), int(p), bool(int(ce))) for b in args.comm_blocks.split(",")
                for p in args.comm_priority.split(",") for ce in args.gather_ce.split(",")]
    modes = ["eager"] if args.no_graph else ["eager", "graph"]
    rec = Recorder("gemm-overlap", FIELDS, all_ranks_agree(), rank, column=("op", "impl", "mode"))
    side_streams = {p: torch.cuda.Stream(priority=p) for _, p, _ in settings}
    defaults = (overlap.CHUNKS, overlap.COMM_BLOCKS, overlap.GATHER_COPY_ENGINE, comm.stream_flags.side())
    if rank == 0:
        print(f"bf16, {world} GPUs, {comm.sms} SMs; us per call; /gemm: over the GEMM alone (same chunks), "
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
            partial = torch.empty(m * n, dtype=torch.bfloat16, device="cuda")

            def mm_nccl_rs() -> None:
                dist.reduce_scatter_tensor(rs_out, torch.mm(a, b))

            def nccl_ag_mm() -> None:
                dist.all_gather_into_tensor(gathered, shard)
                torch.mm(gathered, b, out=ag_out)

            rs_fused, ag_fused = fused("fused_matmul_reduce_scatter"), fused("fused_all_gather_matmul")
            ops = [
                ("gemm_reduce_scatter", a, partial, lambda: collectives.gemm_reduce_scatter(a, b, out=rs_out),
                 mm_nccl_rs, rs_fused and (lambda: rs_fused(a, b, "sum", 0, group))),
                ("all_gather_gemm", shard, ag_out, lambda: collectives.all_gather_gemm(shard, b, out=ag_out),
                 nccl_ag_mm, ag_fused and (lambda: ag_fused(shard, [b], 0, group))),
            ]
            for op, gemm_in, gemm_out, ours, baseline, theirs in ops:
                for mode in modes:
                    graph = mode == "graph"
                    row = dict(op=op, M=m, N=n, K=k, mode=mode)

                    def timed(fn: Callable[[], object]) -> Callable[[], float]:
                        return lambda: time_op(fn, args.iters, graph)

                    base = [rec.baseline(timed(baseline), impl="mm_nccl", chunks=1, **row)]
                    if theirs is None:
                        rec.skipped.append({**row, "impl": "torch_fused", "chunks": 0,
                                            "reason": "this torch has no torch.ops.symm_mem fused op"})
                    else:
                        base.append(rec.baseline(timed(theirs), impl="torch_fused", chunks=0, **row))
                    best = min((t for t in base if t is not None), default=None)
                    for chunks in chunk_counts:
                        overlap.CHUNKS = chunks
                        alone = rec.ours(timed(gemm_alone(op, gemm_in, b, gemm_out, world, rank)),
                                         impl="gemm", chunks=chunks, **row)
                        _line(rank, op, mode, m, n, "gemm", chunks, alone, alone, best)
                        for blocks, priority, copy_engine in settings:
                            if copy_engine and (op != "all_gather_gemm" or blocks):  # (no grid to cap)
                                continue
                            overlap.COMM_BLOCKS, overlap.GATHER_COPY_ENGINE = blocks or None, copy_engine
                            comm.stream_flags.use_side(side_streams[priority])
                            impl = variant(blocks, priority, copy_engine)
                            us = rec.ours(timed(ours), impl=impl, chunks=chunks, **row)
                            collectives.synchronize()
                            _line(rank, op, mode, m, n, impl, chunks, us, alone, best)
                    for impl, t in zip(("mm_nccl", "torch_fused"), base):
                        if t is not None:
                            _line(rank, op, mode, m, n, impl, 0, t, None, best)
    finally:
        overlap.CHUNKS, overlap.COMM_BLOCKS, overlap.GATHER_COPY_ENGINE, side = defaults
        comm.stream_flags.use_side(side)
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
