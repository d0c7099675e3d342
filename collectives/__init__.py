"""Multi-GPU collectives (barrier, all-reduce, reduce-scatter) in CuTeDSL on symmetric memory.

Host layer: :mod:`collectives.errors`, :mod:`collectives.capability` (backend detection:
NVLink multicast vs. peer) and :mod:`collectives.symmetric` (nvshmem4py heap). The symmetric
layer needs torch and nvshmem4py, so it is imported lazily: ``collectives.init`` etc.
"""

from __future__ import annotations

from typing import Any

from .capability import (
    Capabilities,
    agree,
    choose_backend,
    device_supports_multicast,
    multicast_disabled_by_env,
    probe,
)
from .errors import CollectiveError, CollectiveTimeout, MulticastUnavailable, SymmetricMemoryError

_LAZY = {"init", "current", "is_symmetric", "Context", "ALIGN"}  # from .symmetric

__all__ = [
    # errors
    "CollectiveError", "CollectiveTimeout", "MulticastUnavailable", "SymmetricMemoryError",
    # capability
    "Capabilities", "agree", "choose_backend", "device_supports_multicast",
    "multicast_disabled_by_env", "probe",
    # symmetric memory (lazy, see _LAZY)
    "ALIGN", "Context", "current", "init", "is_symmetric",
    # collectives API (kernels): all_reduce, reduce_scatter, barrier, empty -- added with the kernels
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import symmetric

        return getattr(symmetric, name)
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")
