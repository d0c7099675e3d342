"""``ptxops.nvshmem`` with 2 PEs on one GPU: torchrun processes, ``collectives.init()`` (device 0,
NVSHMEM's heap), the ring kernel of tests/support/nvshmem_kernels.py (what it checks:
:func:`~tests.support.nvshmem_kernels.run_ring`).

    CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 2 -m pytest -q tests/ptxops/gpu/procs/test_nvshmem_procs.py
"""

from __future__ import annotations

import os

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world("it is the torchrun-processes path (bash .ci/gpu procs)")]
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
pytest.importorskip("nvshmem.core", reason="nvshmem4py is not installed")


def test_put_signal_ring_between_two_pes_on_one_gpu() -> None:
    if "LOCAL_RANK" not in os.environ:
        pytest.skip("needs torchrun")
    import collectives

    from tests.support.nvshmem_kernels import run_ring

    ctx = collectives.init()  # one visible GPU: device 0 for every rank
    try:
        run_ring(ctx)
    finally:
        torch.cuda.current_stream().synchronize()
        ctx.close()
