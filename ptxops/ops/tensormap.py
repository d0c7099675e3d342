"""Device functions for ``tensormap.replace`` and ``tensormap.cp_fenceproxy``: edit a tensor map
on the device and publish it to the TMA unit.

The usual sequence (a per-rank or per-tile map built in a kernel): copy a template map into
shared memory, :func:`tensormap_replace` its fields there (``global_address``, ``global_dim``,
...), :func:`tensormap_cp_fenceproxy` it to global memory with release semantics (every thread
of the warp), and in the threads that use it ``fence(proxy="tensormap::generic",
sem="acquire", ...)`` on the map before the first TMA instruction reads it.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..errors import QualifierError
from ..spec.engine import Value
from ..spec.tensormap import DIMENSION_FIELDS, MODE_FIELDS, WIDE_FIELDS, immediate_range
from . import emit
from .tensor import TENSOR_MAP_ALIGN


def _immediate(inst, what: str, value: Any, allowed: range) -> cutlass.Int32:
    """A Python int in ``allowed``, as the constant an ``n`` operand needs."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise QualifierError(
            inst.family,
            f"{inst.opcode}: {what} must be a Python int in {allowed.start}..{allowed.stop - 1} "
            f"(an immediate), got {value!r} (target {inst.target}).\n"
            f"  rule [immediate-range]: ptxas takes {what} only as a constant in that range.",
            offending={what: value},
            rule="immediate-range",
            legal={what: list(allowed)},
            target=inst.target,
        )
    return cutlass.Int32(value)


@dsl_user_op
def tensormap_replace(
    tensor_map: cute.Pointer,
    field: str,
    value: Any,
    *,
    ord: int | None = None,
    space: Value = "auto",
    loc=None,
    ip=None,
) -> None:
    """Write ``field`` of the tensor map at ``tensor_map`` (global, this CTA's shared memory, or
    generic; 64-byte aligned): ``tensormap.replace.tile.field{.space}.b1024.type``.

    ``global_address`` and ``global_stride`` take a 64-bit value, ``rank``, ``box_dim``,
    ``global_dim`` and ``element_stride`` a 32-bit one (an Int32/Int64 or int); the per-dimension
    fields (``box_dim``, ``global_dim``, ``global_stride``, ``element_stride``) need ``ord``, the
    dimension (a Python int, from 0).  The enumerated fields (``elemtype``,
    ``interleave_layout``, ``swizzle_mode``, ``swizzle_atomicity`` (sm_100a+), ``fill_mode``)
    take their ``CUtensorMap`` encoding as a Python int.  The write is a generic-proxy access:
    publish the map with :func:`tensormap_cp_fenceproxy` or a ``fence.proxy.tensormap::generic``
    release before TMA reads it.
    """
    family = "tensormap.replace"
    space = emit.state_space(family, tensor_map, space, (None, "global", "shared::cta"))
    inst = emit.instruction(
        family, field=field, space=space, type="b64" if field in WIDE_FIELDS else "b32"
    )
    emit.require_alignment(inst, tensor_map, "tensor map", TENSOR_MAP_ALIGN)
    if (ord is not None) != (field in DIMENSION_FIELDS):
        raise ValueError(f"{inst.opcode}: ord= is {'needed' if ord is None else 'not taken'} for .{field}")
    sources = []
    if field in DIMENSION_FIELDS:
        sources.append([_immediate(inst, "ord", ord, immediate_range("ord", inst.target)).ir_value(loc=loc, ip=ip)])
    if field in MODE_FIELDS:
        sources.append([_immediate(inst, field, value, immediate_range(field, inst.target)).ir_value(loc=loc, ip=ip)])
    else:
        kind = cutlass.Int64 if field in WIDE_FIELDS else cutlass.Int32
        sources.append([kind(value).ir_value(loc=loc, ip=ip)])
    emit.emit(inst, emit.address(tensor_map, loc=loc, ip=ip), sources, loc=loc, ip=ip)


@dsl_user_op
def tensormap_cp_fenceproxy(
    dst: cute.Pointer, src: cute.Pointer, *, scope: str = "gpu", loc=None, ip=None
) -> None:
    """Copy the 128-byte tensor map at ``src`` (this CTA's shared memory) to ``dst`` (global)
    and release it to the tensormap proxy at ``scope`` (cta, cluster, gpu or sys):
    ``tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.scope.sync.aligned
    [dst], [src], 128``.  Every thread of the warp executes it (``.sync.aligned``); both maps
    64-byte aligned."""
    family = "tensormap.cp_fenceproxy"
    emit.state_space(family, dst, "global", ("global",))
    emit.state_space(family, src, "shared::cta", ("shared::cta",))
    inst = emit.instruction(family, scope=scope)
    emit.require_alignment(inst, dst, "destination tensor map", TENSOR_MAP_ALIGN)
    emit.require_alignment(inst, src, "source tensor map", TENSOR_MAP_ALIGN)
    emit.emit(inst, None, [[emit.address(dst, loc=loc, ip=ip)], [emit.address(src, loc=loc, ip=ip)]], loc=loc, ip=ip)


__all__ = ["tensormap_cp_fenceproxy", "tensormap_replace"]
