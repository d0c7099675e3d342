"""Benchmark the uneven all-to-all and the MoE dispatch/combine against NCCL's
``torch.distributed.all_to_all_single``.

    torchrun --nproc-per-node 8 -m collectives.tools.all_to_all_bench [--hidden 7168] [--no-graph]
    torchrun --nproc-per-node 8 -m collectives.tools.all_to_all_bench --symm-mem

``--symm-mem`` times ``torch.ops.symm_mem.all_to_all_vdev`` (PyTorch's NVSHMEM all-to-all,
splits on the device) at the same sizes instead, in a process of its own: it starts no
``collectives`` context, so the NVSHMEM that torch loads is the only one (rank 0 prints why
when the installed torch cannot run it).  Its input, output and splits are symmetric tensors
of torch's (``symm_mem.empty``), filled before the timing: the column is its best case.

Part 1, ``all_to_all``: every rank sends ``tokens`` rows of ``hidden`` bf16 to every rank
(``tokens`` = 1, 8, 64, 128, 512, 4096); NCCL's ``all_to_all_single`` on plain tensors against
ours into a plain output (through the staging buffer, where it fits) and into a symmetric one
(direct), over NVLink stores and, column ``nvshmem``, over NVSHMEM put-with-signal
(``transport="nvshmem"``; skipped with the reason where the context's heap is not NVSHMEM's or its
device bitcode is missing: collectives/tools/devbitcode.sh; its first call compiles each kernel with
NVSHMEM's bitcode linked, about 10 s).
Part 2, MoE: ``tokens`` per rank routed to ``--topk`` of ``--experts`` experts (uniformly at
random, distinct per token); ``collectives.moe.dispatch`` and ``combine`` (low latency; their local
steps in torch, as with ``COLLECTIVES_MOE_FUSED=0``, then in one kernel each, *fused*, the
default: ``collectives.runtime.moe``)
against the same layer built on NCCL (a sort by expert, ``all_to_all_single`` of the counts and
of the rows, and back).  Times are the slowest rank's, best of 3 runs of 100 eager calls or
of a CUDA graph of 20 (:func:`collectives.tools.bench.time_op`); rank 0 prints
the device, then one row per size: us per call, and GB/s of the bytes each rank sends to other
ranks; ``--regions`` adds a column, the combine in two kernels (``COLLECTIVES_MOE_REGIONS=1``:
:func:`collectives.runtime.moe.regions_combine`), impl ``ours_regions``.  Part 3, at the ``tokens`` above 512: the MoE layer in throughput mode (exact sizes,
eager), against the same NCCL layer.  ``--fp8`` adds part 4: the low-latency dispatch with
fp8 rows (``fp8=True``: e4m3 and a scale per token, the rows the published pplx-kernels figures
send), eager and in graphs, torch steps and fused, against the bf16 dispatch's fused time
measured in the same part.  ``--profile N`` runs only part 5: where an eager layer's time goes
at ``N`` tokens per rank (host time to enqueue a dispatch and a combine against their time per
call, torch's profiler table of host time by operation and cProfile's table of the Python
functions by own time, rank 0), then the GPU's timeline of
one dispatch (bf16, and fp8 with ``--fp8``) and one combine, each eager and replayed from a
CUDA graph (the last of 3 calls back to back: :func:`gpu_timeline`): every kernel in launch
order with its start and duration (rank 0; :func:`kernel_table`).  ``--out DIR`` writes the
figures of parts 1-4 as ``DIR/moe-<device>.json`` (records: part, impl, dtype, tokens, mode, us;
:data:`FIELDS`; with ``--symm-mem``: ``DIR/moe-symm-mem-<device>.json``).  A NCCL or torch
column that raises is skipped with its reason (printed, and in the JSON), never the run.  NVLink
multicast stays off.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .bench import capture, time_op  # noqa: E402
from .records import Recorder, all_ranks_agree  # noqa: E402

TOKENS = (1, 8, 64, 128, 512, 4096)
#: The fields of a record, before ``us``.  part: ``all_to_all``, ``dispatch``, ``combine`` (low
#: latency), ``dispatch_throughput``, ``combine_throughput``, ``fp8_dispatch`` (part 4: bf16 and
#: fp8 rows timed side by side); impl: ``nccl``, ``torch_symm_mem``, ``ours_plain`` and
#: ``ours_symmetric`` (the all-to-all's output), ``ours_nvshmem`` (into the symmetric output over
#: ``transport="nvshmem"``), ``ours_torch_steps`` and ``ours_fused`` (MoE).
FIELDS = ("part", "impl", "dtype", "tokens", "mode")


def symm_mem_all_to_all(sizes: list[int], hidden: int, modes: list[str], out_dir: str | None) -> None:
    """Rank 0 prints ``torch.ops.symm_mem.all_to_all_vdev``'s time per call for ``tokens``
    rows of ``hidden`` bf16 to every rank, at every size and mode (see the module), and with
    ``out_dir`` writes them as ``out_dir/moe-symm-mem-<device>.json``."""
    import torch.distributed._symmetric_memory as symm_mem

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)  # before the group: NVSHMEM's teams are made on this device
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        symm_mem.set_backend("NVSHMEM")
        op = torch.ops.symm_mem.all_to_all_vdev
        group = dist.group.WORLD.group_name
    except (AttributeError, RuntimeError) as e:  # no NVSHMEM in this torch, or no such op
        if rank == 0:
            print(f"symm_mem all_to_all_vdev: not available here: {type(e).__name__}: {e}")
        dist.destroy_process_group()
        return
    rec = Recorder("moe-symm-mem", FIELDS, all_ranks_agree(), rank, column=("impl", "mode"))
    # Older torch: (inp, out, in_out_splits[3, W], group); newer: (inp, out, in_splits[W],
    # out_splits_offsets[2, W], group).
    split_rows = len(op.default._schema.arguments) == 4
    if rank == 0:
        print(f"device: {torch.cuda.get_device_name()} x {world}; hidden {hidden}, bf16")
        print("torch.ops.symm_mem.all_to_all_vdev: us per call (GB/s sent to other ranks per rank)")
    try:
        for mode in modes:
            for tokens in sizes:
                n = world * tokens * hidden
                # Every tensor on the pinned device, by index (torch's NVSHMEM team manager takes the
                # device of its first use and refuses any other: "on multiple devices").
                inp = symm_mem.empty(n, dtype=torch.bfloat16, device=device).normal_()
                out = symm_mem.empty(n, dtype=torch.bfloat16, device=device)
                each = torch.full((world,), tokens * hidden, dtype=torch.int64, device=device)
                if split_rows:
                    splits = symm_mem.empty((3, world), dtype=torch.int64, device=device)
                    splits[0].copy_(each)
                    args = (inp, out, splits, group)
                else:
                    in_splits = symm_mem.empty(world, dtype=torch.int64, device=device).copy_(each)
                    out_splits = symm_mem.empty((2, world), dtype=torch.int64, device=device)
                    args = (inp, out, in_splits, out_splits, group)
                iters = max(10, min(200, (1 << 30) // (n * 2 * 4)))
                sent = (world - 1) * tokens * hidden * 2
                us = rec.baseline(lambda: time_op(lambda: op(*args), iters, mode == "graph"), part="all_to_all",
                                  impl="torch_symm_mem", dtype="bf16", tokens=tokens, mode=mode)
                if rank == 0 and us is not None:  # (a failure, a graph capture it refuses for one, is printed)
                    print(f"{mode:6} {tokens:>6} {us:8.1f} ({sent / us / 1e3:5.0f})", flush=True)
    finally:
        if rank == 0 and out_dir:
            print(f"wrote {rec.write(out_dir, world, torch.cuda.get_device_name())}")
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


def nccl_dispatch(x, ids, experts, world):
    """The MoE dispatch on NCCL: rows sorted by expert, the counts, then the rows (host splits)."""
    order = torch.sort(ids.reshape(-1), stable=True).indices
    counts = torch.bincount(ids.reshape(-1), minlength=experts).view(world, -1)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send, recv = counts.sum(1).tolist(), recv_counts.sum(1).tolist()  # host syncs: NCCL needs host splits
    rows = x.index_select(0, order // ids.shape[1])
    out = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(out, rows, recv, send)
    return out, (order, send, recv)


def nccl_combine(y, handle, tokens, topk, weights):
    order, send, recv = handle
    back = y.new_empty((sum(send), y.shape[1]))
    dist.all_to_all_single(back, y, send, recv)
    entries = torch.empty_like(back).index_copy_(0, order, back).view(tokens, topk, -1)
    return (entries.float() * weights[..., None]).sum(1).to(y.dtype)


def time_layer(dispatch, combine, iters: int, graph: bool) -> tuple[float, float]:
    """(us per ``dispatch()``, us per ``combine(r)`` of the last dispatch's result ``r``)."""
    state = {}

    def run() -> None:
        state["d"] = dispatch()

    dispatch_us = time_op(run, iters, graph)
    result = state["d"]
    return dispatch_us, time_op(lambda: combine(result), iters, graph)


def torch_steps_then_fused(measure: Callable[[], list[float]]) -> list[float]:
    """``measure()`` with the MoE layer's local steps in torch (``COLLECTIVES_MOE_FUSED=0``),
    then in one kernel each (the default), concatenated; the flag restored even on an error."""
    from collectives.runtime import moe as runtime_moe

    default, us = runtime_moe.FUSED, []
    try:
        for fused in (False, True):
            runtime_moe.FUSED = fused
            us += measure()
    finally:
        runtime_moe.FUSED = default
    return us


def time_ours(dispatch, iters: int, graph: bool) -> list[float]:
    """[dispatch, combine] us of ``dispatch()`` (a ``collectives.moe.dispatch`` call) and its
    combine, torch steps then fused (:func:`torch_steps_then_fused`)."""
    from collectives import moe

    return torch_steps_then_fused(lambda: list(time_layer(dispatch, lambda d: moe.combine(d[0], d[2]), iters, graph)))


def time_regions_combine(dispatch, iters: int, graph: bool) -> float:
    """us per combine of ``dispatch()``'s result with the combine's two kernels (fused, and
    :data:`collectives.runtime.moe.REGIONS` on; both flags restored even on an error)."""
    from collectives import moe
    from collectives.runtime import moe as runtime_moe

    default = runtime_moe.FUSED, runtime_moe.REGIONS
    try:
        runtime_moe.FUSED = runtime_moe.REGIONS = True
        return time_layer(dispatch, lambda d: moe.combine(d[0], d[2]), iters, graph)[1]
    finally:
        runtime_moe.FUSED, runtime_moe.REGIONS = default


def time_dispatches(dispatches: dict, iters: int, graph: bool) -> list[float]:
    """us per call of each of ``dispatches`` (name -> ``collectives.moe.dispatch`` call), torch
    steps then fused (:func:`torch_steps_then_fused`)."""
    return torch_steps_then_fused(lambda: [time_op(dispatch, iters, graph) for dispatch in dispatches.values()])


def layer_inputs(args: argparse.Namespace, tokens: int, gen: torch.Generator) -> tuple:
    """``(x, topk_ids, topk_weights)`` of ``tokens`` bf16 tokens, each routed to ``args.topk`` of
    ``args.experts`` experts uniformly at random (distinct per token), drawn from ``gen``."""
    x = torch.randn((tokens, args.hidden), device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.argsort(torch.rand((tokens, args.experts), device="cuda", generator=gen), 1)[:, :args.topk]
    return x, ids, torch.rand((tokens, args.topk), device="cuda", generator=gen)


def time_nccl(x, ids, weights, experts: int, world: int, iters: int) -> tuple[float, float]:
    """(dispatch, combine) us of the same layer on NCCL (eager: it syncs the host)."""
    tokens, topk = ids.shape
    return time_layer(lambda: nccl_dispatch(x, ids, experts, world),
                      lambda d: nccl_combine(d[0], d[1], tokens, topk, weights), iters, False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.all_to_all_bench", description=__doc__)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--tokens", default=",".join(str(t) for t in TOKENS))
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--symm-mem", action="store_true", help="time torch.ops.symm_mem.all_to_all_vdev instead")
    parser.add_argument("--fp8", action="store_true", help="also time the dispatch with fp8 rows (part 4)")
    parser.add_argument("--regions", action="store_true",
                        help="also time the low-latency combine in two kernels (COLLECTIVES_MOE_REGIONS=1)")
    parser.add_argument("--profile", type=int, default=0, metavar="TOKENS",
                        help="only part 5: the host time of an eager layer at TOKENS tokens per rank")
    parser.add_argument("--out", help="write DIR/moe-<device>.json (parts 1-4)")
    args = parser.parse_args(argv)
    if args.symm_mem:
        symm_mem_all_to_all([int(t) for t in args.tokens.split(",")], args.hidden,
                            ["eager"] if args.no_graph else ["eager", "graph"], args.out)
        return

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    if args.profile:
        profile_layer(args, args.profile)
        collectives.current().close()
        return
    rec = Recorder("moe", FIELDS, all_ranks_agree(), comm.rank)
    try:
        layer_parts(args, rec, ["eager"] if args.no_graph else ["eager", "graph"],
                    [int(t) for t in args.tokens.split(",")])
    finally:
        if comm.rank == 0 and args.out:
            path = rec.write(args.out, comm.world, torch.cuda.get_device_name(), hidden=args.hidden,
                             experts=args.experts, topk=args.topk)
            print(f"wrote {path}")
    torch.cuda.synchronize()
    dist.barrier()
    collectives.current().close()


def _us(t: float | None, sent: int | None = None) -> str:
    """A cell: microseconds (and GB/s of ``sent`` bytes), or ``-`` for a skipped column."""
    if t is None:
        return "-"
    return f"{t:.1f}" + (f" ({sent / t / 1e3:5.0f})" if sent else "")


def layer_parts(args: argparse.Namespace, rec: Recorder, modes: list[str], sizes: list[int]) -> None:
    """Parts 1-4 (see the module) into ``rec``, rank 0 printing a row per size."""
    import collectives
    from collectives import moe
    from collectives.runtime.all_to_all import STAGING_BYTES
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, rank, hidden, dtype = comm.world, comm.rank, args.hidden, torch.bfloat16
    if rank == 0:
        print(f"device: {torch.cuda.get_device_name()} x {world}; hidden {hidden}, bf16")
        print("all_to_all: us per call (GB/s sent to other ranks per rank)")
        print(f"{'mode':6} {'tokens':>6} {'nccl':>16} {'ours plain':>16} {'ours symmetric':>16} {'nvshmem':>16}")
    for mode in modes:
        graph = mode == "graph"
        for tokens in sizes:
            n = world * tokens
            iters = max(10, min(200, (1 << 30) // (n * hidden * 2 * 4)))
            inp = torch.randn((n, hidden), device="cuda").to(dtype)
            plain = torch.empty_like(inp)
            symmetric = collectives.empty((n, hidden), dtype)
            sent = (world - 1) * tokens * hidden * 2
            staged = plain.nbytes <= STAGING_BYTES  # a larger plain output does not fit the staging buffer
            row = dict(part="all_to_all", dtype="bf16", tokens=tokens, mode=mode)
            us = [rec.baseline(lambda: time_op(lambda: dist.all_to_all_single(plain, inp), iters, graph),
                               impl="nccl", **row),
                  rec.ours(lambda: time_op(lambda: collectives.all_to_all(plain, inp), iters, graph),
                           impl="ours_plain", **row) if staged else None,
                  rec.ours(lambda: time_op(lambda: collectives.all_to_all(symmetric, inp), iters, graph),
                           impl="ours_symmetric", **row),
                  # the NVSHMEM transport (skipped with its reason where it cannot run: not NVSHMEM's heap,
                  # or no bitcode)
                  rec.baseline(lambda: time_op(lambda: collectives.all_to_all(symmetric, inp, transport="nvshmem"),
                                               iters, graph), impl="ours_nvshmem", **row)]
            collectives.synchronize()
            if rank == 0:
                print(f"{mode:6} {tokens:>6} " + " ".join(f"{_us(t, sent):>16}" for t in us), flush=True)
            comm.ctx.free(symmetric)

    if rank == 0:
        print(f"MoE top-{args.topk} of {args.experts} experts: us per call (NCCL: eager only, it syncs the host)")
        print(f"{'mode':6} {'tokens':>6} {'nccl dispatch':>14} {'nccl combine':>13} {'dispatch':>9} {'combine':>8} "
              f"{'fused dispatch':>15} {'fused combine':>14}" + (f" {'regions combine':>16}" if args.regions else ""))
    gen = torch.Generator(device="cuda").manual_seed(rank)

    def layer(parts: tuple[str, str], ours: list[float], nccl: Callable[[], tuple[float, float]] | None,
              **row) -> list[float | None]:
        """Record our (dispatch, combine) times, torch steps then fused, and NCCL's (timed by
        ``nccl()``, a baseline); returns [nccl dispatch, nccl combine, *ours]."""
        for (impl, part), t in zip([(i, p) for i in ("ours_torch_steps", "ours_fused") for p in parts], ours):
            rec.add(t, part=part, impl=impl, **row)
        theirs: list[float | None] = [None, None]
        if nccl is not None:
            def both() -> float:
                theirs[:] = nccl()
                return theirs[0]
            if rec.baseline(both, part=parts[0], impl="nccl", **row) is None:
                theirs = [None, None]
            else:
                rec.add(theirs[1], part=parts[1], impl="nccl", **row)
        return theirs + ours

    for mode in modes:
        for tokens in [t for t in sizes if t <= 512]:
            x, ids, weights = layer_inputs(args, tokens, gen)
            # Eager rows of 20 calls moved by 100-200 us from size to size (2 x H100); a graph
            # holds every captured call's buffers (a dispatch at 512 tokens: 1.9 GB), so 20 there.
            iters = 20 if mode == "graph" else 100
            ours = time_ours(lambda: moe.dispatch(x, ids, weights, args.experts, max_tokens=tokens), iters,
                             mode == "graph")
            us = layer(("dispatch", "combine"), ours, (lambda: time_nccl(x, ids, weights, args.experts, world, iters))
                       if mode == "eager" else None, dtype="bf16", tokens=tokens, mode=mode)
            regions = ""
            if args.regions:
                t = time_regions_combine(lambda: moe.dispatch(x, ids, weights, args.experts, max_tokens=tokens),
                                         iters, mode == "graph")
                rec.add(t, part="combine", impl="ours_regions", dtype="bf16", tokens=tokens, mode=mode)
                regions = f" {t:16.1f}"
            collectives.synchronize()
            if rank == 0:
                print(f"{mode:6} {tokens:>6} {_us(us[0]):>14} {_us(us[1]):>13} {us[2]:9.1f} {us[3]:8.1f} "
                      f"{us[4]:15.1f} {us[5]:14.1f}{regions}", flush=True)
    throughput = [t for t in sizes if t > 512]
    if throughput and rank == 0:
        print("MoE throughput mode (exact sizes; eager: every call reads sizes back, as NCCL's does): us per call "
              "(GB/s of rows each rank dispatched to other ranks)")
        print(f"{'tokens':>6} {'nccl dispatch':>21} {'nccl combine':>13} {'dispatch':>16} {'combine':>8} "
              f"{'fused dispatch':>15} {'fused combine':>14}")
    for tokens in throughput:
        x, ids, weights = layer_inputs(args, tokens, gen)
        sent = tokens * args.topk * (world - 1) // world * hidden * 2  # rows to other ranks, on average
        ours = time_ours(lambda: moe.dispatch(x, ids, weights, args.experts, mode="throughput"), 10, False)
        us = layer(("dispatch_throughput", "combine_throughput"), ours,
                   lambda: time_nccl(x, ids, weights, args.experts, world, 10), dtype="bf16", tokens=tokens,
                   mode="eager")
        collectives.synchronize()
        if rank == 0:
            print(f"{tokens:>6} {_us(us[0], sent):>21} {_us(us[1]):>13} {_us(us[2], sent):>16} {us[3]:8.1f} "
                  f"{us[4]:15.1f} {us[5]:14.1f}", flush=True)
    if args.fp8:
        fp8_dispatch(args, rec, modes, [t for t in sizes if t <= 512], gen)


def fp8_dispatch(args: argparse.Namespace, rec: Recorder, modes: list[str], sizes: list[int],
                 gen: torch.Generator) -> None:
    """Part 4: the low-latency dispatch of bf16 rows and of fp8 rows, torch steps then fused."""
    import collectives
    from collectives import moe

    rank = dist.get_rank()
    if rank == 0:
        print(f"MoE dispatch with fp8 rows (e4m3, a scale per token), top-{args.topk} of {args.experts} experts: "
              "us per call")
        print(f"{'mode':6} {'tokens':>6} {'bf16':>9} {'fp8':>9} {'fused bf16':>11} {'fused fp8':>10}")
    for mode in modes:
        for tokens in sizes:
            x, ids, weights = layer_inputs(args, tokens, gen)
            calls = {fp8: (lambda fp8=fp8: moe.dispatch(x, ids, weights, args.experts, max_tokens=tokens, fp8=fp8))
                     for fp8 in (False, True)}
            us = time_dispatches(calls, 20 if mode == "graph" else 100, mode == "graph")
            for t, (impl, kind) in zip(us, [(i, k) for i in ("ours_torch_steps", "ours_fused") for k in ("bf16", "fp8")]):
                rec.add(t, part="fp8_dispatch", impl=impl, dtype=kind, tokens=tokens, mode=mode)
            collectives.synchronize()
            if rank == 0:
                print(f"{mode:6} {tokens:>6} {us[0]:9.1f} {us[1]:9.1f} {us[2]:11.1f} {us[3]:10.1f}", flush=True)


def kernel_table(kernels: list[tuple[str, float, float]], width: int = 90) -> list[str]:
    """The lines of a GPU timeline: ``kernels`` as ``(name, start us, duration us)`` (any
    order), one line each in start order (start from the first kernel's, duration, the gap
    since the previous one ended, the name cut to ``width``), then a total: kernels, the time
    they ran, the span from the first start to the last end, and the idle rest of it."""
    if not kernels:
        return ["no GPU kernel recorded"]
    kernels = sorted(kernels, key=lambda k: k[1])
    first, end = kernels[0][1], kernels[0][1]
    lines = [f"{'#':>3} {'start us':>9} {'us':>8} {'gap us':>8}  kernel"]
    for i, (name, start, us) in enumerate(kernels):
        lines.append(f"{i:>3} {start - first:9.1f} {us:8.1f} {max(start - end, 0.0):8.1f}  {name[:width]}")
        end = max(end, start + us)
    busy, span = sum(us for _, _, us in kernels), end - first
    lines.append(f"{len(kernels)} kernels, {busy:.1f} us running, span {span:.1f} us ({span - busy:.1f} us idle "
                 "or overlapped)")
    return lines


def gpu_timeline(step: Callable[[], object], graph: bool, calls: int = 3) -> list[tuple[str, float, float]]:
    """``(name, start us, duration us)`` of every GPU kernel, copy and fill of one ``step()``
    (warmed up first; ``graph``: one replay of a CUDA graph of it), by torch's profiler: the
    last of ``calls`` run back to back.  The first call's first kernel that waits for its peers
    (a dispatch's all-to-all of counts, a combine's of rows) also waits out the ranks' skew
    after the host barrier and the profiler's start (on 4 x H100, 270 us of a 388 us fp8
    dispatch whose graph replays take 126 us each); the calls before the last one align the
    ranks, as a run of calls does."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    run = step
    if graph:
        run = capture(step, 1).replay
        run()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                      if e.device_type == DeviceType.CUDA), key=lambda k: k[1])
    return last_call(kernels, calls)


def last_call(kernels: list[tuple[str, float, float]], calls: int) -> list[tuple[str, float, float]]:
    """The last of ``calls`` calls' kernels (in start order; every call launches as many)."""
    if len(kernels) % calls:
        raise RuntimeError(f"{len(kernels)} kernels recorded for {calls} calls: not as many per call")
    return kernels[len(kernels) - len(kernels) // calls:]


def profile_layer(args: argparse.Namespace, tokens: int, calls: int = 50) -> None:
    """Part 5: an eager low-latency layer (fused, the default) at ``tokens`` tokens per rank.
    Rank 0 prints the host time of enqueueing ``calls`` dispatches, then ``calls`` combines,
    with no wait between calls (where it exceeds the time per call, the host is what an eager
    caller waits for), the time per call (:func:`~collectives.tools.bench.time_op`), and
    torch's profiler table of host time by operation over 10 more layers, and cProfile's table
    of the Python functions over ``calls`` more."""
    import cProfile
    import io
    import pstats
    import time

    import collectives
    from collectives import moe
    from torch.profiler import ProfilerActivity, profile

    rank = dist.get_rank()
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x, ids, weights = layer_inputs(args, tokens, gen)

    def dispatch():
        return moe.dispatch(x, ids, weights, args.experts, max_tokens=tokens)

    d = dispatch()
    moe.combine(d[0], d[2])
    collectives.synchronize()
    host = []
    for step in (dispatch, lambda: moe.combine(d[0], d[2])):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        host.append((time.perf_counter() - start) / calls * 1e6)
        collectives.synchronize()
    per_call = [time_op(dispatch, calls, False), time_op(lambda: moe.combine(d[0], d[2]), calls, False)]
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            e = dispatch()
            moe.combine(e[0], e[2])
        collectives.synchronize()
    dist.barrier()
    functions = cProfile.Profile()
    functions.enable()
    for _ in range(calls):
        e = dispatch()
        moe.combine(e[0], e[2])
    functions.disable()
    collectives.synchronize()
    if rank == 0:
        print(f"device: {torch.cuda.get_device_name()} x {dist.get_world_size()}; eager layer at {tokens} tokens, "
              f"hidden {args.hidden}, top-{args.topk} of {args.experts} experts")
        print(f"dispatch: host {host[0]:.1f} us to enqueue, {per_call[0]:.1f} us per call")
        print(f"combine:  host {host[1]:.1f} us to enqueue, {per_call[1]:.1f} us per call")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        table = io.StringIO()
        pstats.Stats(functions, stream=table).sort_stats("tottime").print_stats(30)
        print(f"cProfile of {calls} layers (dispatch + combine), by own time (the profiler's overhead included):")
        print("\n".join(line[:160] for line in table.getvalue().splitlines()[4:]))
    collectives.synchronize()
    dist.barrier()
    steps = {"dispatch bf16": dispatch}
    if args.fp8:
        steps["dispatch fp8"] = lambda: moe.dispatch(x, ids, weights, args.experts, max_tokens=tokens, fp8=True)
    steps["combine"] = lambda: moe.combine(d[0], d[2])
    for name, step in steps.items():
        for graph in (False, True):
            kernels = gpu_timeline(step, graph)
            collectives.synchronize()
            if rank == 0:
                print(f"\nGPU timeline of one {name}, {'graph replay' if graph else 'eager'}, {tokens} tokens per rank "
                      "(rank 0):")
                print("\n".join(kernel_table(kernels)), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
