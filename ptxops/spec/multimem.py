"""``multimem.ld_reduce``, ``multimem.st`` and ``multimem.red``: NVLink multicast memory.

PTX ISA 9.0, section "Data Movement and Conversion Instructions: multimem".  A multimem
address names one location on every GPU of a multicast group: ``ld_reduce`` reads all of them
and reduces, ``st`` writes all of them, ``red`` reduces into all of them.
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, rule
from .ptxtypes import FP8_ALL, HALF, HALF_X2, INTEGER
from .targets import FP8_MULTIMEM

SCOPES = (None, "cta", "cluster", "gpu", "sys")
FLOAT = HALF + HALF_X2 + ("f32", "f64") + FP8_ALL
REDUCE_FLOAT = HALF + HALF_X2 + ("f32", "f64")

SECTION = "9.7.9.16 multimem.ld_reduce, multimem.st, multimem.red (PTX ISA 9.0)"

# The .vec x type table: "the size of the specified type along with .vec must equal either
# 32-bits or 64-bits or 128-bits ... Type .f64 cannot be used with .vec qualifier."
VEC_BY_TYPE = {
    "f16": (2, 4, 8), "bf16": (2, 4, 8),
    "f16x2": (None, 2, 4), "bf16x2": (None, 2, 4),
    "f32": (None, 2, 4), "f64": (None,),
    "e4m3": (4, 8), "e5m2": (4, 8),
    "e4m3x2": (2, 4, 8), "e5m2x2": (2, 4, 8),
    "e4m3x4": (None, 2, 4), "e5m2x4": (None, 2, 4),
}

_VEC_RULES = tuple(
    rule(
        f"vec-width-{t}",
        "For floating-point multimem operations the size of the type times .vec must be "
        "32, 64 or 128 bits; .f64 takes no .vec; integer types take no .vec. "
        f"For .{t}: " + ", ".join("no .vec" if v is None else f".v{v}" for v in vs) + ".",
        when={"type": t},
        allow={"vec": vs},
    )
    for t, vs in VEC_BY_TYPE.items()
) + (
    rule(
        "vec-integer",
        "Integer multimem operations take no .vec qualifier.",
        when={"type": INTEGER},
        allow={"vec": None},
    ),
)

_FP8_TARGET = rule(
    "fp8-target",
    "The .e4m3/.e5m2 types (scalar, x2, x4) need sm_100a, sm_100f family, sm_103a or sm_120a "
    "(PTX ISA 8.6); sm_90/sm_90a do not have them.",
    when={"type": FP8_ALL},
    allow={"target": FP8_MULTIMEM},
)


def _sem_scope_rules(family: str, ordered: tuple[str, ...]) -> tuple[Rule, ...]:
    """A scope goes with an ordered sem and only with one (ptxas enforces both directions)."""
    return (
        rule(
            "scope-needs-order",
            f"{family} without an ordered sem (absent or .weak) takes no scope "
            "(ptxas: \"Modifier '.sys' requires order\" / \"'.weak' cannot be combined with "
            "'.sys'\"); write ." + " or .".join(ordered) + " to give one.",
            when={"sem": (None, "weak")},
            allow={"scope": None},
        ),
        rule(
            "order-needs-scope",
            f"{family} with an explicit ." + "/.".join(ordered)
            + " sem needs a scope (.cta, .cluster, .gpu or .sys).",
            when={"sem": ordered},
            allow={"scope": SCOPES[1:]},
        ),
    )


_SEM_DOC = "memory-ordering semantics"
_SCOPE_DOC = "the set of threads the ordering is with"
_SPACE_DOC = "state space of the multicast address (absent: generic addressing)"

MULTIMEM_LD_REDUCE = Family(
    name="multimem.ld_reduce",
    summary="Load from every GPU of the multicast group at one address and reduce the values.",
    qualifiers=(
        Qualifier("sem", (None, "weak", "relaxed", "acquire"), _SEM_DOC, absent="weak"),
        Qualifier("scope", SCOPES, _SCOPE_DOC),
        Qualifier("space", (None, "global"), _SPACE_DOC, absent="generic"),
        Qualifier("op", ("add", "min", "max", "and", "or", "xor"), "reduction operation"),
        Qualifier(
            "acc", (None, "f32", "f16"), "accumulation precision (absent: the type's own)",
            prefix=".acc::",
        ),
        Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
        Qualifier("type", INTEGER + FLOAT, "element type"),
    ),
    rules=_sem_scope_rules("multimem.ld_reduce", ("relaxed", "acquire"))
    + (
        rule(
            "op-add-types",
            ".add reduces .u32, .u64, .s32 and the floating-point types (no .s64, no .b32/.b64).",
            when={"op": "add"},
            allow={"type": ("u32", "u64", "s32") + FLOAT},
        ),
        rule(
            "op-bitwise-types",
            ".and, .or and .xor reduce only the bit types .b32 and .b64.",
            when={"op": ("and", "or", "xor")},
            allow={"type": ("b32", "b64")},
        ),
        rule(
            "op-minmax-types",
            ".min and .max reduce .u32, .s32, .u64, .s64, the 16-bit floats and fp8; "
            "not .f32 or .f64.",
            when={"op": ("min", "max")},
            allow={"type": ("u32", "s32", "u64", "s64") + HALF + HALF_X2 + FP8_ALL},
        ),
        *_VEC_RULES,
        _FP8_TARGET,
        rule(
            "acc-f32-types",
            ".acc::f32 raises the accumulation of the 16-bit float types (.f16, .f16x2, .bf16, "
            ".bf16x2) to f32; other types take no .acc::f32.",
            when={"acc": "f32"},
            allow={"type": HALF + HALF_X2},
        ),
        rule(
            "acc-f16-types",
            ".acc::f16 raises the accumulation of the fp8 types (.e4m3, .e5m2 and their x2/x4 "
            "forms) to f16; other types take no .acc::f16.",
            when={"acc": "f16"},
            allow={"type": FP8_ALL},
        ),
        rule(
            "acc-add-only",
            "An .acc qualifier changes the precision of an addition: .min and .max take none "
            '(ptxas: "Illegal reduction operation for instruction multimem.ld_reduce.acc").',
            when={"acc": ("f32", "f16")},
            allow={"op": "add"},
        ),
    ),
    operands=("d", "a"),
    device_function="multimem_ld_reduce",
    section=SECTION,
)

MULTIMEM_ST = Family(
    name="multimem.st",
    summary="Store a value to one address on every GPU of the multicast group.",
    qualifiers=(
        Qualifier("sem", (None, "weak", "relaxed", "release"), _SEM_DOC, absent="weak"),
        Qualifier("scope", SCOPES, _SCOPE_DOC),
        Qualifier("space", (None, "global"), _SPACE_DOC, absent="generic"),
        Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
        Qualifier("type", INTEGER + FLOAT, "element type"),
    ),
    rules=_sem_scope_rules("multimem.st", ("relaxed", "release"))
    + _VEC_RULES
    + (_FP8_TARGET,),
    operands=("a", "b"),
    device_function="multimem_st",
    section=SECTION,
)

MULTIMEM_RED = Family(
    name="multimem.red",
    summary="Reduce a value into one address on every GPU of the multicast group.",
    qualifiers=(
        Qualifier("sem", (None, "relaxed", "release"), _SEM_DOC, absent="relaxed"),
        Qualifier("scope", SCOPES, _SCOPE_DOC, absent="sys"),  # only with no sem
        Qualifier("space", (None, "global"), _SPACE_DOC, absent="generic"),
        Qualifier("op", ("add", "min", "max", "and", "or", "xor"), "reduction operation"),
        Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
        Qualifier("type", INTEGER + REDUCE_FLOAT, "element type"),
    ),
    rules=_sem_scope_rules("multimem.red", ("relaxed", "release"))
    + (
        rule(
            "op-add-types",
            ".add reduces .u32, .u64, .s32 and the types .f16, .f16x2, .bf16, .bf16x2, .f32, "
            ".f64 (no .s64, no .b32/.b64).",
            when={"op": "add"},
            allow={"type": ("u32", "u64", "s32") + REDUCE_FLOAT},
        ),
        rule(
            "op-bitwise-types",
            ".and, .or and .xor reduce only the bit types .b32 and .b64.",
            when={"op": ("and", "or", "xor")},
            allow={"type": ("b32", "b64")},
        ),
        rule(
            "op-minmax-types",
            ".min and .max reduce .u32, .s32, .u64, .s64 and the 16-bit floats; not .f32 "
            "or .f64 (the PTX ISA's `multimem.red...max.f64` example is wrong: ptxas rejects it).",
            when={"op": ("min", "max")},
            allow={"type": ("u32", "s32", "u64", "s64") + HALF + HALF_X2},
        ),
        rule(
            "minmax-packed-needs-vec",
            ".min and .max on .f16x2/.bf16x2 need .v2 or .v4: ptxas 13.0 rejects the scalar "
            "packed form (\"Incorrect type '.f16x2' for operation '.min'\") that the PTX ISA lists.",
            when={"op": ("min", "max"), "type": HALF_X2},
            allow={"vec": (2, 4)},
        ),
        *(r for r in _VEC_RULES if r.name.removeprefix("vec-width-") not in FP8_ALL),
    ),
    operands=("a", "b"),
    device_function="multimem_red",
    section=SECTION,
)

FAMILIES = (MULTIMEM_LD_REDUCE, MULTIMEM_ST, MULTIMEM_RED)
__all__ = ["FAMILIES", "MULTIMEM_LD_REDUCE", "MULTIMEM_ST", "MULTIMEM_RED"]
