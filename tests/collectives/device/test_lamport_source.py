"""The Lamport all-reduce as its own source runs it (CPU, no CuTeDSL compile).

:mod:`device_sim` executes :class:`collectives.algorithms.lamport.LamportKernel` and
:mod:`collectives.device.lamport` from their source files over simulated receive buffers, pads
and error records (the peer backend, f32 moved as bits; the "sum" of the simulation's reduction
stand-in adds the words as integers, so the test checks which values were combined, not float
arithmetic).  Scaled down where nothing depends on the size: 4 threads per block, slots of 64
bytes, 4 fixed parts (``LAMPORT_BLOCKS``, 128 in the kernel) on a grid of 2 blocks, so each
block runs two parts, as a rank with a smaller share of its GPU does (part 0 holds every vector
of these sizes; a part past it touches only its own call count).  Each rank runs its calls in order;
every call's output must be the sum of that call's inputs, and a call whose sizes differ must
be a size mismatch on every rank, after which the buffer it left dirty is emptied before reuse.
"""

from __future__ import annotations

import random
import types

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives.algorithms import REGISTRY, KernelKey  # noqa: E402
from collectives.algorithms.base import Call, signature  # noqa: E402
from collectives.config import BARRIER_THREADS, CALL_EPOCHS, LAMPORT_BUFFERS  # noqa: E402
from collectives.device.lamport import negative_zero  # noqa: E402
from collectives.layouts import ERROR_FIELDS, ERROR_RECORDS, RECOVERABLE_RECORD, SIZE_MISMATCH, PadLayout  # noqa: E402

FAKES = fakes()
Int32, Int64, Uint32 = FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint32
CARRIER = {bits: getattr(FAKES["cutlass"], f"Uint{bits}") for bits in (8, 16, 32)}  # an element's, by width
THREADS, SLOT, PARTS, BLOCKS = 4, 64, 4, 2
NEGATIVE_ZERO = negative_zero(32, 32)  # an f32 -0.0's bits


def combine(a: list, b: list, op: str) -> list:
    return [Uint32(x + y) for x, y in zip(a, b)]


def kernels(edits: tuple = (), signal_edits: tuple = ()) -> types.ModuleType:
    """The simulated ``collectives.algorithms.lamport`` (``edits``: its source edits;
    ``signal_edits``: those of the ``collectives.device.signals`` it runs, its ``signals``)."""
    signals = load("collectives.device.signals", FAKES, signal_edits)
    device_lamport = load("collectives.device.lamport", {**FAKES, "collectives.device.signals": signals})
    reduce = types.SimpleNamespace(convert=lambda values, dtype: values, combine=combine)
    registered = dict(REGISTRY)  # the copy's Lamport class registers itself: put the real one back
    try:
        module = load("collectives.algorithms.lamport", {
            **FAKES,
            "collectives.device": types.SimpleNamespace(lamport=device_lamport, reduce=reduce, signals=signals),
        }, edits)
        module.LAMPORT_BLOCKS = PARTS  # the kernel reads its count of parts from its module
        signals.LAMPORT_BLOCKS = PARTS  # and so does an empty rank's barrier (lamport_missed)
        return module
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)


SOURCE = kernels()


class World:
    """``world`` ranks running Lamport collectives of f32 ``calls``: per call, each rank's element
    count ``n`` (an all-reduce's tensor, a reduce-scatter's output, an all-gather's input), for
    an all-reduce, or ``(collectives, counts)`` with one collective name per rank.  ``kernels``:
    each collective's kernel class (default: ``source``'s all-reduce).  Rank ``r``'s input of
    call ``c`` element ``i`` is the word ``1000 * (c + 1) + 100 * r + i`` (never a -0.0 bit
    pattern)."""

    def __init__(self, world: int, calls: list, seed: int, source: types.ModuleType = SOURCE,
                 kernels: dict | None = None, word: types.FunctionType | None = None, slot: int = SLOT,
                 timeout: int = 3000, seed_call: int = 0) -> None:
        """``word(c, r, i)``: rank ``r``'s input element ``i`` of call ``c`` (default: :meth:`word`;
        elements of the kernel's ``bits``, 32 without); ``slot``: the bytes of a slot;
        ``timeout``: each wait's bound, in ticks; ``seed_call``: every Lamport call count's start
        (as :func:`~collectives.algorithms.lamport.seed_counts` sets it).  A kernel with a
        ``grid`` runs that many blocks."""
        self.world, self.timeout = world, timeout
        self.calls = [call if isinstance(call, tuple) else (["all_reduce"] * world, call) for call in calls]
        if word is not None:
            self.word = word
        self.sim = sim = Sim(seed, speed={0: 8})  # rank 0 fast: it reads before rank 1's data lands
        self.rng = random.Random(seed)
        mem = sim.memory
        self.kernels = {}
        for collective, kernel in (kernels or {"all_reduce": source.LamportKernel}).items():
            if isinstance(kernel, type):  # a Lamport kernel class (else a kernel made already)
                kernel = kernel(KernelKey(collective, "lamport", "peer", "f32", world, threads=256))
            # one for every rank, or a list of each rank's (ranks' keys may differ: alignment)
            self.kernels[collective] = kernel if isinstance(kernel, list) else [kernel] * world
            for each in self.kernels[collective]:
                each.threads, each.slot = THREADS, slot
        layout = PadLayout(world=world)
        self.pads = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.pad_table = mem.alloc(8 * world)
        for r in range(world):
            mem.store(self.pad_table + 8 * r, self.pads[r], Int64)
            for width in range(3):
                for part in range(PARTS):
                    mem.store(self.pads[r] + 4 * (layout.lamport_step(width, 0) + part), seed_call, Uint32)
        # each element width's receive buffers (Lamport's of 32-bit elements unless a kernel's
        # ``bits`` says otherwise), filled with its -0.0, and their table, by width
        self.tables = {}
        for bits in sorted({getattr(k[0], "bits", 32) for k in self.kernels.values()}, reverse=True):
            buffers = [mem.alloc(LAMPORT_BUFFERS * world * slot) for _ in range(world)]
            empty = negative_zero(32, bits)
            for buffer in buffers:
                for i in range(0, LAMPORT_BUFFERS * world * slot, 4):
                    mem.store(buffer + i, empty, Uint32)
            self.tables[bits] = mem.alloc(8 * world)
            for r in range(world):
                mem.store(self.tables[bits] + 8 * r, buffers[r], Int64)
        self.errs = [mem.alloc(4 * len(ERROR_FIELDS) * ERROR_RECORDS) for _ in range(world)]
        most = world * max(max(sizes) for _, sizes in self.calls)  # a reduce-scatter's input, an all-gather's output
        self.src = [mem.alloc(4 * most) for _ in range(world)]
        self.out = [mem.alloc(4 * most) for _ in range(world)]
        self.records: list[list] = [[] for _ in range(world)]  # (call, record, status)
        self.results: list[list] = [[] for _ in range(world)]  # each call's output words
        for r in range(world):
            sim.spawn(lambda r=r: self._host(r), Context(rank=r))
        sim.run()

    def _host(self, r: int) -> None:
        sim, mem = self.sim, self.sim.memory
        for c, (collectives, sizes) in enumerate(self.calls):
            collective, n = collectives[r], sizes[r]
            kernel = self.kernels[collective][r]
            element = CARRIER[getattr(kernel, "bits", 32)]
            for i in range(n * (self.world if collective == "reduce_scatter" else 1)):
                mem.store(self.src[r] + element.width // 8 * i, self.word(c, r, i), element)
            args = types.SimpleNamespace(
                data_table=Int64(self.tables[getattr(kernel, "bits", 32)]), data_mc=Int64(0), out=Int64(self.out[r]),
                src=Int64(self.src[r]),
                n=Int64(n), pad_table=Int64(self.pad_table), pad_mc=Int64(0), pad=Int64(self.pads[r]),
                err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(self.timeout))
            blocks = getattr(kernel, "grid", BLOCKS)
            sim.launch(lambda: kernel.kernel(args), Context(rank=r, call=c), blocks, THREADS,
                       [self.rng.choice([0, 0, 300]) for _ in range(blocks)])
            outs = n * (self.world if collective == "all_gather" else 1)
            self.results[r].append(mem.words(self.out[r], outs, element))
            self.records[r] += [(c, index, status) for index, (status, *_) in
                                mem.take_records(self.errs[r], ERROR_RECORDS, len(ERROR_FIELDS))]

    @staticmethod
    def word(c: int, r: int, i: int) -> int:
        return 1000 * (c + 1) + 100 * r + i

    def expected(self, c: int, rank: int) -> list[int]:
        """Rank ``rank``'s output of call ``c`` (every rank called the same collective)."""
        (collective, *_), (n, *_) = self.calls[c]
        ranks = range(self.world)
        if collective == "all_gather":
            return [self.word(c, q, i) for q in ranks for i in range(n)]
        first = rank * n if collective == "reduce_scatter" else 0
        plus_zero = lambda w: 0 if w == NEGATIVE_ZERO else w  # noqa: E731  (what the kernel sends)
        return [sum(plus_zero(self.word(c, q, first + i)) for q in ranks) % (1 << 32) for i in range(n)]


def agreeing_calls_are_summed_and_a_mismatch_is_cleaned_up(source: types.ModuleType) -> None:
    """Call 2's sizes differ (4 and 8 elements); its buffer (2) is used again by call 5, after
    call 4 emptied it: every other call sums its inputs, call 2 is a size mismatch on both."""
    calls = [[8, 8]] * 2 + [[4, 8]] + [[8, 8]] * 4
    for seed in range(3):
        world = World(2, calls, seed, source)
        for r in range(2):
            assert world.records[r] == [(2, RECOVERABLE_RECORD, SIZE_MISMATCH)], world.records
            for c in range(len(calls)):
                if c != 2:
                    assert world.results[r][c] == world.expected(c, r), (r, c)


def negative_zeros_are_sent_as_positive_zeros(source: types.ModuleType) -> None:
    """Inputs holding -0.0 (the empty slot's bits) in whole vectors and in the tail: each is
    sent as +0.0, so no receiver takes it for a slot not yet written (issue 48 item 7)."""
    def word(c, r, i):
        return NEGATIVE_ZERO if (i + r + c) % 3 == 0 else 1000 * (c + 1) + 100 * r + i

    for seed in range(2):
        world = World(2, [[6, 6], [8, 8]], seed, source, word=word)
        assert world.records == [[], []], world.records
        for r in range(2):
            for c in range(2):
                assert world.results[r][c] == world.expected(c, r), (r, c)


def test_negative_zeros_are_sent_as_positive_zeros() -> None:
    negative_zeros_are_sent_as_positive_zeros(SOURCE)


def test_a_negative_zero_sent_as_is_fails_the_check() -> None:
    """The edit the review found passing every CPU test: the input sent without making it canonical."""
    with pytest.raises(AssertionError):
        negative_zeros_are_sent_as_positive_zeros(kernels((
            ("            words[i] = lamport.canonical(words[i], self.bits)",
             "            words[i] = words[i]"),)))


def test_agreeing_calls_are_summed_and_a_mismatch_is_cleaned_up() -> None:
    agreeing_calls_are_summed_and_a_mismatch_is_cleaned_up(SOURCE)


def test_the_simulated_copy_leaves_the_registry_alone() -> None:
    from collectives.algorithms import lamport

    assert type(REGISTRY["all_reduce", "lamport"]) is lamport.Lamport


MUTATIONS = {
    "no dirty mark": ("                ptxops.st(dirty + buffer, Uint32(lamport_tag(lamport_cleanup_call(call))), sem=\"relaxed\", "
                      "scope=\"gpu\")\n", "                pass\n"),
    "no clean-up of a dirty buffer": ("            if ptxops.ld(dirty + stale, dtype=Uint32) == Uint32(lamport_tag(call)):",
                                      "            if ptxops.ld(dirty + stale, dtype=Uint32) == Uint32(0xFFFFFFFF):"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_of_the_clean_up_fails(name: str) -> None:
    with pytest.raises(AssertionError):
        agreeing_calls_are_summed_and_a_mismatch_is_cleaned_up(kernels((MUTATIONS[name],)))


# -- an empty rank against ranks running Lamport (issue 48 item 4) ----------------------------------


class EmptyRank:
    """What an empty rank launches where its peers' ``auto`` picks Lamport: the bare barrier of
    size 0 (:func:`collectives.api._launch`), the design kernel of ``source``'s signals, one block."""

    grid = 1

    def __init__(self, world: int, source: types.ModuleType, edits: tuple = ()) -> None:
        design = load("collectives.algorithms.design", {
            **FAKES, "collectives.device": types.SimpleNamespace(signals=source.signals, reduce=None)}, edits)
        key = KernelKey("barrier", "one_shot", "peer", "f32", world, threads=BARRIER_THREADS)  # Barrier.plan's
        self.barrier = design.kernel(key, design.Blocks(key), stage=None)
        self.kinds = signature("barrier", "bf16", "sum", Call.bare("barrier", "peer", key.world).kinds)

    def kernel(self, args: types.SimpleNamespace) -> None:
        self.barrier(types.SimpleNamespace(**{**vars(args), "n": Int64(0), "kinds": Int32(self.kinds)}))


def assert_mismatches_then_sums(world: World, world_size: int, seed: int, mismatched: dict, checked: int) -> None:
    """Every rank recorded a size mismatch at exactly the calls of ``mismatched`` (recoverable),
    and its results of the other calls below ``checked`` are the expected sums."""
    for r in range(world_size):
        assert world.records[r] == [(c, RECOVERABLE_RECORD, SIZE_MISMATCH) for c in mismatched], (
            world_size, seed, world.records)
        for c in range(checked):
            if c not in mismatched:
                assert world.results[r][c] == world.expected(c, r), (world_size, seed, r, c)


def pad_words(world: World, words: list[int]) -> set[tuple[int, ...]]:
    """The distinct tuples of the signal pads' 32-bit ``words`` (word indices) over the ranks."""
    return {tuple(world.sim.memory.load(pad + 4 * w, Uint32).v for w in words) for pad in world.pads}


def an_empty_rank_among_lamport_ranks(source: types.ModuleType, design_edits: tuple = ()) -> None:
    """At call 1 rank 0 is empty (it launches the barrier of size 0) and at call 5 rank W - 1 is,
    where the other ranks all-reduce 40 elements with Lamport (three parts: a part of another
    block waits too): each such call is a size mismatch on every rank, never a timeout; the
    collective call counts and the Lamport counts stay equal, so the Lamport calls after sum
    their inputs (calls 4 and 8 use the buffer that the empty rank's peers wrote into, emptied
    at calls 3 and 7) and a barrier of every rank passes."""
    n = 40
    for world_size, seed in ((2, 0), (2, 1), (3, 2)):
        last = world_size - 1
        empty_at = {1: 0, 5: last}
        calls = [(["all_reduce"] * world_size if c not in empty_at else
                  ["barrier" if r == empty_at[c] else "all_reduce" for r in range(world_size)],
                  [0 if empty_at.get(c) == r else n for r in range(world_size)]) for c in range(9)]
        calls.append((["barrier"] * world_size, [0] * world_size))
        world = World(world_size, calls, seed, source, slot=4 * n, timeout=12000,
                      kernels={"all_reduce": source.LamportKernel,
                               "barrier": EmptyRank(world_size, source, design_edits)})
        assert_mismatches_then_sums(world, world_size, seed, empty_at, len(calls) - 1)
        layout = PadLayout(world=world_size)
        words = [layout.calls] + [layout.lamport_step(2, part) for part in range(PARTS)]
        counts = pad_words(world, words)
        assert counts == {(len(calls) * CALL_EPOCHS, *[len(calls) - 1] * PARTS)}, counts


def test_an_empty_rank_among_lamport_ranks_is_a_size_mismatch_on_every_rank_and_the_counts_stay_equal() -> None:
    an_empty_rank_among_lamport_ranks(SOURCE)


def lamport_of_another_width_among_lamport_ranks(source: types.ModuleType) -> None:
    """Ranks whose dtypes differ (so ``auto`` gives them Lamport kernels of different element
    widths): at call 1 rank 0 runs the Lamport kernel of 2-byte elements where the others run
    the f32 one, at call 4 the last rank does: each a size mismatch on every rank, never a
    timeout, and every rank's call count and Lamport counts of both widths stay equal, so the f32
    calls after sum their inputs (calls 3 and 6 use the buffers the mismatches left dirty) and
    the 2-byte calls after pass."""
    n = 40
    for world_size, seed in ((2, 0), (3, 1)):
        bf16 = source.LamportKernel(KernelKey("all_reduce", "lamport", "peer", "bf16", world_size, threads=256))
        other = {1: 0, 4: world_size - 1}
        calls = [(["bf16" if other.get(c) == r else "all_reduce" for r in range(world_size)], [n] * world_size)
                 for c in range(8)]
        calls += [(["bf16"] * world_size, [n] * world_size), (["barrier"] * world_size, [0] * world_size)]
        world = World(world_size, calls, seed, source, slot=4 * n, timeout=12000,
                      kernels={"all_reduce": source.LamportKernel, "bf16": bf16,
                               "barrier": EmptyRank(world_size, source)})
        assert_mismatches_then_sums(world, world_size, seed, other, 8)
        layout = PadLayout(world=world_size)
        words = [layout.calls] + [layout.lamport_step(w, part) for w in (1, 2) for part in range(PARTS)]
        counts = pad_words(world, words)
        assert len(counts) == 1, counts


def test_lamport_of_another_width_is_a_size_mismatch_on_every_rank_and_the_counts_stay_equal() -> None:
    lamport_of_another_width_among_lamport_ranks(SOURCE)


class Barriered:
    """What a rank whose size made ``auto`` choose a barriered algorithm launches where its peers'
    picked Lamport: the one-shot f32 all-reduce of the design kernel (``source``'s signals; its
    data phase not simulated, as in :mod:`test_barrier_source`) on ``grid`` blocks."""

    def __init__(self, world: int, source: types.ModuleType, grid: int = 2) -> None:
        design = load("collectives.algorithms.design", {
            **FAKES, "collectives.device": types.SimpleNamespace(signals=source.signals, reduce=None)})
        key = KernelKey("all_reduce", "one_shot", "peer", "f32", world, end_barrier=True)
        self.body = design.kernel(key, design.Blocks(key), lambda *a: None, move=lambda *a: None)
        self.grid = grid
        self.kinds = signature("all_reduce", "f32", "sum", 0b111)

    def kernel(self, args: types.SimpleNamespace) -> None:
        self.body(types.SimpleNamespace(**{**vars(args), "kinds": Int32(self.kinds)}))


def a_barriered_rank_among_lamport_ranks(source: types.ModuleType) -> None:
    """Ranks whose sizes differ so that ``auto`` picks a barriered all-reduce on one and Lamport
    on the others: at call 1 rank 0 runs the one-shot kernel (two blocks: a block other than 0
    fails too) on 400 elements where the others all-reduce 40 with f32 Lamport, at call 4 the
    last rank does: each a size mismatch on every rank, never a timeout, and every rank's call
    count and f32 Lamport count stay equal, so the Lamport calls after (calls 3 and 6 on the
    buffers the mismatches left dirty) sum their inputs and a barrier of every rank passes."""
    n = 40
    for world_size, seed in ((2, 0), (3, 1)):
        other = {1: 0, 4: world_size - 1}
        calls = [(["one_shot" if other.get(c) == r else "all_reduce" for r in range(world_size)],
                  [10 * n if other.get(c) == r else n for r in range(world_size)]) for c in range(8)]
        calls.append((["barrier"] * world_size, [0] * world_size))
        world = World(world_size, calls, seed, source, slot=4 * n, timeout=12000,
                      kernels={"all_reduce": source.LamportKernel, "one_shot": Barriered(world_size, source),
                               "barrier": EmptyRank(world_size, source)})
        assert_mismatches_then_sums(world, world_size, seed, other, 8)
        layout = PadLayout(world=world_size)
        words = [layout.calls] + [layout.lamport_step(2, part) for part in range(PARTS)]
        counts = pad_words(world, words)
        assert counts == {(len(calls) * CALL_EPOCHS, *[len(calls) - 1] * PARTS)}, counts


def test_a_barriered_rank_among_lamport_ranks_is_a_size_mismatch_and_the_counts_stay_equal() -> None:
    a_barriered_rank_among_lamport_ranks(SOURCE)


def test_a_barriered_kernel_that_moves_no_lamport_count_fails() -> None:
    """The gap as it was: a barriered kernel whose start failed leaves its Lamport counts as they were."""
    with pytest.raises(AssertionError):
        a_barriered_rank_among_lamport_ranks(kernels(signal_edits=((
            "        ran = Uint32(0)  # bit w: some rank ran width w\n",
            "        ran = Uint32(0)  # bit w: some rank ran width w\n        return\n"),)))


#: Edits that leave a Lamport count behind where ranks' kernels were of different widths, each caught.
WIDTH_MUTATIONS = {
    "a Lamport kernel that does not move another width's count": ("collectives.algorithms.lamport", (
        "                signals.lamport_missed_any(args.pad, calls, self.world, own=self.width)\n", "")),
    "a scan that moves the kernel's own width too": ("collectives.device.signals", (
        "            if cutlass.const_expr(width != own):", "            if cutlass.const_expr(True):")),
}


@pytest.mark.parametrize("name", WIDTH_MUTATIONS)
def test_each_mutation_of_the_width_protocol_fails(name: str) -> None:
    module, edit = WIDTH_MUTATIONS[name]
    source = kernels((edit,) if module == "collectives.algorithms.lamport" else (),
                     (edit,) if module == "collectives.device.signals" else ())
    with pytest.raises(AssertionError):
        lamport_of_another_width_among_lamport_ranks(source)


#: Edits of the Lamport kernel and the barrier that break issue 48 item 4, each caught.
EMPTY_RANK_MUTATIONS = {
    "no arrival of a Lamport kernel": ("collectives.algorithms.lamport", (
        "                ptxops.st(signals.arrival_word(peer, calls, Int32(0), rank, self.world), self.arrival(calls, n),\n"
        "                          sem=\"relaxed\", scope=\"sys\")\n", "")),
    "no watch of the ranks' arrival": ("collectives.algorithms.lamport", (
        "                if block == 0:\n                    word =", "                if block < 0:\n                    word =")),
    "no watch of part 0's failure": ("collectives.algorithms.lamport", (
        "                    left = Int32(-1)", "                    left = Int32(0)")),
    "part 0's failure polled by weak loads (a stale L1 line)": ("collectives.algorithms.lamport", (
        "ptxops.ld(failed, sem=\"relaxed\", scope=\"gpu\", dtype=Uint32)", "ptxops.ld(failed, dtype=Uint32)")),
    "a Lamport kernel that does not count the call": ("collectives.algorithms.lamport", (
        "            ptxops.st(count, calls + Uint32(CALL_EPOCHS))", "            pass")),
    "no Lamport count moved on by the barrier": ("collectives.algorithms.design", (
        "            if not ok:\n                signals.lamport_missed", "            if False:\n                signals.lamport_missed")),
    "no dirty mark by the barrier": ("collectives.device.signals", (
        "    ptxops.st(words + (layout.lamport_dirty(width, 0) + Int32(lamport_buffer(call))),\n"
        "              Uint32(lamport_tag(lamport_cleanup_call(call))))\n", "")),
}


@pytest.mark.parametrize("name", EMPTY_RANK_MUTATIONS)
def test_each_mutation_of_the_empty_rank_protocol_fails(name: str) -> None:
    module, edit = EMPTY_RANK_MUTATIONS[name]
    lamport_edits = (edit,) if module == "collectives.algorithms.lamport" else ()
    signal_edits = (edit,) if module == "collectives.device.signals" else ()
    design_edits = (edit,) if module == "collectives.algorithms.design" else ()
    with pytest.raises(AssertionError):
        an_empty_rank_among_lamport_ranks(kernels(lamport_edits, signal_edits), design_edits)


# -- a size mismatch's mark across the wrap of the count ---------------------------------------------

#: The wrap of the Lamport count in :func:`wrapping_at` (``LAMPORT_CALLS`` scaled down: a multiple of 3).
SHORT_WRAP = 9


def wrapping_at(calls: int, edits: tuple = ()) -> types.ModuleType:
    """The simulated ``collectives.algorithms.lamport`` whose counts wrap at ``calls`` instead of
    :data:`~collectives.config.LAMPORT_CALLS` (its ``lamport_next`` and ``lamport_cleanup_call``,
    and its signals' own)."""
    module = kernels(edits)

    def following(call):
        return (call + type(call)(1)) % type(call)(calls)

    for namespace in (module, module.signals):
        namespace.lamport_next = following
        namespace.lamport_cleanup_call = lambda call: following(following(call))
    return module


def a_mismatch_leaves_no_mark_for_the_count_after_the_wrap(source: types.ModuleType) -> None:
    """Call 1 (count 1) is a size mismatch: it marks its buffer dirty with the tag of its clean-up
    call (count 3), which empties the buffer.  The count wraps after :data:`SHORT_WRAP` calls and
    comes back to 1 at call 10: that call must sum its inputs in every part.  (Before the fix the
    mark outlived its clean-up: a part other than part 0 that polled for a size entry there took
    it for part 0's verdict of a mismatch in this call and delivered nothing, with no error; on
    GPUs, the soak at W = 6 after the test hook had moved the counts back: every part of blocks
    1 to 8 of a 512 KB all-reduce left its output unwritten.)  40 elements: parts 0 to 2 hold
    vectors, block 1 runs parts 1 and 3."""
    n = 40
    calls = [[n, n]] + [[n, n + 8]] + [[n, n]] * (SHORT_WRAP + 4)
    for seed in range(4):
        world = World(2, calls, seed, source, slot=4 * (n + 8), timeout=12000)
        assert_mismatches_then_sums(world, 2, seed, {1: None}, len(calls))


def test_a_mismatch_leaves_no_mark_for_the_count_after_the_wrap() -> None:
    a_mismatch_leaves_no_mark_for_the_count_after_the_wrap(wrapping_at(SHORT_WRAP))


def test_a_mark_left_standing_after_its_clean_up_fails_the_wrap_check() -> None:
    """The kernel before the fix: the clean-up emptied the buffer and left the mark."""
    with pytest.raises(AssertionError):
        a_mismatch_leaves_no_mark_for_the_count_after_the_wrap(wrapping_at(SHORT_WRAP, (
            ("                    ptxops.st(dirty + stale, Uint32(0))", "                    pass"),)))
