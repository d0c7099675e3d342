"""CPU tests of the bounded plan cache and staging pool (collectives/staging.py), with a fake
symmetric-memory context that logs every collective operation."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from collectives.config import PLAN_CACHE_SIZE  # noqa: E402
from collectives.runtime.staging import STAGING_MIN_BYTES, PlanCache, StagingPool, capacity  # noqa: E402


@dataclass
class FakePlan:
    holds: tuple[int, ...] = ()
    uses: tuple[int, ...] = ()
    alive: tuple = ()
    used = False


class FakeCtx:
    """Allocations are CPU tensors (``meta`` would share addresses); ``others_captured`` is
    what the other ranks answer to :meth:`agree_any`."""

    def __init__(self, others_captured: bool = False) -> None:
        self.log: list[tuple] = []
        self.live: dict[int, torch.Tensor] = {}
        self.others_captured = others_captured

    def empty(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(n, dtype=dtype)
        self.live[t.data_ptr()] = t
        self.log.append(("empty", n))
        return t

    def free(self, t: torch.Tensor) -> None:
        self.log.append(("free", t.numel()))
        del self.live[t.data_ptr()]

    def host_barrier(self) -> None:
        self.log.append(("host_barrier",))

    def agree_any(self, flag: bool) -> bool:
        self.log.append(("agree_any",))
        return flag or self.others_captured


def pool(ctx: FakeCtx | None = None) -> tuple[StagingPool, PlanCache]:
    ctx = ctx or FakeCtx()
    plans = PlanCache()
    staging = StagingPool(ctx, plans, lambda slot, n: ctx.log.append(("agree", slot, n)))
    return staging, plans


def test_plan_cache_evicts_least_recently_used() -> None:
    cache = PlanCache(capacity=3)
    for k in "abc":
        cache[k] = FakePlan()
    assert cache.get("a") is not None  # a is now the most recent
    cache["d"] = FakePlan()
    assert cache.get("b") is None and len(cache) == 3
    assert all(cache.get(k) is not None for k in "acd")


def test_plan_cache_keeps_a_new_plan_over_plans_launched_before() -> None:
    """Past the capacity with every plan launched since the last sweep, the oldest goes, never
    the plan just cached (not launched yet), and the marks are cleared: the next eviction is
    of the next oldest at once."""
    cache = PlanCache(capacity=3)
    for k in "abc":
        cache[k] = FakePlan()
        cache.get(k)  # (as a launch marks it)
    cache["d"] = FakePlan()
    assert list(cache._plans) == ["b", "c", "d"] and not any(p.used for p in cache._plans.values())
    cache["e"] = FakePlan()
    assert list(cache._plans) == ["c", "d", "e"]


def test_plan_cache_is_bounded_by_default() -> None:
    cache = PlanCache()
    for i in range(10 * PLAN_CACHE_SIZE):
        cache[("all_reduce", i)] = FakePlan()
    assert len(cache) == PLAN_CACHE_SIZE
    assert cache.get(("all_reduce", 10 * PLAN_CACHE_SIZE - 1)) is not None


@pytest.mark.parametrize(("nbytes", "want"), [(1, STAGING_MIN_BYTES), (STAGING_MIN_BYTES, STAGING_MIN_BYTES),
                                              (STAGING_MIN_BYTES + 1, 2 * STAGING_MIN_BYTES), (5 << 20, 8 << 20)])
def test_capacity_is_the_next_power_of_two(nbytes: int, want: int) -> None:
    assert capacity(nbytes) == want


def test_growth_frees_the_superseded_buffer_after_a_host_barrier_and_drops_its_plans() -> None:
    ctx = FakeCtx()
    staging, plans = pool(ctx)
    small = staging.get(1000, 2)
    plans["small"] = FakePlan((small.data_ptr(),))
    plans["other"] = FakePlan()
    assert staging.get(STAGING_MIN_BYTES, 2) is small  # fits: no allocation
    big = staging.get(3 << 20, 2)
    assert big.numel() == 4 << 20
    assert ctx.log == [("agree", 2, STAGING_MIN_BYTES), ("empty", STAGING_MIN_BYTES), ("agree", 2, 4 << 20),
                       ("agree_any",), ("host_barrier",), ("free", STAGING_MIN_BYTES), ("empty", 4 << 20)]
    assert plans.get("small") is None and plans.get("other") is not None


@pytest.mark.parametrize("mine", [True, False])
def test_a_buffer_a_graph_may_use_on_any_rank_is_never_freed(mine: bool) -> None:
    ctx = FakeCtx(others_captured=not mine)
    staging, plans = pool(ctx)
    small = staging.get(1000, 0)
    plans["captured"] = FakePlan((small.data_ptr(),))
    if mine:
        staging.capture((small.data_ptr(),))
    staging.get(2 << 20, 0)
    assert ("free", STAGING_MIN_BYTES) not in ctx.log
    # Kept for the graphs, but no plan may use it again: the next eager call plans on the new
    # buffer on every rank (test_plan_pinning.py: one rank's plan-cache hit moved its data
    # through the old buffer while the others used the new one).
    assert staging.pinned == [small] and plans.get("captured") is None


def test_collective_operations_do_not_depend_on_plan_cache_hits() -> None:
    """Two ranks with the same sizes but different addresses (so different hits and
    evictions) allocate and free the same buffers in the same order."""
    rng = random.Random(0)
    sizes = [rng.choice([64, 4096, 1 << 20, 3 << 20, 9 << 20, 40 << 20]) for _ in range(2000)]
    logs = []
    for rank in range(2):
        ctx = FakeCtx()
        staging, plans = pool(ctx)
        plans.capacity = 8
        rng = random.Random(rank)
        for n in sizes:
            key = (n, rng.randrange(4 if rank else 64))  # rank 1 hits far more often
            if plans.get(key) is None:
                for which in (0, 1):
                    buf = staging.get(n, which)
                plans[key] = FakePlan((buf.data_ptr(),))
        logs.append(ctx.log)
        assert len(ctx.live) == 2
        assert staging.live_bytes == 2 * capacity(max(sizes))
    assert logs[0] == logs[1]


def test_heap_stays_bounded_over_growing_sizes() -> None:
    ctx = FakeCtx()
    staging, _ = pool(ctx)
    for n in range(1, 1 << 26, 1 << 16):
        staging.get(n, 2)
    assert len(ctx.live) == 1 and staging.live_bytes == 1 << 26
    assert sum(1 for op in ctx.log if op[0] == "empty") == 7  # 1 MB .. 64 MB
    assert [op[0] for op in ctx.log if op[0] in ("agree", "empty")] == ["agree", "empty"] * 7  # agreed first
