"""``st.bulk``: set a block of memory to zero with one instruction (Blackwell bulk zeroing).

PTX ISA 9.0, Data Movement and Conversion Instructions: st.bulk (introduced in PTX ISA 8.6,
requires sm_100 or higher).  ``st.bulk{.weak}{.shared::cta} [a], size, initval`` writes
``initval`` to ``size`` bytes from ``a``: weak stores (``.weak`` is the default and the only
semantics), to this CTA's shared memory or through a generic address.  ``size`` is a 64-bit
byte count, a multiple of 8, ``a`` 8-byte aligned, and the only ``initval`` the PTX ISA allows
is the constant 0, so ptxops writes it for you.
"""

from __future__ import annotations

from .engine import Family, Qualifier, rule
from .targets import SM100_ON

ST_BULK = Family(
    name="st.bulk",
    summary="Zero a block of memory (size bytes, a multiple of 8) with weak stores (sm_100+).",
    qualifiers=(
        Qualifier("sem", (None, "weak"), "memory-ordering semantics: only .weak", absent="weak"),
        Qualifier(
            "space", (None, "shared::cta"),
            "state space of the block: this CTA's shared memory (absent: generic addressing)",
            absent="generic",
        ),
    ),
    rules=(
        rule(
            "target",
            "st.bulk needs sm_100 or later (PTX ISA 8.6; ptxas: \"Feature 'st.bulk' requires "
            ".target sm_100 or higher\").",
            allow={"target": SM100_ON},
        ),
    ),
    operands=("a", "bytes", "0"),
    device_function="st_bulk",
    section="Data Movement and Conversion Instructions: st.bulk (PTX ISA 8.6, sm_100+)",
)

FAMILIES = (ST_BULK,)
__all__ = ["FAMILIES", "ST_BULK"]
