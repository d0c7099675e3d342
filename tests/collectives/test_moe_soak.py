"""The MoE soak's cases and checks (collectives.tools.moe_soak) over a simulated world on the CPU
(tests/collectives/test_moe_world.py's): every case is right there, and a layer that gets a row,
a count or an output wrong fails the soak at that call."""

from __future__ import annotations

import argparse
import random

import pytest

torch = pytest.importorskip("torch")
from collectives import moe  # noqa: E402
from collectives.tools import moe_soak  # noqa: E402
from tests.collectives.test_moe_world import World  # noqa: E402


class SimulatedLayer(moe_soak.Layer):
    """A rank's dispatch and combine over ``sim``'s all-to-all (the reference's), on the CPU;
    ``spoil(step, result)``: this rank's results changed (a fault the soak must find)."""

    device = torch.device("cpu")

    def __init__(self, sim: World, rank: int, spoil=None) -> None:
        self.exchange, self.world, self.spoil = sim.exchange(rank), sim.world, spoil
        self.dispatches = 0

    def dispatch(self, x, ids, weights, experts, case):
        self.dispatches += 1
        result = moe.dispatch_with(self.exchange, self.world, x, ids, weights, experts, case.max_tokens, case.mode,
                                   fp8=case.fp8)
        return self.spoil("dispatch", result) if self.spoil else result

    def combine(self, rows, handle):
        out = moe.combine_with(self.exchange, rows, handle)
        return self.spoil("combine", out) if self.spoil else out

    def synchronize(self) -> None:
        pass

    def allocator_calls(self) -> dict[str, int]:
        """A stand-in: one "cudaMalloc" per dispatch."""
        return {"cudaMalloc": self.dispatches}


def soak(world: int, calls: int, seed: int = 0, spoil=None, spoiled_rank: int = 1) -> list[dict]:
    """Every rank's stats after ``calls`` eager cases of ``seed`` (``spoil``: on ``spoiled_rank``)."""
    sim = World(world)
    args = argparse.Namespace(calls=calls, seconds=600.0, seed=seed, graph_fraction=0.0, trace_allocations=False)

    def body(rank: int) -> dict:
        layer = SimulatedLayer(sim, rank, spoil if rank == spoiled_rank else None)
        s = moe_soak.Soak(rank, world, args, layer)
        assert s.run() == 0
        return s.stats

    return sim.run(body)


@pytest.mark.parametrize("world", [2, 3])
def test_every_case_of_the_soak_is_right_over_the_reference_all_to_all(world: int) -> None:
    stats = soak(world, calls=60, seed=world)
    assert all(s["eager"] == 60 for s in stats)
    # The draws cover what the soak promises: throughput mode, fp8 rows, out-of-range ids (rank 0).
    assert stats[0]["throughput"] and stats[0]["fp8"] and stats[0]["dropped"]


def _corrupt_first_row(step, result):
    if step == "combine":
        if result.numel():
            result = result.clone()
            result.view(-1)[0] += 1
        return result
    return result


def _miscount(step, result):
    if step != "dispatch":
        return result
    ex, counts, handle = result
    handle.dropped = handle.dropped + 1
    return ex, counts, handle


def _swap_rows(step, result):
    if step != "dispatch":
        return result
    ex, counts, handle = result
    flat = ex.view(-1, ex.shape[-1])
    if int(counts.sum()) >= 2 and not torch.equal(flat[0], flat[1]):
        flat[[0, 1]] = flat[[1, 0]]
    return ex, counts, handle


@pytest.mark.parametrize(("spoil", "message", "world"), [(_corrupt_first_row, "combine output differs", 2),
                                                         (_miscount, "rank 1 dropped 1 entries, not 0", 2),
                                                         (_swap_rows, "rows differ", 1)])
def test_a_wrong_row_count_or_output_fails_the_soak(spoil, message: str, world: int) -> None:
    """(Swapped rows: in a world of one rank, else another rank's combine, which gets the
    spoiled rows back, may raise first.)"""
    with pytest.raises(AssertionError, match=message) as info:
        soak(world, calls=30, seed=7, spoil=spoil, spoiled_rank=world - 1)
    assert any(n.startswith("[moe soak] rank ") and " at call " in n and "Case(" in n for n in info.value.__notes__)
    # and the allocator's calls into CUDA during that call (here a stand-in's: one per dispatch)
    assert any(n.endswith("(every rank's): cudaMalloc 1") for n in info.value.__notes__), info.value.__notes__


def test_every_rank_draws_the_same_cases_and_graph_cases_have_fixed_shapes() -> None:
    a, b = random.Random(5), random.Random(5)
    cases = [moe_soak.draw(a, 4, 0.5) for _ in range(200)]
    assert cases == [moe_soak.draw(b, 4, 0.5) for _ in range(200)]
    graphs = [c for c in cases if c.graph]
    assert graphs and all(c.mode == "low_latency" and not c.fp8 and c.tokens == (c.max_tokens,) * 4 for c in graphs)
    assert {c.shape for c in graphs} <= {moe_soak.Case("low_latency", *s, ()).shape for s in moe_soak.GRAPH_SHAPES}
    assert all(c.topk <= c.local * 4 and max(c.tokens) <= c.max_tokens for c in cases)
    assert all(c.bad <= c.tokens[0] * c.topk for c in cases)
