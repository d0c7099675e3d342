"""The barriers' call counts, epochs and arrival words (pure Python, no GPU, no CuTeDSL).

:class:`Model` restates what every block of a collective kernel does with the signal pad
(:mod:`collectives.device.signals`, :func:`collectives.algorithms.design.kernel`): read the
rank's call count ``C`` and take a ticket, signal epoch ``C + 1 + j`` with its size into every
rank's arrival word of the call's parity, wait for every rank's word, judge it, and (the last
block) advance ``C``.  The words' addresses, the call's parity and last epoch, the step per
call and the grid come from :mod:`collectives.config` and :meth:`Communicator.blocks`, and the
comparison is the kernel's ``int32(seen - want) >= 0`` on 32-bit words, so the model crosses
the 2^32 wrap as the kernel does.  Ranks run consecutive calls (a rank's next kernel starts
when all its blocks finished) in random interleavings; a wait no step can satisfy times out.

The model checks that a wait passes only on every rank's word of the same call with the same
size (else "stale" or "silent"), that a call whose sizes differ fails on every rank with a
size mismatch and no timeout, and that every rank's count stays equal.  The old rules are
mutations the tests show failing: an epoch per block (a mismatch that changes the grid), one
arrival slot whose word past the call counts as passed, no watch of block 0, and the old
multicast counter's target ``(counter // world + 1) * world`` across the wrap.
"""

from __future__ import annotations

import functools
import random

import pytest

torch = pytest.importorskip("torch")
from collectives.algorithms import KernelKey  # noqa: E402
from collectives.algorithms import grid as kernel_grid  # noqa: E402
from collectives.config import CALL_EPOCHS  # noqa: E402
from collectives.layouts import PadLayout, call_last, call_parity  # noqa: E402
from collectives.runtime.communicator import Communicator  # noqa: E402

U32 = 1 << 32
TIMEOUT, MISMATCH = "timeout", "size mismatch"


def reached(seen: int, want: int) -> bool:
    """The kernel's wrap-safe ``int32(seen - want) >= 0`` on uint32 values."""
    return (seen - want) % U32 < 1 << 31


def in_call(epoch: int, calls: int) -> bool:
    """:func:`collectives.device.signals.in_call`: ``calls < epoch <= call_last(calls)``."""
    return not reached(calls, epoch) and reached(call_last(calls) % U32, epoch)


class Hazard(AssertionError):
    pass


@functools.cache
def grid(world: int, n: int) -> int:
    """The runtime's grid of a one-shot f32 all-reduce of ``n`` elements on an H100 (132 SMs)."""
    comm = Communicator.__new__(Communicator)
    comm.sms, comm.layout = 132, PadLayout()
    key = KernelKey("all_reduce", "one_shot", "peer", "f32", world)
    return kernel_grid(comm, key, n // key.full_vector)


class Model:
    """``world`` ranks running ``calls`` (per call, each rank's element count) of a design
    kernel with ``waits`` barriers (2: start and end; 1: the start barrier only, the final
    wait), each rank's pad a dict of words.  ``seed``: the count every pad starts at (the
    runtime's test hook: the count and every arrival word's epoch).  ``multicast``: a signal
    reaches every rank in one step (one ``multimem.st``), else one store per rank."""

    def __init__(self, world: int, calls: list, waits: int = 2, seed: int = 0, mutation: str = "",
                 multicast: bool = False) -> None:
        self.world, self.calls, self.waits, self.mutation, self.multicast = world, calls, waits, mutation, multicast
        self.layout = PadLayout(world=world)
        self.pads = [dict() for _ in range(world)]
        for pad in self.pads:
            pad[self.layout.calls], pad[self.layout.tickets] = seed, 0
        self.seed = seed
        self.records: list[list] = [[] for _ in range(world)]  # (call, status, block, peer)
        self.ranks = [self._rank(r) for r in range(world)]
        self.blocks: list[list] = [[] for _ in range(world)]  # each rank's running blocks: [generator, step]
        self.call = [0] * world

    # -- the pad ---------------------------------------------------------------------------

    def _word(self, r: int, index: int) -> tuple:
        """(epoch, size, call that wrote it) of the arrival word at ``index`` of rank r's pad."""
        return self.pads[r].get(index, (self.seed, 0, None))

    def _parity(self, calls: int) -> int:
        return 0 if self.mutation in ("one slot", "epoch per block") else call_parity(calls)

    # -- one rank: its calls, each a kernel of blocks -----------------------------------------

    def _rank(self, r: int):
        for c, sizes in enumerate(self.calls):
            self.call[r] = c
            self.blocks[r] = [[self._block(r, c, b, sizes[r]), None] for b in range(grid(self.world, sizes[r]))]
            for entry in self.blocks[r]:
                entry[1] = next(entry[0])
            yield  # the kernel runs until all its blocks finished
        self.call[r] = None

    def _block(self, r: int, c: int, b: int, size: int):
        pad, layout = self.pads[r], self.layout
        blocks = grid(self.world, size)
        if self.mutation == "epoch per block":  # the old design: each block's own count
            calls = pad.get(("epoch", b), self.seed)
        else:
            calls = pad[layout.calls]
        last = True
        if blocks > 1:  # the ticket (atom.add.acq_rel.gpu)
            last = pad[layout.tickets] == blocks - 1
            pad[layout.tickets] += 1
        yield ("step",)
        for j in range(self.waits):
            epoch = (calls + 1 + j) % U32
            word = layout.arrival(self._parity(calls), b, r)
            for t in range(self.world):
                self.pads[t][word] = (epoch, size, c)
                if not self.multicast or t == self.world - 1:
                    yield ("step",)
            ok = yield ("wait", r, c, b, calls, epoch, size, j == self.waits - 1)
            if not ok:
                break
        if self.mutation == "epoch per block":
            pad[("epoch", b)] = (calls + self.waits) % U32
        elif last:
            if blocks > 1:
                pad[layout.tickets] = 0
            pad[layout.calls] = (calls + CALL_EPOCHS) % U32
        yield None

    # -- waits: ready, and judged as the kernel judges ---------------------------------------

    def _watch(self, r: int, b: int, calls: int, size: int, t: int) -> bool:
        """Rank t's block 0 signalled this call with another size (blocks > 0 watch it)."""
        if b == 0 or self.mutation in ("no block 0 watch", "epoch per block"):
            return False
        epoch, other, _ = self._word(r, self.layout.arrival(self._parity(calls), 0, t))
        return in_call(epoch, calls) and other != size

    def _ready(self, step: tuple) -> bool:
        _, r, c, b, calls, want, size, final = step
        return all(reached(self._word(r, self.layout.arrival(self._parity(calls), b, t))[0], want)
                   or self._watch(r, b, calls, size, t) for t in range(self.world))

    def _judge(self, step: tuple, expired: bool) -> bool:
        _, r, c, b, calls, want, size, final = step
        ok = True
        for t in range(self.world):
            epoch, seen, wrote = self._word(r, self.layout.arrival(self._parity(calls), b, t))
            if not reached(epoch, want):
                status = MISMATCH if self._watch(r, b, calls, size, t) else TIMEOUT
            elif self.mutation in ("one slot", "epoch per block"):  # the old rule
                last = want if self.mutation == "epoch per block" else call_last(calls) % U32
                if reached(last, epoch):
                    status = MISMATCH if seen != size else None
                else:  # rank t already left the call: passed at a final wait, failed elsewhere
                    status = None if final or self.mutation == "epoch per block" else MISMATCH
                    wrote = c  # taken as rank t's word of this call
            elif not in_call(epoch, calls):
                status = TIMEOUT
            else:
                status = MISMATCH if seen != size else None
            if status is None and wrote != c:
                raise Hazard(f"rank {r} call {c} block {b} passed on rank {t}'s word of call {wrote}")
            if status is not None:
                ok = False
                self.records[r].append((c, status, b, t))
        if ok and any(sizes != size for sizes in self.calls[c]):
            raise Hazard(f"rank {r} call {c} block {b} passed a wait of a call whose sizes differ")
        return ok

    # -- scheduling ------------------------------------------------------------------------

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        for rank in self.ranks:
            next(rank)
        while any(c is not None for c in self.call):
            ready = [(r, i) for r in range(self.world) for i, (_, step) in enumerate(self.blocks[r])
                     if step is not None and (step[0] == "step" or self._ready(step))]
            if ready:
                r, i = rng.choice(ready)
                self._advance(r, i, expired=False)
            else:  # every block left is waiting for a word no step will write: a deadline passes
                waiting = [(r, i) for r in range(self.world) for i, (_, s) in enumerate(self.blocks[r]) if s]
                if not waiting:
                    raise Hazard("no block can move")
                r, i = rng.choice(waiting)
                self._advance(r, i, expired=True)

    def _advance(self, r: int, i: int, expired: bool) -> None:
        entry = self.blocks[r][i]
        step = entry[1]
        entry[1] = entry[0].send(self._judge(step, expired) if step[0] == "wait" else None)
        if all(s is None for _, s in self.blocks[r]):
            next(self.ranks[r], None)

    def counts(self) -> set:
        return {pad[self.layout.calls] for pad in self.pads}


EQUAL, WIDE = 2048, 2056  # one-shot f32: one block, two blocks (the example)
ROUNDS = 15


def mismatched(world: int, odd: set) -> list:
    """A call in which ranks ``odd`` bring 2056 elements (two blocks) and the others 2048 (one)."""
    return [WIDE if r in odd else EQUAL for r in range(world)]


def calls_around(world: int, odd: set, size: int = WIDE) -> list:
    return [[size] * world] * 2 + [mismatched(world, odd)] + [[size] * world] * 4


def test_the_grid_depends_on_the_size() -> None:
    assert (grid(2, EQUAL), grid(2, WIDE)) == (1, 2)


def check_mismatch_recovers(model: Model, mismatch: int) -> None:
    """Every rank records only size mismatches, in the mismatched call only, and the counts stay equal."""
    for r, records in enumerate(model.records):
        assert records, f"rank {r} recorded nothing"
        assert {(c, status) for c, status, _, _ in records} == {(mismatch, MISMATCH)}, records
    assert len(model.counts()) == 1


@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("waits", [1, 2])
def test_a_mismatch_that_changes_the_grid_then_equal_calls_across_the_wrap(world: int, waits: int) -> None:
    """Calls whose count starts 3 calls below 2^32; the third call's sizes differ (grids of 1 and 2
    blocks); every call after it runs on words of its own call."""
    rng = random.Random(world)
    for seed in range(ROUNDS):
        odd = set(rng.sample(range(world), rng.randint(1, world - 1)))
        for start in (0, U32 - 3 * CALL_EPOCHS):
            model = Model(world, calls_around(world, odd, rng.choice([EQUAL, WIDE])), waits, seed=start,
                          multicast=seed % 2 == 1)
            model.run(seed)
            check_mismatch_recovers(model, 2)
            assert model.counts() == {(start + 7 * CALL_EPOCHS) % U32}


@pytest.mark.parametrize("world", range(2, 9))
def test_equal_calls_across_the_wrap_record_nothing(world: int) -> None:
    for seed in range(ROUNDS // 2):
        model = Model(world, [[WIDE] * world] * 6, seed=U32 - 2 * CALL_EPOCHS, multicast=seed % 2 == 1)
        model.run(seed)
        assert model.records == [[]] * world


def test_an_epoch_per_block_passes_on_a_stale_word_after_the_grid_changed() -> None:
    """The old design: rank 1's second block advances alone in the mismatched call, and a later
    call's block passes on its word of the failed call."""
    with pytest.raises(Hazard, match=r"passed on rank \d.s word of call [23]"):
        for seed in range(ROUNDS):
            Model(2, calls_around(2, {1}), mutation="epoch per block").run(seed)


def test_one_arrival_slot_passes_a_rank_that_left_the_call_failing() -> None:
    """One slot, the old rule (a word past the call passed a final wait): ranks 1 and 2 (16
    elements) fail against rank 0 (8), leave and signal their next call over their words before
    rank 0 reads them, and rank 0 passes its only barrier with sizes that differ."""
    calls = [[WIDE, EQUAL, EQUAL]] + [[EQUAL] * 3] * 3
    with pytest.raises(Hazard, match="sizes differ|passed on"):
        for seed in range(ROUNDS * 20):
            Model(3, calls, waits=1, mutation="one slot").run(seed)


def test_blocks_that_exist_on_some_ranks_only_wait_for_the_deadline_without_block_0_watch() -> None:
    with pytest.raises(AssertionError, match="timeout"):
        model = Model(2, calls_around(2, {1}), mutation="no block 0 watch")
        model.run(0)
        check_mismatch_recovers(model, 2)


# -- the old multicast counter --------------------------------------------------------------


def old_multicast(world: int, barriers: int, seed: int) -> None:
    """Every rank's one block passes ``barriers`` multicast barriers of the old design: one
    counter per rank that every arrival increments on every rank (``multimem.red``), and the
    target ``(counter // world + 1) * world`` from the counter read before arriving, starting
    at ``world * m`` for the last ``m`` below the wrap.  Raises Hazard if a rank passes before
    every rank arrived, or if no rank can move."""
    rng = random.Random(seed)
    counter = [world * ((U32 - 1) // world) % U32] * world
    arrived = [0] * world  # barriers each rank arrived at
    targets: list = [None] * world
    done = [0] * world
    while min(done) < barriers:
        moves = [(r, "arrive" if targets[r] is None else "pass") for r in range(world) if done[r] < barriers
                 and (targets[r] is None or reached(counter[r], targets[r]))]
        if not moves:
            raise Hazard(f"world {world}: no rank can pass (counters {counter}, targets {targets})")
        r, move = rng.choice(moves)
        if move == "arrive":
            targets[r] = (counter[r] // world + 1) * world % U32
            counter = [(v + 1) % U32 for v in counter]
            arrived[r] += 1
        else:
            if min(arrived) < arrived[r]:
                raise Hazard(f"world {world}: rank {r} passed barrier {arrived[r]} before every rank arrived")
            targets[r], done[r] = None, done[r] + 1


@pytest.mark.parametrize("world", [3, 5, 6, 7])
def test_the_old_multicast_target_breaks_across_the_wrap(world: int) -> None:
    with pytest.raises(Hazard):
        for seed in range(ROUNDS):
            old_multicast(world, 4, seed)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_old_multicast_target_held_where_world_divides_2_to_the_32(world: int) -> None:
    for seed in range(ROUNDS):
        old_multicast(world, 4, seed)
