"""The collectives on PyTorch's symmetric memory alone (``collectives.init(heap="torch")``, no
NVSHMEM): peer backend, multicast off.  One process per GPU (``bash .ci/gpu peer``), or two
processes sharing one GPU, which torch allows for tests:

    CUDA_VISIBLE_DEVICES=0 TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 \\
        torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_torch_heap.py

A process group of gloo only where ranks share a GPU (NCCL refuses two ranks on one GPU).  Skips
without torchrun or without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.multigpu

torch = pytest.importorskip("torch")
if "WORLD_SIZE" not in os.environ or "LOCAL_RANK" not in os.environ or int(os.environ["WORLD_SIZE"]) < 2:
    pytest.skip("not launched by torchrun --nproc-per-node >= 2", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)
WORLD, RANK, LOCAL = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
SHARED = torch.cuda.device_count() < WORLD  # ranks share GPUs
if SHARED and os.environ.get("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES") != "1":
    pytest.skip("ranks share a GPU: set TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1", allow_module_level=True)

# NVLink multicast must stay off wherever this runs (shared GPU hosts): force the switches.
from collectives.symmetric.capability import force_multicast_off  # noqa: E402

force_multicast_off()

import torch.distributed as dist  # noqa: E402
from torch.distributed import _symmetric_memory as symm_mem  # noqa: E402

import collectives  # noqa: E402
from collectives import MulticastUnavailable  # noqa: E402
from collectives.symmetric import Context, TorchHeap  # noqa: E402

DEVICE = LOCAL % torch.cuda.device_count()


@pytest.fixture(scope="module")
def ctx() -> Iterator[Context]:
    from datetime import timedelta

    torch.cuda.set_device(DEVICE)
    dist.init_process_group("gloo" if SHARED else "cpu:gloo,cuda:nccl", timeout=timedelta(seconds=60))
    c = collectives.init(device=DEVICE, heap="torch")
    try:
        yield c
    finally:
        c.close()
        dist.destroy_process_group()


def torch_symmetric(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A tensor as an inference engine makes one: ``symm_mem.empty`` + ``rendezvous`` (collective)."""
    t = symm_mem.empty(n, dtype=dtype, device=torch.device("cuda", DEVICE))
    symm_mem.rendezvous(t, dist.group.WORLD.group_name)
    return t


def test_the_heap_is_torchs_and_multicast_is_never_made(ctx: Context) -> None:
    assert isinstance(ctx.heap, TorchHeap) and ctx.backend == "peer"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    t = ctx.empty(64, torch.float32)
    with pytest.raises(MulticastUnavailable, match="TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        ctx.multicast_tensor(t)
    ctx.free(t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_rank_reads_every_ranks_allocation(ctx: Context, dtype: torch.dtype) -> None:
    t = ctx.empty((3, 1000), dtype)
    t.fill_(RANK + 1)
    ctx.host_barrier()
    for r, view in enumerate(ctx.peer_tensors(t[1:, 8:])):
        assert view.shape == (2, 992) and bool((view == r + 1).all()), r
    ctx.host_barrier()
    ctx.free(t)


def test_a_torch_symmetric_tensor_is_reduced_in_place_without_staging(ctx: Context) -> None:
    """A tensor from symm_mem.empty + rendezvous is symmetric: all_reduce runs on it in place,
    with no staging copy (the staging pool stays as it was); a plain tensor of the same size is
    staged."""
    from collectives.runtime.communicator import communicator

    n = 1 << 16
    warm = ctx.empty(n, torch.bfloat16)
    warm.fill_(1)
    collectives.all_reduce(warm, algorithm="two_shot")  # the communicator's own buffers, once
    pool = communicator().pool
    staged = pool.live_bytes
    mine = torch_symmetric(n, torch.bfloat16)
    assert ctx.is_symmetric(mine) and ctx.is_symmetric(mine[n // 2:])
    peers = ctx.peer_tensors(mine)
    assert peers[RANK].data_ptr() == mine.data_ptr() and len({p.data_ptr() for p in peers}) == WORLD
    mine.fill_(RANK + 1)
    collectives.all_reduce(mine, algorithm="two_shot")
    collectives.synchronize()
    assert bool((mine == WORLD * (WORLD + 1) // 2).all())
    assert pool.live_bytes == staged, "a torch symmetric tensor was staged"
    plain = torch.full((n,), RANK + 1, dtype=torch.bfloat16, device=torch.device("cuda", DEVICE))
    assert not ctx.is_symmetric(plain)
    collectives.all_reduce(plain, algorithm="two_shot")
    collectives.synchronize()
    assert bool((plain == WORLD * (WORLD + 1) // 2).all())
    assert pool.live_bytes > staged, "a plain tensor was not staged"
    with pytest.raises(collectives.SymmetricMemoryError, match="symm_mem"):
        ctx.free(mine)
    ctx.free(warm)


def test_torch_symmetric_tensors_freed_by_reference_count_reduce_right(ctx: Context) -> None:
    """Issue 48 item 1: a tensor from symm_mem.empty is freed with its last reference, telling
    no one; a new one may come at its local address with other peer addresses (rank 0 holds an
    extra block every other step, so its copies land elsewhere than the others').  Each is
    all-reduced in place (zero-copy, through its peer table) and checked."""
    n, want, held = 1 << 14, WORLD * (WORLD + 1) // 2, []
    for i in range(20):
        if RANK == 0 and i % 2:
            held.append(symm_mem.empty(n, dtype=torch.float32, device=torch.device("cuda", DEVICE)))
        mine = torch_symmetric(n, torch.float32)
        mine.fill_(RANK + 1)
        collectives.all_reduce(mine, algorithm="two_shot")
        collectives.synchronize()
        assert bool((mine == want).all()), (i, mine[:4].tolist())
        del mine
