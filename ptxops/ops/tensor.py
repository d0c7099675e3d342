"""Device functions for ``cp.async.bulk.tensor``, ``cp.reduce.async.bulk.tensor`` and
``cp.async.bulk.prefetch.tensor``: TMA copies, reductions and prefetches through a tensor map.

A tensor map is a ``cute.Pointer`` to a 64-byte aligned ``CUtensorMap`` in global memory (or a
generic pointer to one), as CuTeDSL's own TMA helpers take (``cpasync.copy_tensormap``,
``fence_tma_desc_acquire``); ``coords`` are one Int32 (or int) per dimension of the map, and the
form's ``.1d`` .. ``.5d`` follows their number (``.tile::gather4``/``.tile::scatter4``: five
coordinates of a 2-D map, the column and then the four rows).  The copy direction follows the pointers: a shared
destination is a load (tensor map as ``src``, completing on ``mbar``), a shared source a store
(tensor map as ``dst``, completing in the bulk async-group).  Shared memory is 128-byte
aligned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass.cutlass_dsl import dsl_user_op

from ..render import Instruction
from ..spec.engine import Value
from ..spec.tensor import DIMS, ROWS, WIDE
from . import emit
from .bulk import completion_for

#: A ``CUtensorMap`` is 128 bytes, 64-byte aligned.
TENSOR_MAP_ALIGN = 64
#: The shared memory of a tensor copy is 128-byte aligned (more for swizzled boxes: the map's).
TMA_SMEM_ALIGN = 128
SHARED_POINTERS = (cute.AddressSpace.smem, cute.AddressSpace.dsmem)


#: How many coordinates name the four rows of ``.tile::gather4``/``.tile::scatter4``.
ROW_COORDS = 5


def dim(family: str, coords: Sequence[Any], load_mode: Value = None) -> str:
    """The form's ``.dim``: ``"2d"`` for two coordinates, and for the five of four rows."""
    if load_mode in ROWS:
        if len(coords) != ROW_COORDS:
            raise ValueError(
                f"{family}: .{load_mode} takes {ROW_COORDS} coordinates (the column, then four "
                f"rows of a 2-D tensor), got {len(coords)}"
            )
        return "2d"
    if not 1 <= len(coords) <= len(DIMS):
        raise ValueError(f"{family}: give 1 to {len(DIMS)} tensor coordinates, got {len(coords)}")
    return DIMS[len(coords) - 1]


def operands(inst: Instruction, given: Mapping[str, list[ir.Value] | None]) -> list[list[ir.Value]]:
    """The carriers of ``inst``'s inputs, in operand order, from ``given`` (role -> carriers or
    None if the caller left it out); an error naming an operand the form needs and lacks, or one
    given that the form does not take."""
    roles = {o.role for o in inst.inputs}
    needed = [r for r in roles if given.get(r) is None]
    unused = [r for r, v in given.items() if v is not None and r not in roles]
    if needed or unused:
        raise ValueError(
            f"{inst.opcode}: "
            + "; ".join(
                ([f"needs the {', '.join(sorted(needed))} operand(s)"] if needed else [])
                + ([f"takes no {', '.join(sorted(unused))} operand(s)"] if unused else [])
            )
        )
    return [given[o.role] for o in inst.inputs]  # type: ignore[misc]


def _ints(values: Sequence[Any] | None, kind: type, *, loc=None, ip=None) -> list[ir.Value] | None:
    return None if values is None else [kind(v).ir_value(loc=loc, ip=ip) for v in values]


def tensor_operands(
    inst: Instruction, tensor_map: cute.Pointer, coords: Sequence[Any], *, loc=None, ip=None
) -> dict[str, list[ir.Value] | None]:
    """The tensor map's address (checked: global or generic, 64-byte aligned) and coordinates
    (those of four rows as the ``gather`` operand)."""
    emit.state_space(inst.family, tensor_map, "global", ("global",))
    emit.require_alignment(inst, tensor_map, "tensor map", TENSOR_MAP_ALIGN)
    rows = inst.qualifiers.get("load_mode") in ROWS
    return {
        "tmap": [emit.address(tensor_map, loc=loc, ip=ip)],
        "gather" if rows else "coords": _ints(coords, cutlass.Int32, loc=loc, ip=ip),
    }


def hints(
    load_mode: Value = None,
    im2col_offsets: Sequence[Any] | None = None,
    cta_mask: Any = None,
    cache_policy: Any = None,
    *,
    loc=None,
    ip=None,
) -> dict[str, list[ir.Value] | None]:
    """The optional operands: the im2col information (16-bit: the im2col offsets, or for
    ``.im2col::w`` modes ``(wHalo, wOffset)``), a ctaMask (16-bit), an L2 cache policy."""
    return {
        "wide" if load_mode in WIDE else "im2col": _ints(im2col_offsets, cutlass.Int16, loc=loc, ip=ip),
        "mask": _ints(None if cta_mask is None else [cta_mask], cutlass.Int16, loc=loc, ip=ip),
        "policy": _ints(None if cache_policy is None else [cache_policy], cutlass.Int64, loc=loc, ip=ip),
    }


@dsl_user_op
def cp_async_bulk_tensor(
    dst: cute.Pointer,
    src: cute.Pointer,
    coords: Sequence[Any],
    *,
    mbar: cute.Pointer | None = None,
    load_mode: str | None = None,
    im2col_offsets: Sequence[Any] | None = None,
    cta_mask: Any = None,
    cta_group: int | None = None,
    cache_policy: Any = None,
    dst_space: Value = "auto",
    src_space: Value = "auto",
    completion: Value = "auto",
    loc=None,
    ip=None,
) -> None:
    """Copy the box at ``coords`` of a tensor map's tensor asynchronously (TMA):
    ``cp.async.bulk.tensor.dim.dst.src{.load_mode}.completion{.multicast::cluster}
    {.cta_group::n}{.L2::cache_hint}``.

    Load: ``dst`` this CTA's shared memory (``.shared::cta``) or a cluster's
    (``.shared::cluster``, a distributed-shared pointer), ``src`` the tensor map; it completes
    on the mbarrier at ``mbar`` (its transaction count drops by the box's bytes).  With
    ``cta_mask`` (a 16-bit mask of cluster CTA ranks) the box lands at the same offset in every
    CTA of the mask and signals each one's mbarrier at ``mbar``'s offset.  ``load_mode="im2col"``
    with ``im2col_offsets`` (one 16-bit offset per dimension less two) loads an im2col box;
    ``"im2col::w"``/``"im2col::w::128"`` with ``im2col_offsets=(w_halo, w_offset)`` one along W;
    ``"tile::gather4"`` with five ``coords`` (column, four rows) four rows of a 2-D tensor.
    ``cta_group`` (1 or 2, sm_100 family): the load's CTA group (``.cta_group::2``: ``mbar`` may
    be the peer CTA's of the pair).
    Store: ``dst`` the tensor map, ``src`` this CTA's shared memory; it joins
    the bulk async-group (:func:`~ptxops.cp_async_bulk_commit_group`); ``load_mode=
    "im2col_no_offs"`` stores an im2col box, ``"tile::scatter4"`` four rows (five ``coords``).
    ``cache_policy``: a 64-bit L2 policy (``createpolicy``) adds ``.L2::cache_hint``.
    """
    family = "cp.async.bulk.tensor"
    load = dst.memspace in SHARED_POINTERS
    smem, tensor_map = (dst, src) if load else (src, dst)
    if load:
        dst_space = emit.state_space(family, dst, dst_space, ("shared::cta", "shared::cluster"))
        src_space = "global" if src_space == "auto" else src_space
    else:
        src_space = emit.state_space(family, src, src_space, ("shared::cta",))
        dst_space = "global" if dst_space == "auto" else dst_space
    inst = emit.instruction(
        family, dim=dim(family, coords, load_mode), dst=dst_space, src=src_space, load_mode=load_mode,
        completion=completion_for(completion, mbar),
        multicast=None if cta_mask is None else "multicast::cluster",
        cta_group=None if cta_group is None else f"cta_group::{cta_group}",
        cache_hint=None if cache_policy is None else "cache_hint",
    )
    emit.require_alignment(inst, smem, "shared memory", TMA_SMEM_ALIGN)
    mbar_carriers = emit.mbarrier_operand(
        inst, mbar, "auto", ("shared::cta", "shared::cluster"), loc=loc, ip=ip
    )
    given = {
        **tensor_operands(inst, tensor_map, coords, loc=loc, ip=ip),
        **hints(load_mode, im2col_offsets, cta_mask, cache_policy, loc=loc, ip=ip),
        "dst" if load else "src": [emit.address(smem, loc=loc, ip=ip)],
        "mbar": mbar_carriers[0] if mbar_carriers else None,
    }
    emit.emit(inst, None, operands(inst, given), loc=loc, ip=ip)


@dsl_user_op
def cp_reduce_async_bulk_tensor(
    dst: cute.Pointer,
    src: cute.Pointer,
    coords: Sequence[Any],
    *,
    op: str = "add",
    load_mode: str | None = None,
    cache_policy: Any = None,
    loc=None,
    ip=None,
) -> None:
    """Reduce this CTA's shared memory at ``src`` element-wise into the box at ``coords`` of
    the tensor map ``dst`` asynchronously (TMA):
    ``cp.reduce.async.bulk.tensor.dim.global.shared::cta.op{.load_mode}.bulk_group
    {.L2::cache_hint}``.

    ``op`` is add, min, max, inc, dec, and, or or xor over the map's element type (the PTX ISA
    lists which types each takes; the map decides, at run time).  Each element's update is an
    atomic read-modify-write of the destination; the box as a whole is not one atomic access.
    It joins the bulk async-group (:func:`~ptxops.cp_async_bulk_commit_group`).
    ``load_mode="im2col_no_offs"`` reduces into an im2col box, ``"tile::scatter4"`` into four
    rows of a 2-D tensor (five ``coords``: the column, then the rows; sm_100 family).
    """
    family = "cp.reduce.async.bulk.tensor"
    emit.state_space(family, src, "shared::cta", ("shared::cta",))
    inst = emit.instruction(
        family, dim=dim(family, coords, load_mode), op=op, load_mode=load_mode,
        cache_hint=None if cache_policy is None else "cache_hint",
    )
    emit.require_alignment(inst, src, "shared memory", TMA_SMEM_ALIGN)
    given = {
        **tensor_operands(inst, dst, coords, loc=loc, ip=ip),
        **hints(load_mode, None, None, cache_policy, loc=loc, ip=ip),
        "src": [emit.address(src, loc=loc, ip=ip)],
    }
    emit.emit(inst, None, operands(inst, given), loc=loc, ip=ip)


@dsl_user_op
def cp_async_bulk_prefetch_tensor(
    tensor_map: cute.Pointer,
    coords: Sequence[Any],
    *,
    load_mode: str | None = None,
    im2col_offsets: Sequence[Any] | None = None,
    cache_policy: Any = None,
    loc=None,
    ip=None,
) -> None:
    """Prefetch the box at ``coords`` of a tensor map's tensor into the L2 cache:
    ``cp.async.bulk.prefetch.tensor.dim.L2.global{.load_mode}{.L2::cache_hint}``.  A hint with
    nothing to wait for; ``load_mode="im2col"`` takes ``im2col_offsets``, ``"im2col::w"`` and
    ``"im2col::w::128"`` take ``(w_halo, w_offset)``, ``"tile::gather4"`` five ``coords``."""
    family = "cp.async.bulk.prefetch.tensor"
    inst = emit.instruction(
        family, dim=dim(family, coords, load_mode), load_mode=load_mode,
        cache_hint=None if cache_policy is None else "cache_hint",
    )
    given = {
        **tensor_operands(inst, tensor_map, coords, loc=loc, ip=ip),
        **hints(load_mode, im2col_offsets, None, cache_policy, loc=loc, ip=ip),
    }
    emit.emit(inst, None, operands(inst, given), loc=loc, ip=ip)


__all__ = ["cp_async_bulk_prefetch_tensor", "cp_async_bulk_tensor", "cp_reduce_async_bulk_tensor"]
