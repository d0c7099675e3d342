"""Between typed CuTeDSL values and the integer registers inline asm carries.

A form's data operand is ``count`` PTX registers of one width, which travel as LLVM integers
(the operand's *carriers*).  Typed values are reinterpreted bit for bit, never converted: eight
BFloat16 values are the four 32-bit carriers of ``.v4.bf16x2``.  The one exception is an 8-bit
integer or fp8 type carried one value per 16-bit register (``ld.u8``), which is widened or
truncated per element.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import arith, vector
from cutlass.cutlass_dsl import T

from ..render import Operand

Numeric = type[cutlass.Numeric]


def _ir(value: Any, dtype: Numeric, *, loc=None, ip=None) -> ir.Value:
    if isinstance(value, ir.Value):
        return value
    return dtype(value).ir_value(loc=loc, ip=ip)


def element_count(operand: Operand, dtype: Numeric) -> int:
    """How many ``dtype`` values an operand holds."""
    if operand.bits > dtype.width and operand.bits <= 16:
        return operand.count  # one narrow value per 16-bit register
    return operand.count * max(operand.bits, 8) // dtype.width


def to_carriers(
    values: Any, dtype: Numeric, operand: Operand, *, loc=None, ip=None
) -> list[ir.Value]:
    """Pack typed values (a TensorSSA, a sequence of scalars, or one scalar) into carriers."""
    n = element_count(operand, dtype)
    if isinstance(values, cute.TensorSSA):
        if values.dtype is not dtype:
            raise TypeError(f"values are {values.dtype.__name__}, the form takes {dtype.__name__}")
        if cute.size(values.shape) != n:
            raise ValueError(f"{cute.size(values.shape)} values given, the form takes {n}")
        vec = values.ir_value(loc=loc, ip=ip)
        if ir.VectorType(vec.type).rank != 1:  # shapes (n,) and n are both one-dimensional
            vec = vector.shape_cast(T.vector(n, dtype.mlir_type), vec, loc=loc, ip=ip)
        elements = None
    else:
        seq = list(values) if isinstance(values, (list, tuple)) else [values]
        if len(seq) != n:
            raise ValueError(f"{len(seq)} values given, the form takes {n}")
        elements = [_ir(v, dtype, loc=loc, ip=ip) for v in seq]
        vec = None
    width = operand.carriers[0] if operand.carriers else operand.bits
    if dtype.width < width and operand.bits <= 16 and operand.count == n:
        if elements is None:
            elements = [vector.extract(vec, [], [i], loc=loc, ip=ip) for i in range(n)]
        return [
            arith.extui(T.i(width), _as_int(e, dtype, loc=loc, ip=ip), loc=loc, ip=ip)
            for e in elements
        ]
    if vec is None:
        vec = vector.from_elements(T.vector(n, dtype.mlir_type), elements, loc=loc, ip=ip)
    k = n * dtype.width // width
    words = vector.bitcast(T.vector(k, T.i(width)), vec, loc=loc, ip=ip)
    return [vector.extract(words, [], [i], loc=loc, ip=ip) for i in range(k)]


def _as_int(value: ir.Value, dtype: Numeric, *, loc=None, ip=None) -> ir.Value:
    if dtype.is_float:
        return arith.bitcast(T.i(dtype.width), value, loc=loc, ip=ip)
    return value


def from_carriers(
    carriers: Sequence[ir.Value], dtype: Numeric, operand: Operand, *, loc=None, ip=None
) -> Any:
    """Reinterpret carriers as ``dtype`` values: a scalar for one value, else a TensorSSA."""
    n = element_count(operand, dtype)
    width = operand.carriers[0]
    if dtype.width < width and operand.bits <= 16 and operand.count == n:
        narrow = [arith.trunci(T.i(dtype.width), c, loc=loc, ip=ip) for c in carriers]
        if dtype.is_float:
            narrow = [arith.bitcast(dtype.mlir_type, c, loc=loc, ip=ip) for c in narrow]
        vec = vector.from_elements(T.vector(n, dtype.mlir_type), narrow, loc=loc, ip=ip)
    else:
        words = vector.from_elements(T.vector(len(carriers), T.i(width)), list(carriers), loc=loc, ip=ip)
        vec = vector.bitcast(T.vector(n, dtype.mlir_type), words, loc=loc, ip=ip)
    if n == 1:
        return dtype(vector.extract(vec, [], [0], loc=loc, ip=ip))
    return cute.TensorSSA(vec, (n,), dtype)


def raw(carriers: Sequence[ir.Value], operand: Operand) -> list[Any]:
    """Carriers as CuTeDSL integers (Int16/Int32/Int64), for callers who want packed registers."""
    kinds = {16: cutlass.Int16, 32: cutlass.Int32, 64: cutlass.Int64}
    return [kinds[b](c) for b, c in zip(operand.carriers, carriers)]


def from_raw(values: Sequence[Any], operand: Operand, *, loc=None, ip=None) -> list[ir.Value]:
    """Packed registers given by the caller, as carriers of the operand's widths."""
    if len(values) != len(operand.carriers):
        raise ValueError(f"{len(values)} registers given, the form takes {len(operand.carriers)}")
    kinds = {16: cutlass.Int16, 32: cutlass.Int32, 64: cutlass.Int64}
    return [_ir(v, kinds[b], loc=loc, ip=ip) for v, b in zip(values, operand.carriers)]


def data_shape(
    data: Any,
    dtype: Numeric | None,
    pointer_dtype: Numeric,
    num_elements: int | None,
    packed: bool,
    explicit: bool,
) -> tuple[Numeric, int]:
    """The dtype and count of values a source operand holds.

    The dtype is ``dtype`` if given, else the values' own (a TensorSSA's or a typed scalar's:
    CuTeDSL pointers are signless, so ``Uint32(1)`` is what makes an atomic max unsigned),
    else the pointer's.  ``explicit``: the caller named the PTX type, so packed registers need
    no count.
    """
    if isinstance(data, cute.TensorSSA):
        own = data.dtype
    elif isinstance(data, cutlass.Numeric) and not packed:
        own = type(data)
    else:
        own = None
    dtype = dtype or own or pointer_dtype
    if num_elements is not None:
        return dtype, num_elements
    if isinstance(data, cute.TensorSSA):
        return dtype, cute.size(data.shape)
    if isinstance(data, (list, tuple)):
        if packed and not explicit:
            raise ValueError(
                "packed registers need num_elements= (how many values they hold) or type="
            )
        return dtype, len(data)
    return dtype, 1


def source(data: Any, dtype: Numeric, operand: Operand, packed: bool, *, loc=None, ip=None) -> list[ir.Value]:
    """Carriers of a source operand from typed values, or from packed registers."""
    if packed:
        return from_raw(list(data), operand, loc=loc, ip=ip)
    return to_carriers(data, dtype, operand, loc=loc, ip=ip)


def result(carriers: Sequence[ir.Value], dtype: Numeric, operand: Operand, packed: bool, *, loc=None, ip=None) -> Any:
    """A destination operand as typed values, or as packed registers."""
    if packed:
        return raw(carriers, operand)
    return from_carriers(carriers, dtype, operand, loc=loc, ip=ip)
