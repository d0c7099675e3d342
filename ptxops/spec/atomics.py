"""``atom`` and ``red``: atomic read-modify-write with and without the old value.

PTX ISA 9.0, sections 9.7.13.5 (atom) and 9.7.13.6 (red).  Both take a sem, a scope and a state
space independently; the op x type x vector table below is theirs.  ``.noftz`` is implied for the
16-bit float types (ptxas requires it there and rejects it elsewhere in PTX ISA 9.0).
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, implied, rule
from .ptxtypes import HALF, HALF_X2

SCOPES = (None, "cta", "cluster", "gpu", "sys")
SPACES = (None, "global", "shared", "shared::cta", "shared::cluster")
ATOM_TYPES = (
    "b16", "b32", "b64", "b128", "u32", "u64", "s32", "s64",
) + HALF + HALF_X2 + ("f32", "f64")
SECTION = "9.7.13.5 atom, 9.7.13.6 red (PTX ISA 9.0)"

#: op -> (scalar types, {vector width: vector types})
OP_TYPES: dict[str, tuple[tuple[str, ...], dict[int, tuple[str, ...]]]] = {
    "add": (
        ("u32", "s32", "u64", "f32", "f64") + HALF + HALF_X2,
        {2: HALF + HALF_X2 + ("f32",), 4: HALF + HALF_X2 + ("f32",), 8: HALF},
    ),
    "min": (("u32", "s32", "u64", "s64"), {2: HALF + HALF_X2, 4: HALF + HALF_X2, 8: HALF}),
    "max": (("u32", "s32", "u64", "s64"), {2: HALF + HALF_X2, 4: HALF + HALF_X2, 8: HALF}),
    "inc": (("u32",), {}),
    "dec": (("u32",), {}),
    "and": (("b32", "b64"), {}),
    "or": (("b32", "b64"), {}),
    "xor": (("b32", "b64"), {}),
    "exch": (("b32", "b64", "b128"), {}),
    "cas": (("b16", "b32", "b64", "b128"), {}),
}


def _type_rules(ops: tuple[str, ...]) -> tuple[Rule, ...]:
    rules = []
    for op in ops:
        scalar, vectors = OP_TYPES[op]
        rules.append(
            rule(
                f"{op}-types",
                f".{op} takes the scalar types ." + ", .".join(scalar)
                + (
                    "; vectors: " + "; ".join(
                        f".v{w} of ." + ", .".join(ts) for w, ts in vectors.items()
                    )
                    if vectors else "; no vectors"
                ) + ".",
                when={"op": op, "vec": None},
                allow={"type": scalar},
            )
        )
        for width in (2, 4, 8):
            rules.append(
                rule(
                    f"{op}-v{width}-types",
                    f".{op} with .v{width} takes "
                    + (", ".join(f".{t}" for t in vectors[width]) if width in vectors else "no types")
                    + " (vector atomics are the f16/bf16/f32 forms of PTX ISA 8.1).",
                    when={"op": op, "vec": width},
                    allow={"type": vectors.get(width, ())},
                )
            )
    return tuple(rules)


_VECTOR_SPACE = rule(
    "vector-global-only",
    "Vector atomics work only on .global memory or generic addresses that point to it.",
    when={"vec": (2, 4, 8)},
    allow={"space": (None, "global")},
)


def _qualifiers(sems: tuple[str, ...], ops: tuple[str, ...], types: tuple[str, ...]) -> tuple:
    return (
        Qualifier("sem", (None,) + sems, "memory-ordering semantics", absent="relaxed"),
        Qualifier("scope", SCOPES, "the set of threads the ordering is with", absent="gpu"),
        Qualifier("space", SPACES, "state space (absent: generic addressing)", absent="generic"),
        Qualifier("op", ops, "read-modify-write operation"),
        implied(
            "noftz", "noftz", "no flush-to-zero: implied for the 16-bit float types",
            by={"type": HALF + HALF_X2},
        ),
        Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
        Qualifier("type", types, "operand type"),
    )


ATOM = Family(
    name="atom",
    summary="Atomic read-modify-write; returns the value memory held before.",
    qualifiers=_qualifiers(("relaxed", "acquire", "release", "acq_rel"), tuple(OP_TYPES), ATOM_TYPES),
    rules=_type_rules(tuple(OP_TYPES)) + (_VECTOR_SPACE,),
    operands=("d", "a", "b"),
    operand_variants={"op=cas": ("d", "a", "b", "c")},
    device_function="atom",
    section=SECTION,
)

RED_OPS = tuple(op for op in OP_TYPES if op not in ("exch", "cas"))

RED = Family(
    name="red",
    summary="Atomic reduction into memory; returns nothing.",
    qualifiers=_qualifiers(
        ("relaxed", "release"), RED_OPS, tuple(t for t in ATOM_TYPES if t not in ("b16", "b128"))
    ),
    rules=_type_rules(RED_OPS) + (_VECTOR_SPACE,),
    operands=("a", "b"),
    device_function="red",
    section=SECTION,
)

FAMILIES = (ATOM, RED)
