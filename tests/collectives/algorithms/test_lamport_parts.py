"""Lamport's fixed parts on any grid (pure Python): block ``b`` of a grid of ``G`` runs parts
``b, b + G, ...`` of :data:`~collectives.config.LAMPORT_BLOCKS`, sending all of them before it
waits for any (:meth:`collectives.algorithms.lamport.LamportKernel.kernel`).  A model of the
blocks' steps under random interleavings: every part is covered once, and every grid finishes,
even grids that differ across ranks (a block that waited for a part before sending it would
not)."""

from __future__ import annotations

import random

import pytest

from collectives.config import LAMPORT_BLOCKS


def parts(block: int, grid: int) -> list[int]:
    return list(range(block, LAMPORT_BLOCKS, grid))


def program(block: int, grid: int, sends_first: bool):
    """A block's steps, ("send", part) or ("wait", part): the kernel's (``sends_first``), or
    each part waited for before it is sent (a broken order, to see the model fail)."""
    mine = parts(block, grid)
    if sends_first:
        return [("send", p) for p in mine] + [("wait", p) for p in mine]
    return [step for p in mine for step in (("wait", p), ("send", p))]


def run(grids: list[int], sends_first: bool, seed: int) -> bool:
    """Whether every block of every rank (rank ``r`` on ``grids[r]`` blocks, all resident)
    finishes; a part's wait needs that part sent by every rank."""
    rng = random.Random(seed)
    sent = [set() for _ in grids]
    blocks = [(r, program(b, g, sends_first)) for r, g in enumerate(grids) for b in range(g)]
    pcs = [0] * len(blocks)
    while True:
        ready = []
        for i, (r, steps) in enumerate(blocks):
            if pcs[i] < len(steps):
                kind, p = steps[pcs[i]]
                if kind == "send" or all(p in s for s in sent):
                    ready.append(i)
        if not ready:
            return all(pc == len(steps) for pc, (_, steps) in zip(pcs, blocks))
        i = rng.choice(ready)
        r, steps = blocks[i]
        kind, p = steps[pcs[i]]
        if kind == "send":
            sent[r].add(p)
        pcs[i] += 1


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("grid", [1, 3, 8, 99, LAMPORT_BLOCKS])
def test_every_part_of_every_rank_is_covered_once(world: int, grid: int) -> None:
    covered = sorted(p for b in range(grid) for p in parts(b, grid))
    assert covered == list(range(LAMPORT_BLOCKS))
    for seed in range(3):
        assert run([grid] * world, sends_first=True, seed=seed)


@pytest.mark.parametrize("grids", [[128, 1], [99, 128, 64], [8, 16, 3, 128], [5] * 7 + [6]])
def test_sending_first_finishes_even_where_grids_differ_across_ranks(grids: list[int]) -> None:
    for seed in range(5):
        assert run(grids, sends_first=True, seed=seed)


def test_a_block_that_waits_before_it_sends_never_finishes() -> None:
    assert not run([4, 4], sends_first=False, seed=0)
