"""Device functions for ``multimem.cp.async.bulk`` and ``multimem.cp.reduce.async.bulk``: bulk
copies and bulk reductions from this CTA's shared memory to every GPU of a multicast group.

``mc_dst`` is a multicast address (global memory).  Both join the thread's bulk async-group
(:func:`~ptxops.cp_async_bulk_commit_group` / :func:`~ptxops.cp_async_bulk_wait_group`).  These
instructions are PTX ISA 9.1: CuTeDSL's compiler assembles them; ``python -m ptxops check``
needs a ptxas of CUDA 13.1 or newer.  Under :func:`ptxops.emulate_multicast` each becomes one
``cp.async.bulk`` / ``cp.reduce.async.bulk`` to every rank's copy of ``mc_dst``.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..render import Instruction
from . import emit, emulation, forms
from .bulk import bulk_issuer

#: The unicast bulk form each one becomes under emulation: shared::cta to global.
_UNICAST = dict(dst="global", src="shared::cta", completion="bulk_group")


def _emit(inst: Instruction, unicast: Instruction, mc_dst, src, size: Any, extra, *, loc=None, ip=None) -> None:
    emit.state_space(inst.family, mc_dst, "global", ("global",))
    emit.state_space(inst.family, src, "shared::cta", ("shared::cta",))
    em = emulation.active()
    if em is None:
        bulk_issuer(inst, mc_dst, src, size, None, extra, loc=loc, ip=ip)(emit.address(mc_dst, loc=loc, ip=ip))
    else:
        emulation.multicast_bulk(em, mc_dst, bulk_issuer(unicast, mc_dst, src, size, None, loc=loc, ip=ip), loc=loc, ip=ip)


@dsl_user_op
def multimem_cp_async_bulk(
    mc_dst: cute.Pointer, src: cute.Pointer, size: Any, *, byte_mask: Any = None, loc=None, ip=None
) -> None:
    """Copy ``size`` bytes (a multiple of 16) from ``src`` (this CTA's shared memory) to the
    multicast address ``mc_dst`` on every GPU of the group:
    ``multimem.cp.async.bulk.global.shared::cta.bulk_group{.cp_mask}``.  ``byte_mask`` (16-bit,
    sm_100+) copies only the bytes of each 16 whose bit is set.  Both 16-byte aligned."""
    inst = emit.instruction("multimem.cp.async.bulk", cp_mask=None if byte_mask is None else "cp_mask")
    if byte_mask is not None and emulation.active() is not None:
        raise ValueError(f"{inst.opcode}: a byte mask is not emulated under emulate_multicast")
    unicast = emit.instruction("cp.async.bulk", **_UNICAST)
    mask = [] if byte_mask is None else [[cutlass.Int16(byte_mask).ir_value(loc=loc, ip=ip)]]
    _emit(inst, unicast, mc_dst, src, size, mask, loc=loc, ip=ip)


@dsl_user_op
def multimem_cp_reduce_async_bulk(
    mc_dst: cute.Pointer,
    src: cute.Pointer,
    size: Any,
    *,
    op: str = "add",
    dtype: type[cutlass.Numeric] | None = None,
    type: str | None = None,
    loc=None,
    ip=None,
) -> None:
    """Reduce ``size`` bytes of elements at ``src`` (this CTA's shared memory) into the
    multicast address ``mc_dst`` on every GPU of the group:
    ``multimem.cp.reduce.async.bulk.global.shared::cta.bulk_group.op{.noftz}.type``.

    ``op``: add, min, max, inc, dec, and, or, xor over ``dtype`` (default: ``src``'s) or the PTX
    ``type`` named, as :func:`~ptxops.cp_reduce_async_bulk` into global memory: each element's
    update on each GPU is an atomic read-modify-write; the array is not one atomic access.
    """
    family = "multimem.cp.reduce.async.bulk"
    inst = forms.scalar(family, dtype or src.dtype, op, type)
    q = inst.qualifiers
    unicast = emit.instruction("cp.reduce.async.bulk", **_UNICAST, op=q["op"], type=q["type"])
    _emit(inst, unicast, mc_dst, src, size, [], loc=loc, ip=ip)


__all__ = ["multimem_cp_async_bulk", "multimem_cp_reduce_async_bulk"]
