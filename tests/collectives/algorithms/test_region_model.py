"""The regions' exchange (pure Python, no GPU, no torch, no CuTeDSL): the protocol a two-kernel
MoE dispatch and combine are designed on (``docs/guide-moe.md``, "What is not built yet"),
modelled before any kernel.

:class:`Model` runs ``world`` ranks through consecutive calls; a call is a sending kernel (a
block per receiver: :func:`~collectives.layouts.may_store` on its own words, its rows stored
straight into the receiver's region of the call's half, then ``facts`` and the ``arrived``
release) and, after it, a receiving kernel (a block per source: the wait for ``arrived``,
:func:`~collectives.layouts.judge_region`, the rows read).  Memory is sequentially consistent
and every store and load of a row is a step of its own, so a late sender's stores interleave
with a receiver's reads in any order the scheduler picks.  Words, offsets, seeds and judging
come from :mod:`collectives.layouts` (the module under test), and counts start anywhere,
near the 2^32 wrap included.  A wait ends when its word arrives, or times out when nothing
else can run (a stall: never expected) or when the test injects a timeout there (a slow peer,
a late host), after which the rank goes on to its next call as a rank that kept the
communicator would.

It checks that a receiver's call that passes read only its sources' rows of that very call
(else :class:`Hazard`), that agreed calls pass on every rank with no timeout at all, that a
shape that disagrees fails the pairs it touches with a size mismatch on both ends and never a
timeout, and that after injected timeouts no wrong row is ever accepted and every call after
the last one passes on every rank (a late source's stores land in a half its receiver reads
again only after that source's next release).  Mutations show it failing: one half instead of two, no
``may_store`` before the stores, ``facts`` not compared, epochs compared without the wrap.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import given, strategies as st

from collectives import layouts
from collectives.config import CALL_EPOCHS
from collectives.layouts import (
    REFUSED,
    SIZE_MISMATCH,
    TIMEOUT,
    RegionLayout,
    call_parity,
    judge_region,
    may_store,
    pack,
    reached,
    region_facts,
    unpack,
)

U32 = 1 << 32
UNIT = 16  # bytes a data cell of the model holds (a row is whole cells)


class Hazard(AssertionError):
    pass


@dataclass
class Call:
    """One rank's call: rows to each receiver, the row bytes and kind of its rows."""

    rows: list[int]
    row_bytes: int = 32
    kind: int = 1
    expect: list[int] | None = None  # a combine's rows expected from each source (None: what they send)


@dataclass
class Rank:
    data: dict[int, tuple] = field(default_factory=dict)  # byte offset -> (source, call, row, cell)
    words: dict[int, int] = field(default_factory=dict)
    status: list[int] = field(default_factory=list)  # per call: 0, SIZE_MISMATCH or TIMEOUT
    wrong: list[bool] = field(default_factory=list)  # per call: a row read that was not the call's


class Model:
    """``world`` ranks, counts from ``seed``, regions of ``region_bytes``; ``calls[n][r]`` is
    rank ``r``'s :class:`Call` ``n`` (its ``rows[d]`` go to rank ``d``).  ``inject``: the
    probability that a wait the scheduler visits unsatisfied times out (0: waits end only by
    their words, or by a stall), in a rank's first ``inject_calls`` calls.  ``expected_rows``:
    receivers know each source's rows (a combine) instead of taking what arrives (a
    dispatch).  ``halves``, ``precheck``, ``check_facts``: the mutations' switches."""

    def __init__(self, world: int, calls: list[list[Call]], seed: int = 0, region_bytes: int = 8 * UNIT,
                 rng: random.Random | None = None, inject: float = 0.0, inject_calls: int = 1 << 30,
                 expected_rows: bool = False, halves: int = 2, precheck: bool = True,
                 check_facts: bool = True) -> None:
        self.world, self.calls, self.seed = world, calls, seed
        self.layout = RegionLayout(world, region_bytes)
        self.rng = rng or random.Random(0)
        self.inject, self.inject_calls, self.expected_rows = inject, inject_calls, expected_rows
        self.halves, self.precheck, self.check_facts = halves, precheck, check_facts
        self.ranks = [Rank(words=dict(self.layout.seeded(seed))) for _ in range(world)]
        self.stalls = 0
        self.injected: list[tuple[int, int]] = []  # (rank, call index) of each injected timeout

    def half(self, count: int) -> int:
        return call_parity(count) if self.halves == 2 else 0

    def count(self, n: int) -> int:
        """Every rank's count at its call ``n``."""
        return (self.seed + n * CALL_EPOCHS) % U32

    # -- the kernels' blocks (generators: yield a predicate to wait on; receive whether it held)

    def send(self, s: int, n: int, r: int):
        """Block ``r`` of rank ``s``'s sending kernel of call ``n``."""
        lay, count, call = self.layout, self.count(n), self.calls[n][s]
        h, mine, theirs = self.half(count), self.ranks[s], self.ranks[r]
        if self.precheck:
            other = lay.arrived(self.half(count - CALL_EPOCHS), r)
            if not (yield lambda: may_store(mine.words.get(other, 0), count)):
                self.fail(s, n, TIMEOUT)
                theirs.words[lay.arrived(h, s)] = pack(REFUSED, count + 1)
                return
        rows = call.rows[r]
        if rows > lay.capacity(call.row_bytes):  # announced, nothing stored: both ends fail the pair
            self.fail(s, n, SIZE_MISMATCH)
        else:
            base = lay.region(h, s)
            for i in range(rows):
                for c in range(call.row_bytes // UNIT):
                    theirs.data[base + i * call.row_bytes + c * UNIT] = (s, n, i, c)
                    yield None
        theirs.words[lay.facts(h, s)] = region_facts(call.row_bytes, call.kind)
        yield None
        theirs.words[lay.arrived(h, s)] = pack(rows, count + 1)

    def receive(self, r: int, n: int, s: int):
        """Block ``s`` of rank ``r``'s receiving kernel of call ``n``."""
        lay, count, call = self.layout, self.count(n), self.calls[n][r]
        h, mine = self.half(count), self.ranks[r]
        word = lay.arrived(h, s)
        if not (yield lambda: reached(unpack(mine.words.get(word, 0))[1], (count + 1) % U32)):
            self.fail(r, n, TIMEOUT)
            return
        facts = region_facts(call.row_bytes, call.kind) if not self.check_facts else mine.words.get(lay.facts(h, s))
        expected = None if not self.expected_rows else call.expect[s] if call.expect else self.calls[n][s].rows[r]
        status, rows = judge_region(mine.words[word], facts, count, region_facts(call.row_bytes, call.kind),
                                    lay.capacity(call.row_bytes), expected)
        if status:
            self.fail(r, n, status)
            return
        base = lay.region(h, s)
        for i in range(rows):
            for c in range(call.row_bytes // UNIT):
                if mine.data.get(base + i * call.row_bytes + c * UNIT) != (s, n, i, c):
                    mine.wrong[n] = True
                yield None

    def fail(self, r: int, n: int, status: int) -> None:
        self.ranks[r].status[n] = max(self.ranks[r].status[n], status)

    # -- the scheduler

    def program(self, r: int):
        """Rank ``r``: each call's sending kernel, then its receiving kernel (stream order)."""
        for n in range(len(self.calls)):
            self.ranks[r].status.append(0)
            self.ranks[r].wrong.append(False)
            yield [self.send(r, n, d) for d in range(self.world)]
            yield [self.receive(r, n, s) for s in range(self.world)]
            if self.ranks[r].status[n] == 0 and self.ranks[r].wrong[n]:
                raise Hazard(f"rank {r} accepted call {n} with a row that was not the call's")

    def run(self) -> Model:
        kernels = [self.program(r) for r in range(self.world)]
        blocks: list[list] = [[[b, None] for b in next(k)] for k in kernels]  # [generator, pending wait]
        for r in range(self.world):
            for blk in blocks[r]:
                self.advance(blk, None)
        while any(blocks):
            ready = [(r, blk) for r in range(self.world) for blk in blocks[r]
                     if blk[0] is not None and (blk[1] is None or blk[1]())]
            waiting = [(r, blk) for r in range(self.world) for blk in blocks[r]
                       if blk[0] is not None and blk[1] is not None and not blk[1]()]
            slow = [(r, blk) for r, blk in waiting if len(self.ranks[r].status) <= self.inject_calls]
            if not ready:
                self.stalls += 1
                self.advance(self.rng.choice(waiting)[1], False)
            elif slow and self.rng.random() < self.inject / 8:
                r, blk = self.rng.choice(slow)
                self.injected.append((r, len(self.ranks[r].status) - 1))
                self.advance(blk, False)
            else:
                r, blk = self.rng.choice(ready)
                self.advance(blk, True if blk[1] is not None else None)
            for r in range(self.world):
                if blocks[r] and all(b[0] is None for b in blocks[r]):
                    try:
                        blocks[r] = [[b, None] for b in next(kernels[r])]
                    except StopIteration:
                        blocks[r] = []
                    for blk in blocks[r]:
                        self.advance(blk, None)
        return self

    @staticmethod
    def advance(blk: list, value) -> None:
        try:
            blk[1] = blk[0].send(value) if value is not None else next(blk[0])
        except StopIteration:
            blk[0], blk[1] = None, None


def agreed(world: int, count: int, rng: random.Random, region_rows: int = 4, **kw) -> list[list[Call]]:
    return [[Call([rng.randint(0, region_rows) for _ in range(world)], **kw) for _ in range(world)]
            for _ in range(count)]


SEEDS = [0, CALL_EPOCHS, (1 << 31) - 3 * CALL_EPOCHS, U32 - 5 * CALL_EPOCHS, U32 - 2 * CALL_EPOCHS]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("expected_rows", [False, True])
def test_agreed_calls_pass_everywhere_across_the_wrap(seed: int, world: int, expected_rows: bool) -> None:
    for trial in range(3):
        rng = random.Random(seed * 7 + world * 131 + trial)
        m = Model(world, agreed(world, 8, rng), seed, rng=rng, expected_rows=expected_rows).run()
        assert m.stalls == 0
        assert all(status == [0] * 8 for status in (rank.status for rank in m.ranks))


@pytest.mark.parametrize("what", ["row_bytes", "kind"])
def test_a_rank_whose_shape_disagrees_fails_its_pairs_with_a_size_mismatch_and_the_rest_pass(what: str) -> None:
    world, bad, at = 4, 2, 3
    for trial in range(5):
        rng = random.Random(trial)
        calls = agreed(world, 6, rng, region_rows=2)
        setattr(calls[at][bad], what, 48 if what == "row_bytes" else 2)
        m = Model(world, calls, U32 - 4 * CALL_EPOCHS, rng=rng).run()
        assert m.stalls == 0
        for r, rank in enumerate(m.ranks):
            assert rank.status == [0] * at + [SIZE_MISMATCH] + [0] * (6 - at - 1), (r, rank.status)


def test_rows_past_a_region_or_unlike_a_combines_fail_the_pair_on_both_ends_without_a_timeout() -> None:
    """A source's rows past the receiver's region (nothing stored) fail the pair on both ends;
    rows unlike those a combine's receiver expects fail it on the receiver."""
    world, fails = 3, [0, SIZE_MISMATCH, 0, 0]
    calls = agreed(world, 4, random.Random(5), region_rows=2)
    calls[1][0].rows[2] = 9  # 9 rows of 32 bytes into a region of 128
    m = Model(world, calls, 7, region_bytes=4 * 32, rng=random.Random(5)).run()
    assert m.stalls == 0
    assert [rank.status for rank in m.ranks] == [fails, [0] * 4, fails]
    calls = agreed(world, 4, random.Random(6), region_rows=2)
    calls[1][2].expect = [calls[1][s].rows[2] for s in range(world)]
    calls[1][2].expect[0] += 1
    m = Model(world, calls, 7, region_bytes=4 * 32, rng=random.Random(6), expected_rows=True).run()
    assert m.stalls == 0
    assert [rank.status for rank in m.ranks] == [[0] * 4, [0] * 4, fails]


@pytest.mark.parametrize("seed", [3 * CALL_EPOCHS, U32 - 3 * CALL_EPOCHS])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_injected_timeouts_never_accept_a_wrong_row_and_the_calls_recover(seed: int, world: int) -> None:
    calls, injected = 10, 0
    for trial in range(12):
        rng = random.Random(trial * 1000 + world)
        m = Model(world, agreed(world, calls, rng), seed, rng=rng, inject=0.5, inject_calls=5).run()
        last = max((n for _, n in m.injected), default=-1)
        injected += len(m.injected)
        for rank in m.ranks:
            assert rank.status[last + 1:] == [0] * len(rank.status[last + 1:]), (last, rank.status)
    assert injected > 0


@pytest.mark.parametrize("mutation", ["one half", "no may_store", "facts unchecked", "epochs without the wrap"])
def test_the_model_catches_each_mutation(mutation: str, monkeypatch) -> None:
    """Each mutation breaks a property the tests above hold."""
    world, caught = 3, 0
    for trial in range(40):
        rng = random.Random(trial)
        kw: dict = {}
        calls = agreed(world, 6, rng)
        seed = 11 * CALL_EPOCHS
        if mutation == "one half":
            kw["halves"] = 1
        elif mutation == "no may_store":
            kw.update(precheck=False, inject=0.6)
        elif mutation == "facts unchecked":
            kw["check_facts"] = False
            calls[2][1].row_bytes = 48
            calls[2][1].rows = [1, 2, 1]
            for r in range(world):
                calls[2][r].rows[1] = 2
        else:
            seed = U32 - 3 * CALL_EPOCHS
            monkeypatch.setattr(layouts, "reached", lambda seen, want: seen >= want)
            monkeypatch.setattr(sys.modules[__name__], "reached", lambda seen, want: seen >= want)
        try:
            m = Model(world, calls, seed, rng=rng, **kw).run()
        except Hazard:
            caught += 1
            continue
        if mutation == "epochs without the wrap" and (m.stalls or any(any(r.status) for r in m.ranks)):
            caught += 1
    assert caught >= (40 if mutation in ("facts unchecked", "epochs without the wrap") else 4), (mutation, caught)


@given(world=st.integers(1, 8), units=st.integers(1, 1 << 12))
def test_the_regions_and_words_are_disjoint_and_inside_the_allocation(world: int, units: int) -> None:
    lay = RegionLayout(world, units * UNIT)
    starts = sorted(lay.region(h, s) for h in (0, 1) for s in range(world))
    assert starts == list(range(0, lay.bytes, lay.region_bytes))
    data = [w for h in (0, 1) for s in range(world) for w in (lay.arrived(h, s), lay.facts(h, s))]
    assert len(set(data)) == len(data) and all(w % 2 == 0 and w + 2 <= lay.counter[0] for w in data)
    assert lay.counter[1] == lay.counter[0] + 1 and lay.send_tickets == lay.counter[1] + 1
    assert [lay.refused(r) for r in range(world)] == list(range(lay.send_tickets + 1, lay.words))


@given(calls=st.integers(0, U32 // CALL_EPOCHS - 1).map(lambda c: c * CALL_EPOCHS), back=st.integers(0, 3))
def test_judging_a_word_by_its_epoch_across_the_wrap(calls: int, back: int) -> None:
    facts = region_facts(64, 3)
    word = pack(2, calls + 1 - back * CALL_EPOCHS)
    assert judge_region(word, facts, calls, facts, 4) == ((0, 2) if back == 0 else (TIMEOUT, 0))
    later = pack(2, calls + CALL_EPOCHS + 1)  # a refusal's, a call later
    assert judge_region(later, facts, calls, facts, 4) == (TIMEOUT, 0)
    assert judge_region(pack(REFUSED, calls + 1), facts, calls, facts, 4) == (TIMEOUT, 0)
    assert judge_region(pack(2, calls + 1), region_facts(64, 4), calls, facts, 4) == (SIZE_MISMATCH, 0)
    assert judge_region(pack(5, calls + 1), facts, calls, facts, 4) == (SIZE_MISMATCH, 0)
    assert judge_region(pack(2, calls + 1), facts, calls, facts, 4, expected_rows=3) == (SIZE_MISMATCH, 0)
    assert may_store(pack(0, calls - CALL_EPOCHS + 1), calls) and may_store(later, calls)
    assert not may_store(pack(0, calls - 2 * CALL_EPOCHS + 1), calls)


def test_a_seeded_rank_finds_both_halves_free_and_nothing_arrived() -> None:
    for calls in (0, U32 - CALL_EPOCHS):
        lay = RegionLayout(3, 64)
        words = lay.seeded(calls)
        assert words[lay.counter[0]] == calls
        for s in range(3):
            assert may_store(words[lay.arrived(call_parity(calls - CALL_EPOCHS), s)], calls)
            assert judge_region(words[lay.arrived(call_parity(calls), s)], 0, calls, 0, 4)[0] == TIMEOUT


def test_a_layout_refuses_what_it_cannot_address() -> None:
    for world, region in [(0, 16), (9, 16), (2, 0), (2, 24)]:
        with pytest.raises(ValueError):
            RegionLayout(world, region)
    with pytest.raises(ValueError):
        region_facts(U32, 0)
    assert RegionLayout(2, 96).capacity(32) == 3 and RegionLayout(2, 96).capacity(0) == 0
