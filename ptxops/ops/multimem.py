"""Device functions for ``multimem.ld_reduce``, ``multimem.st`` and ``multimem.red``.

``mc_ptr`` is a multicast address (global memory): every GPU of the multicast group holds the
location.  These functions never run on GPUs without NVLink multicast; compile them anywhere,
or trace them under :func:`ptxops.emulate_multicast` to emit unicast accesses to every rank.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.ptxtypes import FP8_ALL, HALF, HALF_X2
from . import emit, emulation, forms, pointer_reach, values

_ACC_NAMES = {cutlass.Float32: "f32", cutlass.Float16: "f16"}


def _acc(acc: Any, op: str, ptx_type: str) -> str | None:
    """``"auto"``: f32 for a 16-bit float add, f16 for an fp8 add, else the type's own."""
    if acc == "auto":
        if op != "add":
            return None
        return "f32" if ptx_type in HALF + HALF_X2 else "f16" if ptx_type in FP8_ALL else None
    return _ACC_NAMES.get(acc, acc)


def _form(family: str, dtype, n: int, op: str | None, type, vec, acc, **q) -> Any:
    def with_acc(ptx_type: str) -> dict:
        return {"acc": _acc(acc, op, ptx_type)} if family == "multimem.ld_reduce" else {}

    if op is not None:
        q["op"] = op
    if type is not None:
        return emit.instruction(family, type=type, vec=vec, **q, **with_acc(type))
    types = forms.arithmetic_types(dtype, op)
    candidates = forms.lanes(types)
    first = next((t for t, _ in candidates(n)), types[0])
    return forms.choose(family, dtype, n, candidates, **q, **with_acc(first))


@dsl_user_op
def multimem_ld_reduce(
    mc_ptr: cute.Pointer,
    *,
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int = 1,
    op: str = "add",
    acc: Any = "auto",
    sem: str | None = None,
    scope: str | None = None,
    space: str | None = "auto",
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> Any:
    """Load ``num_elements`` values at ``mc_ptr`` from every GPU of the group and reduce them.

    ``multimem.ld_reduce{.sem}{.scope}.global.op{.acc::prec}{.vec}.type``.  ``acc`` is the
    accumulation precision: ``"auto"`` (default) adds 16-bit floats in f32 and fp8 in f16,
    ``None`` keeps the type's own precision, or ``cutlass.Float32`` / ``"f32"`` etc.  ``sem``
    is weak (default), ``"relaxed"`` or ``"acquire"`` (the latter two need ``scope``).
    Returns a scalar for one value, else a TensorSSA of ``num_elements`` values of ``dtype``
    (default: the pointer's), or the raw registers with ``packed=True``.  ``type``/``vec``
    pick an exact PTX form instead of the packed one chosen for ``dtype``.
    """
    dtype = dtype or mc_ptr.dtype
    space = emit.state_space("multimem.ld_reduce", mc_ptr, space, ("global", None))
    inst = _form(
        "multimem.ld_reduce", dtype, num_elements, op, type, vec, acc,
        sem=sem, scope=scope, space=space,
    )
    if (em := emulation.active()) is not None:
        pointer_reach.check(inst, mc_ptr)
        return emulation.ld_reduce(em, inst, mc_ptr, dtype, packed)
    return emit.send(inst, mc_ptr, [], packed, result=dtype, loc=loc, ip=ip)


@dsl_user_op
def multimem_st(
    mc_ptr: cute.Pointer,
    data: Any,
    *,
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    sem: str | None = None,
    scope: str | None = None,
    space: str | None = "auto",
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Store ``data`` at ``mc_ptr`` on every GPU of the group.

    ``multimem.st{.sem}{.scope}.global{.vec}.type``; ``sem`` is weak (default), ``"relaxed"``
    or ``"release"``.  ``data`` is a TensorSSA, a sequence of scalars or one scalar of
    ``dtype`` (default: the pointer's), or packed registers with ``packed=True``.
    """
    dtype, n = values.data_shape(data, dtype, mc_ptr.dtype, num_elements, packed, type is not None)
    space = emit.state_space("multimem.st", mc_ptr, space, ("global", None))
    inst = _form("multimem.st", dtype, n, None, type, vec, None, sem=sem, scope=scope, space=space)
    if (em := emulation.active()) is not None:
        pointer_reach.check(inst, mc_ptr)
        return emulation.store(em, inst, mc_ptr, data, dtype, packed)
    emit.send(inst, mc_ptr, [(data, dtype)], packed, loc=loc, ip=ip)


@dsl_user_op
def multimem_red(
    mc_ptr: cute.Pointer,
    data: Any,
    *,
    op: str = "add",
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    sem: str | None = None,
    scope: str | None = None,
    space: str | None = "auto",
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Reduce ``data`` into ``mc_ptr`` on every GPU of the group.

    ``multimem.red{.sem}{.scope}.global.op{.vec}.type``; without ``sem`` PTX means
    ``.relaxed.sys``; with one (``"relaxed"``/``"release"``) give ``scope`` too.
    ``multimem_red(flag_mc, 1, sem="release", scope="sys")`` is the arrive of a barrier.
    """
    dtype, n = values.data_shape(data, dtype, mc_ptr.dtype, num_elements, packed, type is not None)
    space = emit.state_space("multimem.red", mc_ptr, space, ("global", None))
    inst = _form("multimem.red", dtype, n, op, type, vec, None, sem=sem, scope=scope, space=space)
    if (em := emulation.active()) is not None:
        pointer_reach.check(inst, mc_ptr)
        return emulation.reduce(em, inst, mc_ptr, data, dtype, packed)
    emit.send(inst, mc_ptr, [(data, dtype)], packed, loc=loc, ip=ip)


__all__ = ["multimem_ld_reduce", "multimem_st", "multimem_red"]
