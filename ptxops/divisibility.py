"""Which power of two an integer expression is known to be a multiple of: the alignment analysis.

A vector access at ``ptr + offset`` is legal only if the address is a multiple of the access
width.  ptxops proves that from how the offset was computed, the way Triton's axis analysis does:
the device functions turn the offset's defining operations into the small expression tree here
(:mod:`ptxops.ops.alignment` does that at trace time) and :func:`trailing_zeros` gives a lower
bound on the number of trailing zero bits of every value the expression can take.

Only powers of two are tracked, because GPU integers wrap: ``x * 3`` is a multiple of 3 in
Python but not after wrapping modulo 2**32, while a multiple of ``2**k`` (k at most the width)
stays one.  A bound of :data:`ZERO` (64) or more means the expression is zero.  The rules:

=====================  ==================================================================
``c`` (constant)        the trailing zeros of ``c`` (:data:`ZERO` for 0)
input                   what is known of it (a ``cute.assume``, a type's divisibility), else 0
``a + b``, ``a - b``    min (the gcd of two powers of two); also ``|``, ``^``, min, max,
                        select, and ``a % b`` (``a - b*q``)
``-a``                  the same as ``a``
``a * b``               the sum (the product of the powers of two)
``a << c``              ``a``'s plus ``c``; ``a << b``: ``a``'s
``a >> c``              ``a``'s minus ``c`` (at least 0); ``a >> b``: 0
``a & b``               max (either operand's zero bits clear the result's)
``a / c``               ``a``'s minus k when ``c`` is ``2**k`` and ``a``'s is at least k, else 0
``assume(a, d)``        max of ``a``'s and ``d``'s (a promise the program makes)
=====================  ==================================================================

A loop index running from ``start`` in steps of ``step`` is ``start + k * step`` for an input
``k``: the min of ``start``'s and ``step``'s (:func:`loop_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: The bound that means "the expression is zero" (more trailing zeros than any width has).
ZERO = 64


@dataclass(frozen=True)
class Const:
    """An integer constant."""

    value: int


@dataclass(frozen=True)
class Var:
    """An input the analysis cannot see into, with ``known`` trailing zero bits."""

    name: str
    known: int = 0


@dataclass(frozen=True)
class Op:
    """An integer operation on ``args`` (see :data:`OPS`)."""

    name: str
    args: tuple[Expr, ...]


Expr = Const | Var | Op

#: Operations and their arity.  ``shrs``/``divs``/``rems`` are signed, ``shru``/``divu``/``remu``
#: unsigned; ``select(c, a, b)`` is ``a`` if ``c`` else ``b``; ``assume(a, d)`` is ``a``, which
#: the program promises is a multiple of the constant ``d``.
OPS: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "neg": 1, "shl": 2, "shrs": 2, "shru": 2, "and": 2, "or": 2,
    "xor": 2, "min": 2, "max": 2, "select": 3, "divs": 2, "divu": 2, "rems": 2, "remu": 2,
    "assume": 2,
}


class BrokenPromise(ValueError):
    """An ``assume`` evaluated on a value that breaks its promise."""


def tz(value: int) -> int:
    """Trailing zero bits of ``value`` (:data:`ZERO` for 0)."""
    return ZERO if value == 0 else min((value & -value).bit_length() - 1, ZERO)


def loop_index(start: Expr, step: Expr, name: str = "k") -> Expr:
    """The index of a loop from ``start`` in steps of ``step``: ``start + k * step``."""
    return Op("add", (start, Op("mul", (Var(name), step))))


def trailing_zeros(expr: Expr) -> int:
    """A lower bound on the trailing zero bits of every value ``expr`` takes (at most
    :data:`ZERO`).  Shared subexpressions are analysed once."""
    memo: dict[int, int] = {}

    def bound(e: Expr) -> int:
        key = id(e)
        if key not in memo:
            memo[key] = _rule(e, bound)
        return memo[key]

    return bound(expr)


def _rule(e: Expr, bound: Callable[[Expr], int]) -> int:
    """The bound of ``e`` from its operands' (see the table in the module docstring)."""
    if isinstance(e, Const):
        return tz(e.value)
    if isinstance(e, Var):
        return min(e.known, ZERO)
    args = e.args
    if e.name in ("add", "sub", "or", "xor", "min", "max", "rems", "remu"):
        return min(bound(args[0]), bound(args[1]))
    if e.name == "select":
        return min(bound(args[1]), bound(args[2]))
    if e.name == "neg":
        return bound(args[0])
    if e.name == "mul":
        return min(bound(args[0]) + bound(args[1]), ZERO)
    if e.name in ("and", "assume"):
        return max(bound(args[0]), bound(args[1]))
    c = args[1].value if len(args) > 1 and isinstance(args[1], Const) else None  # a constant right operand
    if e.name == "shl":
        return min(bound(args[0]) + (c if c is not None and 0 <= c < ZERO else 0), ZERO)
    if e.name in ("shrs", "shru"):
        return max(bound(args[0]) - c, 0) if c is not None and 0 <= c < ZERO else 0
    if e.name in ("divs", "divu"):
        if c is not None and c > 0 and c & (c - 1) == 0:
            k = c.bit_length() - 1
            return bound(args[0]) - k if bound(args[0]) >= k else 0
        return 0
    raise ValueError(f"unknown operation {e.name!r}; known: {', '.join(OPS)}")


def divisor(expr: Expr) -> int:
    """The largest power of two every value of ``expr`` is known to be a multiple of."""
    return 1 << trailing_zeros(expr)


def evaluate(expr: Expr, env: Mapping[str, int], bits: int = 32) -> int:
    """The value of ``expr`` in ``bits``-bit two's complement (every result wraps), with the
    inputs in ``env``.  A division or remainder by zero, undefined on the GPU, gives 0; an
    ``assume(a, d)`` is ``a``, or raises :class:`BrokenPromise` where ``a`` is no multiple of
    ``d`` (the program is undefined then)."""
    mask = (1 << bits) - 1

    def signed(v: int) -> int:
        v &= mask
        return v - (1 << bits) if v >> (bits - 1) else v

    def ev(e: Expr) -> int:
        if isinstance(e, Const):
            return signed(e.value)
        if isinstance(e, Var):
            return signed(env[e.name])
        a = [ev(x) for x in e.args]
        n = e.name
        if n == "select":
            return a[1] if a[0] else a[2]
        if n == "neg":
            return signed(-a[0])
        x, y = a
        ux, uy = x & mask, y & mask
        if n in ("shl", "shrs", "shru") and not 0 <= uy < bits:
            return 0  # an over-wide shift is poison in LLVM; any value will do
        if n in ("divs", "divu", "rems", "remu") and y == 0:
            return 0
        if n == "assume":
            if y == 0 or x % y:
                raise BrokenPromise(f"assume({x}, {y}): {x} is not a multiple of {y}")
            return x
        ops = {
            "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
            "shl": lambda: x << uy, "shrs": lambda: x >> uy, "shru": lambda: ux >> uy,
            "and": lambda: x & y, "or": lambda: x | y, "xor": lambda: x ^ y,
            "min": lambda: min(x, y), "max": lambda: max(x, y),
            "divs": lambda: _trunc_div(x, y),
            "divu": lambda: ux // uy,
            "rems": lambda: x - y * _trunc_div(x, y), "remu": lambda: ux % uy,
        }
        if n not in ops:
            raise ValueError(f"unknown operation {n!r}; known: {', '.join(OPS)}")
        return signed(ops[n]())

    return ev(expr)


def _trunc_div(x: int, y: int) -> int:
    """Integer division rounding toward zero (as PTX ``div.s32``)."""
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q
