"""The host side of ranks as threads, without a GPU: contexts of a CPU world (loopback heap,
thread agreement) bound per thread, agreeing, allocating, mapping peers, refusing mismatches and
closing; the communicator registry (a Communicator names itself; forget); the default device of
a rank where one GPU is visible."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import CollectiveError, SymmetricMemoryError  # noqa: E402
from collectives.runtime import communicator as runtime  # noqa: E402
from collectives.symmetric import bootstrap, context  # noqa: E402
from collectives.symmetric.capability import Capabilities  # noqa: E402
from collectives.symmetric.loopback import LoopbackHeap, Meeting, ThreadAgreement, WorldError  # noqa: E402
from tests.collectives.symmetric.test_loopback import Stream, threads  # noqa: E402


def cpu_context(meeting: Meeting, table: dict, rank: int) -> context.Context:
    caps = Capabilities(device=0, world_size=meeting.world, multicast=False, multicast_reason="a CPU world",
                        peer_access=True, peer_reason=None, nvlink_mesh=True)
    return context.Context(heap=LoopbackHeap(meeting, table, rank, "cpu", stream=Stream), group=None, rank=rank,
                             world_size=meeting.world, device=0, caps=caps, backend="peer",
                             agreement=ThreadAgreement(meeting, rank), ranks_on_device=meeting.world)


def test_every_rank_thread_has_its_own_current_context_that_agrees_and_allocates() -> None:
    world = 3
    meeting, table = Meeting(world, timeout_s=10), {}

    def body(rank: int) -> list[int]:
        ctx = cpu_context(meeting, table, rank)
        context.bind_thread(ctx)
        assert context.current() is ctx and bootstrap.init() is ctx  # no group: this thread's
        t = ctx.empty(16, torch.float32)
        t.fill_(rank)
        ctx.host_barrier()
        seen = [int(p[0]) for p in ctx.peer_tensors(t[4:])]
        assert ctx.agree_any(rank == 1) and not ctx.agree_any(False)
        ctx.agree_bounded("same values", [1, 2], 5)
        with pytest.raises(SymmetricMemoryError, match="ranks disagree"):
            ctx.agree_bounded("per-rank values", [rank], 5)
        with pytest.raises(SymmetricMemoryError, match="ranks disagree"):
            ctx.empty(16 + rank, torch.float32)  # refused on every rank before any allocation
        ctx.free(t)
        ctx.close()
        assert ctx.closed and context.current() is None
        with pytest.raises(CollectiveError, match="one-GPU world, is closed"):
            bootstrap.init()  # not a new NVSHMEM job from a world's rank thread
        return seen

    assert threads(world, body) == [[0, 1, 2]] * world
    assert context.current() is None and table == {}  # the main thread never had one


def test_a_rank_that_never_allocates_gives_the_others_an_error_naming_it() -> None:
    meeting, table = Meeting(2, timeout_s=0.3), {}

    def body(rank: int) -> None:
        ctx = cpu_context(meeting, table, rank)
        if rank == 0:
            ctx.empty(8, torch.uint8)

    got = threads(2, body)
    assert isinstance(got[0], WorldError) and got[0].ranks == (1,) and got[1] is None


def test_a_communicator_names_itself_and_forget_drops_a_contexts() -> None:
    comm = runtime.Communicator.__new__(runtime.Communicator)
    comm.ctx = SimpleNamespace(closed=False)
    assert runtime.communicator(comm) is comm  # not a new communicator on its context
    assert comm.block_cap(SimpleNamespace()) is None  # its rank has the GPU alone
    comm.ctx.closed = True
    with pytest.raises(CollectiveError, match="closed"):
        runtime.communicator(comm)
    runtime._COMMS[id(comm.ctx)] = comm
    runtime.forget(comm.ctx)
    assert id(comm.ctx) not in runtime._COMMS


@pytest.mark.parametrize(("visible", "local_rank", "device"), [(1, 0, 0), (1, 1, 0), (1, 7, 0), (4, 3, 3), (8, 0, 0)])
def test_the_default_device_is_local_rank_or_the_one_visible_gpu(monkeypatch, visible: int, local_rank: int,
                                                                  device: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert bootstrap.default_device(None, local_rank) == device
    assert bootstrap.default_device(2, local_rank) == 2  # named: taken as it is


def test_a_local_rank_past_several_visible_gpus_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CollectiveError, match="LOCAL_RANK 3 names no GPU: 2 are visible"):
        bootstrap.default_device(None, 3)


def test_an_abandoned_context_is_closed_and_holds_nothing() -> None:
    """A broken world's contexts cannot agree any more: abandon() closes one alone."""
    meeting, table = Meeting(2, timeout_s=5), {}

    def body(rank: int) -> None:
        ctx = cpu_context(meeting, table, rank)
        ctx.empty(64, torch.uint8)
        return ctx

    ctxs = threads(2, body)
    for ctx in ctxs:
        ctx.abandon()
        assert ctx.closed and not ctx._allocs
        with pytest.raises(SymmetricMemoryError, match="closed"):
            ctx.empty(64, torch.uint8)


def test_the_world_sets_cudas_environment_before_cuda_starts_and_refuses_after(monkeypatch) -> None:
    from collectives import testing

    for name in testing.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(testing, "_context_started", lambda: False)
    testing.require_environment()
    assert {n: __import__("os").environ[n] for n in testing.ENVIRONMENT} == {
        "CUDA_MODULE_LOADING": "EAGER", "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(CollectiveError, match=r"CUDA_DEVICE_MAX_CONNECTIONS=32 \(not '8': with fewer hardware queues"):
        testing.require_environment()


def test_a_tensor_outside_a_worlds_heap_is_not_symmetric() -> None:
    """The loopback heap adopts nothing (a world's symmetric memory is its own allocations):
    the context asks it for every tensor outside them, and answers no, or names the tensor."""
    meeting, table = Meeting(1, timeout_s=5), {}
    ctx = cpu_context(meeting, table, 0)
    inside, outside = ctx.empty(8, torch.float32), torch.empty(8)
    assert ctx.is_symmetric(inside) and not ctx.is_symmetric(outside)
    with pytest.raises(SymmetricMemoryError, match="not \\(entirely\\) in this context's symmetric heap"):
        ctx.allocation(outside)
    ctx.close()
