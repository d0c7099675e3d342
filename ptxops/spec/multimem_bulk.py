"""``multimem.cp.async.bulk`` and ``multimem.cp.reduce.async.bulk``: bulk copies and bulk
reductions from this CTA's shared memory to every GPU of a multicast group.

PTX ISA 9.1, Data Movement and Conversion Instructions: multimem.cp.async.bulk and
multimem.cp.reduce.async.bulk (introduced in PTX ISA 9.1, sm_90 and later; an assembler of CUDA
13.1 or newer reads them).  ``[dstMem]`` is a multimem address in global memory: the copy
writes, and the reduction reduces into, every GPU's copy of ``size`` bytes (a multiple of 16,
both addresses 16-byte aligned).  Both complete in the bulk async-group (``.bulk_group``);
``.cp_mask`` (sm_100 and later) adds a 16-bit byte mask selecting the bytes of each 16 copied.
The reduction's operation and type table is that of ``cp.reduce.async.bulk`` into ``.global``,
and its f16/bf16 add needs ``.noftz`` (ptxas: "Modifier '.noftz' required for instruction
'multimem.cp.reduce.async.bulk'").  The ``.sem``/``.scope`` qualifiers of PTX ISA 9.3 are not
wrapped.
"""

from __future__ import annotations

from .bulk import REDUCE_SLOTS, REDUCE_TYPES
from .engine import Family, Qualifier, implied, rule
from .targets import WIDE_LDST

PTX_VERSION = "9.1"
SECTION = "Data Movement and Conversion Instructions: {} (PTX ISA 9.1)"
#: Targets with ``.cp_mask`` (ptxas: "Feature '.cp_mask' requires .target sm_100 or higher").
CP_MASK_TARGETS = WIDE_LDST

_DST = implied("dst", "global", "state space of the destination: a multimem address", by={})
_SRC = implied("src", "shared::cta", "state space of the source: this CTA's shared memory", by={})
_COMPLETION = implied("completion", "bulk_group", "completion mechanism: the bulk async-group", by={})

MULTIMEM_CP_ASYNC_BULK = Family(
    name="multimem.cp.async.bulk",
    summary="Copy a contiguous block of this CTA's shared memory to one address on every GPU "
    "of the multicast group, asynchronously (bulk async-group).",
    qualifiers=(
        _DST, _SRC, _COMPLETION,
        Qualifier(
            "cp_mask", (None, "cp_mask"),
            "copy only the bytes of each 16 that the 16-bit byteMask operand selects",
        ),
    ),
    rules=(
        rule(
            "cp-mask-target",
            ".cp_mask needs sm_100 or later (ptxas: \"Feature '.cp_mask' requires .target "
            "sm_100 or higher\").",
            when={"cp_mask": "cp_mask"},
            allow={"target": CP_MASK_TARGETS},
        ),
    ),
    operands=("dst", "src", "size", "mask?cp_mask"),
    device_function="multimem_cp_async_bulk",
    section=SECTION.format("multimem.cp.async.bulk"),
    ptx_version=PTX_VERSION,
)


def _type_rules() -> tuple:
    return tuple(
        rule(
            f"{op}-types",
            f"A multimem bulk .{op} takes ." + ", .".join(types) + " (ptxas: \"Incorrect type "
            "'.s64' for operation '.add' in instruction 'multimem.cp.reduce.async.bulk'\").",
            when={"op": op},
            allow={"type": types},
        )
        for op, types in REDUCE_TYPES["global"].items()
    )


MULTIMEM_CP_REDUCE_ASYNC_BULK = Family(
    name="multimem.cp.reduce.async.bulk",
    summary="Reduce a contiguous array of this CTA's shared memory element-wise into one "
    "address on every GPU of the multicast group, asynchronously (bulk async-group).",
    qualifiers=(
        _DST, _SRC, _COMPLETION, *REDUCE_SLOTS,
    ),
    rules=_type_rules(),
    operands=("dst", "src", "size"),
    device_function="multimem_cp_reduce_async_bulk",
    section=SECTION.format("multimem.cp.reduce.async.bulk"),
    ptx_version=PTX_VERSION,
)

FAMILIES = (MULTIMEM_CP_ASYNC_BULK, MULTIMEM_CP_REDUCE_ASYNC_BULK)
__all__ = ["FAMILIES", "MULTIMEM_CP_ASYNC_BULK", "MULTIMEM_CP_REDUCE_ASYNC_BULK"]
