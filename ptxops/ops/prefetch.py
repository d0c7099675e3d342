"""Device functions for ``prefetch``, ``prefetchu`` and ``cp.async.bulk.prefetch``: cache hints
that bring data (or a tensor map) closer before it is read.

A prefetch changes no memory and orders nothing: it only makes a later load (or the TMA's read
of a tensor map) faster.  The state space follows the pointer (``.global`` for a global one,
``.local`` for a register-memory one, generic addressing for a generic one) unless ``space=``
says otherwise; a tensor map in global memory is prefetched through its generic address.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from ..spec.prefetch import PARAM, PREFETCH
from . import emit

#: ``cp.async.bulk.prefetch`` needs a 16-byte aligned address and a size that is a multiple of 16.
BULK_ALIGN = 16


@dsl_user_op
def prefetch(ptr: cute.Pointer, level: str = "L2", *, space: Value = "auto", loc=None, ip=None) -> None:
    """``prefetch{.space}.level [ptr]``: bring the line holding ``ptr`` into the ``"L1"`` or
    ``"L2"`` cache, into L2 with an eviction priority (``"L2::evict_last"``,
    ``"L2::evict_normal"``; global memory only), or, with ``level="tensormap"``, bring the
    128-byte tensor map at ``ptr`` into the cache the TMA reads descriptors from (a tensor map
    in global memory is addressed generically, one in constant memory as ``.const``).
    """
    if space == "auto" and level == "tensormap" and ptr.memspace == cute.AddressSpace.gmem:
        space = None
    allowed = tuple(s for s in PREFETCH.domain("space") if s != PARAM)
    space = emit.state_space("prefetch", ptr, space, allowed)
    inst = emit.instruction("prefetch", space=space, level=level)
    emit.emit(inst, emit.address(ptr, loc=loc, ip=ip), loc=loc, ip=ip)


@dsl_user_op
def prefetchu(ptr: cute.Pointer, *, loc=None, ip=None) -> None:
    """``prefetchu.L1 [ptr]``: bring the line at the generic address ``ptr`` (a generic or
    global pointer) into the uniform cache."""
    emit.state_space("prefetchu", ptr, None, (None,))
    emit.emit(emit.instruction("prefetchu", level="L1"), emit.address(ptr, loc=loc, ip=ip), loc=loc, ip=ip)


@dsl_user_op
def cp_async_bulk_prefetch(
    ptr: cute.Pointer, size: Any, *, cache_policy: Any = None, loc=None, ip=None
) -> None:
    """``cp.async.bulk.prefetch.L2.global{.L2::cache_hint} [ptr], size{, policy}``: prefetch
    ``size`` bytes (an int or Int32, a multiple of 16: proved from its arithmetic, or
    ``cute.assume(size, divby=16)``) of global memory from ``ptr`` (16-byte
    aligned) into L2, asynchronously; nothing waits for it.  ``cache_policy`` (a 64-bit policy
    from ``createpolicy``) adds ``.L2::cache_hint``."""
    emit.state_space("cp.async.bulk.prefetch", ptr, "global", ("global",))
    hint, extra = emit.cache_hint(cache_policy, loc=loc, ip=ip)
    inst = emit.instruction("cp.async.bulk.prefetch", cache_hint=hint)
    emit.require_size_multiple(inst, size, BULK_ALIGN)
    emit.require_alignment(inst, ptr, "source", BULK_ALIGN)
    sources = [[cutlass.Int32(size).ir_value(loc=loc, ip=ip)], *extra]
    emit.emit(inst, emit.address(ptr, loc=loc, ip=ip), sources, loc=loc, ip=ip)


__all__ = ["cp_async_bulk_prefetch", "prefetch", "prefetchu"]
