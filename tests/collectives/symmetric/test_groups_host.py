"""CPU tests of sub-group communicators (collectives.symmetric.groups, bootstrap.init(group=...),
runtime.communicator.communicator(group), the API's group=): the pool's group-collective allocation, the
rank -> PE maps, the registry of contexts per group and dispatch by group.

nvshmem is a fake heap (tests/collectives/symmetric/test_symmetric_host.py); the process groups are real
(torch.distributed over gloo, 4 processes)."""

from __future__ import annotations

import os

import pytest
from tests.support.spawn_support import run_gloo

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from collectives.symmetric import groups  # noqa: E402
from collectives.errors import CollectiveError, MulticastUnavailable, SymmetricMemoryError  # noqa: E402
from collectives.symmetric.groups import PoolHeap, Ranges, common_fit  # noqa: E402

# -- free ranges and the common first fit ------------------------------------------------------


def test_ranges_take_give_and_merge() -> None:
    r = Ranges(100)
    r.take(0, 16)
    r.take(32, 48)
    assert r.free == [(16, 32), (48, 100)] and r.used == 32
    r.give(0, 16)
    assert r.free == [(0, 32), (48, 100)]
    r.give(32, 48)
    assert r.free == [(0, 100)] and r.used == 0
    with pytest.raises(SymmetricMemoryError, match="freed twice"):
        r.give(10, 20)
    r.take(40, 60)
    with pytest.raises(SymmetricMemoryError, match="not free"):
        r.take(50, 70)


def test_common_fit_is_the_first_range_free_on_every_member() -> None:
    assert common_fit([[(0, 100)], [(0, 100)]], 100) == 0
    assert common_fit([[(0, 30), (50, 100)], [(20, 80)]], 25) == 50  # (20, 30) too small
    assert common_fit([[(0, 30), (50, 100)], [(20, 80)]], 31) is None
    assert common_fit([[(0, 64)], [(0, 16), (32, 64)], [(0, 48)]], 16) == 0
    assert common_fit([[(0, 64)], [(16, 64)], [(0, 48)]], 16) == 16


RANKS = 4
GROUPS = [(0, 1), (2, 3), (0, 1, 2, 3), (0, 2), (1, 3), (3, 1, 0)]
POOL = 1 << 12


class Job:
    """Every rank's pool share (CPU tensors) and free ranges; group allocations made by every
    member in turn from one snapshot of the members' free lists (the all-gather)."""

    def __init__(self) -> None:
        self.pools = [torch.zeros(POOL, dtype=torch.uint8) for _ in range(RANKS)]
        self.ranges = [Ranges(POOL) for _ in range(RANKS)]
        self.live: list[tuple[tuple[int, ...], list[torch.Tensor]]] = []

    def heap(self, members: tuple[int, ...], me: int, snapshot: list) -> PoolHeap:
        return PoolHeap(self.pools[me], [self.pools[m] for m in members], self.ranges[me],
                        lambda _: snapshot, lambda: None)

    def alloc(self, members: tuple[int, ...], nbytes: int) -> bool:
        snapshot = [list(self.ranges[m].free) for m in members]
        try:
            raws = [self.heap(members, m, snapshot).alloc(nbytes) for m in members]
        except SymmetricMemoryError as e:
            assert "no" in str(e) and "free on every member" in str(e)
            return False
        offsets = {raw.data_ptr() - self.pools[m].data_ptr() for m, raw in zip(members, raws, strict=True)}
        assert len(offsets) == 1, "a group allocation must sit at one offset on every member"
        (offset,) = offsets
        for i, m in enumerate(members):
            heap = self.heap(members, m, snapshot)
            for j, other in enumerate(members):  # group rank j's view: the pool at its PE, same offset
                assert heap.peer(raws[i], j).data_ptr() == self.pools[other].data_ptr() + offset
        self.live.append((members, raws))
        return True

    def free(self, index: int) -> None:
        members, raws = self.live.pop(index)
        for m, raw in zip(members, raws, strict=True):
            self.heap(members, m, []).free(raw)

    def check_disjoint(self) -> None:
        for rank in range(RANKS):
            spans = sorted((raw.data_ptr(), raw.data_ptr() + raw.numel())
                           for members, raws in self.live for m, raw in zip(members, raws, strict=True) if m == rank)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"rank {rank}: live allocations overlap"
            assert self.ranges[rank].used == sum(e - s for s, e in spans)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, len(GROUPS) - 1), st.integers(1, 64)), max_size=40))
def test_group_allocations_over_overlapping_groups_never_collide(ops) -> None:
    job = Job()
    for alloc, g, size in ops:
        if alloc or not job.live:
            job.alloc(GROUPS[g], 16 * size)
        else:
            job.free(g % len(job.live))
        job.check_disjoint()
    while job.live:
        job.free(0)
    assert all(r.free == [(0, POOL)] for r in job.ranges)


def test_pool_heap_peer_views_and_refusals() -> None:
    job = Job()
    members = (3, 1)
    assert job.alloc(members, 64)
    raws = job.live[0][1]
    heap = job.heap(members, 3, [])
    off = raws[0].data_ptr() - job.pools[3].data_ptr()
    for i, m in enumerate(members):  # group rank i's view: the pool at its PE, same offset
        view = heap.peer(raws[0], i)
        assert view.data_ptr() == job.pools[m].data_ptr() + off and view.numel() == 64
    with pytest.raises(MulticastUnavailable, match="sub-group"):
        heap.multicast(raws[0])
    assert not job.alloc(members, 2 * POOL)  # exhausted: a clear error, on every member alike


def test_pe_map_and_its_refusals() -> None:
    assert groups.pe_map((2, 3), range(4), 3) == [2, 3]
    assert groups.pe_map((6, 4), (4, 5, 6, 7), 4) == [2, 0]  # a node's base context: global 4.. = PE 0..
    with pytest.raises(CollectiveError, match="not in the group"):
        groups.pe_map((0, 1), range(4), 2)
    with pytest.raises(CollectiveError, match="twice"):
        groups.pe_map((0, 0), range(4), 0)
    with pytest.raises(CollectiveError, match="outside this NVLink domain"):
        groups.pe_map((3, 4), range(4), 3)
    with pytest.raises(CollectiveError, match="2 or more"):
        groups.pe_map((1,), range(4), 1)


# -- contexts per group, over gloo -------------------------------------------------------------


class StubCommunicator:
    """Stands in for runtime.communicator.Communicator (which needs a GPU): the first method an API call uses
    (its error record's check, poll, or call for the GEMM overlap) names its context."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.errors = self

    def check(self) -> None:
        raise LookupError(id(self.ctx))

    poll = call = check


def _contexts(rank: int, world: int, out: list[str]) -> None:
    import torch.distributed as dist
    from tests.collectives.symmetric.test_symmetric_host import FakeHeap, caps
    from torch.distributed.device_mesh import init_device_mesh

    from collectives import api
    from collectives.runtime import communicator as runtime
    from collectives.symmetric import bootstrap, context

    base = context.Context(heap=FakeHeap(rank), group=None, rank=rank, world_size=world, device=0,
                             caps=caps(False, world), backend="peer")
    base.reserve(1 << 16)
    context._CTX = base
    assert bootstrap.init() is base
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp_pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = tp_pairs[rank // 2]
    odd = dist.new_group([1, 3])
    tp = bootstrap.init(group=mine)
    out.append(f"tp:{tp.rank}/{tp.world_size}:{tp.backend}")
    out.append(f"same:{bootstrap.init(group=mine) is tp}:{bootstrap.init(group=mesh['tp']) is tp}")
    out.append(f"world_is_base:{bootstrap.init(group=dist.group.WORLD) is base}")
    # Allocations of the TP group: one offset on both members, apart from the base's own.
    a = tp.empty(100, torch.float32)
    offset = a.data_ptr() - base.pool.data_ptr()
    offsets: list = [None] * world
    dist.all_gather_object(offsets, offset)
    out.append(f"offsets:{offsets[rank ^ 1] == offset}")
    peers = tp.peer_pointers(a)
    out.append(f"peers:{len(peers)}:{peers[tp.rank] == a.data_ptr()}")
    w = base.empty(100, torch.float32)
    out.append(f"apart:{not base.is_symmetric(a) and not tp.is_symmetric(w)}")
    # The odd ranks' group shares ranks 1 and 3's pool with their TP groups: no overlap.
    if rank % 2:
        other = bootstrap.init(group=odd)
        b = other.empty(100, torch.float32)
        out.append(f"odd:{other.rank}:{b.data_ptr() >= a.data_ptr() + 400 or b.data_ptr() + 400 <= a.data_ptr()}"
                   f":{not other.is_symmetric(a)}")
    else:
        try:
            bootstrap.init(group=odd)
            out.append("odd:no error")
        except CollectiveError as e:
            out.append("odd:" + ("not a member" in str(e)).__str__())
    try:
        bootstrap.init(group=mine, backend="multicast")
        out.append("mc:no error")
    except MulticastUnavailable as e:
        out.append("mc:" + str("sub-group" in str(e)))
    try:
        bootstrap.init(group=mesh)
        out.append("mesh2d:no error")
    except CollectiveError as e:
        out.append("mesh2d:" + str("one dimension" in str(e)))
    try:
        tp.empty(1 << 20, torch.uint8)
        out.append("full:no error")
    except SymmetricMemoryError as e:
        out.append("full:" + str("free on every member" in str(e)))
    c = tp.empty(16, torch.uint8)  # still in step after the refusal
    out.append(f"after_full:{c.numel()}")
    # Dispatch by group: one communicator per context, whatever names its group.
    runtime.Communicator = StubCommunicator  # type: ignore[misc]
    comm = runtime.communicator(mine)
    same = [runtime.communicator(g) for g in (mesh["tp"], tp, comm)]
    out.append(f"comm:{comm.ctx is tp}:{all(s is comm for s in same)}:{runtime.communicator() is not comm}")
    e_ = api.empty(8, torch.float32, group=mesh["tp"])
    out.append(f"api_empty:{tp.is_symmetric(e_)}")
    try:
        api.all_reduce(torch.zeros(4), group=mine)
    except LookupError as e:
        out.append(f"api_all_reduce:{e.args[0] == id(tp)}")
    try:
        api.barrier(group=None)
    except LookupError as e:
        out.append(f"api_barrier:{e.args[0] == id(base)}")
    from collectives import overlap

    calls = [lambda: api.reduce_scatter(torch.zeros(2), torch.zeros(4), group=tp),
             lambda: api.all_gather(torch.zeros(4), torch.zeros(2), group=mesh["tp"]),
             lambda: overlap.gemm_reduce_scatter(torch.zeros(2, 2), torch.zeros(2, 2), group=mine),
             lambda: overlap.all_gather_gemm(torch.zeros(2, 2), torch.zeros(2, 2), group=comm)]
    for call in calls:
        try:
            call()
        except LookupError as e:
            out.append(f"dispatch:{e.args[0] == id(tp)}")
    used = base.ranges.used
    tp.close()
    out.append(f"closed:{base.ranges.used < used}:{bootstrap.init(group=mine) is not tp}")
    try:
        runtime.communicator(tp)
        out.append("closed_comm:no error")
    except CollectiveError as e:
        out.append("closed_comm:" + str("closed" in str(e)))
    base.close()
    out.append(f"base_closed:{all(g.closed for g in [tp]) and not context._GROUPS}")


def test_group_contexts_over_gloo(tmp_path: os.PathLike[str]) -> None:
    world = 4
    results = run_gloo(_contexts, world, tmp_path)
    for rank in range(world):
        out = results[rank]
        expect = [f"tp:{rank % 2}/2:peer", "same:True:True", "world_is_base:True", "offsets:True",
                  "peers:2:True", "apart:True",
                  f"odd:{rank // 2}:True:True" if rank % 2 else "odd:True",
                  "mc:True", "mesh2d:True", "full:True", "after_full:16", "comm:True:True:True",
                  "api_empty:True", "api_all_reduce:True", "api_barrier:True", *["dispatch:True"] * 4, "closed:True:True",
                  "closed_comm:True", "base_closed:True"]
        assert out == expect, (rank, out)
