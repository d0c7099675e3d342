"""CuTeDSL device functions, one per PTX instruction family, validated through ptxops.spec."""

from .atomics import atom, atom_add, atom_cas, atom_exch, red
from .fence import fence
from .memory import ld, ld_acquire, st, st_release
from .multimem import multimem_ld_reduce, multimem_red, multimem_st

__all__ = [
    "atom", "atom_add", "atom_cas", "atom_exch", "fence", "ld", "ld_acquire",
    "multimem_ld_reduce", "multimem_red", "multimem_st", "red", "st", "st_release",
]
