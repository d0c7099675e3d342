"""Multi-GPU collectives (barrier, all-reduce, reduce-scatter, all-gather, and GEMMs overlapped
with reduce-scatter / all-gather) in CuTeDSL on symmetric memory.

``collectives.all_reduce / reduce_scatter / all_gather / barrier / empty`` (:mod:`collectives.api`,
one call skeleton for every collective) run on four wings, each with its contract in its
``__init__``:

- :mod:`collectives.symmetric`: host memory (heaps, contexts, bootstrap, sub-group pools,
  capability probing: NVLink multicast vs. peer);
- :mod:`collectives.runtime`: the host runtime (the communicator and its parts, the compile path,
  torch custom operators);
- :mod:`collectives.algorithms`: plans, keys, backend rules, tuning, one module per algorithm;
  they reach the runtime only through :class:`~collectives.algorithms.protocol.Runtime`;
- :mod:`collectives.device`: ``@cute.jit`` blocks on ptxops, launchers and kernel argument layouts.

Shared: :mod:`collectives.config`, :mod:`collectives.dtypes`, :mod:`collectives.errors`.  Every
call takes ``group=`` (default: every rank); :mod:`collectives.hierarchical` runs groups spanning
nodes (our kernels inside a node, NCCL across).  ``collectives.gemm_reduce_scatter /
all_gather_gemm`` (:mod:`collectives.overlap`) overlap cuBLAS row chunks with those collectives.
Everything that needs torch and nvshmem4py is imported lazily.
"""
from __future__ import annotations

import importlib
from typing import Any

from .symmetric.capability import (
    Capabilities,
    agree,
    choose_backend,
    device_supports_multicast,
    multicast_disabled_by_env,
    probe,
)
from .errors import CollectiveError, CollectiveTimeout, MissingDependency, MulticastUnavailable, SymmetricMemoryError

_LAZY = {"init", "current", "is_symmetric", "Context", "ALIGN"}  # from .symmetric
_API = {"all_gather", "all_reduce", "all_to_all", "reduce_scatter", "barrier", "empty", "synchronize"}  # from .api
_OVERLAP = {"gemm_reduce_scatter", "all_gather_gemm"}  # from .overlap (torch)
_MODULES = {"testing"}  # submodules loaded as attributes (collectives.testing.run_world)

__all__ = [
    # errors
    "CollectiveError", "CollectiveTimeout", "MissingDependency", "MulticastUnavailable", "SymmetricMemoryError",
    # capability
    "Capabilities", "agree", "choose_backend", "device_supports_multicast",
    "multicast_disabled_by_env", "probe",
    # symmetric memory (lazy, see _LAZY)
    "ALIGN", "Context", "current", "init", "is_symmetric",
    # collectives (lazy, see _API)
    "all_gather", "all_reduce", "all_to_all", "barrier", "empty", "reduce_scatter", "synchronize",
    # GEMM overlapped with communication (lazy, see _OVERLAP)
    "all_gather_gemm", "gemm_reduce_scatter",
]


def __getattr__(name: str) -> Any:
    """The lazy names, loaded on first use; a package they need that is missing (torch,
    CuTeDSL) raises :class:`MissingDependency` naming the extra that installs it."""
    try:
        return _load(name)
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing in MissingDependency.EXTRAS:  # named after what was asked for, not the module it needed
            raise MissingDependency(f"collectives.{name}", missing) from None
        raise


def _load(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        from . import symmetric

        return getattr(symmetric, name)
    if name in _API:
        from . import api

        value = globals()[name] = getattr(api, name)  # later lookups skip this hook
        return value
    if name in _OVERLAP:
        from . import overlap

        value = globals()[name] = getattr(overlap, name)
        return value
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")
