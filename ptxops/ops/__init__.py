"""CuTeDSL device functions, one per PTX instruction family, validated through ptxops.spec."""

from .. import DEVICE_FUNCTIONS
from ..errors import CuTeDSLMissing

try:
    import cutlass  # noqa: F401  (first, so that a missing CuTeDSL says how to install it)
except ModuleNotFoundError as missing:
    if (missing.name or "").partition(".")[0] != "cutlass":
        raise
    raise CuTeDSLMissing(missing.name) from missing

from .atomics import atom, atom_add, atom_cas, atom_exch, red
from .bulk import (
    cp_async_bulk, cp_async_bulk_commit_group, cp_async_bulk_wait_group, cp_reduce_async_bulk,
)
from .cluster import mapa, red_async, st_async
from .clusterlaunchcontrol import clusterlaunchcontrol_query_cancel, clusterlaunchcontrol_try_cancel
from .elect import elect_sync
from .fence import fence
from .griddepcontrol import griddepcontrol_launch_dependents, griddepcontrol_wait
from .mbarrier import mbarrier_arrive, mbarrier_init, mbarrier_try_wait
from .membar import membar
from .memory import ld, ld_acquire, st, st_release
from .multimem import multimem_ld_reduce, multimem_red, multimem_st
from .nanosleep import nanosleep
from .multimem_bulk import multimem_cp_async_bulk, multimem_cp_reduce_async_bulk
from .pointer_reach import reach
from .prefetch import cp_async_bulk_prefetch, prefetch, prefetchu
from .st_bulk import st_bulk
from .tensor import cp_async_bulk_prefetch_tensor, cp_async_bulk_tensor, cp_reduce_async_bulk_tensor
from .tensormap import tensormap_cp_fenceproxy, tensormap_replace

#: One list of device functions: :data:`ptxops.DEVICE_FUNCTIONS`, each imported above.
__all__ = list(DEVICE_FUNCTIONS)
