"""Device functions for ``st.async``, ``red.async`` and ``mapa``: writes into another CTA's
shared memory that complete on its mbarrier, and the address map that names that memory.

``mapa(ptr, rank)`` turns a pointer into this CTA's shared memory into a distributed-shared
pointer (``.shared::cluster``) to the same variable in the CTA of ``rank``; hand that pointer,
and the mapped pointer of the receiver's mbarrier, to :func:`st_async` or :func:`red_async`.
The receiver raises its mbarrier's expected transaction count by the bytes it expects
(:func:`~ptxops.mbarrier_arrive` with ``tx_count``) and waits on the phase.  The state space
follows the pointer (``.shared::cluster`` for a distributed-shared one, ``.global`` for a global
one, generic addressing for a generic one) unless ``space=`` says otherwise.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.cluster import MBARRIER, RED_ASYNC, ST_ASYNC
from ..spec.engine import Value
from . import alignment, emit, forms, pointer_reach, values

@dsl_user_op
def st_async(
    ptr: cute.Pointer,
    value: Any,
    mbar: cute.Pointer | None = None,
    *,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Store ``value`` (a scalar, a sequence or a TensorSSA) asynchronously at ``ptr`` in
    another CTA's shared memory and, once written, perform a complete-tx of its size in bytes
    on the mbarrier at ``mbar`` in that same CTA:
    ``st.async{.weak}.shared::cluster.mbarrier::complete_tx::bytes{.vec}.type [ptr], value, [mbar]``.

    The store is weak; the receiver that waits on the mbarrier's phase sees it.  32- and 64-bit
    types, ``.v2`` of both and ``.v4`` of 32-bit ones (sub-word values are packed into 32-bit
    words: eight BFloat16 are one ``.v4.b32``).  On sm_100+, ``sem="release"`` with ``scope``
    ``"gpu"`` or ``"sys"`` and no ``mbar`` is a release store to global memory instead.
    """
    dtype, n = values.data_shape(value, dtype, ptr.dtype, num_elements, packed, type is not None)
    space = emit.state_space("st.async", ptr, space, ST_ASYNC.domain("space"))
    q = {"sem": sem, "scope": scope, "space": space, "completion": MBARRIER if mbar is not None else None}
    if type is not None:
        inst = emit.instruction("st.async", type=type, vec=vec, **q)
    else:
        inst = forms.choose("st.async", dtype, n, forms.words(dtype), **q)
    extra = emit.mbarrier_operand(inst, mbar, space, (space,), loc=loc, ip=ip)
    emit.send(inst, ptr, [(value, dtype)], packed, extra=extra, loc=loc, ip=ip)


@dsl_user_op
def red_async(
    ptr: cute.Pointer,
    value: Any,
    mbar: cute.Pointer | None = None,
    *,
    op: str = "add",
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    type: str | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Reduce ``value`` asynchronously into ``ptr`` in another CTA's shared memory and, once
    done, perform a complete-tx of its size in bytes on the mbarrier at ``mbar`` in that CTA:
    ``red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.op.type [ptr],
    value, [mbar]``.

    ``op`` is add (u32/s32/u64), min, max (u32/s32), inc, dec (u32) or and, or, xor (b32),
    the type following ``value``'s dtype.  The reduction is relaxed at cluster scope and the
    complete-tx has ``.release.cluster`` semantics.  With ``mbar`` the sem and scope default to
    ``.relaxed.cluster``; without it (sm_100+) to ``.release`` with the ``scope`` you name,
    ``"gpu"`` or ``"sys"``: a release reduction (``.add``) in global memory.
    """
    dtype, _ = values.data_shape(value, dtype, ptr.dtype, None, packed, type is not None)
    space = emit.state_space("red.async", ptr, space, RED_ASYNC.domain("space"))
    if mbar is not None:
        sem, scope = sem or "relaxed", scope or "cluster"
    inst = forms.scalar(
        "red.async", dtype, op, type, sem=sem or "release", scope=scope, space=space,
        completion=MBARRIER if mbar is not None else None,
    )
    extra = emit.mbarrier_operand(inst, mbar, space, (space,), loc=loc, ip=ip)
    emit.send(inst, ptr, [(value, dtype)], packed, extra=extra, loc=loc, ip=ip)


@dsl_user_op
def mapa(
    ptr: cute.Pointer, rank: Any, *, space: Value = "auto", type: str | None = None, loc=None, ip=None
) -> cute.Pointer:
    """The address of ``ptr``'s location in the shared memory of the CTA of cluster rank
    ``rank`` (an int or Int32): ``mapa{.shared::cluster}.type d, ptr, rank``.

    A pointer into this CTA's shared memory maps with ``.shared::cluster.u32`` to a
    distributed-shared pointer (``cute.AddressSpace.dsmem``) for :func:`st_async`,
    :func:`red_async`, :func:`~ptxops.cp_reduce_async_bulk` and ``.shared::cluster`` mbarrier
    arrives; a generic pointer to shared memory maps with ``.u64`` to a generic pointer
    (``type=`` names the other width).  The result keeps ``ptr``'s dtype and known alignment,
    and has cluster reach (:func:`ptxops.reach`): an ordered access to it needs ``.cluster``
    scope or wider.
    """
    if space == "auto":
        space = None if ptr.memspace == cute.AddressSpace.generic else "shared::cluster"
    space = emit.state_space("mapa", ptr, space, (None, "shared::cluster"))
    inst = emit.instruction("mapa", space=space, type=type or ("u64" if space is None else "u32"))
    integer = cutlass.Int64 if inst.operands[0].bits == 64 else cutlass.Int32
    address = integer(ptr.toint(loc=loc, ip=ip)).ir_value(loc=loc, ip=ip)
    sources = [[address], [cutlass.Int32(rank).ir_value(loc=loc, ip=ip)]]
    (mapped,) = emit.emit(inst, None, sources, loc=loc, ip=ip)
    memspace = cute.AddressSpace.generic if space is None else cute.AddressSpace.dsmem
    mapped_ptr = cute.make_ptr(ptr.dtype, integer(mapped), memspace, assumed_align=alignment.known(ptr), loc=loc, ip=ip)
    return pointer_reach.reach(mapped_ptr, "cluster", by="ptxops.mapa", loc=loc, ip=ip)


__all__ = ["mapa", "red_async", "st_async"]
