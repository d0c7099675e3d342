"""The barrier protocol as the kernels' own source runs it (CPU, no CuTeDSL compile).

:mod:`device_sim` executes :mod:`collectives.device.signals` and the kernel of
:func:`collectives.algorithms.design.kernel` from their source files, every GPU thread a
simulated thread, over simulated pads, tables and error records; each rank's host runs its
calls one after the other (its next kernel starts when all its blocks ended, as a stream runs
them), keeps going after a failed call (kernels already queued still run) and reads and clears
its error records after each call.  The data phase is not simulated (a no-op ``move``): what
runs is the call count, tickets, arrival words, waits and error records.  So an edit of the
device protocol is an edit of what these tests run; :mod:`test_barrier_model` restates the
protocol in Python to explore interleavings at scale.

Every wait that passes is checked: in each thread ``t < world`` the word it passed on must be
rank ``t``'s of the same call, and carry the size ``t`` brought to that call (ours).
"""

from __future__ import annotations

import functools
import random
import types

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, arguments, fakes, load, me  # noqa: E402

import ptxops  # noqa: E402
from collectives.algorithms import KernelKey  # noqa: E402
from collectives.algorithms import grid as kernel_grid  # noqa: E402
from collectives.algorithms.base import signature  # noqa: E402
from collectives.config import BARRIER_THREADS, CALL_EPOCHS  # noqa: E402
from collectives.layouts import (  # noqa: E402
    ERROR_FIELDS,
    ERROR_RECORDS,
    FATAL_RECORD,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
    PadLayout,
    call_parity,
)
from collectives.runtime.communicator import Communicator  # noqa: E402

U32 = 1 << 32
FAKES = fakes()
Int32, Int64, Uint32 = FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint32


def kernels(edits: dict | None = None) -> types.SimpleNamespace:
    """The simulated ``signals`` and ``design`` modules (``edits``: module -> its (old, new)
    source edits)."""
    edits = edits or {}
    signals = load("collectives.device.signals", FAKES, edits.get("signals", ()))
    design = load("collectives.algorithms.design", {
        **FAKES,
        "collectives.device": types.SimpleNamespace(signals=signals, reduce=None),
    }, edits.get("design", ()))
    return types.SimpleNamespace(signals=signals, design=design)


SOURCE = kernels()


class Hazard(AssertionError):
    pass


def grid(world: int, n: int) -> int:
    """The runtime's grid of a one-shot f32 all-reduce of ``n`` elements on an H100 (132 SMs)."""
    comm = Communicator.__new__(Communicator)
    comm.sms, comm.layout = 132, PadLayout()
    key = KernelKey("all_reduce", "one_shot", "peer", "f32", world)
    return kernel_grid(comm, key, n // key.full_vector)


class World:
    """``world`` ranks, each running ``calls`` (per call, each rank's element count, or its
    ``(count, kinds)`` or ``(count, kinds, (collective, dtype, op))``:
    :attr:`collectives.algorithms.Call.kinds`, 0 by default, and what the rank's call is, an
    f32 sum all-reduce by default; brought to the barriers as the host does,
    :func:`~collectives.algorithms.base.signature`) of the
    design kernel of ``collective`` ("all_reduce": one-shot f32, both barriers; "barrier": the
    bare barrier, one block); ``start``: every pad's call count (and arrival epochs) at the
    start; ``late[r] = (c, ticks)``: rank ``r`` starts call ``c`` ``ticks`` after the others'
    first call; ``timeout``: each wait's bound, in ticks; ``speed``: :class:`Sim`'s."""

    THREADS = None  # per block: world + 1 (a thread past the world's takes the idle paths)

    def __init__(self, world: int, calls: list, seed: int, collective: str = "all_reduce", start: int = 0,
                 timeout: int = 3000, late: dict | None = None, multicast: bool = False,
                 source: types.SimpleNamespace = SOURCE, speed: dict | None = None) -> None:
        self.world, self.calls, self.collective, self.timeout = world, calls, collective, timeout
        self.late = late or {}
        self.sim = sim = Sim(seed, speed=speed)
        self.rng = random.Random(seed)
        mem = sim.memory
        self.layout = layout = PadLayout(world=world)
        self.pads = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.pad_table = mem.alloc(8 * world)
        self.data_table = mem.alloc(8 * world)
        for r in range(world):
            mem.store(self.pad_table + 8 * r, self.pads[r], Int64)
            mem.store(self.data_table + 8 * r, mem.alloc(256), Int64)
            mem.store(self.pads[r] + 4 * layout.calls, start, Uint32)
            for word in range(0, layout.calls, 2):
                mem.store(self.pads[r] + 4 * word, start, Uint32)
        self.pad_mc = mem.alloc_multicast(self.pads, 4 * layout.words) if multicast else 0
        self.errs = [mem.alloc(4 * len(ERROR_FIELDS) * ERROR_RECORDS) for _ in range(world)]
        backend = "multicast" if multicast else "peer"
        key = KernelKey("barrier", "one_shot", backend, "f32", world, threads=BARRIER_THREADS)  # Barrier.plan's
        self.barrier = source.design.kernel(key, source.design.Blocks(key), stage=None)
        key = KernelKey("all_reduce", "one_shot", backend, "f32", world, end_barrier=True)
        self.all_reduce = source.design.kernel(key, source.design.Blocks(key), lambda *a: None, move=lambda *a: None)
        self.records: list[list] = [[] for _ in range(world)]  # (call, record, status, barrier, peer, block)
        self.passes: list[int] = [0] * world
        signals = source.signals
        original, record_error, cas = signals.wait_peers, signals.record_error, signals.ptxops.atom_cas
        #: (rank, call, record address) -> the fields of the failure whose compare-and-swap
        #: claimed the record (the first failure: the one the record must hold).
        self.claims: dict[tuple, tuple] = {}

        def checked_wait(*args, **kwargs):
            ok = original(*args, **kwargs)
            self._check(arguments(original, args, kwargs), ok)
            return ok

        def failing(*args, **kwargs):
            me().failure = arguments(record_error, args, kwargs)
            try:
                return record_error(*args, **kwargs)
            finally:
                me().failure = None

        def claim(ptr, *args, **kwargs):
            old = cas(ptr, *args, **kwargs)
            failure, ctx = getattr(me(), "failure", None), me().ctx
            if failure is not None and old.v == 0:
                self.claims[ctx.rank, ctx.call, ptr.address] = tuple(
                    int(failure[f]) for f in ("status", "barrier", "peer", "block", "rank"))
            return old

        signals.wait_peers, signals.record_error, signals.ptxops.atom_cas = checked_wait, failing, claim
        try:
            for r in range(world):
                sim.spawn(lambda r=r: self._host(r), Context(rank=r))
            sim.run()
        finally:
            signals.wait_peers, signals.record_error, signals.ptxops.atom_cas = original, record_error, cas

    def _bare(self, size: int) -> bool:
        """Whether a rank bringing ``size`` launches the barrier: the barrier collective, or an
        all-reduce of nothing (the API's barrier of size 0)."""
        return self.collective == "barrier" or size == 0

    def _signature(self, entry) -> int:
        """The ``kinds`` argument a rank's host passes for ``entry``: its call's signature, or
        the bare barrier's where it launches that (:meth:`collectives.algorithms.Call.bare`)."""
        size, kinds = _size_and_kinds(entry)
        if self._bare(size):
            return signature("barrier", "bf16", "sum", 0b100)
        return signature(*_what(entry), kinds)

    def _host(self, r: int) -> None:
        sim, mem = self.sim, self.sim.memory
        threads = self.world + 1
        for c, call in enumerate(self.calls):
            me().ctx.call = c
            if r in self.late and self.late[r][0] == c:
                sim.sleep_until(self.late[r][1])
            size, kinds = _size_and_kinds(call[r])
            bare = self._bare(size)
            kinds = self._signature(call[r])
            blocks = 1 if bare else grid(self.world, size)
            body = self.barrier if bare else self.all_reduce
            args = types.SimpleNamespace(
                data_table=Int64(self.data_table), data_mc=Int64(0), out=Int64(0), src=Int64(0),
                n=Int64(0 if bare else size), kinds=Int32(kinds), pad_table=Int64(self.pad_table), pad_mc=Int64(self.pad_mc),
                pad=Int64(self.pads[r]), err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(self.timeout))
            delays = [self.rng.choice([0, 0, self.timeout // 8]) for _ in range(blocks)]
            sim.launch(lambda: body(args), Context(rank=r, call=c), blocks, threads, delays)
            for index in range(ERROR_RECORDS):
                at = self.errs[r] + 4 * len(ERROR_FIELDS) * index
                status, barrier, peer, block, rank = mem.words(at, len(ERROR_FIELDS))
                if status:
                    self.records[r].append((c, index, status, barrier, peer, block))
                    claimed = self.claims.get((r, c, at))
                    if claimed != (status, barrier, peer, block, rank):
                        raise Hazard(f"rank {r} call {c}: record {index} holds {(status, barrier, peer, block, rank)}, "
                                     f"not the fields of the failure that claimed it first, {claimed}")
                for i in range(len(ERROR_FIELDS)):
                    mem.store(at + 4 * i, 0, Int32)

    def _check(self, a: dict, ok) -> None:
        t, ctx = me().ctx.tidx, me().ctx
        if t >= self.world or not ok:
            return
        calls = int(a["calls"]) % U32
        word = int(a["pad"]) + 4 * self.layout.arrival(call_parity(calls), int(a["block"]), t)
        wrote = me().seen.get(word)
        if wrote != (t, ctx.call):
            raise Hazard(f"rank {ctx.rank} call {ctx.call} block {ctx.block} passed on rank {t}'s word "
                         f"written by (rank, call) {wrote}")
        sizes = [(0 if self._bare(_size_and_kinds(e)[0]) else _size_and_kinds(e)[0]) ^ self._signature(e) & (U32 - 1)
                 for e in self.calls[ctx.call]]
        if sizes[t] != sizes[ctx.rank]:
            raise Hazard(f"rank {ctx.rank} call {ctx.call} block {ctx.block} passed rank {t} with another size: "
                         f"{sizes}")

    def counts(self) -> set:
        return {self.sim.memory.load(pad + 4 * self.layout.calls, Uint32).v for pad in self.pads}

    def statuses(self, r: int) -> set:
        """(call, record, status) of rank ``r``'s records."""
        return {(c, index, status) for c, index, status, *_ in self.records[r]}


def _size_and_kinds(entry) -> tuple[int, int]:
    return entry[:2] if isinstance(entry, tuple) else (entry, 0)


def _what(entry) -> tuple[str, str, str]:
    """(collective, dtype, op) of a rank's call."""
    return entry[2] if isinstance(entry, tuple) and len(entry) > 2 else ("all_reduce", "f32", "sum")


EQUAL, WIDE, SHORT = 2048, 2056, 2040  # one-shot f32: one block, two blocks, one block
SEEDS = range(4)
LATE = 3000  # ticks: a wait's bound (World's default timeout)


def equal_calls_across_the_wrap(source, collective: str = "all_reduce", multicast: bool = False,
                                speed: dict | None = None) -> None:
    """Equal calls from 2 calls below the 2^32 wrap record nothing, and every count ends one
    step of :data:`CALL_EPOCHS` per call on (``speed``: :class:`Sim`'s, e.g. a slow thread)."""
    start = U32 - 2 * CALL_EPOCHS
    for seed in SEEDS:
        world = World(2 + seed % 2, [[WIDE] * (2 + seed % 2)] * 4, seed, collective, start=start, multicast=multicast,
                      source=source, speed=speed)
        assert world.records == [[]] * world.world
        assert world.counts() == {(start + 4 * CALL_EPOCHS) % U32}


def mismatch_changing_the_grid(source) -> None:
    """A call of 2048 elements (one block) on rank 0 and 2056 (two) on rank 1: a size mismatch
    on both ranks (the recoverable record), no timeout, and the counts stay equal."""
    for seed in SEEDS:
        calls = [[WIDE, WIDE]] * 2 + [[EQUAL, WIDE]] + [[WIDE, WIDE]] * 2
        world = World(2, calls, seed, source=source)
        for r in range(2):
            assert world.statuses(r) == {(2, RECOVERABLE_RECORD, SIZE_MISMATCH)}, world.records
        assert world.counts() == {5 * CALL_EPOCHS}


def mismatch_on_the_same_grid(source) -> None:
    for seed in SEEDS:
        world = World(2, [[EQUAL, EQUAL], [EQUAL, SHORT], [EQUAL, EQUAL]], seed, source=source)
        for r in range(2):
            assert world.statuses(r) == {(1, RECOVERABLE_RECORD, SIZE_MISMATCH)}, world.records


def tensors_of_different_kinds(source) -> None:
    """Equal sizes, but rank 1's tensor differs in kind from rank 0's at call 1 (symmetric on
    one, plain on the other: the ranks may have planned different kernels; bit 31 of the size
    word set on both): a size mismatch on both ranks, no timeout, the counts equal, and the
    next call passes; from count 0 and from two calls below the 2^31 and the 2^32 boundaries."""
    for seed, start in zip(SEEDS, [0, (1 << 31) - 2 * CALL_EPOCHS, U32 - 2 * CALL_EPOCHS, 0]):
        calls = [[WIDE, WIDE], [(WIDE, 0b101), (WIDE, 0b100)], [(WIDE, 1), (WIDE, 1)]]
        world = World(2, calls, seed, source=source, start=start)
        for r in range(2):
            assert world.statuses(r) == {(1, RECOVERABLE_RECORD, SIZE_MISMATCH)}, world.records
        assert world.counts() == {(start + 3 * CALL_EPOCHS) % U32}


def calls_of_different_dtypes_or_collectives(source) -> None:
    """Equal element counts, but at call 1 rank 0 all-reduces f32 where rank 1 all-reduces
    bf16 (the f32 rank would move twice the bytes), and at call 2 rank 0 all-gathers where
    rank 1 reduce-scatters: a size mismatch on both ranks at each, no timeout, the counts equal
    (issue 48 item 3)."""
    for seed in SEEDS:
        calls = [[WIDE, WIDE], [(WIDE, 0, ("all_reduce", "f32", "sum")), (WIDE, 0, ("all_reduce", "bf16", "sum"))],
                 [(WIDE, 0, ("all_gather", "f32", "sum")), (WIDE, 0, ("reduce_scatter", "f32", "sum"))],
                 [WIDE, WIDE]]
        world = World(2, calls, seed, source=source)
        for r in range(2):
            assert world.statuses(r) == {(1, RECOVERABLE_RECORD, SIZE_MISMATCH),
                                         (2, RECOVERABLE_RECORD, SIZE_MISMATCH)}, world.records
        assert world.counts() == {4 * CALL_EPOCHS}


def an_empty_rank(source) -> None:
    """Rank 0's tensor of call 1 is empty: it launches the barrier (of size 0) where rank 1
    runs an all-reduce of 2056 elements (two blocks): a size mismatch on both, no timeout, and
    the counts stay equal (the API's zero-size call, issue 31 item 4)."""
    for seed in SEEDS:
        world = World(2, [[WIDE, WIDE], [0, WIDE], [WIDE, WIDE]], seed, source=source)
        for r in range(2):
            assert world.statuses(r) == {(1, RECOVERABLE_RECORD, SIZE_MISMATCH)}, world.records
        assert world.counts() == {3 * CALL_EPOCHS}


def late_rank(source, collective: str = "barrier", multicast: bool = False, size: int = EQUAL) -> None:
    """Rank 1 starts its only call two timeouts late: rank 0 times out waiting for it (the
    fatal record), and rank 1, arriving after, must not pass on rank 0's signal (rank 0 left
    the call failing): a timeout too.  (``size`` :data:`WIDE`: two blocks, two failures a rank,
    of which the record holds the first's fields.)"""
    for seed in SEEDS:
        world = World(2, [[size, size]], seed, collective, late={1: (0, 2 * LATE)}, multicast=multicast,
                      source=source)
        assert world.statuses(0) == {(0, FATAL_RECORD, TIMEOUT)}, world.records
        assert world.statuses(1) == {(0, FATAL_RECORD, TIMEOUT)}, world.records


def rank_two_calls_behind(source) -> None:
    """Rank 0's kernels keep running after its first call timed out (they were queued); rank 1
    starts 8 timeouts late, when rank 0's third call has signalled into the same arrival slot."""
    for seed in SEEDS:
        world = World(2, [[EQUAL, EQUAL]] * 3, seed, late={1: (0, 8 * LATE)}, source=source)
        assert {status for _, _, status in world.statuses(0)} == {TIMEOUT}
        assert (0, FATAL_RECORD, TIMEOUT) in world.statuses(1), world.records


@pytest.mark.parametrize("multicast", [False, True])
@pytest.mark.parametrize("collective", ["all_reduce", "barrier"])
def test_equal_calls_across_the_wrap_record_nothing_and_advance_the_count_by_a_call_each(collective: str,
                                                                                      multicast: bool) -> None:
    equal_calls_across_the_wrap(SOURCE, collective, multicast)


def test_a_mismatch_that_changes_the_grid_is_a_size_mismatch_on_every_rank_and_the_counts_stay_equal() -> None:
    mismatch_changing_the_grid(SOURCE)


def test_a_mismatch_on_the_same_grid_is_a_size_mismatch_on_every_rank() -> None:
    mismatch_on_the_same_grid(SOURCE)


def test_tensors_of_different_kinds_are_a_size_mismatch_on_every_rank() -> None:
    tensors_of_different_kinds(SOURCE)


def test_calls_of_different_dtypes_or_collectives_are_a_size_mismatch_on_every_rank() -> None:
    calls_of_different_dtypes_or_collectives(SOURCE)


def test_an_empty_rank_and_its_peers_record_a_size_mismatch_and_stay_in_step() -> None:
    an_empty_rank(SOURCE)


@pytest.mark.parametrize("multicast", [False, True])
@pytest.mark.parametrize("collective", ["all_reduce", "barrier"])
def test_a_rank_that_arrives_after_its_peer_gave_up_times_out_too(collective: str, multicast: bool) -> None:
    late_rank(SOURCE, collective, multicast)


def test_the_error_record_holds_the_first_failures_fields() -> None:
    """Two blocks of each rank time out: each record holds the fields of the failure that
    claimed it (checked in every run, :class:`World`)."""
    late_rank(SOURCE, "all_reduce", size=WIDE)


def test_a_rank_two_calls_behind_does_not_pass_on_a_later_calls_word() -> None:
    rank_two_calls_behind(SOURCE)


# -- mutations of the device source, each caught -------------------------------------------------

#: Edits that break the protocol (module, old text, new text), and the check that catches each.
MUTATIONS = {
    "every block advances the call count": (
        "signals", "if cute.arch.thread_idx()[0] == 0 and last:", "if cute.arch.thread_idx()[0] == 0:",
        equal_calls_across_the_wrap),
    "a step of 1 per call": (
        "signals", "ptxops.st(words + count, calls + Uint32(CALL_EPOCHS))",
        "ptxops.st(words + count, calls + Uint32(1))", equal_calls_across_the_wrap),
    "no leave_call": (
        "design", "        signals.leave_call(pad, calls, last, world, single)\n", "", equal_calls_across_the_wrap),
    "no watch of block 0": ("signals", "            if block > 0:\n", "            if block < 0:\n",
                            mismatch_changing_the_grid),
    "no in_call check": (
        "signals", "elif not reached(epoch, want) or not in_call(epoch, calls):", "elif not reached(epoch, want):",
        rank_two_calls_behind),
    "no size compare": ("signals", "elif Uint32(seen >> 32) != size:", "elif False:", mismatch_on_the_same_grid),
    "the size word without the kinds": (
        "signals", "    return Uint32(n) ^ Uint32(kinds)", "    return Uint32(n)", tensors_of_different_kinds),
    "the size word without the call's tag": (
        "signals", "    return Uint32(n) ^ Uint32(kinds)", "    return Uint32(n) ^ (Uint32(kinds) & Uint32(7 << 29))",
        calls_of_different_dtypes_or_collectives),
    "timeouts into the recoverable record": (
        "signals", "        index = Int32(FATAL_RECORD)\n", "        index = Int32(RECOVERABLE_RECORD)\n", late_rank),
    "no sync before a bare barrier's leave_call": (
        "design", "            if cutlass.const_expr(threads <= cute.arch.WARP_SIZE):\n                cute.arch.sync_warp()\n"
        "            else:\n                cute.arch.sync_threads()\n", "",
        # (thread 1 of rank 0 slow: it reads C after thread 0 advanced it)
        functools.partial(equal_calls_across_the_wrap, collective="barrier", speed={(0, 1): 0.02})),
    "no first-failure claim of the error record": (
        "signals", 'sem="relaxed", scope="sys") == 0:\n        ptxops.st(record + ERROR_FIELD["barrier"]',
        'sem="relaxed", scope="sys") != 7:\n        ptxops.st(record + ERROR_FIELD["barrier"]',
        functools.partial(late_rank, collective="all_reduce", size=WIDE)),
    "no word left by a rank that gave up": (
        "signals", "        if status == Int32(TIMEOUT):\n            word =",
        "        if status == Int32(-7):\n            word =", late_rank),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_of_the_protocol_fails_its_check(name: str) -> None:
    module, old, new, check = MUTATIONS[name]
    with pytest.raises((AssertionError, RuntimeError)):
        check(kernels({module: ((old, new),)}))


#: Edits that break a pointer's reach or an access's scope (old text, new text, the run that
#: meets it), and the error ptxops raises for it: the simulation checks every access as the
#: trace of a collectives kernel does.
REACH_MUTATIONS = {
    "a peer's arrival word released at .gpu": (
        'rank, world), word, scope="sys")\n', 'rank, world), word, scope="gpu")\n', equal_calls_across_the_wrap,
        ptxops.ScopeError, r"st\.release\.gpu.* a release store to peer memory needs \.sys"),
    "the call count untagged": (
        'words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.enter_call")', "words = gmem(Uint32, pad, 4)",
        equal_calls_across_the_wrap, ptxops.QualifierError,
        r"ld\.global\.b32: the pointer has no reach, and a collectives kernel \(simulated\) tags every pointer"),
    "the error record's fields stored at .gpu": (
        'ptxops.st(record + ERROR_FIELD["barrier"], barrier, sem="relaxed", scope="sys")',
        'ptxops.st(record + ERROR_FIELD["barrier"], barrier, sem="relaxed", scope="gpu")', late_rank,
        ptxops.ScopeError, r"relaxed store to host-mapped memory needs \.sys[\s\S]*set by "
                           r"collectives\.device\.signals\.record_error at .*signals\.py:\d+"),
    "a reach that is none": (
        'gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.enter_call")',
        'gmem(Uint32, pad, 4, "local", "collectives.device.signals.enter_call")', equal_calls_across_the_wrap,
        ptxops.QualifierError, r"'local' is not a reach"),
}


@pytest.mark.parametrize("name", REACH_MUTATIONS)
def test_the_simulation_checks_each_access_against_its_pointers_reach(name: str) -> None:
    old, new, run, error, message = REACH_MUTATIONS[name]
    with pytest.raises(error, match=message):
        run(kernels({"signals": ((old, new),)}))
