"""Device functions for ``cp.async.bulk`` (1-D TMA bulk copies) and its bulk async-groups.

A copy into shared memory completes on an mbarrier (pass ``mbar=``: the copy's bytes count
down the transaction count that :func:`~ptxops.mbarrier_arrive` with ``tx_count`` raised); a
copy out to global memory joins the thread's bulk async-group, which
:func:`cp_async_bulk_commit_group` closes and :func:`cp_async_bulk_wait_group` waits on.  The
state spaces follow the pointers (``.global`` for a global pointer, ``.shared::cta`` for a shared
one, ``.shared::cluster`` for a distributed-shared one) unless ``dst_space``/``src_space`` say
otherwise.  Under :func:`ptxops.emulate_multicast` a copy to a global address in a multicast
window becomes one copy per rank.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from .. import emulation
from ..spec.bulk import CP_ASYNC_BULK, MBARRIER
from ..spec.engine import Value
from . import emit

#: Bulk copies need 16-byte aligned addresses and a size that is a multiple of 16.
BULK_ALIGN = 16


@dsl_user_op
def cp_async_bulk(
    dst: cute.Pointer,
    src: cute.Pointer,
    size: Any,
    *,
    mbar: cute.Pointer | None = None,
    dst_space: Value = "auto",
    src_space: Value = "auto",
    completion: Value = "auto",
    loc=None,
    ip=None,
) -> None:
    """Copy ``size`` bytes (an int or Int32, a multiple of 16) from ``src`` to ``dst``
    asynchronously: ``cp.async.bulk.dst.src.completion [dst], [src], size{, [mbar]}``.

    Global to shared (``.shared::cta`` or ``.shared::cluster``) and shared to another CTA's
    shared memory complete on the mbarrier at ``mbar``; shared to global completes in the
    bulk async-group (``.bulk_group``, no ``mbar``).  ``completion`` defaults to the one that
    ``mbar`` implies.  Both pointers must be 16-byte aligned.
    """
    dst_space = emit.state_space("cp.async.bulk", dst, dst_space, CP_ASYNC_BULK.domain("dst"))
    src_space = emit.state_space("cp.async.bulk", src, src_space, CP_ASYNC_BULK.domain("src"))
    if completion == "auto":
        completion = MBARRIER if mbar is not None else "bulk_group"
    inst = emit.instruction("cp.async.bulk", dst=dst_space, src=src_space, completion=completion)
    needs_mbar = any(o.role == "mbar" for o in inst.operands)
    if needs_mbar != (mbar is not None):
        raise ValueError(
            f"{inst.opcode}: "
            + ("needs mbar= (the mbarrier the copy completes on)" if needs_mbar else "takes no mbar")
        )
    if isinstance(size, int) and (size <= 0 or size % BULK_ALIGN):
        raise ValueError(f"{inst.opcode}: size must be a positive multiple of 16 bytes, got {size}")
    emit.require_alignment(inst, dst, "destination", BULK_ALIGN)
    emit.require_alignment(inst, src, "source", BULK_ALIGN)
    operands = [
        [emit.address(src, loc=loc, ip=ip)],
        [cutlass.Int32(size).ir_value(loc=loc, ip=ip)],
    ]
    if mbar is not None:
        emit.state_space("cp.async.bulk", mbar, "auto", ("shared::cta", "shared::cluster"))
        emit.require_alignment(inst, mbar, "mbarrier", 8)
        operands.append([emit.address(mbar, loc=loc, ip=ip)])

    def copy(address) -> None:
        emit.emit(inst, None, [[address], *operands], loc=loc, ip=ip)

    em = emulation.active()
    if em is not None and dst_space == "global":
        emulation.bulk_copy(em, dst, copy, loc=loc, ip=ip)  # one copy per rank in a window
    else:
        copy(emit.address(dst, loc=loc, ip=ip))


@dsl_user_op
def cp_async_bulk_commit_group(*, loc=None, ip=None) -> None:
    """``cp.async.bulk.commit_group``: close this thread's bulk async-group (the
    ``.bulk_group`` copies issued since the last commit)."""
    emit.emit(emit.instruction("cp.async.bulk.commit_group"), None, loc=loc, ip=ip)


@dsl_user_op
def cp_async_bulk_wait_group(n: int = 0, *, read: bool | str | None = None, loc=None, ip=None) -> None:
    """``cp.async.bulk.wait_group{.read} n``: wait until at most ``n`` (a Python int, 0 for
    all) of this thread's committed bulk async-groups are pending.  ``read=True`` waits only
    until their sources have been read, so the shared memory they copied from may be reused.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"cp.async.bulk.wait_group: n must be a non-negative Python int, got {n!r}")
    inst = emit.instruction(
        "cp.async.bulk.wait_group", read="read" if read is True else (None if read is False else read)
    )
    emit.emit(inst, None, [[cutlass.Int32(n).ir_value(loc=loc, ip=ip)]], loc=loc, ip=ip)


__all__ = ["cp_async_bulk", "cp_async_bulk_commit_group", "cp_async_bulk_wait_group"]
