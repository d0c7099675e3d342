"""The Lamport all-reduce's rotation, tags and clean-up after a size mismatch (pure Python, no
GPU, no CuTeDSL).

:class:`Model` restates one thread block of :mod:`collectives.algorithms.lamport` per rank, step
by step, on every rank's receive buffers, size words and clean-up words, with the formulas the
kernel evaluates (:func:`~collectives.layouts.lamport_buffer`, ``lamport_next``, ``lamport_tag``,
``lamport_stale``, ``lamport_cleanup_call``).  Ranks run consecutive calls in random
interleavings (rank 0 usually first: a fast rank), each store to another rank a step of its
own (so a slow rank's data lands late).  It fails on:

- a store into a slot that still holds a value (a fast rank overwriting what a slow one reads),
- a read of a value from another call (stale or early data: silent wrong results),
- a clean-up erasing a value of a call that succeeded and is not yet read,
- a call that fails although every rank brought the same size, or succeeds although not,
- no rank able to move (a hang).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import pytest

from collectives.config import LAMPORT_BUFFERS, LAMPORT_CALLS
from collectives.layouts import lamport_buffer, lamport_cleanup_call, lamport_next, lamport_stale, lamport_tag


class Hazard(AssertionError):
    pass


@dataclass(frozen=True)
class Rule:
    """The count's arithmetic: the kernel's (:data:`REAL`) or a mutation of it."""

    buffer: Callable[[int], int] = lamport_buffer
    next: Callable[[int], int] = lamport_next
    tag: Callable[[int], int] = lamport_tag
    stale: Callable[[int], int] = lamport_stale
    cleanup_call: Callable[[int], int] = lamport_cleanup_call
    cleans: bool = True  # a mismatch marks its buffer dirty
    clears: bool = True  # the clean-up clears the mark


REAL = Rule()
#: The rule before the fix: a Uint32 count wrapping at 2^32 (no multiple of 3).
OLD_WRAP = Rule(buffer=lambda c: c % 3, next=lambda c: (c + 1) % 2**32, tag=lambda c: (c + 1) % 2**32,
                stale=lambda c: (c + 1) % 3, cleanup_call=lambda c: (c + 2) % 2**32)
#: Before the fix, no kernel emptied a buffer a mismatch left dirty.
NO_CLEANUP = Rule(cleans=False)
#: The count wrapping at 9 (``LAMPORT_CALLS`` scaled down, a multiple of 3): a mark's call comes back in 9 calls.
SHORT_WRAP = Rule(next=lambda c: (c + 1) % 9, cleanup_call=lambda c: (c + 2) % 9)
#: Before the fix, the mark outlived its clean-up (found on one H200: the soak at W = 6).
MARK_KEPT = Rule(next=SHORT_WRAP.next, cleanup_call=SHORT_WRAP.cleanup_call, clears=False)
#: Emptying it one call later instead of two: a slow rank's stores of the failed call land after.
CLEANUP_TOO_EARLY = Rule(cleanup_call=lamport_next, stale=lambda c: (c + 2) % LAMPORT_BUFFERS)


def elements(size) -> int:
    """The slot positions a size fills: ``n`` (an all-reduce's, or ``(collective, n)``), twice
    ``n`` for an all-gather (:class:`~collectives.algorithms.lamport_blocks.GatherKernel`: 8
    bytes of tagged words per 4 of data, in the same slots)."""
    if not isinstance(size, tuple):
        return size
    return size[1] * (2 if size[0] == "all_gather" else 1)


class Model:
    """``sizes[g][r]``: the elements rank ``r`` brings to call ``g`` (an all-reduce), or
    ``(collective, elements)`` (:mod:`collectives.algorithms.lamport_blocks`: the same stores
    and waits, its code in the size entry); every count starts at ``start``."""

    def __init__(self, world: int, sizes: list[list[int]], start: int, rule: Rule = REAL) -> None:
        self.world, self.sizes, self.rule = world, sizes, rule
        most = max(max(elements(n) for n in s) for s in sizes)
        # data[r][b][q][i]: (call, sender) or None (empty, -0.0); size[r][b][q]: (tag, size)
        self.data = [[[[None] * most for _ in range(world)] for _ in range(LAMPORT_BUFFERS)] for _ in range(world)]
        self.size = [[[(0, 0)] * world for _ in range(LAMPORT_BUFFERS)] for _ in range(world)]
        self.dirty = [[0] * LAMPORT_BUFFERS for _ in range(world)]
        self.count = [start] * world
        self.failed: list[set[int]] = [set() for _ in range(world)]
        self.read: set[tuple[int, int]] = set()  # (receiver, call) done
        self.programs = [self._run(r) for r in range(world)]
        self.pending = [next(p) for p in self.programs]

    def _run(self, r: int):
        rule, world = self.rule, self.world
        for g, sizes in enumerate(self.sizes):
            yield ("start", g)
            c, n = self.count[r], sizes[r]
            b, tag = rule.buffer(c), rule.tag(c)
            stale = rule.stale(c)
            if self.dirty[r][stale] == tag:  # block 0 empties the dirty buffer before announcing
                self._clean(r, stale)
                if rule.clears:
                    self.dirty[r][stale] = 0
            for q in range(world):
                self.size[q][b][r] = (tag, n)
            for q in range(world):
                yield ("send", g, q)
                for i in range(elements(n)):
                    if self.data[q][b][r][i] is not None:
                        raise Hazard(f"rank {r} call {g} overwrote rank {q}'s buffer {b} slot {r}[{i}] "
                                     f"holding call {self.data[q][b][r][i][0]}")
                    self.data[q][b][r][i] = (g, r)
            yield ("sizes", g, tag)
            if self.dirty[r][b] == rule.tag(rule.cleanup_call(c)):  # the other parts' view of part 0's verdict
                raise Hazard(f"rank {r} call {g}: buffer {b}'s mark of an earlier call reads as this call's mismatch "
                             "(the parts but part 0 deliver nothing)")
            agree = all(self.size[r][b][q] == (tag, n) for q in range(world))
            if agree != (len(set(sizes)) == 1):
                raise Hazard(f"rank {r} call {g}: sizes {sizes}, but the check says agree={agree}")
            if not agree:
                self.failed[r].add(g)
                if rule.cleans:
                    self.dirty[r][b] = rule.tag(rule.cleanup_call(c))
            else:
                yield ("data", g, elements(n))
                for q in range(world):
                    for i in range(elements(n)):
                        if self.data[r][b][q][i] != (g, q):
                            raise Hazard(f"rank {r} call {g} read {self.data[r][b][q][i]} "
                                         f"from buffer {b} slot {q}[{i}]")
                        self.data[r][b][q][i] = None
                self.read.add((r, g))
            self.count[r] = rule.next(c)
        yield None

    def _clean(self, r: int, b: int) -> None:
        for q, slot in enumerate(self.data[r][b]):
            for i, value in enumerate(slot):
                if value is not None and value[0] not in self.failed[r] and (r, value[0]) not in self.read:
                    raise Hazard(f"rank {r} emptied buffer {b} slot {q}[{i}] holding call {value[0]}, not yet read")
                slot[i] = None

    def enabled(self, r: int) -> bool:
        step = self.pending[r]
        if step is None or step[0] in ("start", "send"):
            return step is not None
        b = self.rule.buffer(self.count[r])
        if step[0] == "sizes":
            return all(self.size[r][b][q][0] == step[2] for q in range(self.world))
        return all(v is not None for q in range(self.world) for v in self.data[r][b][q][:step[2]])

    def run(self, seed: int, fast: float = 0.8) -> None:
        rng = random.Random(seed)
        while any(p is not None for p in self.pending):
            ready = [r for r in range(self.world) if self.enabled(r)]
            if not ready:
                raise Hazard(f"no rank can move: {self.pending}")
            r = 0 if 0 in ready and rng.random() < fast else rng.choice(ready)
            self.pending[r] = next(self.programs[r])


SEEDS = 60


@pytest.mark.parametrize("world", range(2, 9))
def test_rotation_holds_across_the_wrap(world: int) -> None:
    """Counts start 4 below the wrap and run 8 calls past it, a fast rank ahead of the others."""
    for seed in range(SEEDS):
        model = Model(world, [[2] * world] * 12, LAMPORT_CALLS - 4)
        model.run(seed)
        assert model.count == [LAMPORT_CALLS - 4 + 12 - LAMPORT_CALLS] * world
        assert len(model.read) == 12 * world


def test_the_count_wraps_at_a_multiple_of_the_buffers_below_2_32() -> None:
    assert LAMPORT_CALLS % LAMPORT_BUFFERS == 0 and LAMPORT_CALLS < 2**32
    assert lamport_next(LAMPORT_CALLS - 1) == 0
    assert [lamport_buffer(c) for c in (LAMPORT_CALLS - 2, LAMPORT_CALLS - 1, 0, 1)] == [1, 2, 0, 1]
    assert 0 not in {lamport_tag(c) for c in (0, LAMPORT_CALLS - 1)} and lamport_tag(LAMPORT_CALLS - 1) < 2**32


@pytest.mark.parametrize("world", range(2, 9))
def test_the_old_uint32_count_repeats_buffer_0_at_the_wrap(world: int) -> None:
    """Calls 2^32 - 1 and 2^32 both used buffer 0: the fast rank's next data lands on a slot the
    slow rank has not read yet (or, first, a clean-up tag of 0 reads as a fresh mark)."""
    with pytest.raises(Hazard, match="overwrote|reads as this call"):
        for seed in range(SEEDS):
            Model(world, [[2] * world] * 12, 2**32 - 4, OLD_WRAP).run(seed)


def _mismatch(world: int, at: int, calls: int) -> list[list[int]]:
    """Call ``at``: rank 1 brings 3 elements, the others 2; every other call 3 everywhere (so
    that a call of the failed call's buffer reads past the smaller size)."""
    return [[2 + (r == 1) for r in range(world)] if g == at else [3] * world for g in range(calls)]


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("start", [0, LAMPORT_CALLS - 5, LAMPORT_CALLS - 3])
def test_a_size_mismatch_fails_every_rank_and_its_buffer_is_clean_by_its_next_use(world: int, start: int) -> None:
    """Every rank fails the mismatched call, none hangs, and the calls after it, three of which
    reuse its buffer (before and after the wrap), read only their own data."""
    for seed in range(SEEDS):
        model = Model(world, _mismatch(world, 2, 9), start)
        model.run(seed)
        assert model.failed == [{2}] * world
        assert len(model.read) == 8 * world


@pytest.mark.parametrize("world", [2, 3, 8])
def test_a_mismatch_leaves_no_mark_when_its_count_comes_back_after_the_wrap(world: int) -> None:
    """A mismatch at count 1, then calls past the (scaled-down) wrap and through count 1 again:
    every call after it reads its own data; a mark left standing reads as that later call's
    mismatch."""
    for seed in range(SEEDS):
        model = Model(world, _mismatch(world, 1, 14), 0, SHORT_WRAP)
        model.run(seed)
        assert model.failed == [{1}] * world and len(model.read) == 13 * world
    with pytest.raises(Hazard, match="reads as this call's mismatch"):
        Model(world, _mismatch(world, 1, 14), 0, MARK_KEPT).run(0)


@pytest.mark.parametrize(("rule", "match"), [(NO_CLEANUP, "read|overwrote"),
                                             (CLEANUP_TOO_EARLY, "read|overwrote")])
def test_without_the_cleanup_two_calls_later_stale_data_is_read(rule: Rule, match: str) -> None:
    """Left dirty (before the fix, when the host reset raced), or emptied one call later (a slow
    rank's stores of the failed call land after), the buffer gives a later call old data."""
    with pytest.raises(Hazard, match=match):
        for seed in range(SEEDS * 5):
            Model(3, _mismatch(3, 2, 9), 0, rule).run(seed, fast=0.5)


def test_a_tag_of_zero_matches_a_fresh_size_word() -> None:
    """Why tags start at 1: with the old Uint32 tag, the call at 2^32 - 1 has tag 0, which a
    size word that no call wrote yet (zero) already holds: a false size mismatch."""
    with pytest.raises(Hazard, match="agree=False"):
        Model(2, [[2, 2]], 2**32 - 1, OLD_WRAP).run(0, fast=1.0)  # rank 0 checks before rank 1 announces


@pytest.mark.parametrize("world", range(2, 9))
def test_the_test_seed_starts_exactly_the_kernels_counts(world: int) -> None:
    """COLLECTIVES_TEST_SEED_CALL writes the words the kernel of this world size counts in
    (``PadLayout(world=W)``, not the pad's allocation layout of 8 ranks), and nothing else."""
    torch = pytest.importorskip("torch")
    from collectives.config import LAMPORT_BLOCKS
    from collectives.errors import CollectiveError
    from collectives.algorithms.lamport import seed_counts
    from collectives.layouts import PadLayout
    from collectives.runtime.communicator import Communicator

    comm = Communicator.__new__(Communicator)
    comm.world, comm.lamport_buffers = world, {}
    comm.pad = torch.zeros(PadLayout().words, dtype=torch.int32)
    seed_counts(comm, LAMPORT_CALLS - 2)
    kernel = PadLayout(world=world)
    steps = {kernel.lamport_step(w, b) for w in range(3) for b in range(LAMPORT_BLOCKS)}
    written = set(torch.nonzero(comm.pad).flatten().tolist())
    assert written == steps
    assert {int(comm.pad[i]) % 2**32 for i in written} == {LAMPORT_CALLS - 2}
    with pytest.raises(CollectiveError, match="COLLECTIVES_TEST_SEED_CALL"):
        seed_counts(comm, LAMPORT_CALLS)
    comm.lamport_buffers = {2: None}  # moved mid-life: refused while a mark awaits its clean-up
    comm.pad[kernel.lamport_dirty(1, 2)] = 32
    with pytest.raises(CollectiveError, match="clean-up is pending"):
        seed_counts(comm, 7)
    comm.pad[kernel.lamport_dirty(1, 2)] = 0
    seed_counts(comm, 7)
    assert {int(comm.pad[i]) for i in steps} == {7}


def _mixed(world: int, calls: int, seed: int) -> list[list]:
    """``calls`` calls of random collectives and sizes, the same on every rank."""
    rng = random.Random(seed)
    return [[(rng.choice(COLLECTIVES), rng.choice((1, 2, 3)))] * world for _ in range(calls)]


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("start", [0, 2**31 - 4, LAMPORT_CALLS - 4])
def test_mixed_collectives_share_the_rotation_across_2_31_and_the_wrap(world: int, start: int) -> None:
    """All-reduces, reduce-scatters and all-gathers of changing sizes in one sequence of calls
    (one buffer set and count per element width), a fast rank ahead, across 2^31 and the wrap."""
    for seed in range(SEEDS):
        model = Model(world, _mixed(world, 12, seed), start)
        model.run(seed)
        assert len(model.read) == 12 * world


@pytest.mark.parametrize("world", [2, 4])
def test_mixed_collectives_repeat_buffer_0_at_2_32_under_the_old_wrap(world: int) -> None:
    with pytest.raises(Hazard, match="overwrote|reads as this call"):
        for seed in range(SEEDS):
            Model(world, _mixed(world, 12, seed), 2**32 - 4, OLD_WRAP).run(seed)


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("start", [0, 2**31 - 2, LAMPORT_CALLS - 3])
def test_different_collectives_of_one_count_fail_every_rank_and_are_cleaned_up(world: int, start: int) -> None:
    """Call 2: rank 1 all-gathers where the others reduce-scatter 3 elements (the code in the
    size entry tells them apart); the later calls reuse its buffer and read only their own data."""
    calls = [[("reduce_scatter", 3)] * world] * 9
    calls[2] = [("all_gather" if r == 1 else "reduce_scatter", 3) for r in range(world)]
    for seed in range(SEEDS):
        model = Model(world, calls, start)
        model.run(seed)
        assert model.failed == [{2}] * world
        assert len(model.read) == 8 * world
