"""The bounded all-to-all (:attr:`collectives.algorithms.all_to_all.AllToAllKey.bounded`) as the
kernel's own source runs it in the device simulation (:mod:`test_all_to_all_source`'s world):
each receiver's output is cut in ``world`` slots of whole rows, the senders' sizes travel with
their ``arrived`` and land in the receiver's ``out_splits``.

Judged against the host model (:func:`collectives.layouts.slot`,
:func:`~collectives.layouts.judge_within`): a chunk at most the slot is delivered into its
source's slot bit for bit and its rows recorded; a chunk above it fails its pair on both ends
as a size mismatch (never a timeout), stores nothing and records 0 rows; no byte outside a
delivered chunk changes, and the next call passes.
"""

from __future__ import annotations

import random

import pytest

from tests.collectives.device.test_all_to_all_source import (
    CANARY,
    SEEDS,
    U32,
    Side,
    World,
    kernels,
    source_byte,
)

from collectives import layouts as model
from collectives.config import CALL_EPOCHS
from collectives.layouts import MAX_CHUNK, RECOVERABLE_RECORD, SIZE_MISMATCH

SOURCE = kernels()


def bounded(in_splits: list, slot: int, world: int, **kw) -> Side:
    """A rank of a bounded call: its splits, ``slot`` rows from each source at most."""
    return Side(in_splits, [slot] * world, bounded=True, **kw)


def fits(call: list, s: int, r: int) -> bool:
    """Whether sender ``s``'s chunk for ``r`` moves, as the host model judges both words."""
    send, recv = call[s], call[r]
    sent = model.chunk(send.in_splits, r, send.in_rows * send.row, send.row)[2]
    slot = model.slot(recv.out_rows * recv.row, recv.row, len(call))
    calls = 0  # the words' judging does not depend on the count
    ready = model.judge_within(model.pack(slot, calls + 1), calls, sent, MAX_CHUNK)
    arrived = model.judge_within(model.pack(sent, calls + 1), calls, 0, slot)
    return ready == arrived == 0 if s != r else sent <= slot


def check(world: World) -> None:
    """Every bounded call of every rank as the host model says."""
    W = world.world
    for c, call in enumerate(world.calls):
        for r in range(W):
            side = call[r]
            e = side.bytes
            slot = model.slot(side.out_rows * side.row, side.row, W)
            out, allocation, at = world.outputs[r][c]
            want, rows = bytearray([CANARY] * len(out)), []
            for s in range(W):
                sender = call[s]
                ok = fits(call, s, r)
                rows.append(sender.in_splits[r] if ok else 0)
                if ok:
                    from_at, count, _ = model.chunk(sender.in_splits, r, sender.in_rows * sender.row, sender.row)
                    begin = s * slot
                    want[begin * e:(begin + count) * e] = bytes(source_byte(s, c, from_at * e + b)
                                                                for b in range(count * e))
            assert out == bytes(want), f"rank {r} call {c}: out {list(out)} != {list(want)}"
            assert world.received[r][c] == rows, f"rank {r} call {c}: rows {world.received[r][c]} != {rows}"
            if allocation:
                beyond = allocation[:at] + allocation[at + len(out) - 8:]
                assert set(beyond) <= {CANARY}, f"rank {r} call {c}: its allocation was written outside out"
            failed = any(not fits(call, s, r) or not fits(call, r, s) for s in range(W))
            want_records = {(c, RECOVERABLE_RECORD, SIZE_MISMATCH)} if failed else set()
            got = {x for x in world.statuses(r) if x[0] == c}
            assert got == want_records, (r, c, world.records)
    assert world.counts() == {(world.start + len(world.calls) * CALL_EPOCHS) % U32}


def under_and_exact(source) -> None:
    """Senders of 0 rows up to the whole slot, staged and direct (at different places of the
    allocations), f32 and bf16, across the 2^32 wrap: every chunk in its slot, its rows
    recorded, nothing else written."""
    for seed in SEEDS:
        rng = random.Random(seed)
        world, slot, calls = 2 + seed % 2, 3, []
        for c in range(3):
            dtype, direct = rng.choice(["f32", "bf16"]), c % 2 == 1
            calls.append([bounded([rng.choice([0, 1, slot]) for _ in range(world)], slot, world, dtype=dtype,
                                  direct=direct, offset=16 * rng.choice([0, 1]) + 8 * c) for _ in range(world)])
        calls.append([bounded([slot] * world, slot, world) for _ in range(world)])  # every slot full
        check(World(calls, seed, start=U32 - 2 * CALL_EPOCHS, source=source))


def over_the_bound(source) -> None:
    """Rank 0 sends rank 1 a row more than its slot (staged, then direct): that pair fails on
    both ends, nothing of it lands (no overrun into the next slot or past the output), 0 rows
    are recorded for it; the other pairs deliver and the next call passes."""
    for seed in SEEDS:
        for direct in (False, True):
            good = [bounded([1, 2], 2, 2, direct=direct), bounded([2, 0], 2, 2, direct=direct)]
            bad = [bounded([1, 3], 2, 2, in_rows=4, direct=direct), bounded([2, 0], 2, 2, direct=direct)]
            check(World([good, bad, good], seed, source=source))


def over_its_own_slot(source) -> None:
    """Rank 0's chunk to itself is a row past its slot: recorded as a size mismatch, not
    copied, 0 rows; the pairs with rank 1 deliver."""
    for seed in SEEDS:
        calls = [[bounded([3, 1], 2, 2, direct=True), bounded([1, 1], 2, 2, direct=True)]]
        check(World(calls, seed, source=source))


def test_chunks_under_or_at_the_bound_land_in_their_slots_with_their_rows() -> None:
    under_and_exact(SOURCE)


def test_a_chunk_over_the_bound_fails_both_ends_and_stores_nothing() -> None:
    over_the_bound(SOURCE)


def test_an_own_chunk_over_its_slot_is_refused() -> None:
    over_its_own_slot(SOURCE)


#: Edits of the bounded paths (module, old text, new text), and the check that catches each.
MUTATIONS = {
    "no bound on either end": (
        "exchange", "elif size < low or size > high or size == Uint32(REFUSED):", "elif size == Uint32(REFUSED):",
        over_the_bound),
    "the sender trusts the slot": (
        "all_to_all", "send_size, Uint32(MAX_CHUNK), deadline)", "Uint32(0), Uint32(MAX_CHUNK), deadline)",
        over_the_bound),
    "the rows not recorded": (
        "all_to_all", "record_rows(args.out_splits, sender, rows)", "pass", under_and_exact),
    "the slot's size recorded, not the sender's": (
        "all_to_all", "got = Int64(sent)", "got = Int64(recv_size)", under_and_exact),
    "the own chunk copied past its slot": (
        "all_to_all", "fits = send_size <= recv_size", "fits = True", over_its_own_slot),
    "the staged copy-out of the whole slot": (
        "all_to_all", "recv_n = shared[3]", "recv_n = recv_n", under_and_exact),
    "slots one row short": (
        "all_to_all", "return Int64(peer) * size, size, Uint32(size)",
        "return Int64(peer) * size, size - row, Uint32(size - row)", under_and_exact),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_of_the_bounded_paths_fails_its_check(name: str) -> None:
    module, old, new, run = MUTATIONS[name]
    with pytest.raises((AssertionError, RuntimeError)):
        run(kernels({module: ((old, new),)}))
