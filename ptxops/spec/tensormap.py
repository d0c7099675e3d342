"""``tensormap.replace`` and ``tensormap.cp_fenceproxy``: tensor maps built or edited on the
device.

PTX ISA 9.0, Data Movement and Conversion Instructions: tensormap.replace, and Parallel
Synchronization and Communication Instructions: tensormap.cp_fenceproxy.
``tensormap.replace.tile.field{.ss}.b1024.type [addr], {ord,} new_val`` writes one field of
the 1024-bit tensor map at ``addr`` (global or this CTA's shared memory, generic if ``.ss`` is
absent) in the generic proxy: a 64-bit global address or stride, a 32-bit rank or size, or an
enumerated mode given as an immediate.  ``ord`` (an immediate, from 0) picks the dimension
of the per-dimension fields.  ``tensormap.cp_fenceproxy`` copies a 128-byte tensor map from
shared to global memory and fences the copy against the tensormap proxy with release
semantics at a scope, so that a ``fence.proxy.tensormap::generic.acquire`` by a thread that
uses the map sees it.  Both are warp-wide where ``.sync.aligned`` says so.
"""

from __future__ import annotations

from .engine import Family, Qualifier, implied, rule
from .targets import TARGETS

REPLACE_SECTION = "Data Movement and Conversion Instructions: tensormap.replace (PTX ISA 9.0)"
FENCE_SECTION = (
    "Parallel Synchronization and Communication Instructions: tensormap.cp_fenceproxy "
    "(PTX ISA 9.0)"
)

#: Fields with one value for the whole map (``[addr], new_val``).
WHOLE_FIELDS = ("global_address", "rank")
#: Per-dimension fields (``[addr], ord, new_val``; ``ord`` an immediate).
DIMENSION_FIELDS = ("box_dim", "global_dim", "global_stride", "element_stride")
#: Enumerated fields whose ``new_val`` is an immediate (``[addr], new_val``).
MODE_FIELDS = ("elemtype", "interleave_layout", "swizzle_mode", "swizzle_atomicity", "fill_mode")
FIELDS = WHOLE_FIELDS + DIMENSION_FIELDS + MODE_FIELDS
#: Fields written as 64-bit values; every other field is ``.b32``.
WIDE_FIELDS = ("global_address", "global_stride")
#: Targets with ``tensormap.replace`` (ptxas: "not supported on .target 'sm_90'").
REPLACE_TARGETS = tuple(t for t in TARGETS if t != "sm_90")
#: Targets with ``.swizzle_atomicity`` (PTX ISA: sm_100a and later).
SWIZZLE_ATOMICITY_TARGETS = ("sm_100a", "sm_100f", "sm_103a", "sm_120a")

#: The immediates each field takes, per group of targets: ``ord`` of a per-dimension field is
#: below 5; the enumerated fields' values are the ``CUtensorMap`` encodings (ptxas: "value
#: '15' expected to be in range [0..12] when .elemtype modifier is used" on sm_90a).
IMMEDIATE_RANGE: dict[str, range] = {
    "ord": range(5), "interleave_layout": range(3), "swizzle_mode": range(4),
    "swizzle_atomicity": range(4), "fill_mode": range(2),
}
#: ``.elemtype`` gains the sub-byte types (13..15) on sm_100a and later.
ELEMTYPE_RANGE = {"sm_90a": range(13)}
ELEMTYPE_RANGE_DEFAULT = range(16)


def immediate_range(field: str, target: str) -> range:
    """The immediates ``field`` (or ``"ord"``) takes on ``target``."""
    if field == "elemtype":
        return ELEMTYPE_RANGE.get(target, ELEMTYPE_RANGE_DEFAULT)
    return IMMEDIATE_RANGE[field]


TENSORMAP_REPLACE = Family(
    name="tensormap.replace",
    summary="Write one field (address, rank, sizes, strides, element type, modes) of a tensor "
    "map in global or shared memory.",
    qualifiers=(
        implied("mode", "tile", "the tensor map's mode: tile (the only one)", by={}),
        Qualifier("field", FIELDS, "the field written"),
        Qualifier(
            "space", (None, "global", "shared::cta"),
            "state space of the tensor map (absent: generic addressing)", absent="generic",
        ),
        implied("b1024", "b1024", "the size of a tensor map: 1024 bits", by={}),
        Qualifier("type", ("b32", "b64"), "width of the new value"),
    ),
    rules=(
        rule(
            "replace-target",
            "tensormap.replace needs sm_90a or a later target (ptxas: \"Instruction "
            "'tensormap.replace' not supported on .target 'sm_90'\").",
            allow={"target": REPLACE_TARGETS},
        ),
        rule(
            "wide-fields-b64",
            ".global_address and .global_stride are 64-bit: .b64.",
            when={"field": WIDE_FIELDS},
            allow={"type": "b64"},
        ),
        rule(
            "narrow-fields-b32",
            "Every field but .global_address and .global_stride is 32-bit: .b32.",
            when={"field": tuple(f for f in FIELDS if f not in WIDE_FIELDS)},
            allow={"type": "b32"},
        ),
        rule(
            "swizzle-atomicity-target",
            ".swizzle_atomicity needs sm_100a or later (ptxas: \"Instruction "
            "'tensormap.replace.swizzle_atomicity' not supported on .target 'sm_90a'\").",
            when={"field": "swizzle_atomicity"},
            allow={"target": SWIZZLE_ATOMICITY_TARGETS},
        ),
    ),
    operands=("a", "b"),
    operand_variants={
        **{f"field={f}": ("a", "n", "b") for f in DIMENSION_FIELDS},
        **{f"field={f}": ("a", "n") for f in MODE_FIELDS},
    },
    device_function="tensormap_replace",
    section=REPLACE_SECTION,
)

TENSORMAP_CP_FENCEPROXY = Family(
    name="tensormap.cp_fenceproxy",
    summary="Copy a 128-byte tensor map from shared to global memory and release it to the "
    "tensormap proxy at a scope (warp-wide).",
    qualifiers=(
        implied("dst", "global", "state space of the destination tensor map", by={}),
        implied("src", "shared::cta", "state space of the source: this CTA's shared memory", by={}),
        implied("proxy", "tensormap::generic", "the proxies ordered: tensormap after generic", by={}),
        implied("sem", "release", "memory-ordering semantics of the fence", by={}),
        Qualifier("scope", ("cta", "cluster", "gpu", "sys"), "the set of threads it orders with"),
        implied("sync", "sync", "executed by every thread of the warp", by={}),
        implied("aligned", "aligned", "every thread of the warp executes the same instruction", by={}),
    ),
    rules=(),
    operands=("dst", "src", "128"),
    device_function="tensormap_cp_fenceproxy",
    section=FENCE_SECTION,
)

FAMILIES = (TENSORMAP_REPLACE, TENSORMAP_CP_FENCEPROXY)
__all__ = ["FAMILIES", "TENSORMAP_CP_FENCEPROXY", "TENSORMAP_REPLACE"]
