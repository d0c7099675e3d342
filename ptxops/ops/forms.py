"""Choose the PTX form a typed call means: which ``.type`` and ``.vec`` carry ``n`` values of a
CuTeDSL dtype, preferring packed types (eight BFloat16 are ``.v4.bf16x2``, not ``.v8.bf16``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cutlass

from .. import spec
from ..errors import QualifierError
from ..render import Instruction
from ..spec.engine import Value
from ..spec.ptxtypes import TYPES
from .emit import compile_target, instruction

Numeric = type[cutlass.Numeric]

#: PTX types that carry each float dtype for arithmetic, packed first.
FLOAT_TYPES: dict[str, tuple[str, ...]] = {
    "Float16": ("f16x2", "f16"),
    "BFloat16": ("bf16x2", "bf16"),
    "Float32": ("f32",),
    "Float64": ("f64",),
    "Float8E4M3FN": ("e4m3x4", "e4m3x2", "e4m3"),
    "Float8E5M2": ("e5m2x4", "e5m2x2", "e5m2"),
}
#: Operations that see only bits, whatever the dtype.
BIT_OPS = ("and", "or", "xor", "exch", "cas")


def arithmetic_types(dtype: Numeric, op: str | None) -> tuple[str, ...]:
    """PTX types that carry ``dtype`` for ``op`` (None: a plain multimem store)."""
    width = dtype.width
    if op in BIT_OPS or (op is None and not dtype.is_float):
        return (f"b{width}",)
    if dtype.is_float:
        if dtype.__name__ not in FLOAT_TYPES:
            raise TypeError(f"ptxops has no PTX type for {dtype.__name__}")
        return FLOAT_TYPES[dtype.__name__]
    if op in ("inc", "dec"):
        return (f"u{width}",)
    if op == "add" and width == 64:
        return ("u64",)  # two's-complement addition is sign-blind; PTX has no add.s64
    return (f"{'s' if dtype.signed else 'u'}{width}",)


def words(dtype: Numeric) -> Callable[[int], list[tuple[str, int]]]:
    """Candidates for ``ld``/``st`` of ``n`` values of ``dtype``."""
    return lambda n: memory_types(dtype, n)


def memory_types(dtype: Numeric, n: int) -> list[tuple[str, int]]:
    """(type, registers) for ``ld``/``st`` of ``n`` values: sub-word values are packed into
    32-bit words when they fill them, so eight BFloat16 are one ``.v4.b32``."""
    total = n * dtype.width
    if dtype.width < 32 and total >= 32 and total % 32 == 0:
        return [("b32", total // 32), (f"b{dtype.width}", n)]
    return [(f"b{dtype.width}", n)]


def choose(
    family: str,
    dtype: Numeric,
    n: int,
    candidates: Callable[[int], Sequence[tuple[str, int]]],
    **qualifiers: Value,
) -> Instruction:
    """The first legal form among ``candidates(n)`` ((type, registers) pairs) carrying ``n``
    values; a :class:`QualifierError` naming the legal element counts if none is legal."""
    first: QualifierError | None = None
    for ptx_type, regs in candidates(n):
        try:
            return instruction(family, type=ptx_type, vec=None if regs == 1 else regs, **qualifiers)
        except QualifierError as err:
            first = first or err
    counts = [
        m for m in (1, 2, 4, 8, 16, 32)
        if m != n and any(_legal(family, t, r, qualifiers) for t, r in candidates(m))
    ]
    if not counts or first is None:
        raise first if first else ValueError(f"{family}: no PTX type carries {dtype.__name__}")
    raise QualifierError(
        family,
        f"{family}: {n} x {dtype.__name__} has no form (target {compile_target()}); "
        f"legal num_elements here: {', '.join(map(str, counts))}.\n  nearest form: {first}",
        offending={"num_elements": n},
        rule=first.rule,
        legal={"num_elements": counts},
        target=compile_target(),
    )


def lanes(types: Sequence[str]) -> Callable[[int], list[tuple[str, int]]]:
    """Candidates for ``n`` values: each type whose lanes divide ``n``, with its registers."""
    return lambda n: [(t, n // TYPES[t].lanes) for t in types if n % TYPES[t].lanes == 0]


def _legal(family: str, ptx_type: str, regs: int, qualifiers: dict[str, Value]) -> bool:
    try:
        instruction(family, type=ptx_type, vec=None if regs == 1 else regs, **qualifiers)
    except QualifierError:
        return False
    return True


def scalar(family: str, dtype: Numeric, op: str, type: str | None = None, **qualifiers: Value) -> Instruction:
    """The form of a family without vectors (``red.async``, ``cp.reduce.async.bulk``) for
    ``op`` on ``dtype``: the PTX ``type`` if given, else the first legal one of the types
    that carry ``dtype`` for ``op``; the spec's error for the first of them if none is."""
    if type is not None:
        return instruction(family, op=op, type=type, **qualifiers)
    domain = spec.family(family).domain("type")
    carriers = arithmetic_types(dtype, op)
    first: QualifierError | None = None
    for ptx_type in [t for t in carriers if t in domain] or carriers[:1]:
        try:
            return instruction(family, op=op, type=ptx_type, **qualifiers)
        except QualifierError as err:
            first = first or err
    assert first is not None
    raise first
