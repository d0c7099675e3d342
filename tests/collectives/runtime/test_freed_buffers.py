"""A freed symmetric allocation takes its peer table and its plans with it (issue 48, item 1).

The kernel view of a buffer (every rank's address of it) is cached by this rank's address; a
heap that hands a freed block's local address out again (torch's caching allocator does) may
place the new allocation elsewhere on the other ranks.  Two rank threads over the loopback heap,
rank 0 reusing freed blocks and rank 1 not, show the cached view serving the freed block's peer
address unless the free reaches the caches; memory adopted from outside the context (torch's
``symm_mem.empty``, freed by reference count with no call) is stood in for by tensors over one
arena (:func:`torch.frombuffer`): a new one lies where the freed one lay."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from collectives.runtime import views  # noqa: E402
from collectives.runtime.views import BufferViews  # noqa: E402
from collectives.symmetric import context  # noqa: E402
from collectives.symmetric.capability import Capabilities  # noqa: E402
from collectives.symmetric.heap import Adopted  # noqa: E402
from collectives.symmetric.loopback import LoopbackHeap, Meeting, ThreadAgreement  # noqa: E402
from tests.collectives.symmetric.test_loopback import Stream, threads  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

CAPS = Capabilities(device=0, world_size=2, multicast=False, multicast_reason="a CPU world", peer_access=True,
                    peer_reason=None, nvlink_mesh=True)


@pytest.fixture(autouse=True)
def cpu_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device tables on the CPU (the table's values are what the tests read)."""
    def table(values: list[int], device: str = "cuda", shared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        host = torch.tensor(values, dtype=torch.int64)
        return host, host

    monkeypatch.setattr(views, "device_table", table)


class CachingHeap(LoopbackHeap):
    """The loopback heap with a caching allocator on rank 0: a freed block is handed out again
    for the next allocation of its size (rank 1 allocates anew, so its copy moves)."""

    def __init__(self, meeting: Meeting, table: dict, rank: int) -> None:
        super().__init__(meeting, table, rank, "cpu", stream=Stream)
        self.cached: dict[int, torch.Tensor] = {}

    def alloc(self, nbytes: int) -> torch.Tensor:
        raw = self.cached.pop(nbytes, None) if self.rank == 0 else None
        if raw is None:
            raw = torch.empty(nbytes, dtype=torch.uint8)
        k, self._next = self._next, self._next + 1
        with self._lock:
            self.table.setdefault(k, [None] * self.meeting.world)[self.rank] = raw
        self._index[raw.data_ptr()] = k
        self.meeting.gather(self.rank, f"alloc #{k}", nbytes)
        return raw

    def free(self, raw: torch.Tensor) -> None:
        super().free(raw)
        self.cached[raw.numel()] = raw


def test_a_freed_allocations_view_is_not_served_for_the_next_one_at_its_address() -> None:
    meeting, table = Meeting(2, timeout_s=10), {}
    def body(rank: int) -> tuple[bool, list[int], list[int]]:
        ctx = context.Context(heap=CachingHeap(meeting, table, rank), group=None, rank=rank, world_size=2,
                              device=0, caps=CAPS, backend="peer", agreement=ThreadAgreement(meeting, rank))
        comm = FakeComm(ctx, BufferViews(ctx))  # the communicator's caches over the real context and views
        old = ctx.empty(256, torch.uint8)
        comm.buffer(old)
        ptr = old.data_ptr()
        ctx.free(old)
        new = ctx.empty(256, torch.uint8)
        return new.data_ptr() == ptr, comm.buffer(new).host.tolist(), ctx.peer_pointers(new, align=1)

    (reused, served, peers), (moved, *_) = threads(2, body)
    assert reused and not moved  # the case: rank 0's new block at the freed one's address, rank 1's elsewhere
    assert served == peers


def _adopting_context(blocks: dict[int, list[int]]) -> context.Context:
    """A context of rank 0 of 2 whose heap adopts tensors at the addresses in ``blocks``, with
    the peer addresses there (torch's ``symm_mem.empty`` blocks)."""

    class Heap:
        def adopt(self, t: torch.Tensor) -> Adopted | None:
            peers = blocks.get(t.data_ptr())
            if peers is None:
                return None
            raw = t.view(torch.uint8).view(-1)
            return Adopted(raw, [raw, torch.empty(0, dtype=torch.uint8)], None, "no multicast here")

    ctx = context.Context(heap=Heap(), group=None, rank=0, world_size=2, device=0, caps=CAPS, backend="peer",
                          agreement=object())
    ctx.peer_pointers = lambda t, align=16: blocks[t.data_ptr()]  # what the rendezvous would say
    return ctx


def test_an_adopted_blocks_view_dies_with_its_storage() -> None:
    arena = bytearray(4096)
    first = torch.frombuffer(arena, dtype=torch.uint8)
    ptr = first.data_ptr()
    blocks = {ptr: [ptr, 0xA000]}
    buffers = BufferViews(_adopting_context(blocks))
    assert buffers.get(first).host.tolist() == [ptr, 0xA000]
    del first  # freed by reference count: the context hears nothing
    blocks[ptr] = [ptr, 0xB000]  # the next block at this address; its peer elsewhere
    second = torch.frombuffer(arena, dtype=torch.uint8)
    assert second.data_ptr() == ptr
    assert buffers.get(second).host.tolist() == [ptr, 0xB000]


# -- plans: a free of memory a plan uses drops it -------------------------------------------------


def test_a_free_drops_the_plans_that_use_the_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives as api

    heap = FakeHeap()
    comm = FakeComm(heap)
    install(monkeypatch, comm, [False])
    block = heap.empty(1 << 12)
    t = FakeTensor(block.data_ptr(), 1 << 10)  # symmetric: all-reduced in place in its own memory
    api.all_reduce(t, algorithm="two_shot")
    assert len(comm.plans) == 1 and block.data_ptr() in comm.views._buffers
    heap.free(block)
    assert len(comm.plans) == 0 and block.data_ptr() not in comm.views._buffers


def test_a_plan_over_an_adopted_block_dies_with_its_storage() -> None:
    from torch.multiprocessing.reductions import StorageWeakRef

    from collectives.algorithms.plan import Plan
    from collectives.runtime.staging import PlanCache

    storage = torch.empty(4).untyped_storage()
    plans = PlanCache()
    plans["call"] = Plan(lambda *a: None, [()], SimpleNamespace(device_index=0), alive=(StorageWeakRef(storage),))
    assert plans.get("call") is not None
    del storage  # the caller's last reference: the block is freed
    assert plans.get("call") is None and len(plans) == 0
