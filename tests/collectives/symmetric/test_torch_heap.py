"""CPU tests of the symmetric heap on PyTorch's symmetric memory, with a fake of
``torch.distributed._symmetric_memory``: one process plays one rank of a world whose every
allocation is a CPU byte tensor per rank (a peer's copy is that rank's tensor), so the heap's
views, its adoption of the caller's torch symmetric tensors and its multicast rule are checked
without a GPU.  The real module runs in gpu/peer/test_torch_heap.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import CollectiveError, MulticastUnavailable, SymmetricMemoryError  # noqa: E402
from collectives.symmetric import bootstrap, torch_heap  # noqa: E402
from collectives.symmetric.capability import MULTICAST_OFF, Capabilities  # noqa: E402
from collectives.symmetric.context import Context  # noqa: E402
from collectives.symmetric.torch_heap import TorchHeap  # noqa: E402

GROUP = "fake-group"


class FakeHandle:
    """What torch's rendezvous returns: every rank's buffer of one block, and its multicast address."""

    def __init__(self, blocks: list[torch.Tensor], multicast_ptr: int) -> None:
        self.blocks, self.multicast_ptr = blocks, multicast_ptr
        self.world_size = len(blocks)
        self.buffer_ptrs = [b.data_ptr() for b in blocks]
        self.buffer_size = blocks[0].numel()

    def get_buffer(self, rank: int, sizes, dtype, storage_offset: int = 0) -> torch.Tensor:
        n = math.prod(sizes)
        es = torch.empty((), dtype=dtype).element_size()
        assert (storage_offset + n) * es <= self.buffer_size, "get_buffer past the block"
        return self.blocks[rank].view(dtype)[storage_offset : storage_offset + n].view(sizes)


class FakeSymmMem:
    """``torch.distributed._symmetric_memory`` for rank ``rank`` of ``world``: ``empty`` makes a
    block on every rank (rank r's filled with r) and returns this rank's; ``rendezvous`` over
    ``GROUP`` returns the block's handle, for any tensor inside it, and refuses other tensors as
    torch does (RuntimeError).  With ``inside`` bytes, a tensor starts that far into its block,
    as torch's memory pool places them."""

    def __init__(self, world: int, rank: int, multicast_ptr: int = 0, inside: int = 0) -> None:
        self.world, self.rank, self.multicast_ptr, self.inside = world, rank, multicast_ptr, inside
        self.handles: list[FakeHandle] = []
        self.rendezvous_calls = 0

    def empty(self, *size, dtype, device) -> torch.Tensor:
        n = math.prod(size) * torch.empty((), dtype=dtype).element_size()
        blocks = [torch.full((self.inside + n,), r, dtype=torch.uint8) for r in range(self.world)]
        self.handles.append(FakeHandle(blocks, self.multicast_ptr))
        return blocks[self.rank][self.inside:].view(dtype).view(size)

    def _handle(self, t: torch.Tensor) -> FakeHandle | None:
        p = t.data_ptr()
        return next((h for h in self.handles if h.buffer_ptrs[self.rank] <= p < h.buffer_ptrs[self.rank] + h.buffer_size), None)

    def is_symm_mem_tensor(self, t: torch.Tensor) -> bool:
        return self._handle(t) is not None

    def rendezvous(self, t: torch.Tensor, group_name: str) -> FakeHandle:
        assert group_name == GROUP
        self.rendezvous_calls += 1
        handle = self._handle(t)
        if handle is None:
            raise RuntimeError("CUDASymmetricMemoryAllocator::rendezvous: input must be allocated via "
                               "CUDASymmetricMemoryAllocator::alloc")
        return handle


class OlderSymmMem(FakeSymmMem):
    """A torch release without ``is_symm_mem_tensor``: only the rendezvous tells."""

    is_symm_mem_tensor = property()  # hasattr() is False


@pytest.fixture(autouse=True)
def multicast_allowed_by_env(monkeypatch):
    for name in MULTICAST_OFF:
        monkeypatch.delenv(name, raising=False)


def make_ctx(world: int = 2, rank: int = 0, multicast_ptr: int = 0, backend: str = "peer",
             symm_mem: type[FakeSymmMem] = FakeSymmMem, inside: int = 0) -> Context:
    sm = symm_mem(world, rank, multicast_ptr, inside)
    caps = Capabilities(device=0, world_size=world, multicast=backend == "multicast",
                        multicast_reason=None if backend == "multicast" else "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                        peer_access=True, peer_reason=None, nvlink_mesh=True)
    heap = TorchHeap(0, rank, GROUP, symm_mem=sm)
    heap.synchronize = lambda: None  # type: ignore[method-assign]  # no GPU to wait for
    ctx = Context(heap=heap, group=None, rank=rank, world_size=world, device=0, caps=caps,
                  backend=backend)  # type: ignore[arg-type]
    ctx._agree = lambda what, values: None  # type: ignore[method-assign]  # single-process stand-in
    return ctx


def test_allocations_are_symm_mem_with_every_ranks_copy() -> None:
    """Each rank's copy at the allocation's offset in that rank's block (allocations start
    inside their block, as in torch's memory pool)."""
    with make_ctx(world=3, rank=1, inside=512) as ctx:
        sm = ctx.heap._sm
        a = ctx.empty(10, torch.float32)
        v = a[2:7]
        peers = ctx.peer_tensors(v)
        assert peers[1].data_ptr() == v.data_ptr()
        for r in (0, 2):
            block = sm.handles[0].blocks[r]
            assert peers[r].data_ptr() == block.data_ptr() + 512 + 8  # same offset in rank r's block
            assert torch.equal(peers[r].view(torch.uint8), torch.full((20,), r, dtype=torch.uint8))
        assert sm.rendezvous_calls == 1  # once per allocation, at its collective alloc


@pytest.mark.parametrize("symm_mem", [FakeSymmMem, OlderSymmMem], ids=["is_symm_mem_tensor", "rendezvous-only"])
def test_a_tensor_from_symm_mem_empty_and_rendezvous_is_symmetric_in_place(symm_mem) -> None:
    """The caller's own torch symmetric tensor: recognised (zero-copy), its peers' copies at its
    offset, never freed by the context; a plain tensor is not symmetric."""
    with make_ctx(world=2, rank=0, symm_mem=symm_mem) as ctx:
        sm = ctx.heap._sm
        mine = sm.empty(64, dtype=torch.bfloat16, device="cuda")  # as symm_mem.empty + rendezvous would
        sm.rendezvous(mine, GROUP)
        t = mine[16:48]
        assert ctx.is_symmetric(t) and ctx.is_symmetric(mine)
        peers = ctx.peer_tensors(t)
        assert peers[0].data_ptr() == t.data_ptr()
        assert peers[1].data_ptr() == sm.handles[0].blocks[1].data_ptr() + 32
        assert not ctx.is_symmetric(torch.empty(8))
        with pytest.raises(SymmetricMemoryError, match="symm_mem"):
            ctx.free(t)
    assert ctx.closed and not ctx._allocs


def test_multicast_only_where_torch_made_one() -> None:
    with make_ctx(backend="multicast", multicast_ptr=0) as ctx:
        a = ctx.empty(16, torch.float32)
        mine = ctx.heap._sm.empty(16, dtype=torch.float32, device="cuda")
        for t in (a, mine):
            with pytest.raises(MulticastUnavailable, match="no multicast object"):
                ctx.multicast_tensor(t)


def test_multicast_view_of_a_blocks_start(monkeypatch) -> None:
    """Where torch made a multicast object: a view of memory at its block's start (own or the
    caller's), none of memory inside a block (torch releases disagree on the offset)."""
    made = []

    def device_tensor(ptr: int, nbytes: int, device: int) -> torch.Tensor:
        made.append((ptr, nbytes, device))
        return torch.zeros(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(torch_heap, "device_tensor", device_tensor)
    with make_ctx(backend="multicast", multicast_ptr=0x7F0000000000) as ctx:
        a = ctx.empty(16, torch.float32)
        assert ctx.multicast_tensor(a[4:]).shape == (12,)
        mine = ctx.heap._sm.empty(8, dtype=torch.float32, device="cuda")
        assert ctx.multicast_tensor(mine).shape == (8,)
        assert made == [(0x7F0000000000, 64, 0), (0x7F0000000000, 32, 0)]
        with pytest.raises(MulticastUnavailable, match="16 bytes into its torch symmetric block"):
            ctx.multicast_tensor(mine[4:])


def test_init_chooses_the_torch_heap_without_nvshmem4py(monkeypatch) -> None:
    found = {"nvshmem": None}
    monkeypatch.setattr(bootstrap.importlib.util, "find_spec", lambda name: found.get(name, object()))
    assert bootstrap.choose_heap("auto") == "torch"
    found["nvshmem"] = object()
    assert bootstrap.choose_heap("auto") == "nvshmem" and bootstrap.choose_heap("torch") == "torch"
    with pytest.raises(CollectiveError, match="'nvshmem', 'torch', not 'nccl'"):
        bootstrap.choose_heap("nccl")


@pytest.mark.parametrize("multicast", [False, True])
def test_the_torch_heap_starts_with_multicast_off_unless_chosen(monkeypatch, multicast) -> None:
    env: dict[str, str] = {}
    monkeypatch.setattr(bootstrap.os, "environ", env)
    heap = bootstrap._start_heap("torch", 0, 1, 2, SimpleNamespace(group_name="tp"), multicast)
    assert isinstance(heap, TorchHeap) and (heap.rank, heap.group_name) == (1, "tp")
    assert env == ({} if multicast else {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
