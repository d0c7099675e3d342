"""f32 arithmetic that rounds once per operation, as torch's eager kernels do.

The compiler contracts a product and a sum of it (``a * b + c``) into one ``fma.rn.f32``
(checked: CuTeDSL 4.8 emits it for plain Float32 arithmetic, and ``ptxas`` may fuse a plain
``mul.f32`` and ``add.f32`` too), which rounds once where torch's ``mul`` then ``add``
kernels round twice: the results differ in the last bit.  ``mul.rn.f32`` and ``add.rn.f32``
(explicit rounding: the PTX ISA forbids fusing them) keep a kernel bit-identical to the same
steps in torch; they come from NVVM's ``mul.rn.f`` / ``add.rn.f`` intrinsics (what CUDA's
``__fmul_rn`` and ``__fadd_rn`` lower to), not from inline assembly; ``div.rn.f32``
(:func:`div_rn`) is torch's true division.  The conversions in and out of f32 (:func:`widen`,
:func:`narrow`, :func:`e4m3`) and the fp8 quantization's steps (:func:`amax`,
:func:`fp8_scale`) sit here too, so that a CPU simulation of a kernel
(``tests/support/device_sim.py``) replaces all of its float arithmetic at one place.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint8, Uint16
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..config import E4M3_MAX


def _intrinsic(name: str, a: Float32, b: Float32, loc, ip) -> Float32:
    args = [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)]
    return Float32(llvm.call_intrinsic(T.f32(), name, args, [], [], loc=loc, ip=ip))


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a * b`` rounded to nearest even (``mul.rn.f32``: never fused into an ``fma``)."""
    return _intrinsic("llvm.nvvm.mul.rn.f", a, b, loc, ip)


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a + b`` rounded to nearest even (``add.rn.f32``: never fused into an ``fma``)."""
    return _intrinsic("llvm.nvvm.add.rn.f", a, b, loc, ip)


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a / b`` rounded to nearest even (``div.rn.f32``: IEEE division, as torch's)."""
    return _intrinsic("llvm.nvvm.div.rn.f", a, b, loc, ip)


@dsl_user_op
def amax(most: Float32, value: Float32, *, loc=None, ip=None) -> Float32:
    """``max(most, |value|)``, NaN once either is NaN (``max.NaN.f32``), as torch's ``amax``."""
    magnitude = Float32(llvm.call_intrinsic(T.f32(), "llvm.nvvm.fabs.f", [Float32(value).ir_value(loc=loc, ip=ip)],
                                            [], [], loc=loc, ip=ip))
    return _intrinsic("llvm.nvvm.fmax.nan.f", most, magnitude, loc, ip)


#: The magnitude past which torch's float8_e4m3fn conversion gives NaN: halfway from 448 to the
#: next step (480, which e4m3fn spends on NaN); PTX's ``satfinite`` gives 448 there.
E4M3_NAN_PAST = 464.0


@cute.jit
def fp8_scale(most: Float32) -> Float32:
    """A token's scale from its largest magnitude: ``most / 448``, 1 where ``most`` is 0 or NaN
    (:func:`collectives.moe.quantize`)."""
    return cutlass.select_(most > Float32(0.0), div_rn(most, Float32(E4M3_MAX)), Float32(1.0))


@dsl_user_op
def _e4m3x2(high: Float32, low: Float32, *, loc=None, ip=None) -> Uint16:
    args = [Float32(high).ir_value(loc=loc, ip=ip), Float32(low).ir_value(loc=loc, ip=ip)]
    return Uint16(llvm.call_intrinsic(T.i16(), "llvm.nvvm.ff.to.e4m3x2.rn", args, [], [], loc=loc, ip=ip))


@cute.jit
def e4m3(value: Float32) -> Uint8:
    """``value`` as float8_e4m3fn bits, as torch converts: to nearest even
    (``cvt.rn.satfinite.e4m3x2.f32``), and NaN (``0x7F``, with the sign of a non-NaN value)
    past :data:`E4M3_NAN_PAST` and for NaN, where PTX saturates."""
    byte = Uint8(_e4m3x2(Float32(0.0), value) & Uint16(0xFF))
    nan = Uint8(0x7F) | cutlass.select_(value < Float32(0.0), Uint8(0x80), Uint8(0))
    return cutlass.select_(amax(Float32(0.0), value) <= Float32(E4M3_NAN_PAST), byte, nan)


@cute.jit
def zero() -> Float32:
    """An f32 zero."""
    return Float32(0.0)


@cute.jit
def widen(value) -> Float32:
    """A loaded scalar as f32 (exact: f16 and bf16 widen without rounding)."""
    return Float32(value)


@cute.jit
def narrow(values: list, dtype: cutlass.Constexpr):
    """f32 values as ``dtype``, each rounded to nearest even (``cvt.rn``): one scalar for one
    value, else a vector (a TensorSSA) to store at once."""
    if cutlass.const_expr(len(values) == 1):
        return dtype(values[0])
    vector = cute.make_rmem_tensor(len(values), Float32)
    for i in cutlass.range_constexpr(len(values)):
        vector[i] = values[i]
    return vector.load().to(dtype)


__all__ = ["E4M3_MAX", "E4M3_NAN_PAST", "add_rn", "amax", "div_rn", "e4m3", "fp8_scale", "mul_rn", "narrow", "widen",
           "zero"]
