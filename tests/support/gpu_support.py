"""Shared pieces of the GPU tests (tests/ptxops/gpu/one_gpu/test_atomics.py, tests/ptxops/gpu/ranks/test_peer.py).

Importable without torch and without a GPU (the compile test builds every GPU kernel on CPU):
the device helper below needs only CuTeDSL and ptxops; the host helpers import torch when
called.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

import ptxops

THREADS = 128
#: Every spin-wait in a test kernel also gives up after this many polls (besides its
#: globaltimer deadline), so a broken timer cannot hang the GPU either.
MAX_SPINS = 1 << 24


@cute.jit
def spin_until(
    flag: cute.Pointer,
    target: Int32,
    deadline: Int64,
    acquire: cutlass.Constexpr[bool],
    scope: cutlass.Constexpr[str],
) -> Int32:
    """Poll the Int32 at ``flag`` until it is >= ``target``: with ``ld.acquire.scope`` when
    ``acquire``, else ``ld.relaxed.scope`` (the caller fences).  Returns 0 when seen, 1 when
    ``%globaltimer`` passed ``deadline`` (ns) or MAX_SPINS polls went by first."""
    state = Int32(0)  # 0 polling, 1 seen, 2 timed out
    spins = Int32(0)
    while state == 0:
        if cutlass.const_expr(acquire):
            v = ptxops.ld_acquire(flag, scope=scope)
        else:
            v = ptxops.ld(flag, sem="relaxed", scope=scope)
        spins += 1
        if v >= target:
            state = Int32(1)
        else:
            if cute.arch.globaltimer() > deadline:
                state = Int32(2)
            if spins >= MAX_SPINS:
                state = Int32(2)
    return state - 1


def device_arch(device: Any = None) -> str:
    """The CuTeDSL target of the current torch device: ``sm_90a`` on Hopper, ``sm_100a`` on
    Blackwell (the arch-specific variant, as ptxops' forms need)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def current_stream() -> Any:
    """torch's current CUDA stream as the ``CUstream`` CuTeDSL launches take."""
    import cuda.bindings.driver as cuda
    import torch

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def compile_for_device(launcher: Any, *args: Any) -> Any:
    """``cute.compile`` for the current GPU's architecture."""
    return cute.compile[cute.GPUArch(device_arch())](launcher, *args)


def small_ints(n: int, salt: int, dtype: Any) -> Any:
    """``n`` small integers on the current GPU in a torch ``dtype`` (sums of a few ranks' values
    are exact in every float dtype, whatever the order: results compare bit for bit with NCCL)."""
    import torch

    i = torch.arange(n, device="cuda")
    return (((i * 7 + salt * 13) % 17) - 8).to(dtype)


def sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@contextlib.contextmanager
def peer_context(world: int | None = None, dist_timeout_s: int = 60) -> Iterator[Any]:
    """This torchrun rank's symmetric-memory context on the peer backend (multicast off), for a
    multi-GPU test: skips unless launched by torchrun with ``world`` ranks (default: 2 or more)
    on sm_90+ GPUs with nvshmem; opens the process group and the context unless open already,
    and closes what it opened.  In a one-GPU world (tests/support/world_support.py): each rank
    thread's context, resolved in the rank's thread."""
    import pytest

    torch = pytest.importorskip("torch")
    from tests.support.world_support import WORLD, PerRank

    if WORLD:  # a one-GPU world: each rank thread's own context (the world opens and closes it)
        if world and world != WORLD:
            pytest.skip(f"needs {world} ranks, the world has {WORLD}")
        import collectives

        yield PerRank(collectives.current)
        return
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" not in os.environ or (ranks != world if world else ranks < 2):
        pytest.skip(f"needs torchrun --nproc-per-node {world or '>= 2'}")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs >= 2 GPUs")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs sm_90+")
    pytest.importorskip("nvshmem.core")
    from datetime import timedelta

    import torch.distributed as dist

    import collectives

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    owns_dist = not dist.is_initialized()
    if owns_dist:
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timedelta(seconds=dist_timeout_s))
    existing = collectives.current()
    ctx = existing or collectives.init(device=local)
    assert ctx.backend == "peer" and not ctx.caps.multicast, ctx
    try:
        yield ctx
    finally:
        if existing is None:
            ctx.close()
        if owns_dist and dist.is_initialized():
            dist.destroy_process_group()
