"""The pipelined push's rounds and signals (pure Python, no GPU, no CuTeDSL).

The round and event formulas are the ones the kernel evaluates (:mod:`collectives.config`).
:func:`program` restates the schedule of one thread block of
:func:`collectives.algorithms.push.pipeline` step by step; :class:`Model` runs it for every
rank over consecutive calls in random interleavings, tracking each element of every rank's
buffers (receive slots; the all-reduce's result buffer, a region per owner, which the owner
stores into on every other rank and each rank copies out of locally): a read must see the
value written in the same call, ordered before it by a signal the reader acquired, and a value
may be overwritten only once every rank that reads it has, each read ordered before the write
the same way.  The multicast backends' push all-reduce is the same schedule in one round (its
two barriers are the signal and wait of events 0 and 1), with each owner storing its result
into its own result buffer and every rank pulling the other owners' results from theirs.
"""

from __future__ import annotations

import random

import pytest

from collectives.config import CALL_EPOCHS, PUSH_EPOCHS, PUSH_MAX_ROUNDS, PUSH_ROUND_STRIDES
from collectives.algorithms.base import ceil_div
from collectives.algorithms.push import push_events, push_round_strides, push_rounds
from collectives.layouts import call_last, call_parity


def test_rounds_cover_the_slots_in_whole_rounds() -> None:
    """At most PUSH_MAX_ROUNDS rounds of a whole number of PUSH_ROUND_STRIDES strides, none
    empty, and the fewest such rounds of at least PUSH_ROUND_STRIDES strides."""
    for strides in list(range(1, 400)) + [10**6, 2**31]:
        per, rounds = push_round_strides(strides), push_rounds(strides)
        assert per % PUSH_ROUND_STRIDES == 0 and 1 <= rounds <= PUSH_MAX_ROUNDS
        assert (rounds - 1) * per < strides <= rounds * per
        if strides <= PUSH_ROUND_STRIDES * PUSH_MAX_ROUNDS:
            assert per == PUSH_ROUND_STRIDES
    assert push_rounds(1) == 1 and push_rounds(PUSH_ROUND_STRIDES) == 1


def test_a_call_emits_at_most_its_range_of_epochs() -> None:
    assert push_events(1, False) == 1 and push_events(1, True) == 2  # the unpipelined barriers
    assert push_events(PUSH_MAX_ROUNDS, True) == PUSH_EPOCHS
    assert call_last(0) >= PUSH_EPOCHS  # event j of the call at count C is epoch C + 1 + j


def test_rounds_of_large_tensors() -> None:
    """256 MB of bf16 on 2 and 4 H200s (264 blocks of 512 threads, 8 elements a vector)."""
    step = 264 * 512
    for world, rounds in ((2, 32), (4, 16)):
        strides = ceil_div(ceil_div((128 << 20) // world, 8), step)
        assert push_rounds(strides) == rounds, (world, strides)
    assert push_rounds(ceil_div(ceil_div(1 << 20, 8), step)) == 1  # 4 MB on 2 GPUs: one round


def program(rounds: int, all_reduce: bool, final: bool, mutation: str = "", gather: bool = False):
    """The steps of one block of one rank in one call, in the kernel's order (``gather``: the
    push all-gather's, :mod:`collectives.algorithms.push_gather`, whose step after each wait
    copies the other ranks' slots out instead of reducing them)."""
    events = push_events(rounds, final)
    yield "push", 0
    yield "signal", 0
    if mutation != "push before the first wait":
        yield "wait", 0
    for k in range(rounds):
        if k + 1 < rounds:
            yield "push", k + 1
        if all_reduce and k > 0 and mutation == "collect before wait":
            yield "collect", k - 1
        if k > 0 and mutation != "reduce before wait" or k == 0 and mutation == "push before the first wait":
            yield "wait", k
        yield ("copy" if gather else "reduce"), k
        if all_reduce and k > 0 and mutation != "collect before wait":
            yield "collect", k - 1
        if k + 1 < events:
            yield "signal", k + 1
    if final and mutation != "no final wait":
        yield "wait", rounds
    if all_reduce:
        yield "collect", rounds - 1


class Hazard(AssertionError):
    pass


class Model:
    """``world`` ranks, one block each, running ``calls`` (per call and rank: its slot
    elements, also its size, and its rounds) on buffers of one element per slot element.  The reduce-scatter
    without a final wait alternates two buffers, as its caller does; the all-reduce's result
    regions are a buffer of their own (``apart``) or follow the slots; ``multicast``: the owner
    stores its result on its own rank and the others pull it (calls of one round)."""

    def __init__(self, world: int, calls: list, all_reduce: bool, final: bool, mutation: str = "",
                 alternate: bool | None = None, apart: bool = True, multicast: bool = False,
                 gather: bool = False) -> None:
        self.world, self.calls, self.all_reduce, self.final = world, calls, all_reduce, final
        self.gather = gather  # the push all-gather: slot r of every other rank, copied out there
        self.mutation, self.apart, self.multicast = mutation, apart, multicast
        self.alternate = (not final) if alternate is None else alternate
        self.memory: dict = {}  # (owner, buffer, element) -> value record
        self.word = [(0, None)] * world  # each rank's last signal: (epoch, size)
        self.slots = [[(0, None)] * 2 for _ in range(world)]  # its arrival words, by call parity
        self.seen = [[0] * world for _ in range(world)]  # epochs each rank acquired of each rank
        self.epoch = [0] * world
        self.failed = [[] for _ in range(world)]  # calls in which a wait saw another size
        self.programs = [self._run(r) for r in range(world)]
        self.pending = [next(p) for p in self.programs]

    # -- one rank's calls --------------------------------------------------------------------

    def _run(self, r: int):
        for c, call in enumerate(self.calls):
            steps = program(call[r][1], self.all_reduce, self.final, self.mutation, self.gather)
            for step in steps:
                if step[0] == "wait":
                    yield ("wait", c, step[1])
                    if c in self.failed[r]:
                        break
                else:
                    yield (step[0], c, step[1])
            self.epoch[r] += CALL_EPOCHS
        yield None

    def _chunk(self, c: int, r: int, k: int) -> range:
        m, rounds = self.calls[c][r]
        per = ceil_div(m, rounds)
        return range(min(k * per, m), min((k + 1) * per, m))

    def _buffer(self, c: int) -> int:
        return c % 2 if self.alternate else 0

    def _result(self, c: int, m: int, holder: int, q: int, i: int) -> tuple:
        """Element ``i`` of owner ``q``'s result region (``world`` regions of ``m`` elements,
        ``m`` as the accessing rank sees it) on rank ``holder``."""
        region = 0 if self.mutation == "one result region" else q * m
        return (holder, "results", region + i) if self.apart else (holder, self._buffer(c), self.world * m + region + i)

    # -- memory accesses ---------------------------------------------------------------------

    def _ordered(self, later: int, rank: int, word: int) -> bool:
        """Whether rank ``later`` has acquired a signal ``rank`` made after its word was ``word``."""
        return later == rank or self.seen[later][rank] > word

    def _write(self, r: int, c: int, where: tuple, readers: set) -> None:
        old = self.memory.get(where)
        if old is not None and not self.failed_call(old["call"]):
            missing = old["readers"] - {reader for reader, _ in old["reads"]}
            if missing:
                raise Hazard(f"rank {r} call {c} overwrote {where} before ranks {missing} read it")
            for reader, word in old["reads"]:
                if not self._ordered(r, reader, word):
                    raise Hazard(f"rank {r} call {c} overwrote {where} unordered after rank {reader}'s read")
        self.memory[where] = {"call": c, "writer": r, "word": self.word[r][0], "readers": readers, "reads": []}

    def _read(self, r: int, c: int, where: tuple) -> None:
        value = self.memory.get(where)
        if value is None or value["call"] != c:
            raise Hazard(f"rank {r} call {c} read {where} holding call {value and value['call']}'s value")
        if not self._ordered(r, value["writer"], value["word"]):
            raise Hazard(f"rank {r} call {c} read {where} unordered after rank {value['writer']}'s write")
        value["reads"].append((r, self.word[r][0]))

    def failed_call(self, c: int) -> bool:
        return any(c in f for f in self.failed)

    # -- steps ---------------------------------------------------------------------------------

    def enabled(self, r: int) -> bool:
        step = self.pending[r]
        if step is None:
            return False
        if step[0] != "wait":
            return True
        want = self.epoch[r] + 1 + step[2]
        parity = call_parity(self.epoch[r])
        return all(self.slots[p][parity][0] >= want for p in range(self.world))

    def do(self, r: int) -> None:
        kind, c, k = self.pending[r]
        m, rounds = self.calls[c][r]
        b = self._buffer(c)
        if kind == "push":  # (the all-gather stores its own chunk into its output, not its buffer)
            for q in range(self.world):
                for i in self._chunk(c, r, k) if q != r or not self.gather else ():
                    self._write(r, c, (q, b, r * m + i), {q})
        elif kind == "copy":  # the all-gather: the other ranks' slots of our buffer into our output
            for s in set(range(self.world)) - {r}:
                for i in self._chunk(c, r, k):
                    self._read(r, c, (r, b, s * m + i))
        elif kind == "reduce":
            for i in self._chunk(c, r, k):
                for s in range(self.world):
                    self._read(r, c, (r, b, s * m + i))
                others = set(range(self.world)) - {r}
                if self.all_reduce and self.multicast:  # the owner's result, on its own rank
                    self._write(r, c, self._result(c, m, r, r, i), others)
                elif self.all_reduce:  # the owner's result, stored into its region on every other rank
                    for p in others:
                        self._write(r, c, self._result(c, m, p, r, i), {p})
        elif kind == "collect":  # the other owners' results: pulled from theirs, or from our own buffer
            for q in set(range(self.world)) - {r}:
                for i in self._chunk(c, r, k):
                    self._read(r, c, self._result(c, m, q if self.multicast else r, q, i))
        elif kind == "signal":
            self.word[r] = self.slots[r][call_parity(self.epoch[r])] = (self.epoch[r] + 1 + k, m)
        else:  # wait: acquire every rank's word of this call's slot, compare its size
            words = [self.slots[p][call_parity(self.epoch[r])] for p in range(self.world)]
            for p, (epoch, _) in enumerate(words):
                self.seen[r][p] = max(self.seen[r][p], epoch)
            if any(epoch > call_last(self.epoch[r]) or size != m for epoch, size in words):
                self.failed[r].append(c)
        self.pending[r] = next(self.programs[r])

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        while any(s is not None for s in self.pending):
            ready = [r for r in range(self.world) if self.enabled(r)]
            if not ready:
                raise Hazard(f"deadlock: pending {self.pending}")
            self.do(rng.choice(ready))


def _calls(world: int, shapes: list) -> list:
    """Calls of (slot elements, rounds), the same on every rank."""
    return [[shape] * world for shape in shapes]


SHAPES = [(12, 3), (12, 3), (7, 1), (16, 4), (9, 2), (12, 3), (5, 5), (4, 1), (6, 1)]
KINDS = {"all_reduce": (True, True), "reduce_scatter in graphs": (False, True), "reduce_scatter": (False, False)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_schedule_is_race_free_over_consecutive_calls(kind: str, world: int) -> None:
    all_reduce, final = KINDS[kind]
    for seed in range(150):
        Model(world, _calls(world, SHAPES), all_reduce, final).run(seed)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_all_gather_schedule_is_race_free_over_consecutive_calls(world: int) -> None:
    """The push all-gather: one buffer, its final wait (every rank copied everything out)."""
    for seed in range(150):
        Model(world, _calls(world, SHAPES), False, True, gather=True).run(seed)


@pytest.mark.parametrize("mutation", ["no final wait", "reduce before wait", "push before the first wait"])
def test_the_model_catches_a_broken_all_gather_schedule(mutation: str) -> None:
    """Without its final wait the next call's first pushes land on slots a rank still copies
    out; a copy before its wait reads a chunk not yet pushed; a push before the first wait
    outlives a failed call."""
    calls = _calls(4, [(12, 3)]) + [MISMATCH] + _calls(4, [(12, 3), (16, 4)]) if "first" in mutation else _calls(
        3, SHAPES)
    with pytest.raises(Hazard):
        for seed in range(300):
            Model(len(calls[0]), calls, False, True, mutation, gather=True).run(seed)


def test_all_gather_sizes_that_differ_fail_every_rank_and_keep_the_epochs() -> None:
    for seed in range(300):
        model = Model(4, _calls(4, [(12, 3)]) + [MISMATCH] + _calls(4, [(12, 3), (16, 4)]), False, True, gather=True)
        model.run(seed)
        assert all(f == [1] for f in model.failed), model.failed
        assert len(set(model.epoch)) == 1


@pytest.mark.parametrize(("kind", "mutation", "alternate", "apart"), [
    ("all_reduce", "no final wait", None, True),
    ("all_reduce", "reduce before wait", None, True),
    ("all_reduce", "collect before wait", None, True),  # an owner's chunk before its signal
    ("all_reduce", "one result region", None, True),  # owners' results over each other
    ("all_reduce", "", None, False),  # results after the slots: a larger call pushes over them
    ("reduce_scatter in graphs", "no final wait", False, True),
    ("reduce_scatter", "", False, True),  # one buffer without the final wait
])
def test_model_catches_a_broken_schedule(kind: str, mutation: str, alternate: bool | None, apart: bool) -> None:
    """The model is strong enough to matter: dropping or passing a wait, the second buffer, the
    result buffer or its region per owner races."""
    all_reduce, final = KINDS[kind]
    with pytest.raises(Hazard):
        for seed in range(300):
            Model(3, _calls(3, SHAPES), all_reduce, final, mutation, alternate, apart).run(seed)


ONE_ROUND = [(m, 1) for m, _ in SHAPES]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_multicast_schedule_is_race_free_over_consecutive_calls(world: int) -> None:
    for seed in range(150):
        Model(world, _calls(world, ONE_ROUND), True, True, multicast=True).run(seed)


def test_multicast_results_after_the_slots_race() -> None:
    """The multicast backends' former layout, each owner's result region after its slots: a
    rank's next call of a larger size pushes over a region another rank is still pulling."""
    with pytest.raises(Hazard, match="overwrote"):
        for seed in range(300):
            Model(3, _calls(3, ONE_ROUND), True, True, apart=False, multicast=True).run(seed)


MISMATCH = [(12, 3), (20, 5), (20, 5), (12, 3)]  # rank 1's chunk 1 lies on rank 2's chunk 0 of 12


@pytest.mark.parametrize("kind", list(KINDS))
def test_sizes_that_differ_fail_every_rank_and_keep_the_epochs(kind: str) -> None:
    """Ranks 0, 3 bring one size (3 rounds), ranks 1, 2 another (5): every rank's first wait
    sees a size of this call that differs, no rank waits forever, every rank's epoch advances
    alike, and the next calls (same size everywhere) run race-free: no push of the failed
    call lands after the next call's."""
    all_reduce, final = KINDS[kind]
    for seed in range(300):
        model = Model(4, _calls(4, [(12, 3)]) + [MISMATCH] + _calls(4, [(12, 3), (16, 4)]), all_reduce, final)
        model.run(seed)
        assert all(f == [1] for f in model.failed), model.failed
        assert len(set(model.epoch)) == 1


def test_a_push_before_the_first_wait_outlives_a_failed_call() -> None:
    """Why the second chunk waits for every rank's first signal: pushed before it, a failed
    call's chunk can land on the next call's."""
    with pytest.raises(Hazard, match="overwrote"):
        for seed in range(300):
            Model(4, _calls(4, [(12, 3)]) + [MISMATCH] + _calls(4, [(12, 3), (16, 4)]), True, True,
                  "push before the first wait").run(seed)
