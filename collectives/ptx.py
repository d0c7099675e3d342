"""Compile a collective kernel for a target without a GPU and return its PTX (the same compile
the runtime launches: :func:`collectives.kernels.compile_kernel`); refuse PTX that holds
multimem where there is no NVLink multicast."""

from __future__ import annotations

from .algorithms.key import KernelKey
from .kernels import compile_kernel, refuse_multimem


def kernel_ptx(key: KernelKey, arch: str = "sm_90a") -> str:
    """The PTX of ``key``'s kernel compiled for ``arch`` (ptxas runs, so it also assembles)."""
    return compile_kernel(key, arch).__ptx__


__all__ = ["kernel_ptx", "refuse_multimem"]
