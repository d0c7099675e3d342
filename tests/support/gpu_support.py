"""Shared pieces of the GPU tests (tests/ptxops/gpu/single/test_atomics.py, tests/ptxops/gpu/peer/test_peer.py).

Importable without torch and without a GPU (the compile test builds every GPU kernel on CPU):
the device helper below needs only CuTeDSL and ptxops; the host helpers import torch when
called.
"""

from __future__ import annotations

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
