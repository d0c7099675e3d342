"""f32 arithmetic that rounds once per operation, as torch's eager kernels do.

The compiler contracts a product and a sum of it (``a * b + c``) into one ``fma.rn.f32``
(checked: CuTeDSL 4.8 emits it for plain Float32 arithmetic, and ``ptxas`` may fuse a plain
``mul.f32`` and ``add.f32`` too), which rounds once where torch's ``mul`` then ``add``
kernels round twice: the results differ in the last bit.  ``mul.rn.f32`` and ``add.rn.f32``
(explicit rounding: the PTX ISA forbids fusing them) keep a kernel bit-identical to the same
steps in torch; they come from NVVM's ``mul.rn.f`` / ``add.rn.f`` intrinsics (what CUDA's
``__fmul_rn`` and ``__fadd_rn`` lower to), not from inline assembly.  The conversions in and
out of f32 (:func:`widen`, :func:`narrow`) sit here too, so that a CPU simulation of a kernel
(``tests/support/device_sim.py``) replaces all of its float arithmetic at one place.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


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


__all__ = ["add_rn", "mul_rn", "narrow", "widen", "zero"]
