"""WIP (issue 51 item 1), not yet the library's: the rank-rows dispatch's host plan, checked
against today's per-entry placement.  A source sends one row per (token, destination rank) with
>= 1 of the token's entries, each with a header: for each of the token's entries to that rank
(ascending k) its index ``j`` in today's per-entry stream to it (its sorted position ``slots[i]``
less the rank's first).  The receiver places entry ``start[source] + j`` by today's rule
(:func:`collectives.moe.place_rows`, :mod:`collectives.algorithms.moe_place`'s ``where``): the
same places, kept flags, expert rows, counts, drops and entry splits, so that the handle and the
combine stay as they are.  The rows' order is then free (the header alone places): token order
here, any dense deterministic order in the kernels."""

from __future__ import annotations

import pytest
import torch

from collectives.moe import inverse, place_rows, route_ids

Placed = tuple[torch.Tensor, ...]


def _entry_rows(xs: list[torch.Tensor], ids: list[torch.Tensor], experts: int, world: int, capacity: int,
                exact: bool) -> list[tuple[Placed, int]]:
    """Today's dispatch on each rank: a row per entry, sorted by expert; placed; with its rows' count."""
    local = experts // world
    routed = [route_ids(i, experts, world) for i in ids]
    out = []
    for r in range(world):
        rows, counts = [], []
        for s, (order, _, bins, send, _) in enumerate(routed):
            start, n = int(send[:r].sum()), int(send[r])
            rows.append(xs[s][order[start:start + n] // ids[s].shape[1]])
            counts.append(bins[r * local:(r + 1) * local])
        received = torch.cat(rows)
        room = torch.zeros(max(received.shape[0], 1), xs[0].shape[1], dtype=xs[0].dtype)
        room[:received.shape[0]] = received
        out.append((place_rows(torch.stack(counts), room, received.shape[0] if exact else local * capacity,
                               capacity, exact), received.shape[0]))
    return out


def _rank_rows(xs: list[torch.Tensor], ids: list[torch.Tensor], experts: int, world: int, capacity: int,
               exact: bool) -> list[tuple[Placed, int]]:
    """The rank-rows dispatch on each rank: (expert rows, place, kept, expert counts, dropped, entry
    splits) and the rows that arrived."""
    local = experts // world
    sent, bins_of = [], []  # per source: per rank its rows as (token values, header)
    for x, i in zip(xs, ids):
        tokens, topk = i.shape
        order, _, bins, send, _ = route_ids(i, experts, world)
        slots, first = inverse(order), torch.cumsum(send, 0) - send
        expert = i.reshape(-1).clamp(-1, experts).remainder(experts + 1)
        per_rank: list[list[tuple[torch.Tensor, list[int]]]] = [[] for _ in range(world)]
        for t in range(tokens):
            header: dict[int, list[int]] = {}
            for k in range(topk):
                e = int(expert[t * topk + k])
                if e < experts:
                    header.setdefault(e // local, []).append(int(slots[t * topk + k]) - int(first[e // local]))
            for r, js in header.items():
                per_rank[r].append((x[t], js))
        sent.append(per_rank)
        bins_of.append(bins)
    out = []
    for r in range(world):
        counts = torch.stack([b[r * local:(r + 1) * local] for b in bins_of])
        entries = int(counts.sum())
        rows_out = entries if exact else local * capacity
        # each entry's place by today's rule (a received buffer of no values: the places only)
        _, place, kept, expert_counts, dropped, _, splits = place_rows(counts, torch.zeros(max(entries, 1), 1),
                                                                       rows_out, capacity, exact)
        expert_x = torch.zeros(rows_out + 1, xs[0].shape[1], dtype=xs[0].dtype)
        start = torch.cumsum(counts.sum(1), 0) - counts.sum(1)
        arrived, seen = 0, []
        for s in range(world):
            for row, js in sent[s][r]:
                arrived += 1
                for j in js:
                    e = int(start[s]) + j
                    seen.append(e)
                    if kept[e]:
                        expert_x[place[e]] = row
        assert sorted(seen) == list(range(entries)), "the headers' entries are not each entry once"
        out.append(((expert_x, place, kept, expert_counts, dropped, splits), arrived))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_rank_rows_place_every_entry_as_the_entry_rows_do(world: int, exact: bool, seed: int) -> None:
    topk, experts, tokens = (1, 2, 8)[seed % 3], world * (1, 2, 4)[seed % 3], 5 + seed
    capacity = (0 if exact else 3) + seed
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(tokens, 16, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.randint(-1, experts + 1, (tokens, topk), generator=g) for _ in range(world)]  # repeats, out of range
    for ((ex, place, kept, counts, dropped, _, splits), entries), ((ex2, place2, kept2, counts2, dropped2, splits2),
                                                                  rows) in zip(
            _entry_rows(xs, ids, experts, world, capacity, exact), _rank_rows(xs, ids, experts, world, capacity, exact)):
        assert torch.equal(place[:entries], place2[:entries]) and torch.equal(kept[:entries], kept2[:entries])
        assert torch.equal(counts, counts2) and int(dropped) == int(dropped2) and torch.equal(splits, splits2)
        placed = place[:entries][kept[:entries]]
        assert torch.equal(ex[placed].view(torch.int16), ex2[placed].view(torch.int16))
        assert rows <= entries
