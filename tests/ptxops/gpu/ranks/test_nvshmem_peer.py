"""``ptxops.nvshmem`` on GPUs: the ring kernel of tests/support/nvshmem_kernels.py (the one the
CPU test links) between NVSHMEM PEs, one per torchrun rank, on the symmetric heap of
``collectives`` (NVSHMEM's, through nvshmem4py).

Run: ``torchrun --nproc-per-node 2 -m pytest -q tests/ptxops/gpu/ranks/test_nvshmem_peer.py`` (or
4; ``bash .ci/gpu peer``).  Skipped without torchrun, GPUs or nvshmem4py; NVLink multicast stays
off.  What it checks: :func:`tests.support.nvshmem_kernels.run_ring`.
"""

from __future__ import annotations

import os

import pytest

cutlass = pytest.importorskip("cutlass")
pytest.importorskip("nvshmem.core", reason="nvshmem4py is not installed")

from tests.support.gpu_support import peer_context  # noqa: E402
from tests.support.nvshmem_kernels import run_ring  # noqa: E402

from collectives.symmetric.capability import force_multicast_off  # noqa: E402

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world("NVSHMEM PEs are processes, not rank threads")]

if "WORLD_SIZE" in os.environ:
    force_multicast_off()


def test_put_signal_ring_fetch_add_and_bounded_wait() -> None:
    with peer_context() as ctx:
        run_ring(ctx)
