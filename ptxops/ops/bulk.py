"""Device functions for ``cp.async.bulk`` and ``cp.reduce.async.bulk`` (1-D TMA bulk copies
and bulk reductions) and their bulk async-groups.

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

from collections.abc import Callable, Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass.cutlass_dsl import dsl_user_op

from .. import spec
from ..render import Instruction
from ..spec.bulk import MBARRIER
from ..spec.engine import Value
from . import emit, emulation, forms

#: Bulk copies need 16-byte aligned addresses and a size that is a multiple of 16.
BULK_ALIGN = 16


def _spaces(family: str, dst, src, dst_space: Value, src_space: Value) -> tuple[Value, Value]:
    fam = spec.family(family)
    return (
        emit.state_space(family, dst, dst_space, fam.domain("dst")),
        emit.state_space(family, src, src_space, fam.domain("src")),
    )


def completion_for(completion: Value, mbar: cute.Pointer | None) -> Value:
    """The completion mechanism ``mbar`` implies unless the caller names one."""
    if completion != "auto":
        return completion
    return MBARRIER if mbar is not None else "bulk_group"


def bulk_issuer(
    inst: Instruction, dst, src, size: Any, mbar, extra: Sequence[list[ir.Value]] = (), *, loc=None, ip=None
) -> Callable[[ir.Value], None]:
    """Check a bulk form's mbarrier, size and alignments; return what emits it to a
    destination address (``extra``: the carriers of operands after the size and mbarrier)."""
    emit.require_size_multiple(inst, size, BULK_ALIGN)
    emit.require_alignment(inst, dst, "destination", BULK_ALIGN)
    emit.require_alignment(inst, src, "source", BULK_ALIGN)
    mbar_carriers = emit.mbarrier_operand(
        inst, mbar, "auto", ("shared::cta", "shared::cluster"), loc=loc, ip=ip
    )
    operands = [
        [emit.address(src, loc=loc, ip=ip)],
        [cutlass.Int32(size).ir_value(loc=loc, ip=ip)],
        *mbar_carriers,
        *extra,
    ]

    def issue(address: ir.Value) -> None:
        emit.emit(inst, None, [[address], *operands], loc=loc, ip=ip)

    return issue


def _emit_bulk(inst: Instruction, dst, src, size: Any, mbar, extra: Sequence[list[ir.Value]] = (), *,
               loc=None, ip=None) -> None:
    """Check and emit a bulk form (``extra``: the cache policy's carriers, if any); under
    :func:`~ptxops.emulate_multicast`, a ``.global`` destination inside a multicast window
    becomes one bulk operation per rank."""
    issue = bulk_issuer(inst, dst, src, size, mbar, extra, loc=loc, ip=ip)
    em = emulation.active()
    if em is not None and inst.qualifiers.get("dst") == "global":
        emulation.bulk_copy(em, dst, issue, loc=loc, ip=ip)
    else:
        issue(emit.address(dst, loc=loc, ip=ip))


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
    cache_policy: Any = None,
    loc=None,
    ip=None,
) -> None:
    """Copy ``size`` bytes (an int or Int32, a multiple of 16) from ``src`` to ``dst``
    asynchronously: ``cp.async.bulk.dst.src.completion{.L2::cache_hint} [dst], [src], size{,
    [mbar]}{, cache_policy}``; ``cache_policy`` (a 64-bit L2 policy from ``createpolicy``,
    for a copy to or from global memory) adds ``.L2::cache_hint``.

    Global to shared (``.shared::cta`` or ``.shared::cluster``) and shared to another CTA's
    shared memory complete on the mbarrier at ``mbar``; shared to global completes in the
    bulk async-group (``.bulk_group``, no ``mbar``).  ``completion`` defaults to the one that
    ``mbar`` implies.  Both pointers must be 16-byte aligned.
    """
    dst_space, src_space = _spaces("cp.async.bulk", dst, src, dst_space, src_space)
    cache_hint, extra = emit.cache_hint(cache_policy, loc=loc, ip=ip)
    inst = emit.instruction(
        "cp.async.bulk", dst=dst_space, src=src_space, completion=completion_for(completion, mbar),
        cache_hint=cache_hint,
    )
    _emit_bulk(inst, dst, src, size, mbar, extra, loc=loc, ip=ip)


@dsl_user_op
def cp_reduce_async_bulk(
    dst: cute.Pointer,
    src: cute.Pointer,
    size: Any,
    *,
    op: str = "add",
    dtype: type[cutlass.Numeric] | None = None,
    mbar: cute.Pointer | None = None,
    dst_space: Value = "auto",
    src_space: Value = "auto",
    completion: Value = "auto",
    type: str | None = None,
    cache_policy: Any = None,
    loc=None,
    ip=None,
) -> None:
    """Reduce ``size`` bytes of elements at ``src`` (this CTA's shared memory) into ``dst``
    asynchronously: ``cp.reduce.async.bulk.dst.src.completion{.L2::cache_hint}.op{.noftz}.type
    [dst], [src], size{, [mbar]}{, cache_policy}`` (``cache_policy``, into ``.global`` only:
    a 64-bit L2 policy from ``createpolicy``).

    Element-wise: every ``dst[i]`` becomes ``op(dst[i], src[i])`` for ``op`` in add, min, max,
    inc, dec, and, or, xor over elements of ``dtype`` (default: ``src``'s; Int32 add is
    ``.s32``, BFloat16 add ``.add.noftz.bf16``, ...) or of the PTX ``type`` named.  Each
    element's reduction is a separate atomic read-modify-write with ``.relaxed.gpu``
    semantics; the array as a whole is not one atomic access, and the source reads are weak.
    A ``.gpu`` scope holds only the issuing GPU's threads, so reductions that several GPUs
    issue into one peer array are not atomic with respect to each other by the PTX memory
    model.  The f32 add flushes subnormals to zero; the f16/bf16 add keeps them.

    Into ``.global`` (a global or generic pointer) the reduction joins the bulk async-group
    (``.bulk_group``: :func:`cp_async_bulk_commit_group` / :func:`cp_async_bulk_wait_group`);
    into another CTA's shared memory (``.shared::cluster``, a distributed-shared pointer, e.g.
    from :func:`~ptxops.mapa`) it completes on that CTA's mbarrier at ``mbar``, whose
    complete-tx has ``.release.cluster`` semantics.  Both pointers 16-byte aligned, ``size`` a
    multiple of 16.
    """
    dst_space, src_space = _spaces("cp.reduce.async.bulk", dst, src, dst_space, src_space)
    cache_hint, extra = emit.cache_hint(cache_policy, loc=loc, ip=ip)
    inst = forms.scalar(
        "cp.reduce.async.bulk", dtype or src.dtype, op, type,
        dst=dst_space, src=src_space, completion=completion_for(completion, mbar), cache_hint=cache_hint,
    )
    _emit_bulk(inst, dst, src, size, mbar, extra, loc=loc, ip=ip)


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


__all__ = [
    "cp_async_bulk", "cp_async_bulk_commit_group", "cp_async_bulk_wait_group",
    "cp_reduce_async_bulk",
]
