"""CuTeDSL device functions, one per PTX instruction family, validated through ptxops.spec."""

from .atomics import atom, atom_add, atom_cas, atom_exch, red
from .bulk import cp_async_bulk, cp_async_bulk_commit_group, cp_async_bulk_wait_group
from .fence import fence
from .mbarrier import mbarrier_arrive, mbarrier_init, mbarrier_try_wait
from .memory import ld, ld_acquire, st, st_release
from .multimem import multimem_ld_reduce, multimem_red, multimem_st

__all__ = [
    "atom", "atom_add", "atom_cas", "atom_exch", "cp_async_bulk", "cp_async_bulk_commit_group",
    "cp_async_bulk_wait_group", "fence", "ld", "ld_acquire", "mbarrier_arrive", "mbarrier_init",
    "mbarrier_try_wait", "multimem_ld_reduce", "multimem_red", "multimem_st", "red", "st",
    "st_release",
]
