"""Issue 51 item 1: the dispatch sends each token's row once per destination rank with >= 1 of
its entries (:class:`collectives.moe.Wire`: its header names the entries it carries), and the
receiver places every entry as the per-entry rows were placed: the same expert rows, counts,
drops and handle.  A simulated world on the CPU (:mod:`tests.collectives.test_moe_world`'s),
the library's own steps (:func:`collectives.moe.dispatch_with`), routings that name 1, some and
all ranks, experts named twice, ids out of range and experts past their capacity, at W = 2, 3, 4,
bf16 and fp8, both modes: checked against :mod:`collectives.reference.moe`."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
from collectives import moe  # noqa: E402
from collectives.reference.moe import expert_fn, expert_rows, reference  # noqa: E402
from tests.collectives.test_moe_world import World  # noqa: E402


def _ids(rng: random.Random, tokens: int, topk: int, experts: int, world: int) -> torch.Tensor:
    """Each token's ids: to one rank only, to some, to every rank (as far as top-k allows), with
    an expert named twice and ids out of range now and then."""
    local, rows = experts // world, []
    for _ in range(tokens):
        kind = rng.randrange(3)
        if kind == 0:  # one rank
            r = rng.randrange(world)
            row = [r * local + rng.randrange(local) for _ in range(topk)]
        elif kind == 1:  # every rank first
            row = [(q % world) * local + rng.randrange(local) for q in range(topk)]
        else:
            row = [rng.randrange(experts) for _ in range(topk)]
        if rng.random() < 0.3:
            row[rng.randrange(topk)] = rng.choice([-1, -5, experts, experts + 2])
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64).view(tokens, topk)


def _pairs(ids: torch.Tensor, experts: int, world: int) -> list[int]:
    """Distinct (token, rank) pairs of in-range entries, per rank."""
    local = experts // world
    pairs = {(t, int(e) // local) for t, row in enumerate(ids.tolist()) for e in row if 0 <= e < experts}
    return [sum(1 for _, r in pairs if r == q) for q in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("mode", moe.MODES)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_a_row_per_token_and_rank_placed_as_the_entries(world: int, mode: str, fp8: bool) -> None:
    rng = random.Random(world * 10 + fp8)
    for seed in range(2):
        local, topk, max_tokens, hidden = rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 8]), 4, 32
        experts = world * local
        tokens = [rng.randrange(0, max_tokens + 1) for _ in range(world)]
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn((n, hidden), generator=gen).to(torch.bfloat16) for n in tokens]
        ids = [_ids(rng, n, topk, experts, world) for n in tokens]
        ws = [torch.rand((n, topk), generator=gen) for n in tokens]
        sim = World(world)
        sent: list = [None] * world

        def body(r):
            exchange = sim.exchange(r)

            def spy(out, inp, out_splits, in_splits, bounded=False):
                if in_splits is not None:  # (low latency: each chunk headed by the message's rows)
                    head = moe.header_rows(local, moe.wire(hidden, 2, fp8, topk)) if bounded else 0
                    sent[r] = [int(v) - head for v in in_splits]
                return exchange(out, inp, out_splits, in_splits, **({"bounded": True} if bounded else {}))

            ex, counts, handle = moe.dispatch_with(spy, world, xs[r], ids[r], ws[r], experts, max_tokens, mode,
                                                   fp8=fp8)
            back = torch.empty(ex.shape, dtype=torch.bfloat16)
            flat = ex.view(-1, hidden) if mode == "throughput" else ex
            values = (flat.float() * (handle.scales.reshape(flat.shape[:-1])[..., None])).to(torch.bfloat16) \
                if fp8 else flat
            starts = torch.cumsum(counts, 0) - counts
            for le in range(local):
                rows = values[int(starts[le]):int(starts[le] + counts[le])] if mode == "throughput" else values[le]
                out = expert_fn(rows, r * local + le)
                if mode == "throughput":
                    back[int(starts[le]):int(starts[le] + counts[le])] = out
                else:
                    back[le] = out
            return ex, counts, handle, moe.combine_with(exchange, back, handle)

        results = sim.run(body)
        assert sent == [_pairs(i, experts, world) for i in ids], "the rows sent are not one per (token, rank)"
        capacity = world * max_tokens
        quantized = [moe.quantize(x) for x in xs]
        for r, (ex, counts, handle, out) in enumerate(results):
            dropped = int(((ids[r] < 0) | (ids[r] >= experts)).sum())
            lost = 0
            starts = torch.cumsum(counts, 0) - counts
            for le in range(local):
                e = r * local + le
                want = expert_rows(e, [q.view(torch.uint8) for q, _ in quantized] if fp8 else xs, ids)
                n = want.shape[0]
                assert int(counts[le]) == n
                kept = n if mode == "throughput" else min(n, capacity)
                lost += n - kept
                got = ex[int(starts[le]):int(starts[le]) + n] if mode == "throughput" else ex[le][:kept]
                assert torch.equal(got.contiguous().view(torch.uint8), want[:kept].view(torch.uint8)), (r, le)
                if fp8:
                    scales = handle.scales[int(starts[le]):int(starts[le]) + n] if mode == "throughput" \
                        else handle.scales[le][:kept]
                    want_scales = expert_rows(e, [s[:, None] for _, s in quantized], ids)[:kept, 0]
                    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
            assert int(handle.dropped) == dropped + lost
            if not fp8 and lost == 0:  # every entry came back: the reference's sums, bit for bit
                _, outs = reference(world, experts, xs, ids, ws)
                assert torch.equal(out.view(torch.int16), outs[r].view(torch.int16)), r


@pytest.mark.parametrize("exact", [False, True])
def test_a_placement_of_no_arrived_rows_keeps_no_entry(exact: bool) -> None:
    """:func:`collectives.moe.place_rows` given no rows (room for entries, none arrived; low
    latency: each source's region but its message): every entry unkept, placed at the trash row,
    no expert counted (it indexed an empty tensor)."""
    from collectives.moe import header_rows, place_rows, wire

    world, local, capacity, room = 2, 3, 4, 6
    layout = wire(8, 2, False, 2)
    counts = torch.zeros((world, local + 1), dtype=torch.int64)
    rows_out = 0 if exact else local * capacity
    received = torch.zeros((0 if exact else world * header_rows(local, layout), layout.bytes), dtype=torch.uint8)
    out = place_rows(counts, received, room, rows_out, capacity, exact, layout=layout)
    _, place, kept, expert_counts = out[:4]
    assert not kept.any() and (place == rows_out).all() and not expert_counts.any()
