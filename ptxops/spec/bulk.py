"""``cp.async.bulk``, ``cp.reduce.async.bulk``, ``cp.async.bulk.commit_group`` and
``cp.async.bulk.wait_group``: 1-D bulk copies and bulk reductions by the Tensor Memory
Accelerator (TMA), without a tensor map.

PTX ISA 9.0, Data Movement and Conversion Instructions: cp.async.bulk,
cp.async.bulk.commit_group and cp.async.bulk.wait_group.  A bulk copy moves ``size`` bytes (a multiple of
16, both addresses 16-byte aligned) in the async proxy.  A copy into shared memory completes
on an mbarrier: its bytes count down the barrier's transaction count
(``.mbarrier::complete_tx::bytes``); a copy out to global memory joins the thread's current
bulk async-group (``.bulk_group``), which ``commit_group`` closes and ``wait_group`` waits on.
A bulk reduction (``cp.reduce.async.bulk``) does the same, but reduces each element of the
source array into the destination element instead of overwriting it.
``.L2::cache_hint`` (a copy to or from global memory, a reduction into it) adds a 64-bit
cache-policy operand from ``createpolicy``.  Multicast (``.multicast::cluster``) and byte masks
(``.cp_mask``) are not wrapped.
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, implied, rule
from .ptxtypes import HALF

SECTION = "Data Movement and Conversion Instructions: cp.async.bulk (PTX ISA 9.0)"
SHARED = ("shared::cta", "shared::cluster")
MBARRIER = "mbarrier::complete_tx::bytes"
CACHE_HINT = Qualifier(
    "cache_hint", (None, "cache_hint"),
    "L2 cache hint: adds a 64-bit cache-policy operand (createpolicy)", prefix=".L2::",
)


def _cache_hint_rule(family: str) -> Rule:
    """``.L2::cache_hint`` only where global memory is read or written (PTX ISA 9.0: the
    .shared::cluster destination forms have no cache-policy operand)."""
    return rule(
        "cache-hint-global",
        f"An L2 cache hint is for a {family} to or from .global: the .shared::cluster "
        f"destination form has none (ptxas: \"Illegal modifier '.L2::cache_hint'\").",
        when={"cache_hint": "cache_hint", "dst": "shared::cluster", "src": "shared::cta"},
        allow={"cache_hint": (None,)},
    )

CP_ASYNC_BULK = Family(
    name="cp.async.bulk",
    summary="Copy a contiguous block of bytes asynchronously (TMA, no tensor map) between "
    "global and shared memory or between the shared memories of a cluster.",
    qualifiers=(
        Qualifier("dst", ("shared::cta", "shared::cluster", "global"), "state space of the destination"),
        Qualifier("src", ("global", "shared::cta"), "state space of the source"),
        Qualifier(
            "completion", (MBARRIER, "bulk_group"),
            "completion mechanism: the mbarrier's transaction count (copies into shared "
            "memory) or the bulk async-group (copies out to global memory)",
        ),
        CACHE_HINT,
    ),
    rules=(
        _cache_hint_rule("copy"),
        rule(
            "global-source-to-shared",
            "A copy from .global goes to .shared::cta (PTX ISA 8.6) or .shared::cluster "
            "(ptxas: \"State space incorrect for instruction 'cp.async.bulk'\").",
            when={"src": "global"},
            allow={"dst": SHARED},
        ),
        rule(
            "shared-source-out",
            "A copy from .shared::cta goes to .shared::cluster (another CTA of the cluster) "
            "or to .global; never .shared::cta to .shared::cta (ptxas: \"State space "
            "incorrect for instruction 'cp.async.bulk'\").",
            when={"src": "shared::cta"},
            allow={"dst": ("shared::cluster", "global")},
        ),
        rule(
            "shared-destination-completes-on-mbarrier",
            "A copy into shared memory completes on an mbarrier: "
            ".mbarrier::complete_tx::bytes (ptxas: \"Illegal modifier '.bulk_group' for "
            "instruction 'cp.async.bulk'\").",
            when={"dst": SHARED},
            allow={"completion": MBARRIER},
        ),
        rule(
            "global-destination-bulk-group",
            "A copy into .global completes in a bulk async-group: .bulk_group (ptxas: "
            "\"Illegal modifier '.mbarrier::complete_tx::bytes' for instruction "
            "'cp.async.bulk'\").",
            when={"dst": "global"},
            allow={"completion": "bulk_group"},
        ),
    ),
    operands=("dst", "src", "size", "mbar", "policy?cache_hint"),
    operand_variants={"completion=bulk_group": ("dst", "src", "size", "policy?cache_hint")},
    device_function="cp_async_bulk",
    section=SECTION,
)

CP_ASYNC_BULK_COMMIT_GROUP = Family(
    name="cp.async.bulk.commit_group",
    summary="Close the thread's current bulk async-group: the .bulk_group copies issued since "
    "the last commit become one group that cp.async.bulk.wait_group can wait on.",
    qualifiers=(),
    rules=(),
    operands=(),
    device_function="cp_async_bulk_commit_group",
    section="Data Movement and Conversion Instructions: cp.async.bulk.commit_group (PTX ISA 9.0)",
)

CP_ASYNC_BULK_WAIT_GROUP = Family(
    name="cp.async.bulk.wait_group",
    summary="Wait until at most N of the thread's most recent bulk async-groups are pending "
    "(N an integer constant; 0 waits for all).",
    qualifiers=(
        Qualifier(
            "read", (None, "read"),
            "wait only until the groups' sources have been read (their shared memory may be "
            "reused), not until their writes are done",
        ),
    ),
    rules=(),
    operands=("n",),
    device_function="cp_async_bulk_wait_group",
    section="Data Movement and Conversion Instructions: cp.async.bulk.wait_group (PTX ISA 9.0)",
)

#: op -> element types, per destination (PTX ISA 9.0, cp.reduce.async.bulk: the table of valid
#: .redOp / element-type combinations; ptxas 13.0 accepts exactly these).
REDUCE_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "shared::cluster": {
        "add": ("u32", "s32", "u64"), "min": ("u32", "s32"), "max": ("u32", "s32"),
        "inc": ("u32",), "dec": ("u32",), "and": ("b32",), "or": ("b32",), "xor": ("b32",),
    },
    "global": {
        "add": ("u32", "s32", "u64", "f32", "f64") + HALF,
        "min": ("u32", "s32", "u64", "s64") + HALF, "max": ("u32", "s32", "u64", "s64") + HALF,
        "inc": ("u32",), "dec": ("u32",),
        "and": ("b32", "b64"), "or": ("b32", "b64"), "xor": ("b32", "b64"),
    },
}
REDUCE_OPS = tuple(REDUCE_TYPES["global"])
REDUCE_SECTION = "Data Movement and Conversion Instructions: cp.reduce.async.bulk (PTX ISA 9.0)"


#: The operation, ``.noftz`` and type slots of a bulk reduction (opcode order).
REDUCE_SLOTS = (
    Qualifier("op", REDUCE_OPS, "reduction applied to each element"),
    implied(
        "noftz", "noftz", "no flush-to-zero: required on the f16/bf16 add",
        by={"op": "add", "type": HALF},
    ),
    Qualifier(
        "type", ("b32", "b64", "u32", "s32", "u64", "s64", "f32", "f64") + HALF,
        "element type",
    ),
)


def _reduce_type_rules() -> tuple[Rule, ...]:
    return tuple(
        rule(
            f"{op}-types-{dst.replace('::', '-')}",
            f"A bulk .{op} into .{dst} takes ." + ", .".join(types) + " (ptxas: \"Incorrect "
            "type\" / \"Unexpected instruction types specified for 'cp.reduce.async.bulk'\").",
            when={"dst": dst, "op": op},
            allow={"type": types},
        )
        for dst, ops in REDUCE_TYPES.items()
        for op, types in ops.items()
    )


CP_REDUCE_ASYNC_BULK = Family(
    name="cp.reduce.async.bulk",
    summary="Reduce a contiguous array in shared memory element-wise into global memory or "
    "into another CTA's shared memory, asynchronously (TMA, no tensor map).",
    qualifiers=(
        Qualifier(
            "dst", ("shared::cluster", "global"),
            "state space of the destination (the array reduced into)",
        ),
        Qualifier("src", ("shared::cta",), "state space of the source: this CTA's shared memory"),
        Qualifier(
            "completion", (MBARRIER, "bulk_group"),
            "completion mechanism: the mbarrier's transaction count (into .shared::cluster) "
            "or the bulk async-group (into .global)",
        ),
        CACHE_HINT,
        *REDUCE_SLOTS,
    ),
    rules=(
        _cache_hint_rule("reduction"),
        rule(
            "shared-destination-completes-on-mbarrier",
            "A reduction into .shared::cluster completes on an mbarrier of the destination "
            "CTA: .mbarrier::complete_tx::bytes (ptxas: \"Illegal modifier '.bulk_group' for "
            "instruction 'cp.reduce.async.bulk'\").",
            when={"dst": "shared::cluster"},
            allow={"completion": MBARRIER},
        ),
        rule(
            "global-destination-bulk-group",
            "A reduction into .global completes in a bulk async-group: .bulk_group (ptxas: "
            "\"Illegal modifier '.mbarrier::complete_tx::bytes' for instruction "
            "'cp.reduce.async.bulk'\").",
            when={"dst": "global"},
            allow={"completion": "bulk_group"},
        ),
    ) + _reduce_type_rules(),
    operands=("dst", "src", "size", "mbar", "policy?cache_hint"),
    operand_variants={"completion=bulk_group": ("dst", "src", "size", "policy?cache_hint")},
    device_function="cp_reduce_async_bulk",
    section=REDUCE_SECTION,
)

FAMILIES = (
    CP_ASYNC_BULK, CP_REDUCE_ASYNC_BULK, CP_ASYNC_BULK_COMMIT_GROUP, CP_ASYNC_BULK_WAIT_GROUP,
)
__all__ = [
    "CP_ASYNC_BULK", "CP_ASYNC_BULK_COMMIT_GROUP", "CP_ASYNC_BULK_WAIT_GROUP",
    "CP_REDUCE_ASYNC_BULK", "FAMILIES",
]
