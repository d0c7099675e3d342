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
from collectives.config import LAMPORT_BUFFERS  # noqa: E402
from collectives.device.lamport import negative_zero  # noqa: E402
from collectives.layouts import ERROR_FIELDS, ERROR_RECORDS, RECOVERABLE_RECORD, SIZE_MISMATCH, PadLayout  # noqa: E402

FAKES = fakes()
Int32, Int64, Uint32 = FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint32
THREADS, SLOT, PARTS, BLOCKS = 4, 64, 4, 2
NEGATIVE_ZERO = negative_zero(32, 32)  # an f32 -0.0's bits


def combine(a: list, b: list, op: str) -> list:
    return [Uint32(x + y) for x, y in zip(a, b)]


def kernels(edits: tuple = ()) -> types.ModuleType:
    """The simulated ``collectives.algorithms.lamport`` (``edits``: its source edits)."""
    signals = load("collectives.device.signals", FAKES)
    device_lamport = load("collectives.device.lamport", {**FAKES, "collectives.device.signals": signals})
    reduce = types.SimpleNamespace(convert=lambda values, dtype: values, combine=combine)
    registered = dict(REGISTRY)  # the copy's Lamport class registers itself: put the real one back
    try:
        module = load("collectives.algorithms.lamport", {
            **FAKES,
            "collectives.device": types.SimpleNamespace(lamport=device_lamport, reduce=reduce, signals=signals),
        }, edits)
        module.LAMPORT_BLOCKS = PARTS  # the kernel reads its count of parts from its module
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
                 kernels: dict | None = None, word: types.FunctionType | None = None) -> None:
        """``word(c, r, i)``: rank ``r``'s input word ``i`` of call ``c`` (default: :meth:`word`)."""
        self.world = world
        self.calls = [call if isinstance(call, tuple) else (["all_reduce"] * world, call) for call in calls]
        if word is not None:
            self.word = word
        self.sim = sim = Sim(seed, speed={0: 8})  # rank 0 fast: it reads before rank 1's data lands
        self.rng = random.Random(seed)
        mem = sim.memory
        self.kernels = {}
        for collective, kernel in (kernels or {"all_reduce": source.LamportKernel}).items():
            self.kernels[collective] = kernel(KernelKey(collective, "lamport", "peer", "f32", world, threads=256))
            self.kernels[collective].threads, self.kernels[collective].slot = THREADS, SLOT
        layout = PadLayout(world=world)
        self.pads = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.buffers = [mem.alloc(LAMPORT_BUFFERS * world * SLOT) for _ in range(world)]
        empty = negative_zero(32, 32)
        for buffer in self.buffers:
            for i in range(0, LAMPORT_BUFFERS * world * SLOT, 4):
                mem.store(buffer + i, empty, Uint32)
        self.pad_table, self.data_table = mem.alloc(8 * world), mem.alloc(8 * world)
        for r in range(world):
            mem.store(self.pad_table + 8 * r, self.pads[r], Int64)
            mem.store(self.data_table + 8 * r, self.buffers[r], Int64)
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
            for i in range(n * (self.world if collective == "reduce_scatter" else 1)):
                mem.store(self.src[r] + 4 * i, self.word(c, r, i), Uint32)
            args = types.SimpleNamespace(
                data_table=Int64(self.data_table), data_mc=Int64(0), out=Int64(self.out[r]), src=Int64(self.src[r]),
                n=Int64(n), pad_table=Int64(self.pad_table), pad_mc=Int64(0), pad=Int64(self.pads[r]),
                err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(3000))
            kernel = self.kernels[collective]
            sim.launch(lambda: kernel.kernel(args), Context(rank=r, call=c), BLOCKS, THREADS,
                       [self.rng.choice([0, 0, 300]) for _ in range(BLOCKS)])
            outs = n * (self.world if collective == "all_gather" else 1)
            self.results[r].append(mem.words(self.out[r], outs, Uint32))
            for index in range(ERROR_RECORDS):
                at = self.errs[r] + 4 * len(ERROR_FIELDS) * index
                status = mem.load(at, Int32).v
                if status:
                    self.records[r].append((c, index, status))
                for i in range(len(ERROR_FIELDS)):
                    mem.store(at + 4 * i, 0, Int32)

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
    "no dirty mark": ("                ptxops.st(dirty + buffer, Uint32(lamport_tag(lamport_cleanup_call(call))))\n",
                      "                pass\n"),
    "no clean-up of a dirty buffer": ("            if ptxops.ld(dirty + stale, dtype=Uint32) == Uint32(lamport_tag(call)):",
                                      "            if ptxops.ld(dirty + stale, dtype=Uint32) == Uint32(0xFFFFFFFF):"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_of_the_clean_up_fails(name: str) -> None:
    with pytest.raises(AssertionError):
        agreeing_calls_are_summed_and_a_mismatch_is_cleaned_up(kernels((MUTATIONS[name],)))
