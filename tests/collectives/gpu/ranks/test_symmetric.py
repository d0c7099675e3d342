"""Multi-GPU tests of symmetric memory on nvshmem4py (peer backend; multicast stays OFF).

Run: ``torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_symmetric.py``.
Skips without torchrun, without 2 GPUs or without nvshmem4py. Every rank runs the same
tests in the same order; the process group has a 60 s timeout so a bug cannot hang long.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.multigpu

torch = pytest.importorskip("torch")
if "WORLD_SIZE" not in os.environ or "LOCAL_RANK" not in os.environ:
    pytest.skip("not launched by torchrun", allow_module_level=True)
if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or int(os.environ["WORLD_SIZE"]) < 2:
    pytest.skip("needs >= 2 GPUs and torchrun --nproc-per-node >= 2", allow_module_level=True)
pytest.importorskip("nvshmem.core")

# NVLink multicast must stay off wherever this runs (shared GPU hosts): force the switches.
from collectives.symmetric.capability import force_multicast_off  # noqa: E402

force_multicast_off()

import collectives  # noqa: E402
from collectives import MulticastUnavailable, SymmetricMemoryError  # noqa: E402
from collectives.symmetric import Context  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


@pytest.fixture(scope="module")
def ctx() -> Iterator[Context]:
    from datetime import timedelta

    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timedelta(seconds=60))
    c = collectives.init(device=local)
    try:
        yield c
    finally:
        c.close()
        assert c.closed and collectives.current() is None
        dist.destroy_process_group()


def test_backend_is_peer_with_reason(ctx: Context) -> None:
    assert ctx.backend == "peer"
    assert (ctx.rank, ctx.world_size) == (RANK, WORLD)
    assert ctx.caps.peer_access, ctx.caps
    assert not ctx.caps.multicast
    assert "NVSHMEM_DISABLE_NVLS" in (ctx.caps.multicast_reason or "")


def test_init_is_idempotent(ctx: Context) -> None:
    assert collectives.init() is ctx
    assert collectives.current() is ctx


def test_multicast_is_refused_never_created(ctx: Context) -> None:
    t = ctx.empty(64, torch.float32)
    with pytest.raises(MulticastUnavailable, match="NVSHMEM_DISABLE_NVLS"):
        ctx.multicast_tensor(t)
    with pytest.raises(MulticastUnavailable):
        collectives.init(backend="multicast")
    with pytest.raises(MulticastUnavailable):
        collectives.choose_backend("multicast", ctx.caps)
    ctx.free(t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_peers_read_and_write(ctx: Context, dtype: torch.dtype) -> None:
    n = 4096
    t = ctx.empty(n, dtype)
    assert collectives.is_symmetric(t) and t.device == torch.device("cuda", ctx.device)
    t.fill_(RANK + 1)
    ctx.host_barrier()
    peers = ctx.peer_tensors(t)
    assert len(peers) == WORLD and peers[RANK].data_ptr() == t.data_ptr()
    for r, p in enumerate(peers):
        assert p.device == t.device and p.dtype == dtype and p.shape == t.shape
        assert bool(torch.all(p == r + 1)), f"rank {RANK} sees wrong values in rank {r}'s buffer"
    ctx.host_barrier()  # everyone has read before anyone writes

    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    peers[nxt][:16].fill_(100 + RANK)  # store into the next rank's buffer over NVLink
    ctx.host_barrier()
    assert bool(torch.all(t[:16] == 100 + prv))
    assert bool(torch.all(t[16:] == RANK + 1))

    ptrs = ctx.peer_pointers(t)
    assert ptrs == [p.data_ptr() for p in peers] and ptrs[RANK] == t.data_ptr()
    assert all(p % 16 == 0 for p in ptrs)
    step = 16 // t.element_size()
    assert ctx.peer_pointers(t[step:]) == [p + 16 for p in ptrs]
    ctx.host_barrier()
    ctx.free(t)
    assert not collectives.is_symmetric(t)


def test_mismatched_sizes_raise_on_every_rank(ctx: Context) -> None:
    with pytest.raises(SymmetricMemoryError, match="ranks disagree"):
        ctx.empty(1024 + RANK, torch.uint8)
    t = ctx.empty(1024, torch.uint8)  # still in lockstep
    ctx.free(t)


def test_signal_pad_is_zero_everywhere(ctx: Context) -> None:
    s = ctx.signal_pad(1024)
    assert s.dtype == torch.int32 and s.numel() == 256
    assert all(int(p.abs().sum()) == 0 for p in ctx.peer_tensors(s))
    u = ctx.signal_pad(64, torch.uint32)
    assert u.dtype == torch.uint32
    ctx.host_barrier()
    ctx.free(u)
    ctx.free(s)


def test_foreign_tensor_rejected(ctx: Context) -> None:
    x = torch.empty(64, device="cuda")
    assert not ctx.is_symmetric(x)
    with pytest.raises(SymmetricMemoryError):
        ctx.peer_tensors(x)
    with pytest.raises(SymmetricMemoryError):
        ctx.peer_pointers(x)


def test_leftover_allocation_is_freed_by_close(ctx: Context) -> None:
    t = ctx.empty((32, 32), torch.float16)  # intentionally not freed: close() must free it
    assert ctx.is_symmetric(t)
