"""ptxops: validated, typed CuTeDSL bindings for PTX memory-ordering and multicast instructions.

``ptxops.spec`` (pure Python) holds the instruction tables and validates forms.  The device
functions (``multimem_ld_reduce``, ``atom``, ``ld_acquire``, ...) need CuTeDSL and are loaded
on first use, so ``import ptxops`` works on machines without it.
"""

from . import spec
from .errors import QualifierError, ScopeError

DEVICE_FUNCTIONS = (
    "atom", "atom_add", "atom_cas", "atom_exch", "cp_async_bulk", "cp_async_bulk_commit_group",
    "cp_async_bulk_wait_group", "cp_reduce_async_bulk", "fence", "griddepcontrol_launch_dependents",
    "griddepcontrol_wait", "ld",
    "membar", "elect_sync", "prefetch", "prefetchu", "cp_async_bulk_prefetch", "st_bulk",
    "clusterlaunchcontrol_try_cancel", "clusterlaunchcontrol_query_cancel", "ld_acquire", "mapa",
    "mbarrier_arrive", "mbarrier_init", "mbarrier_try_wait", "multimem_ld_reduce", "multimem_red",
    "multimem_st", "nanosleep", "red", "red_async", "st", "st_async", "st_release",
    "cp_async_bulk_tensor", "cp_reduce_async_bulk_tensor", "cp_async_bulk_prefetch_tensor",
    "tensormap_replace", "tensormap_cp_fenceproxy", "multimem_cp_async_bulk", "multimem_cp_reduce_async_bulk",
    "reach",
)

#: Trace-time multicast emulation (:mod:`ptxops.ops.emulation`), loaded on first use too.
EMULATION = ("emulate_multicast", "translation_table")

__all__ = ["QualifierError", "ScopeError", "spec", *DEVICE_FUNCTIONS, *EMULATION]


def __getattr__(name: str) -> object:
    """The device functions and the emulation entry points, loaded (with CuTeDSL) on first use."""
    if name in DEVICE_FUNCTIONS:
        from . import ops

        return getattr(ops, name)
    if name in EMULATION:
        from .ops import emulation

        return getattr(emulation, name)
    raise AttributeError(f"module 'ptxops' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
