"""``st.async``, ``red.async`` and ``mapa``: stores and reductions into another CTA's shared
memory that complete on its mbarrier, and the address map that names that memory.

PTX ISA 9.0, Data Movement and Conversion Instructions: st.async and mapa; Parallel
Synchronization and Communication Instructions: red.async.  A thread of one CTA of a cluster
writes (``st.async``) or reduces into (``red.async``) a location in the shared memory of another
CTA of the cluster; when the write is done, a complete-tx of its size in bytes is performed on
an mbarrier in that same CTA (``.mbarrier::complete_tx::bytes``), so the receiver waits on its
own mbarrier instead of polling.  ``mapa`` turns an address in this CTA's shared memory into the
address of the same variable in the CTA of a given rank.  On sm_100 and later the two also
have a ``.release`` form that writes global memory without an mbarrier.  ``.mmio``, the
``.b128`` type of ``st.async`` (PTX ISA 9.2) and its 8-bit types (which take ``.b8``
registers) are not wrapped.

ptxas 13.0 is more lenient than the PTX ISA here: it assembles ``st.async`` and ``red.async``
without a completion mechanism or with a scope but no ``.release``, which the PTX ISA does not
define.  ptxops follows the documentation in those rules (``ptxas_enforced=False``).
"""

from __future__ import annotations

from .engine import Family, Qualifier, ptxas_record, rule
from .targets import ASYNC_RELEASE, SM90

MBARRIER = "mbarrier::complete_tx::bytes"
ST_ASYNC_SECTION = "Data Movement and Conversion Instructions: st.async (PTX ISA 9.0)"
RED_ASYNC_SECTION = (
    "Parallel Synchronization and Communication Instructions: red.async (PTX ISA 9.0)"
)
MAPA_SECTION = "Data Movement and Conversion Instructions: mapa (PTX ISA 9.0)"

_SPACE_DOC = "state space of the destination (and of the mbarrier); absent: generic addressing"
_SPACE = Qualifier("space", (None, "shared::cluster", "global"), _SPACE_DOC, absent="generic")
_COMPLETION = Qualifier(
    "completion", (None, MBARRIER),
    "completion mechanism: a complete-tx of the bytes written on the mbarrier operand",
)
_RELEASE_RULES = (
    rule(
        "release-target",
        "The .release form (a release write to global memory) needs sm_100 or later (ptxas: "
        "\"Feature 'st.async/red.async with .release modifier' requires .target sm_100 or "
        "higher\").",
        when={"sem": "release"},
        allow={"target": ASYNC_RELEASE},
    ),
    rule(
        "global-target",
        "The .global state space needs sm_100 or later (ptxas: \"Feature 'st.async/red.async "
        "with .global state space' requires .target sm_100 or higher\").",
        when={"space": "global"},
        allow={"target": ASYNC_RELEASE},
    ),
    rule(
        "release-scope",
        "A .release write names its scope, .gpu or .sys (ptxas: \"Illegal modifier\" / "
        "\"requires scope\").",
        when={"sem": "release"},
        allow={"scope": ("gpu", "sys")},
    ),
    rule(
        "release-no-mbarrier",
        "A .release write completes on no mbarrier: leave the completion mechanism out "
        "(ptxas: \"Illegal modifier '.mbarrier::complete_tx::bytes'\").",
        when={"sem": "release"},
        allow={"completion": None},
    ),
    rule(
        "release-global",
        "A .release write goes to .global memory (or a generic address in it); "
        "never .shared::cluster (ptxas: \"State space incorrect\").",
        when={"sem": "release"},
        allow={"space": (None, "global")},
    ),
    rule(
        "mbarrier-not-global",
        "A write that completes on an mbarrier goes to shared memory (or a generic address "
        "in it), never .global (ptxas: \"State space incorrect\").",
        when={"completion": MBARRIER},
        allow={"space": (None, "shared", "shared::cta", "shared::cluster")},
    ),
    rule(
        "gpu-sys-scope-global",
        "A write at .gpu or .sys scope goes to .global memory or a generic address "
        "(ptxas: \"Modifier '.gpu' requires '.global' space\").",
        when={"scope": ("gpu", "sys")},
        allow={"space": (None, "global")},
    ),
    rule(
        "shared-cluster-completes-on-mbarrier",
        "A write into .shared::cluster completes on an mbarrier: "
        ".mbarrier::complete_tx::bytes (ptxas rejects it without one).",
        when={"space": "shared::cluster"},
        allow={"completion": MBARRIER},
    ),
)

#: Types of ``st.async`` (the 8-bit ones and ``.b128`` are not wrapped).
ST_ASYNC_TYPES = (
    "b16", "u16", "s16", "b32", "u32", "s32", "f32", "b64", "u64", "s64", "f64",
)
ST_ASYNC_MBARRIER_TYPES = ("b32", "u32", "s32", "f32", "b64", "u64", "s64", "f64")

ST_ASYNC = Family(
    name="st.async",
    summary="Store a value into another CTA's shared memory and signal its mbarrier with the "
    "bytes written (or, on sm_100+, a release store to global memory).",
    qualifiers=(
        Qualifier(
            "sem", (None, "weak", "release"),
            "memory-ordering semantics: .weak (the store to shared::cluster) or .release (the "
            "store to global memory, sm_100+)", absent="weak",
        ),
        Qualifier("scope", (None, "gpu", "sys"), "scope of a .release store"),
        Qualifier(
            "space", (None, "shared", "shared::cta", "shared::cluster", "global"), _SPACE_DOC,
            absent="generic",
        ),
        _COMPLETION,
        Qualifier("vec", (None, 2, 4), "vector width", prefix=".v"),
        Qualifier("type", ST_ASYNC_TYPES, "type of the value stored"),
    ),
    rules=_RELEASE_RULES + (
        rule(
            "no-own-shared-memory",
            "The destination is another CTA's shared memory (.shared::cluster), .global, or a "
            "generic address: the PTX ISA allows no other space.  ptxas 13.0 also assembles "
            ".shared / .shared::cta, whose meaning the PTX ISA does not define; map this CTA's "
            "address with mapa first.",
            allow={"space": (None, "shared::cluster", "global")},
            ptxas_enforced=False,
        ),
        rule(
            "weak-no-scope",
            "A .weak store takes no scope (ptxas: \"Illegal modifier\").",
            when={"sem": "weak"},
            allow={"scope": None},
        ),
        rule(
            "mbarrier-no-scope",
            "A store that completes on an mbarrier takes no scope (ptxas: \"Illegal "
            "modifier\").",
            when={"completion": MBARRIER},
            allow={"scope": None},
        ),
        rule(
            "mbarrier-types",
            "A store that completes on an mbarrier takes a 32- or 64-bit type: ."
            + ", .".join(ST_ASYNC_MBARRIER_TYPES) + " (ptxas: \"Unexpected instruction types\").",
            when={"completion": MBARRIER},
            allow={"type": ST_ASYNC_MBARRIER_TYPES},
        ),
        rule(
            "vectors-need-mbarrier",
            "Only the mbarrier form takes a vector: a .release store has none (ptxas: "
            "\"Vector qualifier is not allowed for instruction 'st.async'\").",
            when={"completion": None},
            allow={"vec": None},
        ),
        rule(
            "v4-32bit",
            ".v4 takes the 32-bit types .b32, .u32, .s32, .f32 (ptxas: \"Unexpected "
            "instruction types\").",
            when={"vec": 4},
            allow={"type": ("b32", "u32", "s32", "f32")},
        ),
        rule(
            "weak-completes-on-mbarrier",
            "A .weak store (sem absent or .weak) must name its completion mechanism, "
            ".mbarrier::complete_tx::bytes.  The PTX ISA requires it; ptxas 13.0 also assembles "
            "st.async without one, whose meaning the PTX ISA does not define.",
            when={"sem": (None, "weak")},
            allow={"completion": MBARRIER},
            ptxas_enforced=False,
        ),
        rule(
            "scope-only-with-release",
            "A scope belongs to the .release form only.  ptxas 13.0 also assembles "
            "st.async.gpu / st.async.sys without .release, which the PTX ISA does not define "
            "(ptxas 13.5 too, but on sm_90 and sm_90a it crashes on them without an mbarrier).",
            when={"sem": None},
            allow={"scope": None},
            ptxas_enforced=False,
            ptxas=[ptxas_record("13.5", "crashes", target=SM90, scope=("gpu", "sys"), completion=None)],
        ),
    ),
    operands=("a", "b", "mbar"),
    operand_variants={"completion=None": ("a", "b")},
    device_function="st_async",
    section=ST_ASYNC_SECTION,
)

#: op -> types of ``red.async`` (ptxas 13.0 takes the same table with and without mbarrier).
RED_ASYNC_TYPES: dict[str, tuple[str, ...]] = {
    "add": ("u32", "s32", "u64", "s64"), "min": ("u32", "s32"), "max": ("u32", "s32"),
    "inc": ("u32",), "dec": ("u32",), "and": ("b32",), "or": ("b32",), "xor": ("b32",),
}

RED_ASYNC = Family(
    name="red.async",
    summary="Reduce a value into another CTA's shared memory and signal its mbarrier with the "
    "bytes written (or, on sm_100+, a release reduction in global memory).",
    qualifiers=(
        Qualifier(
            "sem", ("relaxed", "release"),
            "memory-ordering semantics: .relaxed (into shared::cluster, on an mbarrier) or "
            ".release (into global memory, sm_100+)",
        ),
        Qualifier("scope", ("cluster", "gpu", "sys"), "the set of threads the ordering is with"),
        _SPACE,
        _COMPLETION,
        Qualifier("op", tuple(RED_ASYNC_TYPES), "reduction operation"),
        Qualifier("type", ("b32", "u32", "s32", "u64", "s64"), "operand type"),
    ),
    rules=_RELEASE_RULES + tuple(
        rule(
            f"{op}-types",
            f"red.async.{op} takes ." + ", .".join(types) + " (ptxas: \"Incorrect type\" / "
            "\"Unexpected instruction types\").",
            when={"op": op},
            allow={"type": types},
        )
        for op, types in RED_ASYNC_TYPES.items()
    ) + (
        rule(
            "mbarrier-scope-cluster",
            "A reduction that completes on an mbarrier is .relaxed.cluster (ptxas: \"Illegal "
            "modifier\").",
            when={"completion": MBARRIER},
            allow={"scope": "cluster", "sem": "relaxed"},
        ),
        rule(
            "cluster-scope-needs-mbarrier",
            ".cluster scope is the scope of the mbarrier form (ptxas: \"Modifier '.cluster' "
            "requires modifier '.completion_mechanism' for instruction 'red.async'\").",
            when={"scope": "cluster"},
            allow={"completion": MBARRIER},
        ),
        rule(
            "relaxed-completes-on-mbarrier",
            "A .relaxed reduction goes to .shared::cluster and completes on an mbarrier "
            "(.relaxed.cluster...mbarrier::complete_tx::bytes).  ptxas 13.0 also assembles "
            "red.async.relaxed.gpu / .sys without one, which the PTX ISA does not define (ptxas "
            "13.5 too, but it crashes on them on sm_90 and sm_90a).",
            when={"sem": "relaxed"},
            allow={"completion": MBARRIER},
            ptxas_enforced=False,
            ptxas=[ptxas_record("13.5", "crashes", target=SM90, scope=("gpu", "sys"), completion=None)],
        ),
        rule(
            "mbarrier-add-types",
            "With an mbarrier, .add takes .u32, .s32, .u64 (the PTX ISA lists no .s64 there; "
            "ptxas 13.0 assembles add.s64 too).",
            when={"completion": MBARRIER, "op": "add"},
            allow={"type": ("u32", "s32", "u64")},
            ptxas_enforced=False,
        ),
        rule(
            "release-add-only",
            "The .release form is .add only (.u32, .s32, .u64, .s64): the PTX ISA lists no "
            "other operation there; ptxas 13.0 assembles the others too.",
            when={"sem": "release"},
            allow={"op": "add"},
            ptxas_enforced=False,
        ),
    ),
    operands=("a", "b", "mbar"),
    operand_variants={"completion=None": ("a", "b")},
    device_function="red_async",
    section=RED_ASYNC_SECTION,
)

MAPA = Family(
    name="mapa",
    summary="Map an address in this CTA's shared memory to the address of the same location "
    "in the CTA of a given rank of the cluster.",
    qualifiers=(
        Qualifier(
            "space", (None, "shared::cluster"),
            ".shared::cluster: a and d are shared-memory addresses; absent: generic addresses",
            absent="generic",
        ),
        Qualifier("type", ("u32", "u64", "s32", "s64"), "type of the addresses a and d"),
    ),
    rules=(
        rule(
            "unsigned-addresses",
            "The addresses are .u32 or .u64: the PTX ISA lists no other type (ptxas 13.0 "
            "assembles mapa.s32 and mapa.s64 too).",
            allow={"type": ("u32", "u64")},
            ptxas_enforced=False,
        ),
    ),
    operands=("d", "addr", "rank"),
    device_function="mapa",
    section=MAPA_SECTION,
)

FAMILIES = (ST_ASYNC, RED_ASYNC, MAPA)
__all__ = ["FAMILIES", "MAPA", "RED_ASYNC", "ST_ASYNC"]
