"""Benchmark: ours vs NCCL vs ``torch.ops.symm_mem`` in one run on the same GPUs.

    torchrun --nproc-per-node 4 -m collectives.tools.bench [--dtypes bf16,f32] [--out DIR] [--sweep]
    python -m collectives.tools.bench --world 2 [--sizes ...]

``--world W`` runs W ranks as threads on one GPU instead (:mod:`collectives.tools.world_bench`:
each algorithm's bytes per second against a device copy, a one-GPU regression guard).

Times the barrier (beside an empty kernel: the floor of a call that is one launch),
all-reduce, reduce-scatter and all-gather (its rows:
:func:`gather_rows`) back to back with CUDA events, eager
launches from Python and CUDA-graph replays separately, ours on symmetric and on plain tensors
(a row's eager columns interleaved, the median of :data:`BURSTS` bursts each: :func:`time_row`;
``--sizes 4096,16384,65536 --no-graph``: the small eager rows alone, a few minutes);
prints a table with times, bus bandwidth and ratios (rank 0), writes ``DIR/bench-<device>.json``
(``bench-4xH200.json``: :class:`collectives.tools.records.Recorder`, records ``collective, impl,
dtype, bytes, mode, us``) and, where matplotlib is installed, its plot (``.png``).  NCCL is
timed on plain tensors and, where this torch and NCCL have them, on symmetric windows and with
copy engines (:mod:`collectives.tools.nccl_baselines`); every row is compared with the fastest
NCCL column.  From :data:`VARIANT_MIN_BYTES` up it also times :data:`VARIANTS` of the
bandwidth-bound kernels (grid and loads in flight, set through :mod:`collectives.config`'s
knobs), printed under ``[variants]`` against the defaults; ``--sweep`` adds :data:`SWEEP` (the
large all-reduce's push and two_shot at each blocks-per-SM x vectors-per-thread pair).  A baseline column that raises is skipped with its reason (printed, and in the
JSON's ``skipped``), never the run.  Each column of ours (variants too) is checked once before
it is timed: one call on known inputs, every rank's result exact
(:mod:`~collectives.tools.result_checks`; a wrong one stops the run, a variant's is skipped with
the reason).  NVLink multicast stays off: our backend is peer, torch's symm_mem runs without
multicast, NCCL without NVLS.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ..dtypes import DTYPES  # noqa: E402
from .result_checks import all_gather_check, all_reduce_check, reduce_scatter_check  # noqa: E402
from .timing import event_us, repeat_calls, slowest_rank  # noqa: E402

#: The dtypes the benchmarks measure by default (registry names).
BENCH_DTYPES = ("bf16", "f32")
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
#: Variants of the bandwidth-bound kernels, timed from :data:`VARIANT_MIN_BYTES` as columns of
#: their own (``ours_<algorithm><suffix>``, ``_plain`` after it): suffix -> the
#: :mod:`collectives.config` knobs set while the variant's plans (and kernel keys) are made:
#: one block per SM, TMA on half or all of the SMs, 4 vectors in flight per thread.
VARIANTS = {"_b1": {"BLOCKS_PER_SM": 1}, "_d2": {"TMA_SM_DIVISOR": 2}, "_d1": {"TMA_SM_DIVISOR": 1},
            "_u4": {"UNROLL": 4}}
#: The algorithms each variant is timed for, per collective.
VARIANT_ALGORITHMS = {
    "all_reduce": {"_b1": ("two_shot", "push"), "_d2": ("tma",), "_d1": ("tma",), "_u4": ("two_shot", "push")},
    "reduce_scatter": {"_b1": ("one_shot", "push"), "_d2": ("tma",), "_d1": ("tma",), "_u4": ("push",)},
}
VARIANT_MIN_BYTES = 16 << 20
#: ``--sweep``: the all-reduce's push and two_shot at every blocks-per-SM x vectors-per-thread
#: pair (``_b<blocks>u<unroll>``), one run finding the best for the large sizes.
SWEEP = {f"_b{b}u{u}": {"BLOCKS_PER_SM": b, "UNROLL": u} for b in (1, 2) for u in (1, 2, 4, 8)}
SWEEP_ALGORITHMS = ("two_shot", "push")
#: Every variant suffix's knobs (suffixes are unique).
KNOBS = {**VARIANTS, **SWEEP}


def capture(fn: Callable[[], object], iters: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``iters`` back-to-back calls of ``fn``, captured on a side stream after
    one call there (its replay, a bound method, keeps the graph alive)."""
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
    return g


def time_op(fn: Callable[[], object], iters: int, graph: bool, repeats: int = 3) -> float:
    """Microseconds per call of ``fn`` run ``iters`` times back to back (after warm-up): the
    slowest rank's time, the best of ``repeats`` timed runs (shared hosts are noisy)."""
    warm_up(fn)
    if graph:
        run = capture(fn, iters).replay
    else:
        run = functools.partial(repeat_calls, fn, iters)
    run()
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        best = min(best, slowest_rank(event_us(run, iters)))
    return best


#: Timed bursts per eager column of a row (:func:`time_row`): the record's ``us`` is their median
#: (5: about as many calls per column as the best of 3 runs after a warm-up run timed before).
BURSTS = 5


@dataclass
class Column:
    """One column of a row: its ``impl``; ``make()``, the call it times (made once, at its
    warm-up: a baseline's setup failing is that column's failure); whether it is a
    ``baseline`` (it may fail: :meth:`~collectives.tools.records.Recorder.attempt`); the
    ``context`` it runs in (NCCL's stream, a variant's knobs); ``check(call)``, ours' result
    check (:func:`~collectives.tools.result_checks.result_check`), made once in that context
    after the warm-up, before the timing: a column of ours computing a wrong result stops the
    run, a variant's is skipped with the reason."""

    impl: str
    make: Callable[[], Callable[[], object]]
    baseline: bool = False
    context: Callable[[], AbstractContextManager] = nullcontext
    check: Callable[[Callable[[], object]], None] | None = None


def interleaved(bursts: list[Callable[[], float]], repeats: int) -> list[list[float]]:
    """Each of ``bursts`` called ``repeats`` times, interleaved: round ``r`` calls every one
    once, starting at the ``r``-th (mod their count), so that drift of the host (its clock,
    other processes) lands on every column alike, not on the ones timed last; returns each
    one's results in the order they were taken."""
    results: list[list[float]] = [[] for _ in bursts]
    for r in range(repeats):
        for k in range(len(bursts)):
            i = (r + k) % len(bursts)
            results[i].append(bursts[i]())
    return results


def warm_up(fn: Callable[[], object]) -> None:
    """Three calls of ``fn`` (plans made, kernels loaded), then the GPU synchronised."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def burst(fn: Callable[[], object], iters: int) -> tuple[float, BaseException | None]:
    """One timed burst: microseconds per call of ``iters`` back-to-back eager calls of ``fn``
    after one untimed call (CUDA events around them, every rank starting together), the
    slowest rank's; infinite where a rank raised, and the error this rank met (every rank
    takes the same collectives either way, so none waits in vain)."""
    mine, error = math.inf, None
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 (returned, once every rank has met)
        error = err
    dist.barrier()
    if error is None:
        try:
            mine = event_us(functools.partial(repeat_calls, fn, iters), iters)
        except Exception as err:  # noqa: BLE001
            error = err
    return slowest_rank(mine), error


def column(impl: str, fn: Callable[[], object], baseline: bool = False,
           context: Callable[[], AbstractContextManager] = nullcontext,
           check: Callable[[Callable[[], object]], None] | None = None) -> Column:
    """A :class:`Column` timing ``fn`` itself (nothing to set up)."""
    return Column(impl, lambda: fn, baseline, context, check)


def time_row(rec, columns: list[Column], iters: int, graph: bool, **row: Any) -> dict[str, float]:
    """Time and record (``rec``: a :class:`~collectives.tools.records.Recorder`) the columns of
    one row (``row``: its fields but ``impl``); returns implementation -> us of those recorded.
    A column's :attr:`~Column.check` runs once before it is timed.
    Graphs: each column on its own (:func:`time_op`).  Eager: every column warmed up
    (:func:`warm_up`; a baseline that raises is skipped), then :data:`BURSTS` timed bursts of
    each (:func:`burst`), interleaved (:func:`interleaved`); ``us`` is the median of its bursts,
    ``us_min`` and ``us_max`` their spread.  A column a burst of which failed is skipped (a
    baseline) or raises (ours)."""
    us: dict[str, float] = {}
    if graph:
        for c in columns:
            def timed(c: Column = c) -> float:
                with c.context():
                    fn = c.make()
                    if c.check is not None:
                        c.check(fn)
                    return time_op(fn, iters, True)
            got = (rec.baseline if c.baseline else rec.ours)(timed, impl=c.impl, **row)
            if got is not None:
                us[c.impl] = got
        return us
    ready: list[tuple[Column, Callable[[], object]]] = []
    for c in columns:
        def warmed(c: Column = c) -> Callable[[], object]:
            with c.context():
                fn = c.make()
                warm_up(fn)
                if c.check is not None:
                    c.check(fn)
            return fn
        ok, fn = rec.attempt(warmed, impl=c.impl, **row) if c.baseline else (True, warmed())
        if ok:
            ready.append((c, fn))
    errors: dict[str, BaseException] = {}

    def timed_burst(c: Column, fn: Callable[[], object]) -> float:
        with c.context():
            slowest, error = burst(fn, iters)
        if error is not None:
            errors.setdefault(c.impl, error)
        return slowest

    samples = interleaved([functools.partial(timed_burst, c, fn) for c, fn in ready], BURSTS)
    for (c, _), times in zip(ready, samples):
        if math.isinf(max(times)):
            error = errors.get(c.impl, RuntimeError("failed on another rank"))
            if not c.baseline:
                raise RuntimeError(f"{c.impl} failed in a timed burst") from error
            rec.attempt(functools.partial(_raise, error), impl=c.impl, **row)
            continue
        us[c.impl] = rec.add(statistics.median(times), spread={"us_min": min(times), "us_max": max(times)},
                             impl=c.impl, **row)
    return us


def _raise(error: BaseException) -> None:
    raise error


@contextmanager
def knobs(comm, values: dict[str, int]) -> Iterator[None]:
    """The :mod:`collectives.config` knobs set to ``values`` for the plans made inside (the
    communicator's plans are dropped on entry and exit: a plan holds its grid and kernel)."""
    from .. import config

    before = {name: getattr(config, name) for name in values}
    comm.plans.clear()
    for name, value in values.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(config, name, value)
        comm.plans.clear()


def bus_bandwidth(collective: str, nbytes: int, world: int, us: float) -> float:
    """GB/s in nccl-tests' convention (nbytes: per-rank input; the formulas:
    :func:`collectives.tools.nvlink_limit.bus_bandwidth`)."""
    from .nvlink_limit import bus_bandwidth as bytes_per_s

    return bytes_per_s(collective, nbytes, world, us * 1e-6) / 1e9


def main(argv: list[str] | None = None) -> int | None:
    world = argparse.ArgumentParser(add_help=False)
    world.add_argument("--world", type=int, default=0)
    known, rest = world.parse_known_args(argv)
    if known.world:
        from . import world_bench

        return world_bench.main(known.world, rest)
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.bench", description=__doc__)
    parser.add_argument("--world", type=int, default=0, help="W ranks as threads on one GPU (world_bench)")
    parser.add_argument("--dtypes", default=",".join(BENCH_DTYPES))
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes per rank")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--sweep", action="store_true",
                        help="also the large all-reduce's push and two_shot at every SWEEP blocks-per-SM x unroll pair")
    parser.add_argument("--markdown", metavar="BENCH_JSON",
                        help="print the tables of an earlier run's JSON as Markdown, and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.algorithms import KernelKey, grid
    from collectives.config import LAMPORT_MAX_BYTES
    from collectives.runtime.communicator import communicator

    from .nccl_baselines import baselines
    from .records import Recorder, all_ranks_agree

    comm = communicator()
    rank, world = comm.rank, comm.world
    group_name = dist.group.WORLD.group_name
    sizes = [int(s) for s in args.sizes.split(",")]
    nccl = baselines(max(sizes))
    if rank == 0:
        print("\n".join(nccl.lines()))
    rec = Recorder("bench", FIELDS, all_ranks_agree(), rank)
    modes = ["eager"] if args.no_graph else ["eager", "graph"]
    tma = KernelKey("all_reduce", "tma", "peer", "bf16", world)
    meta = {"sms": comm.sms, "tma_blocks_all_reduce_bf16": {b: grid(comm, tma, -(-b // 16 // world)) for b in sizes},
            "nccl_version": nccl.version, "nccl_skipped": nccl.skipped}
    try:
        for mode in modes:
            def torch_barrier() -> Callable[[], object]:  # (setting up torch's buffer may fail: a baseline's failure)
                handle = symm_mem.rendezvous(symm_mem.empty(1024, device="cuda"), group_name)
                return lambda: handle.barrier(channel=0)
            # (beside them the floor of any one-kernel call: an empty kernel (torch's), launched the same way)
            time_row(rec, [Column("ours", lambda: collectives.barrier), Column("torch_symm_mem", torch_barrier, True),
                           column("empty_kernel", functools.partial(torch.cuda._sleep, 0), baseline=True)],
                     200, mode == "graph", collective="barrier", dtype="-", bytes=0, mode=mode)

        for name in args.dtypes.split(","):
            dtype = DTYPES[name].torch
            for nbytes in sizes:
                n = nbytes // torch.empty((), dtype=dtype).element_size()
                iters = max(10, min(200, (1 << 30) // (nbytes * 8)))
                ours = collectives.empty(n, dtype)
                ours.fill_(1)
                plain = torch.ones(n, dtype=dtype, device="cuda")
                theirs: list[torch.Tensor] = []  # torch's symmetric buffer, made by its first column

                def torch_buffer() -> torch.Tensor:
                    if not theirs:
                        theirs.append(symm_mem.empty(n, dtype=dtype, device="cuda"))
                        symm_mem.rendezvous(theirs[0], group_name)
                        theirs[0].fill_(1)
                    return theirs[0]
                rs_out = torch.empty(n // world, dtype=dtype, device="cuda")
                algorithms = ["one_shot", "two_shot", "tma"] + (["lamport"] if nbytes <= LAMPORT_MAX_BYTES else [])
                rs_lamport = ["lamport"] if nbytes // world <= LAMPORT_MAX_BYTES else []  # a block per Lamport slot
                tensors = ((ours, ""), (plain, "_plain"))  # (plain: outside symmetric memory)
                ar_checks = {placement: all_reduce_check(t, rank, world, rec.agree) for t, placement in tensors}
                rs_checks = {placement: reduce_scatter_check(rs_out, t, rank, world, rec.agree)
                             for t, placement in tensors}
                for mode in modes:
                    ar = dict(collective="all_reduce", dtype=name, bytes=nbytes, mode=mode)
                    reduce = functools.partial(collectives.all_reduce, backend="peer")
                    cols = [column(f"ours_{a}", functools.partial(reduce, ours, algorithm=a), check=ar_checks[""])
                            for a in (*algorithms, "push", "auto")]
                    cols += [column(f"ours_{a}_plain", functools.partial(reduce, plain, algorithm=a),  # torch's allocator
                                    check=ar_checks["_plain"]) for a in ("one_shot", "two_shot", "tma", "push", "auto")]
                    cols += [column(f"ours_{a}{suffix}{placement}", functools.partial(reduce, t, algorithm=a), baseline=True,
                                    context=functools.partial(knobs, comm, KNOBS[suffix]),  # an experiment: may fail
                                    check=ar_checks[placement])
                             for suffix, a, t, placement in variants("all_reduce", nbytes, ours, plain, args.sweep)]
                    for c in nccl.columns("all_reduce"):
                        if c == "nccl":
                            cols.append(column(c, functools.partial(dist.all_reduce, plain), baseline=True))
                            continue
                        window, _ = nccl.windows[c].views(n, 0, dtype)
                        window.fill_(1)
                        cols.append(column(c, functools.partial(dist.all_reduce, window, group=nccl.group(c)),
                                           baseline=True, context=functools.partial(nccl.stream, c)))
                    cols += [Column(impl, lambda op=op: functools.partial(getattr(torch.ops.symm_mem, op), torch_buffer(),
                                                                          "sum", group_name), True)
                             for impl, op in (("torch_one_shot", "one_shot_all_reduce"),
                                              ("torch_two_shot", "two_shot_all_reduce_"))]
                    time_row(rec, cols, iters, mode == "graph", **ar)

                    rs = dict(ar, collective="reduce_scatter")
                    scatter = functools.partial(collectives.reduce_scatter, rs_out, backend="peer")
                    cols = [column(f"ours_{a}{placement}", functools.partial(scatter, t, algorithm=a),
                                   check=rs_checks[placement])
                            for t, placement in tensors for a in (*rs_lamport, "one_shot", "tma", "push", "auto")]
                    cols += [column(f"ours_{a}{suffix}{placement}", functools.partial(scatter, t, algorithm=a), baseline=True,
                                    context=functools.partial(knobs, comm, KNOBS[suffix]),  # an experiment: may fail
                                    check=rs_checks[placement])
                             for suffix, a, t, placement in variants("reduce_scatter", nbytes, ours, plain)]
                    for c in nccl.columns("reduce_scatter"):
                        if c == "nccl":
                            cols.append(column(c, functools.partial(dist.reduce_scatter_tensor, rs_out, plain),
                                               baseline=True))
                            continue
                        window, out = nccl.windows[c].views(n, n // world, dtype)
                        window.fill_(1)
                        cols.append(column(c, functools.partial(dist.reduce_scatter_tensor, out, window, group=nccl.group(c)),
                                           baseline=True, context=functools.partial(nccl.stream, c)))
                    # torch's reduce-scatter on its own buffer (peer loads; the eager target: <= 0.8x its time)
                    cols.append(Column("torch_reduce_scatter", lambda: functools.partial(
                        torch.ops.symm_mem.reduce_scatter_out, torch_buffer(), group_name, False, rs_out), True))
                    time_row(rec, cols, iters, mode == "graph", **rs)
                    gather_rows(rec, nccl, name, nbytes, mode, iters)
                collectives.synchronize()
                comm.ctx.free(ours)
    finally:
        if rank == 0:
            report(rec, world, args.out, meta)
    dist.barrier()
    collectives.current().close()


#: Our algorithms in the all-gather rows.
ALGORITHMS_ALL_GATHER = ("one_shot", "tma", "push", "lamport", "auto")


def gather_rows(rec, nccl, dtype_name: str, nbytes: int, mode: str, iters: int) -> dict[str, float]:
    """Time one all-gather row (``nbytes`` of output per rank, rounded down to whole 16-element
    blocks per rank, which every algorithm takes) into ``rec``: every NCCL column of ``nccl``
    (:class:`~collectives.tools.nccl_baselines.Baselines`), then ours on symmetric and on plain
    tensors (Lamport where the input fits, :data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`);
    returns implementation -> us of what was timed (nothing where the size rounds to 0)."""
    import collectives
    from collectives.config import LAMPORT_GATHER_MAX_BYTES
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, dtype = comm.world, DTYPES[dtype_name].torch
    size = torch.empty((), dtype=dtype).element_size()
    n = nbytes // size // world // 16 * 16
    if n == 0:
        return {}
    row = dict(collective="all_gather", dtype=dtype_name, bytes=world * n * size, mode=mode)
    plain_in = torch.ones(n, dtype=dtype, device="cuda")
    plain_out = torch.empty(world * n, dtype=dtype, device="cuda")
    cols = []
    for c in nccl.columns("all_gather"):
        if c == "nccl":
            out, inp = plain_out, plain_in
        else:
            out, inp = nccl.windows[c].views(world * n, n, dtype)
            inp.fill_(1)
        cols.append(column(c, functools.partial(dist.all_gather_into_tensor, out, inp, group=nccl.group(c)),
                           baseline=True, context=functools.partial(nccl.stream, c)))
    sym_in, sym_out = collectives.empty(n, dtype), collectives.empty(world * n, dtype)
    sym_in.fill_(1)
    try:
        cols += [column(f"ours_{algorithm}{suffix}",
                        functools.partial(collectives.all_gather, out, inp, algorithm=algorithm, backend="peer"),
                        check=all_gather_check(out, inp, comm.rank, world, rec.agree))
                 for suffix, out, inp in (("", sym_out, sym_in), ("_plain", plain_out, plain_in))
                 for algorithm in ALGORITHMS_ALL_GATHER
                 if algorithm != "lamport" or n * size <= LAMPORT_GATHER_MAX_BYTES]  # (Lamport: at most half a slot)
        us = time_row(rec, cols, iters, mode == "graph", **row)
        collectives.synchronize()
    finally:
        comm.ctx.free(sym_in)
        comm.ctx.free(sym_out)
    return us


#: The fields of a record of the collectives' benches, before ``us`` (``bytes``: per rank,
#: the larger of input and output: all-reduce's and reduce-scatter's input, all-gather's output).
FIELDS = ("collective", "impl", "dtype", "bytes", "mode")


def variants(collective: str, nbytes: int, symmetric: object, plain: object,
             sweep: bool = False) -> list[tuple[str, str, object, str]]:
    """The variants timed for ``collective`` at ``nbytes`` per rank (none below
    :data:`VARIANT_MIN_BYTES`): (suffix, algorithm, tensor, placement suffix) on the symmetric and
    the plain tensor; with ``sweep``, an all-reduce's also every :data:`SWEEP` pair."""
    if nbytes < VARIANT_MIN_BYTES:
        return []
    table = dict(VARIANT_ALGORITHMS[collective])
    if sweep and collective == "all_reduce":
        table.update((suffix, SWEEP_ALGORITHMS) for suffix in SWEEP)
    return [(suffix, algorithm, tensor, placement)
            for suffix, names in table.items() for algorithm in names
            for tensor, placement in ((symmetric, ""), (plain, "_plain"))]


def variant_lines(results: list[dict]) -> list[str]:
    """One line per variant timed (kept out of the tables and the plot): its time, its
    algorithm's with the default knobs, and the default's over the variant's (> 1: the variant
    is faster)."""
    index = {(r["collective"], r["impl"], r["dtype"], r["bytes"], r["mode"]): r["us"] for r in results}
    lines = []
    for (collective, impl, dtype, nbytes, mode), us in index.items():
        for suffix in KNOBS:
            base = impl.replace(suffix, "", 1)
            if suffix in impl and base != impl and (collective, base, dtype, nbytes, mode) in index:
                default = index[(collective, base, dtype, nbytes, mode)]
                lines.append(f"{collective} {dtype} {mode} {_size(nbytes)}: {impl.removeprefix('ours_')} {us:.1f} us, "
                             f"default {default:.1f} us (default/variant {default / us:.2f}; {KNOBS[suffix]})")
    return lines


#: NCCL's columns (:mod:`collectives.tools.nccl_baselines`): plain tensors, symmetric windows,
#: copy engines on symmetric windows.  Every row is compared with the fastest of those present.
NCCL = ("nccl", "nccl_symm", "nccl_ce")
#: Per collective: our implementations on symmetric tensors, on tensors from torch's allocator
#: (``_plain``), and the baselines (NCCL's columns, torch symm_mem on its own buffer).
IMPLS = {
    "all_reduce": {
        "symmetric": ("ours_lamport", "ours_one_shot", "ours_two_shot", "ours_tma", "ours_push", "ours_auto"),
        "plain": ("ours_one_shot_plain", "ours_two_shot_plain", "ours_tma_plain", "ours_push_plain", "ours_auto_plain"),
        "baselines": ("nccl", "nccl_symm", "torch_one_shot", "torch_two_shot"),
    },
    "reduce_scatter": {
        "symmetric": ("ours_lamport", "ours_one_shot", "ours_tma", "ours_push", "ours_auto"),
        "plain": ("ours_lamport_plain", "ours_one_shot_plain", "ours_tma_plain", "ours_push_plain", "ours_auto_plain"),
        "baselines": ("nccl", "nccl_symm", "torch_reduce_scatter"),
    },
    "all_gather": {
        "symmetric": ("ours_lamport", "ours_one_shot", "ours_tma", "ours_push", "ours_auto"),
        "plain": ("ours_lamport_plain", "ours_one_shot_plain", "ours_tma_plain", "ours_push_plain", "ours_auto_plain"),
        "baselines": ("nccl", "nccl_symm", "nccl_ce"),
    },
}


def strongest_nccl(us: dict[str, float]) -> tuple[str, float] | None:
    """The fastest NCCL column among ``us`` (implementation -> microseconds) and its time;
    None where every NCCL column was skipped."""
    present = [i for i in NCCL if i in us]
    if not present:
        return None
    name = min(present, key=lambda i: us[i])
    return name, us[name]


def _ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}" if num and den else "-"


def table(results: list[dict], world: int, collective: str, dtype: str, mode: str) -> list[list[str]]:
    """One table (header first) of a collective, dtype and mode: microseconds of every
    implementation, the fastest NCCL column and its time over ours for auto on symmetric and
    on plain tensors (> 1: ours faster), torch symm_mem over ours (symmetric), and auto over
    the best fixed algorithm of its placement (<= 1.05 wanted)."""
    index = {(r["impl"], r["bytes"]): r for r in results
             if (r["collective"], r["dtype"], r["mode"]) == (collective, dtype, mode)}
    groups = IMPLS[collective]
    shown = [i for g in ("symmetric", "plain", "baselines") for i in groups[g] if any(k[0] == i for k in index)]
    torch_impls = [b for b in groups["baselines"] if b.startswith("torch") and b in shown]
    head = (["size"] + [i.removeprefix("ours_").replace("_", " ") for i in shown]
            + ["best nccl", "best nccl/auto", "best nccl/auto plain"]
            + [f"{b.replace('_', ' ')}/auto" for b in torch_impls]
            + ["auto/best", "auto plain/best plain", "auto picks"])
    rows = [head]
    for nbytes in sorted({b for _, b in index}):
        us = {i: index[(i, nbytes)]["us"] for i in shown if (i, nbytes) in index}

        def best(group: str) -> float | None:
            return min((us[i] for i in groups[group] if i in us and "auto" not in i), default=None)

        auto, auto_plain = us.get("ours_auto"), us.get("ours_auto_plain")
        nccl, nccl_us = strongest_nccl(us) or ("-", None)
        rows.append([_size(nbytes)] + [f"{us[i]:.1f}" if i in us else "-" for i in shown]
                    + [nccl.replace("_", " "), _ratio(nccl_us, auto), _ratio(nccl_us, auto_plain)]
                    + [_ratio(us.get(b), auto) for b in torch_impls]
                    + [_ratio(auto, best("symmetric")), _ratio(auto_plain, best("plain")),
                       _auto_pick(collective, world, nbytes)])
    return rows


def _tables(results: list[dict], world: int):
    for collective in IMPLS:
        for dtype in sorted({r["dtype"] for r in results if r["collective"] == collective}):
            for mode in ("eager", "graph"):
                if any((r["collective"], r["dtype"], r["mode"]) == (collective, dtype, mode) for r in results):
                    yield f"{collective}, {dtype}, {mode}", table(results, world, collective, dtype, mode)


def _barrier_lines(results: list[dict]) -> list[str]:
    """A line per mode: our barrier against torch symm_mem's, and the empty kernel (the floor of
    any call that is one kernel launch) where the run has it."""
    index = {(r["impl"], r["mode"]): r["us"] for r in results if r["collective"] == "barrier"}
    return [f"Barrier ({mode}): ours {index[('ours', mode)]:.2f} us, torch symm_mem "
            f"{index[('torch_symm_mem', mode)]:.2f} us (ours/torch {index[('ours', mode)] / index[('torch_symm_mem', mode)]:.2f})"
            + (f"; an empty kernel {index[('empty_kernel', mode)]:.2f} us" if ("empty_kernel", mode) in index else "")
            + "." for mode in ("eager", "graph") if ("ours", mode) in index and ("torch_symm_mem", mode) in index]


def report(rec, world: int, out_dir: str, meta: dict) -> None:
    """Print the comparison tables and the skipped columns, and write ``bench-<device>.json``
    (:meth:`~collectives.tools.records.Recorder.write`; and its plot, ``.png``, with
    matplotlib) into ``out_dir``."""
    gpu, results = torch.cuda.get_device_name(), rec.results
    print(f"\n{world} x {gpu}, NVLink multicast off (our backend: peer); microseconds per call, "
          f"back-to-back, slowest rank; eager: the median of {BURSTS} bursts, a row's columns interleaved; graphs: "
          "best of 3; 'plain': a tensor from torch's allocator")
    print(f"{meta['sms']} SMs per GPU; thread blocks (one per SM at most) of the tma all-reduce by "
          f"size: {', '.join(f'{_size(b)}: {n}' for b, n in meta['tma_blocks_all_reduce_bf16'].items())}")
    print(_nccl_line(meta))
    print("\n".join(_barrier_lines(results)))
    for title, rows in _tables(results, world):
        print(f"\n[{title}]")
        print("\n".join(" | ".join(row) for row in rows))
    if lines := variant_lines(results):
        print("\n[variants]")
        print("\n".join(lines))
    for line in skipped_lines(rec.skipped):
        print(line)
    path = rec.write(out_dir, world, gpu, **meta)
    print(f"wrote {path}")
    try:
        plot(results, world, gpu, path.removesuffix(".json") + ".png")
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'ptxops[bench]')")


def skipped_lines(skipped: list[dict]) -> list[str]:
    """One line per baseline column a run skipped (its first failure, then how many of its rows)."""
    first: dict[str, dict] = {}
    count: dict[str, int] = {}
    for s in skipped:
        first.setdefault(s["impl"], s)
        count[s["impl"]] = count.get(s["impl"], 0) + 1
    return [f"{impl} skipped in {count[impl]} row(s), first at "
            f"{', '.join(f'{k}={v}' for k, v in s.items() if k not in ('impl', 'reason'))}: {s['reason']}"
            for impl, s in first.items()]


#: Colours (tab10, then greys for NCCL's columns) and markers of the plot's lines.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
NCCL_COLOURS = ("#000000", "#666666", "#aaaaaa")
MARKERS = ("o", "s", "^", "v", "D", "P", "*", "h", "<", ">")
NCCL_MARKERS = ("x", "+", "1")


def line_styles(results: list[dict]) -> dict[str, dict]:
    """The plot's style of each implementation (ours without its ``_plain`` suffix: one
    algorithm looks the same in both panels): a colour and a marker of its own, solid lines
    for ours and torch's, NCCL's columns alike (grey dashed lines, crosses)."""
    names = sorted({r["impl"].removesuffix("_plain") for r in results if r["collective"] in IMPLS})
    others = [i for i in names if i not in NCCL]
    styles = {impl: dict(color=COLOURS[k % len(COLOURS)], marker=MARKERS[k % len(MARKERS)], linestyle="-")
              for k, impl in enumerate(others)}
    styles.update({impl: dict(color=NCCL_COLOURS[k], marker=NCCL_MARKERS[k], linestyle="--")
                   for k, impl in enumerate(i for i in NCCL if i in names)})
    return styles


def panels(results: list[dict]) -> list[tuple[str, str, str, list[str]]]:
    """The plot's panels: (collective, mode, placement, implementations), bf16 only; the
    symmetric and the plain tensors' panels each show their own algorithms with every
    baseline (NCCL's columns on both, torch symm_mem's on the symmetric one)."""
    found = []
    for collective, groups in IMPLS.items():
        for mode in ("eager", "graph"):
            rows = [r for r in results if (r["collective"], r["mode"], r["dtype"]) == (collective, mode, "bf16")]
            have = {r["impl"] for r in rows}
            for placement in ("symmetric", "plain"):
                shown = [i for i in groups[placement] if i in have] + [
                    i for i in groups["baselines"] if i in have and (placement == "symmetric" or i in NCCL)]
                if any(i.startswith("ours") for i in shown):
                    found.append((collective, mode, placement, shown))
    return found


def plot(results: list[dict], world: int, gpu: str, path: str) -> None:
    """Bus bandwidth over size, a row of two panels (symmetric, plain) per collective and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles, layout = line_styles(results), panels(results)
    rows = (len(layout) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4.2 * rows), squeeze=False)
    for ax, (collective, mode, placement, shown) in zip(axes.flat, layout):
        for impl in shown:
            points = sorted((r for r in results if (r["collective"], r["impl"], r["mode"], r["dtype"])
                             == (collective, impl, mode, "bf16")), key=lambda r: r["bytes"])
            ax.plot([r["bytes"] for r in points], [bus_bandwidth(collective, r["bytes"], world, r["us"]) for r in points],
                    label=impl.removesuffix("_plain"), **styles[impl.removesuffix("_plain")])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective}, {placement} tensors, bf16, {mode}, {world} x {gpu}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(layout):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(run: dict, level: int = 2, title: str | None = None) -> str:
    """A run's JSON as Markdown: a heading of ``level`` (``title``, default the machine), the
    barrier lines and one table per collective, dtype and mode (see :func:`table`) a level
    below (the skipped columns: :mod:`collectives.tools.bench_report`)."""
    machine = f"{run['world']} x {run['gpu']}"
    lines = [f"{'#' * level} {title or machine}", ""]
    if "tma_blocks_all_reduce_bf16" in run:
        blocks = ", ".join(f"{_size(int(b))}: {n}" for b, n in run["tma_blocks_all_reduce_bf16"].items())
        lines += [f"{run['sms']} SMs per GPU. Thread blocks of the TMA all-reduce by size: {blocks}.", ""]
    if "nccl_version" in run:
        lines += [_nccl_line(run), ""]
    lines += [line for b in _barrier_lines(run["results"]) for line in (b, "")]
    for title, rows in _tables(run["results"], run["world"]):
        lines += [f"{'#' * (level + 1)} {title}", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]] + [""]
    return "\n".join(lines)


def _nccl_line(run: dict) -> str:
    """The run's NCCL version and the NCCL columns it could not time, with the reasons."""
    skipped = "; ".join(f"{name} skipped: {why}" for name, why in run.get("nccl_skipped", {}).items())
    return f"NCCL {run['nccl_version']}." + (f" {skipped}." if skipped else "")


def auto_pick(collective: str, world: int, nbytes: int, symmetric: bool) -> str | None:
    """The algorithm ``auto`` picks now (:mod:`collectives.algorithms.tuning`) for a 16-byte
    aligned tensor of ``nbytes`` per rank on the peer backend, symmetric or not (None: the
    collective has one algorithm, the barrier)."""
    from ..algorithms import tuning

    choose = getattr(tuning, f"{collective}_algorithm", None)
    return None if choose is None else choose(world, nbytes, "peer", symmetric=symmetric)


def _auto_pick(collective: str, world: int, nbytes: int) -> str:
    """The algorithms ``auto`` runs for a 16-byte aligned tensor of ``nbytes`` on the peer
    backend, symmetric / plain (:func:`auto_pick`)."""
    return " / ".join(auto_pick(collective, world, nbytes, s) for s in (True, False))


def _size(nbytes: int) -> str:
    for unit, shift in (("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


if __name__ == "__main__":
    sys.exit(main())
