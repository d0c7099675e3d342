"""CPU tests of the symmetric-memory bookkeeping (registry, views, guards) with a fake heap.

nvshmem is replaced by :class:`FakeHeap` (CPU tensors; a "peer" mapping is another tensor
filled with the peer's rank). The nvshmem calls themselves run only in gpu/ranks/test_symmetric.py.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from collectives.symmetric import bootstrap, context  # noqa: E402
from collectives.symmetric.capability import MULTICAST_OFF, Capabilities  # noqa: E402
from collectives.errors import MulticastUnavailable, SymmetricMemoryError  # noqa: E402
from collectives.symmetric.context import ALIGN, Context  # noqa: E402

ENV_OFF = ("NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")


class FakeHeap:
    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.live: dict[int, torch.Tensor] = {}
        self.freed: list[int] = []
        self.mc_calls = 0
        self.finalized = False

    def alloc(self, nbytes: int) -> torch.Tensor:
        t = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
        self.live[t.data_ptr()] = t
        return t

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        assert rank != self.rank, "own rank must not go through the heap"
        return torch.full_like(raw, rank)

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        self.mc_calls += 1
        return raw.clone()

    def adopt(self, t: torch.Tensor) -> None:
        return None  # symmetric only through the context's own allocations

    def free(self, raw: torch.Tensor) -> None:
        self.freed.append(self.live.pop(raw.data_ptr()).data_ptr())

    def synchronize(self) -> None:
        pass

    def finalize(self) -> None:
        assert not self.live, "finalize before freeing everything"
        self.finalized = True


def caps(multicast: bool = False, world_size: int = 1) -> Capabilities:
    return Capabilities(device=0, world_size=world_size, multicast=multicast,
                        multicast_reason=None if multicast else "NVSHMEM_DISABLE_NVLS=1",
                        peer_access=True, peer_reason=None, nvlink_mesh=True)


def make_ctx(world: int = 1, rank: int = 0, backend: str = "peer", mc: bool = False) -> Context:
    ctx = Context(heap=FakeHeap(rank), group=None, rank=rank, world_size=world, device=0,
                  caps=caps(mc, world), backend=backend)  # type: ignore[arg-type]
    if world > 1:
        ctx._agree = lambda what, values: None  # type: ignore[method-assign]  # single-process stand-in
    return ctx


def test_empty_registry_and_close() -> None:
    ctx = make_ctx()
    a = ctx.empty((3, 5), torch.float32)
    b = ctx.empty(7, torch.bfloat16)
    assert a.shape == (3, 5) and a.dtype == torch.float32
    assert b.shape == (7,) and b.dtype == torch.bfloat16
    assert a.data_ptr() % ALIGN == 0 and b.data_ptr() % ALIGN == 0
    assert ctx.is_symmetric(a) and ctx.is_symmetric(a[1:, 2:]) and ctx.is_symmetric(b)
    assert not ctx.is_symmetric(torch.empty(4))
    heap = ctx.heap
    ctx.close()
    assert ctx.closed and heap.finalized and not heap.live  # type: ignore[attr-defined]
    assert heap.freed == [b.data_ptr(), a.data_ptr()]  # type: ignore[attr-defined]  # reverse order
    ctx.close()  # idempotent
    with pytest.raises(SymmetricMemoryError, match="closed"):
        ctx.empty(4)


def test_an_allocation_is_symmetric_itself_whatever_its_padding() -> None:
    """``allocation(view)``: the allocation's own bytes, a symmetric tensor (the all-to-all
    builds its receive table from it); with the heap's padding (an allocation of 20 bytes
    takes 32) it was not, and a symmetric all-to-all output of 5 float rows failed."""
    ctx = make_ctx()
    a = ctx.empty((5, 1), torch.float32)
    whole, number = ctx.allocation(a[2:4])
    assert whole.data_ptr() == a.data_ptr() and whole.nbytes == a.nbytes and number == 0
    assert ctx.is_symmetric(whole)
    assert ctx.allocation(whole)[0].data_ptr() == whole.data_ptr()
    ctx.close()


def test_an_empty_view_of_a_symmetric_tensor_is_symmetric() -> None:
    """torch reports ``data_ptr()`` 0 for a tensor of no elements; the context places an empty
    view by its storage (on one H100, an all-to-all rank receiving 0 rows into a symmetric out
    took it for a plain tensor and received staged while the others received directly)."""
    from collectives.symmetric.context import address

    ctx = make_ctx()
    a = ctx.empty((4, 3), torch.float32)
    empty = a[2:2]
    assert empty.data_ptr() == 0 and address(empty) == a.data_ptr() + 2 * 3 * 4
    assert ctx.is_symmetric(empty) and ctx.allocation(empty)[1] == 0
    assert not ctx.is_symmetric(torch.empty(4)[1:1])
    ctx.close()


def test_context_manager_and_free() -> None:
    with make_ctx() as ctx:
        a = ctx.empty(16, torch.int64)
        ctx.free(a[3:])  # any view of the allocation frees it
        assert not ctx.is_symmetric(a)
        with pytest.raises(SymmetricMemoryError):
            ctx.free(a)
    assert ctx.closed


def test_rejects_foreign_and_overhanging_tensors() -> None:
    with make_ctx() as ctx:
        a = ctx.empty(5, torch.float32)  # 20 bytes, padded to 32 in the heap
        with pytest.raises(SymmetricMemoryError, match="not .*symmetric heap"):
            ctx.peer_tensors(torch.empty(8))
        with pytest.raises(SymmetricMemoryError):
            ctx.peer_pointers("nope")  # type: ignore[arg-type]
        # a view reaching past the allocation's end (into the alignment padding) is refused
        over = a.as_strided((6,), (1,))
        assert not ctx.is_symmetric(over)
        with pytest.raises(SymmetricMemoryError, match="0 bytes"):
            ctx.empty((0, 4))


def test_peer_views_follow_offsets_and_strides() -> None:
    with make_ctx(world=3, rank=1) as ctx:
        a = ctx.empty((4, 6), torch.float32)
        a.fill_(-1)
        v = a[1:, 2:5]
        peers = ctx.peer_tensors(v)
        assert len(peers) == 3
        assert peers[1].data_ptr() == v.data_ptr()  # own rank: the same memory
        assert torch.equal(peers[1], v)
        for r in (0, 2):
            assert peers[r].shape == v.shape and peers[r].stride() == v.stride()
            assert torch.all(peers[r] != 0) if r else True
        base = ctx.peer_tensors(a)
        off = v.data_ptr() - a.data_ptr()
        for r in range(3):
            assert peers[r].data_ptr() == base[r].data_ptr() + off
        # writes through a peer view land in that peer's memory
        peers[2].fill_(7)
        assert torch.all(ctx.peer_tensors(a)[2][1:, 2:5] == 7)
        # cached: the heap mapping is made once per allocation
        assert ctx.peer_tensors(v)[0].data_ptr() == peers[0].data_ptr()


def test_peer_pointers_alignment() -> None:
    with make_ctx(world=2) as ctx:
        a = ctx.empty(64, torch.float32)
        p = ctx.peer_pointers(a)
        assert p[0] == a.data_ptr() and all(x % ALIGN == 0 for x in p)
        assert ctx.peer_pointers(a[4:]) == [x + 16 for x in p]
        with pytest.raises(SymmetricMemoryError, match="aligned"):
            ctx.peer_pointers(a[1:])
        assert ctx.peer_pointers(a[1:], align=4) == [x + 4 for x in p]


def test_signal_pad_zeroed() -> None:
    with make_ctx() as ctx:
        s = ctx.signal_pad(64)
        assert s.dtype == torch.int32 and s.shape == (16,) and int(s.abs().sum()) == 0
        u = ctx.signal_pad(8, torch.uint32)
        assert u.dtype == torch.uint32 and u.shape == (2,)
        assert ctx.is_symmetric(s) and ctx.is_symmetric(u)
        with pytest.raises(SymmetricMemoryError):
            ctx.signal_pad(6)
        with pytest.raises(SymmetricMemoryError):
            ctx.signal_pad(8, torch.float32)


def test_multicast_tensor_guards(monkeypatch: pytest.MonkeyPatch) -> None:
    for n in ENV_OFF:
        monkeypatch.delenv(n, raising=False)
    # capabilities say no
    with make_ctx(backend="peer", mc=False) as ctx:
        a = ctx.empty(8)
        with pytest.raises(MulticastUnavailable, match="NVSHMEM_DISABLE_NVLS"):
            ctx.multicast_tensor(a)
        assert ctx.heap.mc_calls == 0  # type: ignore[attr-defined]
    # capable, but this context runs the peer backend
    with make_ctx(backend="peer", mc=True) as ctx:
        a = ctx.empty(8)
        with pytest.raises(MulticastUnavailable, match="backend is 'peer'"):
            ctx.multicast_tensor(a)
        assert ctx.heap.mc_calls == 0  # type: ignore[attr-defined]
    # capable and multicast backend, but the environment disables it now
    with make_ctx(backend="multicast", mc=True) as ctx:
        a = ctx.empty(8)
        for n, v in MULTICAST_OFF.items():
            monkeypatch.setenv(n, v)
            with pytest.raises(MulticastUnavailable, match=n):
                ctx.multicast_tensor(a)
            monkeypatch.delenv(n)
        assert ctx.heap.mc_calls == 0  # type: ignore[attr-defined]
        # all guards pass: only now is the heap asked (a fake here)
        m = ctx.multicast_tensor(a[2:])
        assert ctx.heap.mc_calls == 1 and m.shape == (6,)  # type: ignore[attr-defined]


def test_module_level_helpers_without_context() -> None:
    assert context.current() is None or not context.current().closed  # type: ignore[union-attr]
    assert context.is_symmetric(torch.empty(2)) is False


def test_init_outside_torchrun_raises_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    from collectives.errors import CollectiveError

    with pytest.raises(CollectiveError, match="torchrun"):
        bootstrap.init()


def _rank_worker(body, rank: int, world: int, store: str, q: mp.Queue[object]) -> None:
    """One spawned rank: a gloo group over ``store``, a Context on a fake heap, then
    ``body(ctx, rank, out)``; puts ``(rank, out)`` (an unexpected error as its last entry)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    out: list[str] = []
    try:
        body(Context(heap=FakeHeap(rank), group=None, rank=rank, world_size=world, device=0,
                     caps=caps(False, world), backend="peer"), rank, out)
    except BaseException as e:
        out.append("unexpected:" + repr(e))
    finally:
        q.put((rank, out))
        dist.destroy_process_group()


def on_ranks(body, world: int, tmp_path: os.PathLike[str]) -> dict[int, list[str]]:
    """Run the module-level ``body(ctx, rank, out)`` on ``world`` spawned ranks: each rank's ``out``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_worker, args=(body, r, world, str(tmp_path) + "/store", q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(q.get(timeout=120) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _mismatch(ctx: Context, rank: int, out: list[str]) -> None:
    try:
        ctx.empty(128 + rank, torch.uint8)  # sizes differ: every rank must raise
        out.append("no error")
    except SymmetricMemoryError as e:
        out.append("size:" + str(e))
    a = ctx.empty(64, torch.float32)  # still in lockstep afterwards
    out.append(f"ok:{a.shape[0]}")
    b = ctx.empty(8)
    try:
        ctx.free(a if rank == 0 else b)  # ranks free different allocations
        out.append("no error")
    except SymmetricMemoryError as e:
        out.append("free:" + str(e))
    ctx.close()
    out.append(f"closed:{ctx.heap.finalized}")  # type: ignore[attr-defined]


def test_mismatched_sizes_raise_on_every_rank(tmp_path: os.PathLike[str]) -> None:
    world = 2
    results = on_ranks(_mismatch, world, tmp_path)
    for rank in range(world):
        out = results[rank]
        assert out[0].startswith("size:") and "[[128, 0], [129, 0]]" in out[0], out
        assert out[1] == "ok:64", out
        assert out[2].startswith("free:"), out
        assert out[3] == "closed:True", out


def test_allocation_names_the_whole_buffer_and_its_number() -> None:
    """What the all-to-all posts as a receive place: the allocation a view lies in and its
    number (collective, in order: the same on every rank)."""
    ctx = make_ctx()
    a = ctx.empty((4, 8), torch.float32)
    b = ctx.empty(16, torch.bfloat16)
    base, number = ctx.allocation(a[2:, 3:])
    assert base.data_ptr() == a.data_ptr() and base.numel() >= a.nbytes and number == 0
    assert ctx.allocation(b[5:])[1] == 1
    with pytest.raises(SymmetricMemoryError, match="not .*in this context's symmetric heap"):
        ctx.allocation(torch.empty(4))
    ctx.close()


class ArenaHeap(FakeHeap):
    """A FakeHeap whose allocations lie in one CPU arena, ``gaps[i]`` bytes after the one before:
    neighbours at any distance, so that a probe can touch, straddle or fall between them."""

    def __init__(self, gaps: list[int]) -> None:
        super().__init__()
        self.arena = torch.zeros(1 << 16, dtype=torch.uint8)
        self.gaps, self.at = list(gaps), 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        self.at += self.gaps.pop(0) if self.gaps else 0
        t = self.arena[self.at:self.at + nbytes]
        self.at += nbytes
        self.live[t.data_ptr()] = t
        return t


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 200), st.integers(0, 3).map(lambda k: 16 * k)), min_size=1, max_size=12),
       st.sets(st.integers(0, 11)), st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 300)), max_size=40))
def test_a_tensor_is_found_in_the_allocation_that_holds_all_of_it(allocs: list[tuple[int, int]], freed: set[int],
                                                                  probes: list[tuple[int, int]]) -> None:
    """:meth:`Context.is_symmetric` and :meth:`Context.allocation` (found by bisection over the
    allocations' addresses) agree with a scan of every live allocation: a tensor is symmetric
    where one allocation's bytes hold all of it (an empty one: where its address lies in one),
    after frees too, whichever neighbours it touches or straddles (each allocation's first and
    last bytes and the bytes either side probed too)."""
    ctx = Context(heap=ArenaHeap([gap for _, gap in allocs]), group=None, rank=0, world_size=1, device=0,
                  caps=caps(), backend="peer")  # type: ignore[arg-type]
    tensors = [ctx.empty(n, torch.uint8) for n, _ in allocs]
    for i in sorted(freed & set(range(len(tensors)))):
        ctx.free(tensors[i])
    live = [(t.data_ptr(), t.numel()) for i, t in enumerate(tensors) if i not in freed]
    base = ctx.heap.arena.data_ptr()
    edges = [(a - base + d, length) for a, n in live for d in (-1, 0, n - 1, n) for length in (0, 1) if a - base + d >= 0]
    for offset, length in probes + edges:
        if offset + length > ctx.heap.arena.numel():
            continue
        view = ctx.heap.arena[offset:offset + length]
        p = base + offset
        holder = [a for a, n in live if a <= p and (p + length <= a + n if length else p < a + n)]
        assert ctx.is_symmetric(view) == bool(holder), (offset, length, live)
        if holder:
            assert ctx.allocation(view)[0].data_ptr() == holder[0]
    ctx.close()
