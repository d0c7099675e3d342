"""The environment switches that keep NVSHMEM, NCCL and torch symmetric memory off NVLink
multicast (NVLS): set them before any of those start, on hosts where multicast must stay off.
The one definition of them (``collectives.capability`` re-exports both names)."""

from __future__ import annotations

import os

#: The variables that keep NVSHMEM, NCCL and torch symm_mem off NVLink multicast, and their values.
MULTICAST_OFF = {"NVSHMEM_DISABLE_NVLS": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def force_multicast_off(env: dict[str, str] | None = None) -> None:
    """Set every variable of :data:`MULTICAST_OFF` in ``env`` (default ``os.environ``), before
    NVSHMEM, NCCL or torch start: on shared hosts NVLink multicast must stay off."""
    (os.environ if env is None else env).update(MULTICAST_OFF)


__all__ = ["MULTICAST_OFF", "force_multicast_off"]
