"""The all-to-all's send/receive slots (pure Python, no GPU, no torch, no CuTeDSL).

:class:`Model` restates what every block of the all-to-all kernel
(:mod:`collectives.algorithms.all_to_all`) does with the slot regions: block ``(d, j)`` of rank
``r`` posts ``ready`` to rank ``r - d`` (``j = 0``), waits for rank ``r + d``'s ``ready``,
stores its part of the chunk into that rank's receive buffer and posts ``arrived``, then waits
for its part's ``arrived`` from rank ``r - d`` and copies it out.  The words, their epochs,
the judging of a wait, the chunks' offsets and sizes and the parts come from
:mod:`collectives.layouts` (the module under test), so the model crosses the 2^31 and 2^32
boundaries as the kernel does.  Ranks run consecutive calls (a rank's next kernel starts when
all its blocks finished) in random interleavings; a wait no step can satisfy times out.

The model checks that a receiver only copies out (and a ``direct`` receiver's output only
holds) the part that its sender wrote in the same call, that a wait passes only on a pair
whose sizes agree, that a pair whose sizes differ (or that a rank refuses) fails on both ends
with a size mismatch and never a timeout while the pairs that agree complete, and that every
rank's call count stays equal.  Mutations show it failing: epochs compared as signed or as
unsigned integers (not wrap-safe), sizes taken apart with a sign extension, a sender that does
not wait for ``ready``.
"""

from __future__ import annotations

import random

import pytest

from collectives import layouts as exchange
from collectives.config import CALL_EPOCHS
from collectives.layouts import (
    ARRIVED_WAIT,
    MAX_CHUNK,
    PLACE_MISMATCH,
    READY_WAIT,
    REFUSED,
    SIZE_MISMATCH,
    TIMEOUT,
    ExchangeLayout,
    chunk,
    judge,
    pack,
    part,
    place,
    unplace,
)

U32 = 1 << 32
VEC = 8  # elements per 16-byte vector of a 16-bit dtype


class Hazard(AssertionError):
    pass


class Model:
    """``world`` ranks running ``calls`` of the all-to-all with ``parts`` blocks per pair.  A
    call is, per rank, ``(in_splits, out_splits, in_n, out_n)`` and optionally the number of
    the allocation it receives into (default 0).  ``seed``: the count every
    rank starts at (and the epoch of every slot word, as the runtime's test hook seeds them).
    ``direct``: the output is the receive buffer (no copy-out)."""

    def __init__(self, world: int, parts: int, calls: list, seed: int = 0, direct: bool = False,
                 mutation: str = "") -> None:
        self.world, self.parts, self.calls, self.seed = world, parts, calls, seed % U32
        self.direct, self.mutation = direct, mutation
        self.layout = ExchangeLayout(world, parts)
        self.regions: list[dict] = [dict() for _ in range(world)]
        self.counts = [self.seed] * world
        self.writes: list[list] = [[] for _ in range(world)]  # each receive buffer's stores: (lo, hi, label)
        self.records: list[list] = [[] for _ in range(world)]  # (call, status, phase, peer)
        self.blocks: list[list] = [[] for _ in range(world)]
        self.ranks = [self._rank(r) for r in range(world)]
        self.done = [False] * world
        self.delivered: dict = {}  # (rank, call) -> the parts a direct receiver's output holds

    def word(self, r: int, index: int) -> int:
        return self.regions[r].get(index, pack(0, self.seed))

    # -- one rank: its calls, each a kernel of world x parts blocks ---------------------------

    def _rank(self, r: int):
        for c in range(len(self.calls)):
            calls = self.counts[r]
            self.blocks[r] = [[self._block(r, c, calls, d, j), None] for d in range(self.world)
                              for j in range(self.parts)]
            for entry in self.blocks[r]:
                entry[1] = next(entry[0])
            yield  # the kernel runs until all its blocks finished
            if self.direct:  # the output holds every part that arrived, as the sender wrote it
                for lo, hi, label in self.delivered.pop((r, c), []):
                    self._check(r, lo, hi, label)
            self.counts[r] = (calls + CALL_EPOCHS) % U32
        self.done[r] = True

    def _spec(self, r: int, c: int) -> tuple:
        return self.calls[c][r][:4]

    def _allocation(self, r: int, c: int) -> int:
        return (self.calls[c][r] + (0,))[4]

    def _check(self, r: int, lo: int, hi: int, label: tuple) -> None:
        """Rank r's receive buffer holds [lo, hi) as stored by ``label``'s sender and part."""
        if lo == hi:
            return
        last = [w for w in self.writes[r] if w[0] < hi and lo < w[1]]
        if not last or last[-1] != (lo, hi, label):
            raise Hazard(f"rank {r} reads [{lo}, {hi}) of {label}, but its last stores there are {last[-3:]}")

    def _block(self, r: int, c: int, calls: int, d: int, j: int):
        w, layout = self.world, self.layout
        receiver, sender = (r + d) % w, (r - d) % w
        ins, outs, in_n, out_n = self._spec(r, c)
        epoch = (calls + 1) % U32
        send_at, send_n, send_size = chunk(ins, receiver, in_n)
        recv_at, recv_n, recv_size = chunk(outs, sender, out_n)
        if d == 0:
            if not (send_size == recv_size != REFUSED) and j == 0:
                self.records[r].append((c, SIZE_MISMATCH, READY_WAIT, r))
            yield None
            return
        if j == 0:  # the offset, then ready with a release (one step: the release carries the offset)
            self.regions[sender][layout.offset(r)] = place(self._allocation(r, c), recv_at)
            self.regions[sender][layout.ready(r)] = pack(recv_size, epoch)
            yield ("step",)
        if self.mutation == "no ready wait":
            word = pack(send_size, epoch)
        else:
            word = yield ("wait", r, layout.ready(receiver), epoch)
        status = judge(word, calls, send_size)
        allocation, offset = unplace(self.regions[r].get(layout.offset(receiver), 0))
        if status != 0:
            self.records[r].append((c, status, READY_WAIT, receiver))
        elif allocation != self._allocation(r, c):
            status = SIZE_MISMATCH
            self.records[r].append((c, status, PLACE_MISMATCH, receiver))
        if status == 0:
            theirs = chunk(self._spec(receiver, c)[1], r, self._spec(receiver, c)[3])
            if theirs[2] != send_size or self._allocation(receiver, c) != allocation:
                raise Hazard(f"rank {r} call {c} sends to {receiver} on a ready of another size or allocation")
            b, e = part(send_n, self.parts, j, VEC)
            self.writes[receiver].append((offset + b, offset + e, (r, c, b)))
            yield ("step",)
        if status != TIMEOUT:
            sent = send_size if status == 0 or self.mutation == "announce unsent" else REFUSED
            self.regions[receiver][layout.arrived(r, j)] = pack(sent, epoch)
            yield ("step",)
        word = yield ("wait", r, layout.arrived(sender, j), epoch)
        status = judge(word, calls, recv_size)
        if status == 0:
            if chunk(self._spec(sender, c)[0], r, self._spec(sender, c)[2])[2] != recv_size:
                raise Hazard(f"rank {r} call {c} receives from {sender} a chunk of another size")
            if self._allocation(sender, c) != self._allocation(r, c):
                raise Hazard(f"rank {r} call {c} passes on a chunk {sender} could not address")
            b, e = part(recv_n, self.parts, j, VEC)
            label = (recv_at + b, recv_at + e, (sender, c, b))
            if self.direct:
                self.delivered.setdefault((r, c), []).append(label)
            else:
                self._check(r, *label)
        else:
            self.records[r].append((c, status, ARRIVED_WAIT, sender))
        yield None

    # -- scheduling ------------------------------------------------------------------------

    def _ready(self, step: tuple) -> bool:
        _, r, index, want = step
        return exchange.reached(exchange.unpack(self.word(r, index))[1], want)

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        for rank in self.ranks:
            next(rank, None)
        while not all(self.done):
            live = [(r, i) for r in range(self.world) for i, (_, s) in enumerate(self.blocks[r]) if s is not None]
            ready = [(r, i) for r, i in live if self.blocks[r][i][1][0] == "step" or self._ready(self.blocks[r][i][1])]
            if ready:
                self._advance(*rng.choice(ready))
            else:  # every block left waits for a word no step will write: a deadline passes
                if not live:
                    raise Hazard("no block can move")
                self._advance(*rng.choice(live))

    def _advance(self, r: int, i: int) -> None:
        entry = self.blocks[r][i]
        step = entry[1]
        entry[1] = entry[0].send(self.word(r, step[2]) if step[0] == "wait" else None)
        if all(s is None for _, s in self.blocks[r]):
            next(self.ranks[r], None)


def agreed_calls(world: int, count: int, rng: random.Random, big: bool = False) -> list:
    """``count`` calls whose splits agree: a matrix ``m[s][r]`` of chunk sizes per call."""
    calls = []
    for _ in range(count):
        pick = (lambda: rng.choice([0, 1, 7, 8, 9, 33, 1 << 31, MAX_CHUNK])) if big else (lambda: rng.randrange(40))
        m = [[pick() for _ in range(world)] for _ in range(world)]
        calls.append([(m[s], [m[q][s] for q in range(world)], sum(m[s]), sum(m[q][s] for q in range(world)))
                      for s in range(world)])
    return calls


SEEDS = [0, (1 << 31) - 2 * CALL_EPOCHS, U32 - 2 * CALL_EPOCHS]


def assert_clean(model: Model) -> None:
    assert model.records == [[] for _ in range(model.world)]
    assert len(set(model.counts)) == 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize(("world", "parts"), [(2, 1), (3, 2), (4, 3)])
def test_agreed_calls_deliver_every_part_across_the_wraps(seed: int, direct: bool, world: int, parts: int) -> None:
    for run in range(4):
        rng = random.Random(run)
        model = Model(world, parts, agreed_calls(world, 5, rng), seed=seed, direct=direct)
        model.run(run)
        assert_clean(model)
        assert model.counts[0] == (seed + 5 * CALL_EPOCHS) % U32


@pytest.mark.parametrize("seed", SEEDS)
def test_sizes_at_and_above_2_31_compare_unsigned(seed: int) -> None:
    model = Model(3, 2, agreed_calls(3, 4, random.Random(1), big=True), seed=seed)
    model.run(1)
    assert_clean(model)


def test_a_mismatched_pair_fails_on_both_ends_without_a_timeout_and_the_rest_completes() -> None:
    """Call 1: rank 0 sends 5 elements to rank 1, which expects 4; every other pair agrees."""
    world, parts = 3, 2
    calls = agreed_calls(world, 3, random.Random(2))
    ins, outs, in_n, out_n = calls[1][0]
    calls[1][0] = ([ins[0], ins[1] + 1, ins[2]], outs, in_n + 1, out_n)
    for run in range(6):
        model = Model(world, parts, calls)
        model.run(run)
        assert model.records[0] == [(1, SIZE_MISMATCH, READY_WAIT, 1)] * parts
        assert sorted(model.records[1]) == [(1, SIZE_MISMATCH, ARRIVED_WAIT, 0)] * parts
        assert model.records[2] == []
        assert len(set(model.counts)) == 1


@pytest.mark.parametrize("bad", ["sum past the output", "negative", "above MAX_CHUNK"])
def test_a_rank_that_refuses_fails_every_pair_of_its_own_without_a_timeout(bad: str) -> None:
    world, parts = 3, 1
    calls = agreed_calls(world, 3, random.Random(3))
    ins, outs, in_n, out_n = calls[1][2]
    if bad == "sum past the output":
        out_n = sum(outs) - 1
    elif bad == "negative":
        outs = [outs[0], -1, outs[2]]
    else:
        outs = [outs[0], MAX_CHUNK + 1, outs[2]]
    calls[1][2] = (ins, outs, in_n, out_n)
    for run in range(6):
        model = Model(world, parts, calls)
        model.run(run)
        for sender in (0, 1):  # every sender to rank 2 sees its refusal
            assert model.records[sender] == [(1, SIZE_MISMATCH, READY_WAIT, 2)]
        assert sorted(model.records[2]) == [(1, SIZE_MISMATCH, READY_WAIT, 2),
                                            (1, SIZE_MISMATCH, ARRIVED_WAIT, 0),
                                            (1, SIZE_MISMATCH, ARRIVED_WAIT, 1)]
        assert not any(status == TIMEOUT for records in model.records for _, status, _, _ in records)


def test_ranks_receiving_into_different_allocations_fail_their_pairs_without_a_timeout() -> None:
    """Call 1: rank 1 receives into allocation 7 (a symmetric out), the others into 0
    (staging): every pair of rank 1 fails on both ends, the pair of ranks 0 and 2 completes."""
    world = 3
    calls = agreed_calls(world, 3, random.Random(5))
    calls[1][1] = calls[1][1] + (7,)
    for run in range(6):
        model = Model(world, 1, calls)
        model.run(run)
        for other in (0, 2):
            assert sorted(model.records[other]) == [(1, SIZE_MISMATCH, ARRIVED_WAIT, 1),
                                                    (1, SIZE_MISMATCH, PLACE_MISMATCH, 1)]
        assert sorted(model.records[1]) == [(1, SIZE_MISMATCH, ARRIVED_WAIT, 0), (1, SIZE_MISMATCH, ARRIVED_WAIT, 2),
                                            (1, SIZE_MISMATCH, PLACE_MISMATCH, 0),
                                            (1, SIZE_MISMATCH, PLACE_MISMATCH, 2)]


def test_announcing_a_chunk_that_was_not_sent_fails() -> None:
    calls = agreed_calls(3, 2, random.Random(5))
    calls[1][1] = calls[1][1] + (7,)
    with pytest.raises(Hazard):
        Model(3, 1, calls, mutation="announce unsent").run(0)


def test_a_rank_that_never_comes_times_out_its_peers() -> None:
    """A wait no step can satisfy ends at the deadline as a timeout (the model's deadline)."""
    calls = agreed_calls(2, 1, random.Random(4))
    model = Model(2, 1, calls)
    model.ranks[1] = iter(())  # rank 1 never launches
    model.done[1] = True
    model.run(0)
    assert (0, TIMEOUT, READY_WAIT, 1) in model.records[0]


def test_judge() -> None:
    calls = U32 - CALL_EPOCHS
    want = (calls + 1) % U32
    assert judge(pack(5, want), calls, 5) == 0
    assert judge(pack(5, want), calls, 4) == SIZE_MISMATCH
    assert judge(pack(REFUSED, want), calls, REFUSED) == SIZE_MISMATCH
    assert judge(pack(1 << 31, want), calls, 1 << 31) == 0
    assert judge(pack(5, calls), calls, 5) == TIMEOUT  # the previous call's word
    assert judge(pack(5, calls + CALL_EPOCHS + 1), calls, 5) == TIMEOUT  # a rank past the call
    assert [part(17, 3, j, VEC) for j in range(3)] == [(0, 8), (8, 16), (16, 17)]
    assert [part(3, 4, j, VEC) for j in range(4)] == [(0, 3), (3, 3), (3, 3), (3, 3)]
    assert chunk([3, 4, 5], 2, 12) == (7, 5, 5) and chunk([3, 4, 5], 2, 11)[2] == REFUSED
    assert chunk([3, 4, 5], 1, 120, row=10) == (30, 40, 40) and chunk([3, 4, 5], 1, 119, row=10)[2] == REFUSED
    assert chunk([0, 0], 1, 0, row=0) == (0, 0, 0)  # empty rows: nothing to move, nothing refused
    assert unplace(place(5, (1 << 40) - 1)) == (5, (1 << 40) - 1)
    with pytest.raises(ValueError, match="offset below 2"):
        place(0, 1 << 40)


# -- mutations: the model fails ----------------------------------------------------------------


def _signed(seen: int, want: int) -> bool:
    def s32(x: int) -> int:
        return x - U32 if x % U32 >= 1 << 31 else x % U32
    return s32(seen) >= s32(want)


@pytest.mark.parametrize(("reached", "seed"), [(_signed, SEEDS[1]), (lambda seen, want: seen >= want, SEEDS[2])],
                         ids=["signed epochs across 2^31", "unsigned epochs across 2^32"])
def test_epochs_compared_without_wrap_fail(monkeypatch, reached, seed: int) -> None:
    monkeypatch.setattr(exchange, "reached", reached)
    with pytest.raises(AssertionError):
        for run in range(4):
            model = Model(3, 2, agreed_calls(3, 5, random.Random(run)), seed=seed)
            model.run(run)
            assert_clean(model)


def test_sizes_taken_apart_with_a_sign_extension_fail(monkeypatch) -> None:
    unpack = exchange.unpack

    def sign_extended(word: int) -> tuple[int, int]:  # shr.s64 kept as 64 bits
        size, epoch = unpack(word)
        return (size - U32 if size >= 1 << 31 else size), epoch

    monkeypatch.setattr(exchange, "unpack", sign_extended)
    with pytest.raises(AssertionError):
        model = Model(3, 2, agreed_calls(3, 4, random.Random(1), big=True))
        model.run(1)
        assert_clean(model)


@pytest.mark.parametrize("direct", [False, True])
def test_a_sender_that_does_not_wait_for_ready_fails(direct: bool) -> None:
    with pytest.raises(Hazard):
        for run in range(20):
            Model(3, 2, agreed_calls(3, 4, random.Random(run)), direct=direct, mutation="no ready wait").run(run)


def test_a_split_whose_element_count_wraps_64_bits_is_refused() -> None:
    """The kernel multiplies splits (rows) by the row's elements in 64 bits: a split chosen so
    that the product wraps to a small count must be refused, not moved as that count.  The
    rule judges rows (``split <= MAX_CHUNK // row``); judging the wrapped product would pass."""
    row = 7168
    split = ((1 << 64) + 8 * row - 1) // row  # split * row = 2^64 + a few rows' elements
    wrapped = (split * row) % (1 << 64)
    assert 0 <= wrapped <= MAX_CHUNK  # what a product-first rule would see: a valid-looking chunk
    assert chunk([split, 0], 0, 1 << 40, row)[2] == REFUSED
    assert chunk([1, split], 0, 1 << 40, row)[2] == REFUSED  # any bad split refuses the rank's every chunk
