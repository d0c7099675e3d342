"""CUDA streams made with the driver (``cuStreamCreate``), outside torch's stream pool: a one-GPU
world's rank streams (:mod:`collectives.testing`) and the private stream of a kernel's load
(:func:`collectives.runtime.kernels.load`).  torch hands out 32 pooled streams per priority,
made together, which may share a hardware queue with a stream of another rank."""

from __future__ import annotations

from typing import Any

from ..errors import CollectiveError


def create_stream() -> Any:
    """A new non-blocking stream (``CUstream``) of the current CUDA context (torch's context of
    the device, current where torch has used it in this thread).

    Raises:
        CollectiveError: no CUDA context is current, or the driver refused the stream.
    """
    from cuda.bindings import driver

    err, current = driver.cuCtxGetCurrent()
    if err != driver.CUresult.CUDA_SUCCESS or not int(current):
        raise CollectiveError(f"cuStreamCreate needs a current CUDA context (cuCtxGetCurrent: {err})")
    err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CollectiveError(f"cuStreamCreate failed: {err}")
    return handle


__all__ = ["create_stream"]
