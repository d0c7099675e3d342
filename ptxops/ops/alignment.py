"""A pointer's alignment, proved at trace time from how its offsets were computed.

CuTeDSL types a pointer with the alignment it can prove (``!cute.ptr<bf16, gmem, align<16>>``),
but ``ptr + tidx * 8`` drops it to the element size: the offset is a plain ``i32`` whose
multiplication CuTeDSL does not look into.  :func:`known` reads the IR that defined the pointer
(``cute.add_offset`` of a base and an offset) and the offset's defining operations (``arith``
products, shifts, sums, ``cute.assume``, the index of a ``scf.for`` loop, CuTe's own
divisibility types), builds a :mod:`ptxops.divisibility` expression and proves what it can.
The same reading proves a bulk operation's byte count a multiple of its unit (:func:`multiple`).
"""

from __future__ import annotations

import re
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import cute as cute_ir

from .. import divisibility as dv

#: MLIR operations and the expression operation each one is.
OPERATIONS = {
    "arith.addi": "add", "arith.subi": "sub", "arith.muli": "mul", "arith.shli": "shl",
    "arith.shrsi": "shrs", "arith.shrui": "shru", "arith.andi": "and", "arith.ori": "or",
    "arith.xori": "xor", "arith.minsi": "min", "arith.maxsi": "max", "arith.minui": "min",
    "arith.maxui": "max", "arith.divsi": "divs", "arith.divui": "divu", "arith.remsi": "rems",
    "arith.remui": "remu", "arith.select": "select",
    "cute.tuple_add": "add", "cute.tuple_sub": "sub", "cute.tuple_mul": "mul",
}
#: Operations whose result has the low bits of their one operand (casts, CuTe's int wrappers;
#: a ``cute.assume``'s promise is in its result type).
SAME_LOW_BITS = (
    "arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui",
    "cute.make_int_tuple", "cute.get_scalars", "cute.assume",
)
#: How many defining operations one pointer's analysis reads at most; beyond, a value is unknown.
BUDGET = 512

_DIVBY = re.compile(r"divby (\d+)")


def known(ptr: cute.Pointer) -> int:
    """The alignment in bytes that ``ptr``'s type declares or its arithmetic proves."""
    return _Reader().pointer(_plain(ptr))


def multiple(value: Any) -> int:
    """The power of two an integer (a Python int, a CuTeDSL integer or its ``ir.Value``) is
    known to be a multiple of: its own for an int, else what its arithmetic proves (a byte
    count of a bulk copy, say)."""
    raw = value.value if isinstance(value, cutlass.Numeric) else value
    if isinstance(raw, int):
        return raw & -raw if raw else 1 << dv.ZERO
    return 1 << min(dv.trailing_zeros(_Reader().integer(_plain(raw))), dv.ZERO)


def _plain(value: Any) -> ir.Value:
    """The bare ``ir.Value`` of a CuTeDSL wrapper (whose ``==`` would emit IR)."""
    return ir.Value(value if isinstance(value, ir.Value) else value.value)


def _declared(value: ir.Value) -> int:
    """The divisibility an integer's type states (CuTe's int tuples and constrained ints)."""
    t = value.type
    if cute_ir.IntTupleType.isinstance(t):
        tuple_type = cute_ir.IntTupleType(t)
        return tuple_type.get_divisibility([0]) if tuple_type.rank == 1 else 1
    found = _DIVBY.search(str(t)) if cute_ir.ConstrainedIntType.isinstance(t) else None
    return int(found.group(1)) if found else 1


class _Reader:
    """One analysis: the expressions of the values read so far, and the operations left."""

    def __init__(self) -> None:
        self.exprs: dict[ir.Value, dv.Expr] = {}
        self.budget = BUDGET

    def pointer(self, ptr: ir.Value) -> int:
        ptr_type = cute_ir.PtrType(ptr.type)
        declared = ptr_type.alignment
        op = ptr.owner
        if isinstance(op, ir.Block) or op.name not in ("cute.add_offset", "cute.recast_iter"):
            return declared
        base = self.pointer(_plain(op.operands[0]))
        if op.name == "cute.recast_iter":  # the same address as another type
            return max(declared, base)
        bits = cutlass.Numeric.from_mlir_type(ptr_type.value_type).width
        offset_bits = dv.tz(bits) + dv.trailing_zeros(self.integer(_plain(op.operands[1])))
        return max(declared, min(base, 1 << max(offset_bits - 3, 0)))

    def integer(self, value: ir.Value) -> dv.Expr:
        if value not in self.exprs:
            self.budget -= 1
            expr = self._structure(value) if self.budget > 0 else dv.Var("unread")
            divby = _declared(value)
            if divby != 1:
                expr = dv.Op("assume", (expr, dv.Const(divby)))
            self.exprs[value] = expr
        return self.exprs[value]

    def _structure(self, value: ir.Value) -> dv.Expr:
        op = value.owner
        if isinstance(op, ir.Block):
            parent = op.owner
            if parent is not None and parent.name == "scf.for" and ir.BlockArgument(value).arg_number == 0:
                start, _, step = (self.integer(_plain(v)) for v in parent.operands[:3])
                return dv.loop_index(start, step)
            return dv.Var("argument")
        if op.name == "arith.constant" and isinstance(op.attributes["value"], ir.IntegerAttr):
            return dv.Const(op.attributes["value"].value)
        if op.name in OPERATIONS:
            return dv.Op(OPERATIONS[op.name], tuple(self.integer(_plain(v)) for v in op.operands))
        if op.name in SAME_LOW_BITS and len(op.operands) == 1:
            return self.integer(_plain(op.operands[0]))
        return dv.Var(op.name)
