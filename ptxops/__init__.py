"""ptxops: validated, typed CuTeDSL bindings for PTX memory-ordering and multicast instructions.

``ptxops.spec`` (pure Python) holds the instruction tables and validates forms.  The device
functions (``multimem_ld_reduce``, ``atom``, ``ld_acquire``, ...) need CuTeDSL and are loaded
on first use, so ``import ptxops`` works on machines without it.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import spec
from .errors import QualifierError

DEVICE_FUNCTIONS = (
    "atom", "atom_add", "atom_cas", "atom_exch", "cp_async_bulk", "cp_async_bulk_commit_group",
    "cp_async_bulk_wait_group", "fence", "ld", "ld_acquire", "mbarrier_arrive", "mbarrier_init",
    "mbarrier_try_wait", "multimem_ld_reduce", "multimem_red", "multimem_st", "red", "st",
    "st_release",
)

#: Trace-time multicast emulation (:mod:`ptxops.emulation`), loaded on first use too.
EMULATION = ("emulate_multicast", "translation_table")

__all__ = ["QualifierError", "spec", *DEVICE_FUNCTIONS, *EMULATION]


def __getattr__(name: str) -> Any:
    if name in DEVICE_FUNCTIONS:
        return getattr(importlib.import_module(".ops", __name__), name)
    if name in EMULATION:
        return getattr(importlib.import_module(".emulation", __name__), name)
    raise AttributeError(f"module 'ptxops' has no attribute {name!r}")
