"""CPU tests of the multi-node path: node boundaries and levels (collectives.symmetric.topology), the chunk
schedule, and the hierarchical composition (collectives.hierarchical) against flat collectives.

The composition runs three ways here: ranks simulated by threads with levels that exchange
through a barrier (every world/node shape, fast), and 4 processes with torch.distributed's gloo
at both levels and a forced split of 2 "nodes" of 2.  Both test the composition, not our kernels.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from tests.support.spawn_support import run_gloo

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from collectives import hierarchical  # noqa: E402
from collectives.symmetric import topology  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402
from collectives.hierarchical import PHASES, Levels, chunk_bounds, schedule  # noqa: E402

# -- node boundaries and levels ----------------------------------------------------------------


def test_node_size_sources_in_order() -> None:
    assert topology.node_size(8, {}) == 8
    assert topology.node_size(8, {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert topology.node_size(8, {"LOCAL_WORLD_SIZE": "4", "COLLECTIVES_NODE_SIZE": "2"}) == 2
    assert topology.node_size(6, {}, hosts=lambda: ["a", "a", "a", "b", "b", "b"]) == 3
    assert topology.node_size(4, {}, hosts=lambda: ["a"] * 4) == 4


@pytest.mark.parametrize("env, hosts", [
    ({"COLLECTIVES_NODE_SIZE": "3"}, None),
    ({"LOCAL_WORLD_SIZE": "0"}, None),
    ({}, ["a", "b", "a", "b"]),  # a host's ranks not consecutive
    ({}, ["a", "a", "a", "b"]),  # unequal hosts
    ({}, ["a", "a", "b", "c"]),  # the second run of two spans hosts
    ({}, ["a", "a", "b", "b", "a", "a"]),  # a host twice (its count then spans a run of another)
])
def test_uneven_nodes_are_refused(env: dict[str, str], hosts: list[str] | None) -> None:
    with pytest.raises(CollectiveError, match="equal"):
        topology.node_size(len(hosts or "abcd"), env, hosts=None if hosts is None else (lambda: hosts))


@pytest.mark.parametrize("members, size, intra", [
    ((0, 1, 2, 3), 2, ((0, 1), (2, 3))),
    (tuple(range(8)), 4, ((0, 1, 2, 3), (4, 5, 6, 7))),
    (tuple(range(8)), 2, ((0, 1), (2, 3), (4, 5), (6, 7))),
    ((0, 1, 2, 3, 4, 5), 3, ((0, 1, 2), (3, 4, 5))),
    ((0, 2, 4, 6), 4, ((0, 1), (2, 3))),  # every other GPU of 2 nodes of 4: group ranks
    ((5, 0, 4, 1), 4, ((1, 3), (0, 2))),  # a group listing its ranks out of node order
    ((0, 1, 2, 3), 1, ((0,), (1,), (2,), (3,))),
    ((0, 1, 2, 3), 4, ((0, 1, 2, 3),)),
])
def test_levels_of_a_group(members: tuple[int, ...], size: int, intra: tuple[tuple[int, ...], ...]) -> None:
    h = topology.hierarchy(members, size)
    assert h.intra == intra
    assert (h.nodes, h.local) == (len(intra), len(intra[0]))
    for n, ranks in enumerate(h.intra):
        assert {members[r] // size for r in ranks} == {sorted({g // size for g in members})[n]}
        for l, r in enumerate(ranks):
            assert h.inter[l][n] == r and h.position(r) == (n, l)
    assert sorted(r for ranks in h.intra for r in ranks) == list(range(len(members)))


def test_a_group_uneven_over_nodes_is_refused() -> None:
    with pytest.raises(CollectiveError, match="unequal numbers of ranks per node"):
        topology.hierarchy((0, 1, 2, 4), 2)


# -- the chunk schedule ------------------------------------------------------------------------


def happens_before(steps: list[hierarchical.Step]) -> list[set[int]]:
    """For each step, the steps ordered before it: earlier on its own stream, or before a
    step it waits for (transitively)."""
    before: list[set[int]] = []
    for i, s in enumerate(steps):
        hb: set[int] = set()
        for j in range(i):
            if steps[j].side == s.side:
                hb |= {j} | before[j]
        if s.after is not None:
            assert steps[s.after].side != s.side and s.after < i
            hb |= {s.after} | before[s.after]
        before.append(hb)
    return before


def check_schedule(collective: str, chunks: int, steps: list[hierarchical.Step]) -> None:
    at = {(s.phase, s.chunk): i for i, s in enumerate(steps)}
    phases = PHASES[collective]
    assert len(at) == len(steps) == chunks * len(phases), "every phase of every chunk, once"
    for i, s in enumerate(steps):
        assert s.side == phases[s.phase][1], "network phases on the side stream, NVLink on the current one"
    hb = happens_before(steps)
    for (p, k), i in at.items():
        if p:
            assert at[(p - 1, k)] in hb[i], f"phase {p} of chunk {k} may run before phase {p - 1}"
    # The pipeline: some step of chunk k and some step of chunk k + 1 on the other stream are
    # unordered (may run at once: NVLink and the network busy together).
    for k in range(chunks - 1):
        assert any(a.side != b.side and i not in hb[j] and j not in hb[i]
                   for i, a in enumerate(steps) if a.chunk == k
                   for j, b in enumerate(steps) if b.chunk == k + 1), f"chunk {k + 1} waits for all of chunk {k}"


def serial(collective: str, chunks: int) -> list[hierarchical.Step]:
    """Each chunk's phases in turn, the next chunk after them (correct, no overlap)."""
    steps: list[hierarchical.Step] = []
    for k in range(chunks):
        for p, (_, side) in enumerate(PHASES[collective]):
            wait = len(steps) - 1 if steps and steps[-1].side != side else None
            steps.append(hierarchical.Step(p, k, side, wait))
    return steps


@pytest.mark.parametrize("collective", list(PHASES))
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 7])
def test_schedule_orders_each_chunk_and_overlaps_the_levels(collective: str, chunks: int) -> None:
    check_schedule(collective, chunks, schedule(collective, chunks))


@pytest.mark.parametrize("collective", list(PHASES))
def test_schedule_check_catches_a_dropped_wait_and_a_serialised_pipeline(collective: str) -> None:
    steps = schedule(collective, 3)
    waiting = next(i for i, s in enumerate(steps) if s.after is not None)
    dropped = list(steps)
    dropped[waiting] = hierarchical.Step(steps[waiting].phase, steps[waiting].chunk, steps[waiting].side, None)
    with pytest.raises(AssertionError, match="may run before"):
        check_schedule(collective, 3, dropped)
    with pytest.raises(AssertionError, match="waits for all of chunk 0"):
        check_schedule(collective, 3, serial(collective, 3))


@pytest.mark.parametrize("n, count, quantum", [(1, 4, 8), (7, 4, 8), (64, 4, 8), (100, 3, 4), (10, 8, 1), (96, 4, 32)])
def test_chunk_bounds_cover_once_on_whole_quanta(n: int, count: int, quantum: int) -> None:
    bounds = chunk_bounds(n, count, quantum)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) <= count
    assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    assert all(b % quantum == 0 for _, b in bounds[:-1])


# -- the composition, ranks simulated by threads -----------------------------------------------


class Hub:
    """Where the members of one simulated process group meet (a barrier, bounded)."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * n

    def exchange(self, i: int, value: torch.Tensor) -> list[torch.Tensor]:
        self.slots[i] = value.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got  # type: ignore[return-value]


REDUCE = {"sum": lambda x: x.sum(0), "min": lambda x: x.amin(0), "max": lambda x: x.amax(0)}


class ThreadLevel:
    """A :class:`~collectives.hierarchical.Level` of simulated ranks: member ``i`` of ``hub``."""

    def __init__(self, hub: Hub, i: int, size: int) -> None:
        self.hub, self.i, self.size = hub, i, size

    def all_reduce(self, t: torch.Tensor, op: str) -> None:
        t.copy_(REDUCE[op](torch.stack(self.hub.exchange(self.i, t))))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
        m = out.numel()
        out.copy_(REDUCE[op](torch.stack(self.hub.exchange(self.i, inp)))[self.i * m:(self.i + 1) * m])

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.copy_(torch.cat(self.hub.exchange(self.i, inp)))


def simulate(members: tuple[int, ...], size: int, body) -> list:
    """Run ``body(levels, group_rank)`` on one thread per member; return the results by group rank."""
    h = topology.hierarchy(members, size)
    intra = [Hub(h.local) for _ in range(h.nodes)]
    inter = [Hub(h.nodes) for _ in range(h.local)]
    results: list = [None] * len(members)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        n, l = h.position(r)
        try:
            lv = Levels.of(h, ThreadLevel(intra[n], l, h.local), ThreadLevel(inter[l], n, h.nodes))
            results[r] = body(lv, r)
        except BaseException as e:  # noqa: BLE001  # reported below, with every barrier broken
            errors.append(e)
            for hub in intra + inter:
                hub.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def inputs(w: int, n: int, seed: int) -> list[np.ndarray]:
    """Integer-valued float64 inputs (exact under any order of additions)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, n).astype(np.float64) for _ in range(w)]


FLAT = {"sum": lambda xs: np.sum(xs, 0), "min": lambda xs: np.min(xs, 0), "max": lambda xs: np.max(xs, 0)}
SHAPES = [((0, 1, 2, 3), 2), (tuple(range(8)), 4), (tuple(range(8)), 2), ((0, 1, 2, 3, 4, 5), 3),
          ((5, 0, 4, 1), 4), ((0, 1, 2, 3), 1), ((0, 1, 2, 3), 4)]


@pytest.mark.parametrize("members, size", SHAPES)
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_hierarchical_all_reduce_equals_the_flat_one(members: tuple[int, ...], size: int, op: str) -> None:
    for n, chunks in ((1, 4), (37, 3), (1000, 4), (64, 1)):
        xs = inputs(len(members), n, n)
        got = simulate(members, size, lambda lv, r: hierarchical.run_all_reduce(
            lv, torch.from_numpy(xs[r].copy()).view(n), op, chunks).numpy())
        for r in range(len(members)):
            np.testing.assert_array_equal(got[r], FLAT[op](xs), err_msg=f"rank {r}, n={n}")


@pytest.mark.parametrize("members, size", SHAPES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_hierarchical_reduce_scatter_equals_the_flat_one(members: tuple[int, ...], size: int, op: str) -> None:
    w = len(members)
    for m, chunks in ((1, 4), (13, 3), (300, 4)):
        xs = inputs(w, w * m, m)

        def body(lv, r):
            out = torch.empty(m, dtype=torch.float64)
            return hierarchical.run_reduce_scatter(lv, out, torch.from_numpy(xs[r].copy()), op, chunks).numpy()

        flat = FLAT[op](xs)
        for r, got in enumerate(simulate(members, size, body)):
            np.testing.assert_array_equal(got, flat[r * m:(r + 1) * m], err_msg=f"rank {r}, m={m}")


@pytest.mark.parametrize("members, size", SHAPES)
def test_hierarchical_all_gather_equals_the_flat_one(members: tuple[int, ...], size: int) -> None:
    w = len(members)
    for m, chunks in ((1, 4), (13, 3), (300, 4)):
        xs = inputs(w, m, m)

        def body(lv, r):
            out = torch.full((w * m,), np.nan, dtype=torch.float64)
            return hierarchical.run_all_gather(lv, out, torch.from_numpy(xs[r].copy()), chunks).numpy()

        for r, got in enumerate(simulate(members, size, body)):
            np.testing.assert_array_equal(got, np.concatenate(xs), err_msg=f"rank {r}, m={m}")


def test_blocks_that_do_not_fit_the_group_are_refused() -> None:
    with pytest.raises(CollectiveError, match="4 ranks x 3"):
        simulate((0, 1, 2, 3), 2, lambda lv, r: hierarchical.run_all_gather(
            lv, torch.empty(11), torch.empty(3), 2))


# -- the composition over gloo: 4 processes, 2 forced "nodes" of 2 -----------------------------


def _forced_nodes(rank: int, world: int, out: list[str]) -> None:
    import torch.distributed as dist

    os.environ["COLLECTIVES_NODE_SIZE"] = "2"
    lv = hierarchical.levels(None, intra="torch")
    out.append(f"levels:{lv.intra.size}x{lv.inter.size}")
    for n in (1, 37, 4096 + 3):
        x = (torch.arange(n, dtype=torch.float64) * (rank + 1)) % 11 - rank
        for op, flat_op in (("sum", dist.ReduceOp.SUM), ("min", dist.ReduceOp.MIN)):
            got, want = x.clone(), x.clone()
            hierarchical.all_reduce(got, op, intra="torch")
            dist.all_reduce(want, op=flat_op)
            out.append(f"ar:{n}:{op}:{torch.equal(got, want)}")
        m = n
        inp = torch.arange(world * m, dtype=torch.float64) * (rank + 1)
        rs, rs_flat = torch.empty(m, dtype=torch.float64), torch.empty(m, dtype=torch.float64)
        hierarchical.reduce_scatter(rs, inp, intra="torch")
        dist.reduce_scatter_tensor(rs_flat, inp)
        out.append(f"rs:{n}:{torch.equal(rs, rs_flat)}")
        ag, ag_flat = torch.empty(world * m, dtype=torch.float64), torch.empty(world * m, dtype=torch.float64)
        hierarchical.all_gather(ag, x, intra="torch")
        dist.all_gather_into_tensor(ag_flat, x)
        out.append(f"ag:{n}:{torch.equal(ag, ag_flat)}")


def test_gloo_composition_over_two_forced_nodes_equals_flat(tmp_path) -> None:
    world = 4
    results = run_gloo(_forced_nodes, world, tmp_path)
    for rank in range(world):
        out = results[rank]
        assert out[0] == "levels:2x2", out
        assert len(out) == 1 + 3 * 4 and all(s.endswith("True") for s in out[1:]), out


# -- levels outliving what they run on ------------------------------------------------------------


def test_levels_made_under_another_default_process_group_are_stale() -> None:
    """After the default process group was destroyed and made anew, levels made before hold
    destroyed groups (gloo's still answer; NCCL's are aborted): stale."""
    levels = hierarchical.Levels(None, None, None, None, dist.group.WORLD)
    assert not levels.stale()
    assert hierarchical.Levels(None, None, None, None, object()).stale()


def test_levels_over_a_closed_communicator_are_built_again(monkeypatch) -> None:
    """One node of two ranks (a kernel level): once its communicator's context is closed (and
    collectives.init opens another), levels() builds new levels on a new communicator."""
    import collectives.runtime.communicator as runtime

    made = []

    def communicator(pg):
        made.append(SimpleNamespace(world=2, sms=132, ctx=SimpleNamespace(closed=False)))
        return made[-1]

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "new_group", lambda ranks, **_: SimpleNamespace(ranks=ranks))
    monkeypatch.setattr(runtime, "communicator", communicator)
    monkeypatch.setenv("COLLECTIVES_NODE_SIZE", "2")
    first = hierarchical.levels(None)
    assert hierarchical.levels(None) is first and first.intra.comm is made[0]
    made[0].ctx.closed = True
    again = hierarchical.levels(None)
    assert again is not first and again.intra.comm is made[1] and not made[1].ctx.closed
