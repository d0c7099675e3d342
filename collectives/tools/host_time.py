"""Host time per eager call on GPUs: what the host spends enqueueing a collective, ours and torch
symm_mem's (issue 50's targets are eager times, which the host sets for small tensors).

    torchrun --nproc-per-node 4 -m collectives.tools.host_time [--bytes 4096,65536] [--calls 2000] [--profile]
        [--breakdown] [--moe 1,128]

Per collective and size: microseconds of host time per call (``time.perf_counter`` around
``--calls`` back-to-back eager calls, the GPU synchronised before and after, never inside; the
slowest rank's, best of :data:`REPEATS` runs, the runs of the rows compared with each other
interleaved: :func:`measure_rows`), for a plan hit (the same tensors again) and for tensors made anew at
each call (the allocator's other addresses; made before the timing).  ``--profile``: every rank
profiles the plan hits, rank 0 prints cProfile's top functions of the plan hits.  ``--breakdown``: first, where a plan
hit of the all-reduce and of the reduce-scatter of the first size goes (:func:`breakdown`).
``--moe TOKENS``: last, an MoE layer's eager dispatch and combine at each token count
(:func:`moe_rows`): each rank's host time per call and the GPU time per call back to back.
Then ours against torch symm_mem's same call, from the interleaved rows (:func:`ratios`).
bf16; NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import math
import pstats
import time
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .timing import slowest_rank as _slowest  # noqa: E402  (a module name the tests stub)


#: Timed runs per row (:func:`host_us`, :func:`interleaved_us`): the best is reported.
REPEATS = 5


def host_run(calls: Callable[[], list[Callable[[], object]]],
             reduce: Callable[[float], object] | None = None) -> tuple[object, Exception | None]:
    """One timed run: microseconds of host time per call of the functions ``calls()`` returns
    (made outside the timing; each called once, in order), the slowest rank's (infinite where a
    rank failed; ``reduce``: what to make of every rank's figure instead, given this rank's),
    and the Python error this rank met (every rank does the same synchronisations either way,
    so that none waits for it)."""
    mine, error = math.inf, None
    try:
        fns = calls()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (returned, once every rank has met)
        error, fns = e, []
    dist.barrier()
    try:
        start = time.perf_counter()
        for fn in fns:
            fn()
        if fns:
            mine = (time.perf_counter() - start) / len(fns) * 1e6
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        error, mine = e, math.inf
    return (reduce or _slowest)(mine), error


def _every(mine: float) -> list[float]:
    """Every rank's ``mine``, by rank (infinite where a rank failed)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def each_rank_us(calls: Callable[[], list[Callable[[], object]]], repeats: int = REPEATS) -> list[float]:
    """:func:`host_us` of every rank, not the slowest's alone: each rank's best of ``repeats``
    runs (the runs of every rank start together), by rank; errors as :func:`host_us` raises them."""
    runs = [host_run(calls, _every) for _ in range(repeats)]
    _best([(max(every), error) for every, error in runs])
    return [min(every[r] for every, _ in runs) for r in range(len(runs[0][0]))]


def _best(runs: list[tuple[float, Exception | None]]) -> float:
    """The best of ``runs`` (:func:`host_run`'s), or the first error this rank met, or, where
    another rank failed, a :class:`RuntimeError` saying so (:func:`_agreed`)."""
    return _agreed(min(us for us, _ in runs), next((e for _, e in runs if e is not None), None))


def host_us(calls: Callable[[], list[Callable[[], object]]], repeats: int = REPEATS) -> float:
    """Microseconds of host time per call of the functions ``calls()`` returns (made anew for
    each of ``repeats`` runs, outside the timing: :func:`host_run`), the slowest rank's, best of
    ``repeats``.  A Python error raised on a rank is raised there after every rank has done the
    same synchronisations (so that none waits for it), and a :class:`RuntimeError` on the
    others."""
    return _best([host_run(calls) for _ in range(repeats)])


def interleaved_us(rows: list[Callable[[], list[Callable[[], object]]]],
                   repeats: int = REPEATS) -> list[float | Exception]:
    """:func:`host_us` of each of ``rows`` (their ``calls``), the runs interleaved
    (:func:`collectives.tools.bench.interleaved`: round ``r`` runs every row once, starting at
    the ``r``-th), so that the host's drift lands on every row alike; each row's best, or the
    error that ended it (as :func:`host_us` raises it)."""
    from .bench import interleaved

    results: list[float | Exception] = []
    for runs in interleaved([lambda calls=calls: host_run(calls) for calls in rows], repeats):
        try:
            results.append(_best(runs))
        except Exception as e:  # noqa: BLE001 (the row's error is its result)
            results.append(e)
    return results


def _agreed(us: float, error: Exception | None) -> float:
    """``us``, or the error this rank met, or, where another rank failed (``us`` infinite), a
    :class:`RuntimeError` saying so."""
    if error is not None:
        raise error
    if math.isinf(us):
        raise RuntimeError("failed on another rank")
    return us


#: Calls of a run short enough that the host never waits for room in the GPU's launch queue
#: (about a thousand launches deep): its host time is the host's alone, whatever the GPU's.
SHORT = 256


def gpu_us(fns: list[Callable[[], object]]) -> float:
    """Microseconds of GPU time per call of ``fns`` launched back to back (CUDA events around
    them): the slowest rank's.  At least the host time per call where the GPU waits for the
    host; more where the GPU is the slower, and then the host's calls wait for the launch
    queue once it is full (a long run's host time is then the GPU's).  Errors as
    :func:`host_us`'s."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    dist.barrier()
    mine, error = math.inf, None
    try:
        start.record()
        for fn in fns:
            fn()
        end.record()
        end.synchronize()
        mine = start.elapsed_time(end) * 1e3 / len(fns)
    except Exception as e:  # noqa: BLE001 (raised once every rank has met)
        error = e
    return _agreed(_slowest(mine), error)


#: A row of the table: its name and microseconds per call, or the error that ended its measurement.
Row = tuple[str, float | str]


def add(rows: list[Row], name: str, measure: Callable[[], float]) -> None:
    """Append row ``name``: what ``measure()`` returns, or the Python error it raises
    (:func:`failed`): a failing row never ends the tool."""
    try:
        rows.append((name, measure()))
    except Exception as e:  # noqa: BLE001 (the row's error is its result)
        rows.append(failed(name, e))


def failed(name: str, error: Exception) -> Row:
    """Row ``name`` that ``error`` ended, printed at once by the rank that met it."""
    print(f"rank {dist.get_rank()}: {name.strip()}: {type(error).__name__}: {error}", flush=True)
    return name, f"failed: {type(error).__name__}: {error}"


def breakdown(comm, t: torch.Tensor, calls: int) -> list[Row]:
    """Host microseconds per call of each part of a plan hit of ``collectives.all_reduce(t)``,
    then of ``collectives.reduce_scatter`` of ``t`` (its key reads a second tensor), each timed
    alone as :func:`host_us` times a call (every rank doing the same, so that the collective
    launches pair), each row measured on its own (:func:`add`): the call; the call in runs too
    short to fill the launch queue, and the GPU time per call (:func:`gpu_us`: where it is the
    host time or more, the long runs' host time may be the GPU's); the call with its launch a
    no-op (our Python); the key (the call's flat key of
    :func:`~collectives.runtime.staging.tensor_key`'s fields, as the API builds it, and the plan
    lookup); the launch alone (the plan's TVM-FFI function, bound to its arguments once); after
    the all-reduce the error record's reads (poll and finish), the stream (torch's raw handle,
    and ``torch.cuda.current_stream``), whether a capture is on, the symmetry lookup of a plain
    tensor (a call on new tensors asks it), an empty torch kernel (``torch.cuda._sleep(0)``); torch symm_mem's two-shot all-reduce and reduce-scatter of as
    many elements, as the calls.  A plan of two argument sets launches them in turn from the
    communicator's, an even number of times (it ends where it began)."""
    import collectives
    from collectives.algorithms.plan import capturing, current_stream
    from collectives.symmetric.context import address

    rows: list[Row] = []
    device, errors, stream = comm.device_index, comm.errors, current_stream(comm.device_index)
    calls += calls % 2
    out = torch.empty(t.numel() // comm.world, dtype=t.dtype, device=t.device)

    def row(name: str, fn: Callable[[], object], runs: int = calls) -> None:
        add(rows, name, lambda: host_us(lambda: [fn] * runs))

    def parts(name: str, call: Callable[[], object], head: tuple, flat: Callable[[tuple], tuple]) -> None:
        """The rows of a plan hit of ``call`` (its key starting with ``head``; ``flat(key)``: the
        key as the API builds it)."""
        key = plan = None
        try:
            call()
            key = next(k for k in reversed(comm.plans._plans) if k[:len(head)] == head)
            plan = comm.plans.get(key)
            if comm.plans.hit(flat(key)) is not plan:
                raise RuntimeError(f"the breakdown's key is not {name}'s: {flat(key)} against {key}")
        except Exception as e:  # noqa: BLE001 (the rows that need the plan are left out)
            rows.append(failed(f"{name} plan hit: its plan", e))
        row(f"{name}, plan hit: the call", call)
        row(f"  the call, runs of {SHORT} (the launch queue never full)", call, SHORT)
        add(rows, f"  GPU time per call, {calls} back to back", lambda: gpu_us([call] * calls))
        if plan is None:
            return
        kept = plan.launches

        def idle() -> float:
            plan.launches = [lambda stream: None] * len(kept)
            try:
                return host_us(lambda: [call] * calls)
            finally:
                plan.launches = kept

        add(rows, "  the call, its launch a no-op (our Python)", idle)
        row("  key: the flat key + plan lookup (PlanCache.hit)", lambda: comm.plans.hit(flat(key)))
        add(rows, "  launch alone: the plan's TVM-FFI function, bound once",
            lambda: host_us(lambda: [functools.partial(kept[(comm.turn + i) % len(kept)], stream)
                                     for i in range(calls)]))

    def facts(x: torch.Tensor) -> tuple:
        return x.data_ptr() or address(x), x.dtype, x.shape, x.is_contiguous(), x.get_device()

    # (the keys as collectives.all_reduce and collectives.reduce_scatter build them)
    parts("all_reduce", lambda: collectives.all_reduce(t), ("all_reduce", None, t.data_ptr()),
          lambda key: ("all_reduce", None, t.data_ptr() or address(t), t.dtype, t.shape, t.is_contiguous(),
                       t.get_device(), *key[7:]))
    row("  error record: poll + the check before finish", lambda: (errors.poll(), errors.deferred is not None))
    row("  stream: torch._C raw handle", lambda: current_stream(device))
    row("  stream: torch.cuda.current_stream()", lambda: torch.cuda.current_stream().cuda_stream)
    row("  capturing()", capturing)
    row("  one tensor's five key facts (data_ptr, dtype, shape, is_contiguous, get_device)", lambda: facts(t))
    row("  is_symmetric(a plain tensor) (a call on new tensors asks)",
        lambda: comm.ctx.is_symmetric(out))
    parts("reduce_scatter", lambda: collectives.reduce_scatter(out, t),
          ("reduce_scatter", out.data_ptr(), t.data_ptr()),
          lambda key: ("reduce_scatter", out.data_ptr() or address(out), t.data_ptr() or address(t), t.dtype, t.shape,
                       t.is_contiguous(), t.get_device(), out.dtype, out.shape, out.is_contiguous(), out.get_device(),
                       *key[11:]))
    row("torch: an empty kernel's launch (torch.cuda._sleep(0))", lambda: torch.cuda._sleep(0))
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    try:
        theirs = symm_mem.empty(t.numel(), dtype=t.dtype, device="cuda")
        symm_mem.rendezvous(theirs, group)
    except Exception as e:  # noqa: BLE001 (torch's rows are left out)
        rows.append(failed("torch symm_mem: its buffer", e))
        return rows

    def two_shot() -> None:
        torch.ops.symm_mem.two_shot_all_reduce_(theirs, "sum", group)

    def scatter() -> None:
        torch.ops.symm_mem.reduce_scatter_out(theirs, group, False, out)

    for name, fn in (("torch two_shot_all_reduce_", two_shot), ("torch reduce_scatter_out", scatter)):
        add(rows, f"{name}: the call", lambda fn=fn: (fn(), host_us(lambda: [fn] * calls))[1])
        row(f"  the call, runs of {SHORT}", fn, SHORT)
        add(rows, f"  GPU time per call, {calls} back to back", lambda fn=fn: gpu_us([fn] * calls))
    return rows


#: The MoE layer of ``--moe`` (the benches' decode shape): hidden size, experts, top-k; bf16 tokens.
MOE_SHAPE = dict(hidden=7168, experts=256, topk=8)


def moe_rows(tokens: list[int], calls: int, inputs: Callable[[int], tuple] | None = None) -> list[Row]:
    """Per token count, the eager ``collectives.moe.dispatch`` (low latency, fused kernels) and the
    ``combine`` of one of its results: host microseconds per call, the slowest rank's and each
    rank's (runs of ``SHORT // 4`` calls: a dispatch launches four kernels), and GPU
    microseconds per call of ``calls`` back to back.  An eager layer's exchange kernels spin
    until every rank has launched its part, so where the GPU time matches the slowest rank's
    host time the layer is as fast as its slowest host enqueues it (docs/guide-moe.md, "The
    slowest host sets an eager layer").  ``inputs(tokens)``: the layer's ``(x, topk_ids,
    topk_weights)`` (default: the benches', :func:`collectives.tools.all_to_all_bench.layer_inputs`,
    on this GPU)."""
    from collectives import moe

    shape = argparse.Namespace(**MOE_SHAPE)
    if inputs is None:
        from .all_to_all_bench import layer_inputs

        gen = torch.Generator(device="cuda").manual_seed(1 + dist.get_rank())
        inputs = functools.partial(layer_inputs, shape, gen=gen)
    rows: list[Row] = []
    for count in tokens:
        x, ids, weights = inputs(count)
        expert_x, _, handle = moe.dispatch(x, ids, weights, shape.experts, max_tokens=count)
        for part, fn in (("dispatch", lambda: moe.dispatch(x, ids, weights, shape.experts, max_tokens=count)),
                         ("combine", lambda: moe.combine(expert_x, handle))):
            name = f"moe {part}, {count} token{'s' if count > 1 else ''}"
            every: list[float] = []

            def slowest(fn: Callable[[], object] = fn, every: list[float] = every) -> float:
                every[:] = each_rank_us(lambda: [fn] * (SHORT // 4))
                return max(every)

            add(rows, f"{name}: host, slowest rank", slowest)
            rows += [(f"  rank {r}'s host", us) for r, us in enumerate(every)]
            add(rows, f"  GPU time per call, {calls} back to back", lambda fn=fn: gpu_us([fn] * calls))
    return rows


def measure_rows(rows: list[Row], group: list[tuple[str, Callable[[], Callable[[], object]], bool]],
                 calls: int) -> None:
    """Append the rows of ``group`` to ``rows``: per (name, make, moved), ``make()`` returning one
    call of a collective on tensors made then: its plan hit (that call made once, then ``calls``
    times per run, after one untimed call), and with ``moved`` its calls on tensors made anew at
    each call (made before the timing); the runs of every row of the group interleaved
    (:func:`interleaved_us`), each row its best, or the error that ended it (:func:`failed`)."""
    labels, runs = [], []
    for name, make, moved in group:
        made: list[Callable[[], object]] = []

        def hits(make: Callable[[], Callable[[], object]] = make, made: list = made) -> list[Callable[[], object]]:
            if not made:
                made.append(make())
            made[0]()  # (the plan made, the kernel loaded; and warm again after the other rows)
            return [made[0]] * calls
        labels.append(f"{name}, plan hit")
        runs.append(hits)
        if moved:
            labels.append(f"{name}, new tensors")
            runs.append(lambda make=make: [make() for _ in range(calls)])
    for label, us in zip(labels, interleaved_us(runs)):
        rows.append((label, us) if isinstance(us, float) else failed(label, us))


#: (ours, torch symm_mem's) rows compared by :func:`ratios` at each size (``{}``: bytes per rank).
COMPARED = (("all_reduce {} B", "torch two_shot_all_reduce_ {} B"),
            ("reduce_scatter {} B", "torch reduce_scatter_out {} B"))


def ratios(rows: list[Row], sizes: list[int]) -> list[str]:
    """``ours / torch's`` plan hits: the barrier's, then each pair of :data:`COMPARED` at each
    of ``sizes``; a pair with a failed or missing row is left out."""
    times = {name: us for name, us in rows if isinstance(us, float)}
    pairs = [("barrier", "torch symm_mem barrier")]
    pairs += [(ours.format(size), theirs.format(size)) for ours, theirs in COMPARED for size in sizes]
    out = []
    for ours, theirs in pairs:
        a, b = times.get(f"{ours}, plan hit"), times.get(f"{theirs}, plan hit")
        if a is not None and b is not None:
            out.append(f"{ours}: {a:.2f} / {b:.2f} us = {a / b:.2f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.host_time", description=__doc__)
    parser.add_argument("--bytes", default="4096,65536", help="bytes per rank")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--breakdown", action="store_true",
                        help="first, where an all-reduce's and a reduce-scatter's plan hits go")
    parser.add_argument("--moe", metavar="TOKENS", default="",
                        help="last, an MoE layer's eager dispatch and combine at these token counts per rank (1,128)")
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.bytes.split(",")]

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, calls = comm.world, args.calls
    group = dist.group.WORLD.group_name
    rows: list[Row] = []

    def measure(entries: list[tuple[str, Callable[[], Callable[[], object]], bool]]) -> None:
        measure_rows(rows, entries, calls)
        for name, make, _ in entries:
            if args.profile:  # every rank makes the calls (they are collectives); rank 0 prints
                hit = make()
                hit()  # (its plan made: the profile is of plan hits)
                profile = cProfile.Profile()
                profile.runcall(lambda: [hit() for _ in range(calls)])
                torch.cuda.synchronize()
                if comm.rank == 0:
                    print(f"== {name}, plan hit: cProfile, {calls} calls")
                    pstats.Stats(profile).sort_stats("tottime").print_stats(12)

    if args.breakdown:
        first = sizes[0] // 2
        rows += breakdown(comm, torch.ones(first, dtype=torch.bfloat16, device="cuda"), calls)
        collectives.synchronize()
    handle_buffer = symm_mem.empty(1024, device="cuda")
    handle = symm_mem.rendezvous(handle_buffer, group)
    measure([("barrier", lambda: collectives.barrier, False),
             ("torch symm_mem barrier", lambda: lambda: handle.barrier(channel=0), False)])
    for nbytes in sizes:
        n = nbytes // 2

        def plain(m: int) -> torch.Tensor:
            return torch.ones(m, dtype=torch.bfloat16, device="cuda")

        theirs = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(theirs, group)
        measure([(f"all_reduce {nbytes} B", lambda: (lambda t=plain(n): collectives.all_reduce(t)), True),
                 (f"reduce_scatter {nbytes} B",
                  lambda: (lambda o=plain(n // world), i=plain(n): collectives.reduce_scatter(o, i)), True),
                 (f"all_gather {nbytes} B",
                  lambda: (lambda o=plain(n), i=plain(n // world): collectives.all_gather(o, i)), True),
                 (f"torch two_shot_all_reduce_ {nbytes} B",
                  lambda: lambda: torch.ops.symm_mem.two_shot_all_reduce_(theirs, "sum", group), False),
                 (f"torch reduce_scatter_out {nbytes} B",
                  lambda: (lambda o=plain(n // world): torch.ops.symm_mem.reduce_scatter_out(theirs, group, False, o)),
                  False)])
        collectives.synchronize()
    if args.moe:
        rows += moe_rows([int(t) for t in args.moe.split(",")], calls)
        collectives.synchronize()
    if comm.rank == 0:
        print(f"host time per eager call, {world} ranks, bf16 ({torch.cuda.get_device_name()}):")
        for name, us in rows:
            print(f"  {name:45s} {us:8.2f} us" if isinstance(us, float) else f"  {name:45s} {us}")
        print("ours against torch symm_mem's same call (plan hits, timed interleaved; issue 50: <= 0.8x, the "
              "barrier <= 1x):")
        for line in ratios(rows, sizes):
            print(f"  {line}")
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
