"""Turn a validated :class:`~ptxops.render.Instruction` into one CuTeDSL inline-asm op.

This is the only module that builds ``llvm.inline_asm``; the device functions choose a form,
validate it through :mod:`ptxops.spec` and hand it here with their operands.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.base_dsl.runtime.cuda import get_compute_capability_major_minor
from cutlass.cutlass_dsl import BaseDSL, T

from .. import spec
from ..errors import DefaultTargetWarning, QualifierError
from ..render import Instruction
from ..spec.engine import Value
from ..spec.ptxtypes import TYPES
from ..spec.targets import normalise_target
from . import alignment, pointer_reach, values

#: The state space a pointer's address space implies when the caller names none.
SPACE_OF_POINTER = {
    cute.AddressSpace.gmem: "global",
    cute.AddressSpace.smem: "shared::cta",
    cute.AddressSpace.dsmem: "shared::cluster",
    cute.AddressSpace.rmem: "local",
    cute.AddressSpace.cmem: "const",
    cute.AddressSpace.generic: None,
}
#: Address spaces a pointer may have for each state-space qualifier.
POINTERS_FOR_SPACE = {
    None: (cute.AddressSpace.generic, cute.AddressSpace.gmem),
    "global": (cute.AddressSpace.gmem, cute.AddressSpace.generic),
    "shared": (cute.AddressSpace.smem,),
    "shared::cta": (cute.AddressSpace.smem,),
    "shared::cluster": (cute.AddressSpace.smem, cute.AddressSpace.dsmem),
    "local": (cute.AddressSpace.rmem,),
    "const": (cute.AddressSpace.cmem,),
}


def compile_target() -> str:
    """The target of the compile being traced (``cute.GPUArch`` option, else CUTE_DSL_ARCH, else
    the GPU CuTeDSL finds, else CuTeDSL's default, which :func:`_say_default_target` names once)."""
    dsl = BaseDSL._get_dsl()
    target = normalise_target(dsl.get_arch_enum().name)
    if not dsl.compile_options.gpu_arch and not os.environ.get("CUTE_DSL_ARCH"):
        _say_default_target(target)
    return target


@functools.cache
def _say_default_target(target: str) -> None:
    """Warn, once per process, that ``target`` is CuTeDSL's default where no GPU is visible."""
    if get_compute_capability_major_minor() == (None, None):
        warnings.warn(DefaultTargetWarning(target), stacklevel=_outside_ptxops())


#: The packages between a kernel and the warning: ptxops, and CuTeDSL's wrappers of its functions.
_INSIDE = ("ptxops", "cutlass")


def _outside_ptxops() -> int:
    """The ``stacklevel`` of the nearest caller outside ptxops and CuTeDSL (the kernel calling a
    device function), counted from the function that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _INSIDE:
        frame, level = frame.f_back, level + 1
    return level


def instruction(family: str, **qualifiers: Value) -> Instruction:
    """:func:`ptxops.spec.instruction` for the target being compiled."""
    return spec.instruction(family, target=compile_target(), **qualifiers)


def state_space(family: str, ptr: cute.Pointer, space: Value, allowed: Sequence[Value]) -> Value:
    """The state-space qualifier for ``ptr``: the caller's, checked, or the one ``ptr`` implies."""
    memspace = ptr.memspace
    if space == "auto":
        if memspace not in SPACE_OF_POINTER:
            raise _pointer_error(family, f"a pointer in {memspace} memory", allowed)
        space = SPACE_OF_POINTER[memspace]
        if space not in allowed and None in allowed and memspace == cute.AddressSpace.generic:
            space = None
    if space not in allowed:
        raise _pointer_error(family, f"space={space!r} (pointer in {memspace})", allowed)
    if memspace not in POINTERS_FOR_SPACE.get(space, ()):
        raise _pointer_error(family, f"space={space!r} with a pointer in {memspace} memory", allowed)
    return space


def _pointer_error(family: str, what: str, allowed: Sequence[Value]) -> QualifierError:
    legal = [("generic" if s is None else s) for s in allowed]
    return QualifierError(
        family,
        f"{family}: {what} is not allowed (target {compile_target()}).\n"
        f"  rule [pointer-space]: {family} addresses memory in "
        f"{', '.join(legal)}; pass a pointer in one of those spaces.",
        offending={"space": what},
        rule="pointer-space",
        legal={"space": list(allowed)},
        target=compile_target(),
    )


def check_alignment(inst: Instruction, ptr: cute.Pointer) -> None:
    """Reject an access wider than the pointer's known alignment (vector accesses must be
    naturally aligned, or the GPU faults with a misaligned-address error)."""
    data = next((o for o in inst.operands if o.role in ("b", "d")), None)
    if data is None:
        return
    require_alignment(inst, ptr, "", data.count * TYPES[str(inst.qualifiers["type"])].bits // 8)


def require_alignment(inst: Instruction, ptr: cute.Pointer, what: str, bytes_: int) -> None:
    """Reject a pointer not known to be ``bytes_``-byte aligned where the instruction needs
    that alignment (a vector access its width, a bulk copy 16 bytes, an mbarrier 8).  The
    alignment is the pointer's type's or what its offsets' arithmetic proves
    (:func:`ptxops.ops.alignment.known`)."""
    proved = alignment.known(ptr)
    if proved >= bytes_:
        return
    need = (f"a {bytes_}-byte access must be {bytes_}-byte aligned" if not what
            else f"{inst.family} needs a {bytes_}-byte aligned {what}")
    element = max(ptr.dtype.width // 8, 1)
    divby = max(bytes_ // element, 1)
    raise QualifierError(
        inst.family,
        f"{inst.opcode}: the {what + ' ' if what else ''}pointer is known to be {proved}-byte "
        f"aligned, but {bytes_}-byte alignment is needed (target {inst.target}).\n"
        f"  rule [pointer-alignment]: {need}.\n"
        f"  ptxops proves alignment from the pointer's type and from how its offsets were "
        f"computed (products and shifts by constants, sums, loop steps, cute.assume); it proves "
        f"{proved} bytes here.\n"
        f"  Fix: an offset that is a multiple of {divby} elements ({bytes_} bytes of {ptr.dtype}) "
        f"by construction, or `ptr + cute.assume(offset, divby={divby})` where it is one but "
        f"cannot be proved; a {bytes_}-byte aligned base (the tensor's assumed_align="
        f"{bytes_}, an allocation's byte_alignment={bytes_})"
        + (", or a narrower access." if not what else "."),
        offending={"alignment": proved},
        rule="pointer-alignment",
        legal={"alignment": [bytes_]},
        target=inst.target,
    )


def require_size_multiple(inst: Instruction, size: Any, unit: int) -> None:
    """Reject a byte count not known to be a positive multiple of ``unit`` (a power of two):
    a Python int by its value, a CuTeDSL integer by what its arithmetic proves
    (:func:`ptxops.ops.alignment.multiple`: products by constants, ``cute.assume``, ...)."""
    constant = size.value if isinstance(size, cutlass.Numeric) else size
    if isinstance(constant, int) and constant <= 0:
        raise ValueError(f"{inst.opcode}: size must be a positive multiple of {unit} bytes, got {constant}")
    proved = alignment.multiple(size)
    if proved % unit == 0:
        return
    known = f"is {constant}" if isinstance(constant, int) else f"is known to be a multiple of {proved}"
    raise QualifierError(
        inst.family,
        f"{inst.opcode}: the size {known}, but it must be a multiple of {unit} bytes (target "
        f"{inst.target}).\n  rule [size-multiple]: {inst.family} moves whole {unit}-byte units.\n"
        f"  Fix: a size that is a multiple of {unit} by construction (a product by a multiple of "
        f"{unit}, a constant), or `cute.assume(size, divby={unit})` where it is one but cannot be "
        "proved.",
        offending={"size": constant if isinstance(constant, int) else proved},
        rule="size-multiple",
        legal={"size_multiple_of": [unit]},
        target=inst.target,
    )


#: An mbarrier object is 8 bytes, 8-byte aligned.
MBARRIER_ALIGN = 8


def mbarrier_operand(
    inst: Instruction, mbar: cute.Pointer | None, space: Value, allowed: Sequence[Value], *, loc=None, ip=None
) -> list[list[ir.Value]]:
    """The carriers of ``inst``'s mbarrier operand (none if the form has none): ``mbar`` must be
    given exactly when the form completes on an mbarrier, in one of ``allowed`` spaces, 8-byte
    aligned."""
    needed = any(o.role == "mbar" for o in inst.operands)
    if needed != (mbar is not None):
        raise ValueError(
            f"{inst.opcode}: " + ("needs mbar= (the mbarrier it completes on)" if needed else "takes no mbar")
        )
    if mbar is None:
        return []
    state_space(inst.family, mbar, space, allowed)
    require_alignment(inst, mbar, "mbarrier", MBARRIER_ALIGN)
    return [[address(mbar, loc=loc, ip=ip)]]


def cache_hint(cache_policy: Any, *, loc=None, ip=None) -> tuple[Value, list]:
    """The ``cache_hint`` qualifier (``.L2::cache_hint``) and the extra operand carriers for a
    64-bit L2 cache policy from ``createpolicy``; ``(None, [])`` without one."""
    if cache_policy is None:
        return None, []
    return "cache_hint", [[cutlass.Int64(cache_policy).ir_value(loc=loc, ip=ip)]]


def address(ptr: cute.Pointer, *, loc=None, ip=None) -> ir.Value:
    """The address operand: a shared pointer's 32-bit offset, else the 64-bit address."""
    return ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)


def emit(
    inst: Instruction,
    addr: ir.Value | None,
    sources: Sequence[Sequence[ir.Value]] = (),
    *,
    loc=None,
    ip=None,
) -> list[ir.Value]:
    """Emit ``inst`` with its address and the carriers of each source operand, in operand
    order; return the carriers of its destination (empty for stores, reductions, fences)."""
    out_bits = [b for o in inst.outputs for b in o.carriers]
    operands: list[ir.Value] = []
    pending = list(sources)
    for op in inst.inputs:
        if op.role == "a":
            operands.append(addr)
        else:
            values = list(pending.pop(0))
            if len(values) != len(op.carriers):
                raise ValueError(
                    f"{inst.opcode}: operand {op.role} needs {len(op.carriers)} registers, "
                    f"got {len(values)}"
                )
            operands += values
    if not out_bits:
        result_type = None
    elif len(out_bits) == 1:
        result_type = T.i(out_bits[0])
    else:
        result_type = llvm.StructType.get_literal([T.i(b) for b in out_bits])
    result = llvm.inline_asm(
        result_type,
        operands,
        inst.template,
        inst.constraints,
        has_side_effects=True,
        asm_dialect=0,
        loc=loc,
        ip=ip,
    )
    if len(out_bits) <= 1:
        return [result] if out_bits else []
    return [llvm.extractvalue(T.i(b), result, [i], loc=loc, ip=ip) for i, b in enumerate(out_bits)]


def send(
    inst: Instruction,
    ptr: cute.Pointer,
    sources: Sequence[tuple[Any, Any]],
    packed: bool,
    *,
    result: Any = None,
    extra: Sequence[Sequence[ir.Value]] = (),
    loc=None,
    ip=None,
) -> Any:
    """Emit a memory instruction at ``ptr``: check alignment, pack each ``(data, dtype)``
    source, append the carriers in ``extra`` (operands after the data: a cache policy, an
    mbarrier address), and return the destination as ``result`` dtype values (None if it has
    none).  An ordered form is checked against ``ptr``'s reach (:func:`ptxops.reach`)."""
    pointer_reach.check(inst, ptr)
    check_alignment(inst, ptr)
    operands = [o for o in inst.inputs if o.role != "a"]
    carriers = [
        values.source(data, dtype, op, packed, loc=loc, ip=ip)
        for (data, dtype), op in zip(sources, operands)
    ]
    out = emit(inst, address(ptr, loc=loc, ip=ip), [*carriers, *extra], loc=loc, ip=ip)
    if not inst.outputs:
        return None
    return values.result(out, result, inst.outputs[0], packed, loc=loc, ip=ip)
