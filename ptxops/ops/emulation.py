"""Multicast emulation: ``multimem`` and multicast bulk copies as unicast accesses to every peer.

Inside ``with emulate_multicast(table, world=W):`` (while a kernel is traced) the device
functions :func:`~ptxops.multimem_ld_reduce`, :func:`~ptxops.multimem_st`,
:func:`~ptxops.multimem_red`, :func:`~ptxops.multimem_cp_async_bulk`,
:func:`~ptxops.multimem_cp_reduce_async_bulk` and a :func:`~ptxops.cp_async_bulk` whose global
destination lies in a multicast window still choose and validate their ``multimem`` form against the spec (an illegal
form is still a :class:`~ptxops.QualifierError` naming the rule), but emit instead ``ld``, ``st``,
``red``, ``cp.async.bulk`` or ``cp.reduce.async.bulk`` on every rank's copy of the location, so the kernel runs on any GPUs
with peer access.  The PTX holds no ``multimem`` instruction.  The unicast pointers of a tagged
multicast pointer (:func:`ptxops.reach`) have peer reach, and the translation table's pointer
this GPU's, so the scope checks see the emulated accesses too.

``table`` is the runtime Int64 address of a device table of int64 entries, ``W + 2`` per window::

    [mc_base, bytes, base_0, ..., base_{W-1}]   # window 0
    [mc_base, bytes, base_0, ..., base_{W-1}]   # window 1 ...

A multicast address ``a`` with ``mc_base <= a < mc_base + bytes`` stands for ``base_r + (a -
mc_base)`` on rank ``r`` (like ``nvshmem_ptr``).  ``mc_base`` need not be a real multicast
mapping: it is compared, never dereferenced.  :func:`translation_table` builds the entries.
A multimem address outside every window is undefined (it is translated through window 0);
a bulk copy outside every window is the plain copy.

Mapping (per rank, in rank order 0..W-1):

=============================================  ==================================================
multimem form                                  emulation
=============================================  ==================================================
``multimem.ld_reduce{.weak}``                  ``ld`` (weak) from every rank, reduced in registers
``multimem.ld_reduce.relaxed.S``               ``ld.relaxed.S`` from every rank, reduced
``multimem.ld_reduce.acquire.S``               ``ld.acquire.S`` from every rank, reduced
``multimem.st{.weak}``                         ``st`` (weak) to every rank
``multimem.st.relaxed.S`` / ``.release.S``     ``st.relaxed.S`` / ``st.release.S`` to every rank
``multimem.red`` (means ``.relaxed.sys``)      ``red.relaxed.sys`` to every rank
``multimem.red.relaxed.S`` / ``.release.S``    ``red.relaxed.S`` / ``red.release.S`` to every rank
``cp.async.bulk`` to a multicast window        one ``cp.async.bulk`` per rank, same bulk group
``multimem.cp.async.bulk``                     one ``cp.async.bulk`` per rank, same bulk group
``multimem.cp.reduce.async.bulk``              one ``cp.reduce.async.bulk`` per rank, same group
=============================================  ==================================================

Where it differs from the hardware:

* Stronger: every per-rank access carries the instruction's semantics, so a release store to
  rank 1 also orders this thread's earlier store to rank 0 (one multimem op is one release).
* Weaker: the W accesses are separate: another thread can see the value on rank 0 before rank 1
  (a multimem store is not one atomic write), and the W loads of a reduction are not one
  snapshot.  ``red`` is atomic per rank, as ``multimem.red`` is.
* No aliasing: every emulated access goes through a rank's unicast address, the one the
  kernel's unicast accesses use, so a missing ``fence.proxy.alias`` between a multicast and a
  unicast access of the same bytes (which the hardware needs: the two addresses are virtual
  aliases, different proxies) changes nothing under emulation; it cannot expose aliasing bugs.
* Reductions: loads are combined in rank order 0..W-1, in the accumulation the instruction
  names (``.acc::f32`` for 16-bit floats, ``.acc::f16`` for fp8, else the type's own, rounding
  after every addition), and rounded once to the type at the end: the result is bit-identical
  on every rank and to the collectives' peer backend, but the switch's own order and rounding
  are not specified, so it may differ from real ``multimem.ld_reduce`` in the last bit.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import scf

from ..render import Instruction
from ..spec.ptxtypes import TYPES
from . import values
from .alignment import known
from .atomics import red
from .emit import check_alignment
from .memory import ld, st
from .pointer_reach import reach, reach_of

#: The CuTeDSL element type of each multimem PTX type.
ELEMENT: dict[str, type[cutlass.Numeric]] = {
    "u32": cutlass.Uint32, "s32": cutlass.Int32, "u64": cutlass.Uint64, "s64": cutlass.Int64,
    "b32": cutlass.Uint32, "b64": cutlass.Uint64, "f32": cutlass.Float32, "f64": cutlass.Float64,
    "f16": cutlass.Float16, "f16x2": cutlass.Float16, "bf16": cutlass.BFloat16,
    "bf16x2": cutlass.BFloat16, "e4m3": cutlass.Float8E4M3FN, "e4m3x2": cutlass.Float8E4M3FN,
    "e4m3x4": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2, "e5m2x2": cutlass.Float8E5M2,
    "e5m2x4": cutlass.Float8E5M2,
}
_ACC = {"f32": cutlass.Float32, "f16": cutlass.Float16}
_FP8 = (cutlass.Float8E4M3FN, cutlass.Float8E5M2)


def translation_table(
    windows: Sequence[tuple[int, int, Sequence[int]]],
) -> list[int]:
    """The int64 entries of a translation table: ``(mc_base, bytes, [base_0, ..., base_{W-1}])``
    per window, flattened.  Copy them to device memory and pass that address."""
    worlds = {len(bases) for _, _, bases in windows}
    if len(worlds) != 1:
        raise ValueError(f"every window needs one base per rank; got {sorted(worlds)} bases")
    return [v for mc, size, bases in windows for v in (mc, size, *bases)]


@dataclass(frozen=True)
class MulticastEmulation:
    """An active emulation: the table's address (a runtime Int64), the world size, the number
    of windows."""

    table: Any
    world: int
    windows: int = 1

    def _entry(self, index: int) -> Int64:
        ptr = cute.make_ptr(Int64, self.table, cute.AddressSpace.gmem, assumed_align=8)
        return ld(reach(ptr, "gpu", by="ptxops.emulate_multicast (its translation table)") + index, dtype=Int64)

    def _bases_entry(self, window: int) -> int:
        """Index of ``base_0`` of ``window`` (after its ``mc_base`` and ``bytes``)."""
        return window * (self.world + 2) + 2

    def bases(self, window: int = 0) -> Int64:
        """The address of ``window``'s ``[base_0, ..., base_{W-1}]``: a device table of every
        rank's copy of the window, as a kernel's table of peer addresses."""
        return Int64(self.table) + Int64(8 * self._bases_entry(window))

    def translate(self, address: Int64) -> tuple[Boolean, list[Int64]]:
        """Whether ``address`` lies in a window, and its address on every rank (through the
        last window that holds it; window 0's translation if none does)."""
        address = Int64(address)
        stride = self.world + 2
        inside = None
        peers: list[Int64] = []
        for w in range(self.windows):
            mc, size = self._entry(w * stride), self._entry(w * stride + 1)
            offset = address - mc
            hit = (address >= mc) & (offset < size)
            bases = [self._entry(self._bases_entry(w) + r) + offset for r in range(self.world)]
            if inside is None:
                inside, peers = hit, bases
            else:
                peers = [Int64(cutlass.select_(hit, b, p)) for b, p in zip(bases, peers)]
                inside = inside | hit
        return Boolean(inside), peers


_ACTIVE: contextvars.ContextVar[MulticastEmulation | None] = contextvars.ContextVar(
    "ptxops_multicast_emulation", default=None
)


@contextmanager
def emulate_multicast(table: Any, *, world: int, windows: int = 1) -> Iterator[MulticastEmulation]:
    """Emulate multicast while the body traces device code: ``table`` is the Int64 address of
    the translation table (``windows`` windows of ``world + 2`` int64 entries), ``world`` the
    number of ranks.  Use inside a ``@cute.kernel`` or ``@cute.jit`` body."""
    if not isinstance(world, int) or world < 1 or not isinstance(windows, int) or windows < 1:
        raise ValueError(f"world and windows must be positive ints, got {world!r}, {windows!r}")
    token = _ACTIVE.set(MulticastEmulation(table, world, windows))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)


def active() -> MulticastEmulation | None:
    """The emulation in force while tracing, or None."""
    return _ACTIVE.get()


# ---------------------------------------------------------------------------------------
# Emission: called by the multimem and bulk device functions once their form is validated.
# ---------------------------------------------------------------------------------------
def _shape(inst: Instruction) -> tuple[type[cutlass.Numeric], int]:
    ptx_type = str(inst.qualifiers["type"])
    return ELEMENT[ptx_type], TYPES[ptx_type].lanes * int(inst.qualifiers.get("vec") or 1)


def _peer_pointers(em: MulticastEmulation, inst: Instruction, mc_ptr: cute.Pointer, dtype) -> list[cute.Pointer]:
    check_alignment(inst, mc_ptr)
    _, peers = em.translate(mc_ptr.toint())
    pointers = [cute.make_ptr(dtype, p, cute.AddressSpace.gmem, assumed_align=known(mc_ptr)) for p in peers]
    tag = reach_of(mc_ptr)
    if tag is None:
        return pointers
    by = f"ptxops.emulate_multicast (a rank's copy of a multicast address with reach {tag.kind}, set by {tag.origin})"
    return [reach(p, "peer", by=by) for p in pointers]


def _ordering(inst: Instruction, default: tuple[str | None, str | None]) -> dict[str, Any]:
    sem, scope = inst.qualifiers.get("sem"), inst.qualifiers.get("scope")
    if sem in (None, "weak"):
        sem, scope = default
    return {"sem": sem, "scope": scope}


def _typed(data: Any, dtype, inst: Instruction, packed: bool) -> Any:
    """The source operand as values of the form's element type."""
    operand = next(o for o in inst.inputs if o.role == "b")
    return values.from_carriers(values.source(data, dtype, operand, packed), _shape(inst)[0], operand)


def _add(total: Any, value: Any, acc) -> Any:
    if acc in _FP8:  # no fp8 arithmetic: add in f32, round to the type after every step
        return _to(_to(total, cutlass.Float32) + _to(value, cutlass.Float32), acc)
    return total + value


def _to(values: Any, dtype) -> Any:
    return values.to(dtype) if isinstance(values, cute.TensorSSA) else dtype(values)


def _combine(total: Any, value: Any, op: str, acc) -> Any:
    if op == "add":
        return _add(total, value, acc)
    if op in ("and", "or", "xor"):
        return {"and": total & value, "or": total | value, "xor": total ^ value}[op]
    if isinstance(total, cute.TensorSSA):
        less = total < value
        return cute.where(less, total, value) if op == "min" else cute.where(less, value, total)
    return cutlass.min(total, value) if op == "min" else cutlass.max(total, value)


def ld_reduce(em: MulticastEmulation, inst: Instruction, mc_ptr: cute.Pointer, dtype, packed: bool) -> Any:
    """``multimem.ld_reduce``: a load of every rank's copy, reduced in rank order."""
    element, n = _shape(inst)
    acc = _ACC.get(inst.qualifiers.get("acc"), element)  # type: ignore[arg-type]
    order = _ordering(inst, (None, None))
    loaded = [ld(p, dtype=element, num_elements=n, **order) for p in _peer_pointers(em, inst, mc_ptr, element)]
    total = _to(loaded[0], acc) if acc is not element else loaded[0]
    for value in loaded[1:]:
        total = _combine(total, _to(value, acc) if acc is not element else value, str(inst.qualifiers["op"]), acc)
    result = _to(total, element) if acc is not element else total
    operand = inst.outputs[0]
    return values.result(values.to_carriers(result, element, operand), dtype, operand, packed)


def store(em: MulticastEmulation, inst: Instruction, mc_ptr: cute.Pointer, data: Any, dtype, packed: bool) -> None:
    """``multimem.st``: a store to every rank's copy."""
    element, n = _shape(inst)
    typed = _typed(data, dtype, inst, packed)
    for p in _peer_pointers(em, inst, mc_ptr, element):
        st(p, typed, dtype=element, num_elements=n, **_ordering(inst, (None, None)))


def reduce(em: MulticastEmulation, inst: Instruction, mc_ptr: cute.Pointer, data: Any, dtype, packed: bool) -> None:
    """``multimem.red``: an atomic ``red`` into every rank's copy (no sem means relaxed.sys)."""
    element, n = _shape(inst)
    typed = _typed(data, dtype, inst, packed)
    q = inst.qualifiers
    for p in _peer_pointers(em, inst, mc_ptr, element):
        red(p, typed, op=str(q["op"]), dtype=element, num_elements=n, type=str(q["type"]),
            vec=q.get("vec"), **_ordering(inst, ("relaxed", "sys")))


def bulk_copy(em: MulticastEmulation, dst: cute.Pointer, copy: Any, *, loc=None, ip=None) -> None:
    """A bulk copy to ``dst``: ``copy(address)`` once per rank if ``dst`` is in a window, else
    ``copy(dst)`` (one runtime branch)."""
    inside, peers = em.translate(dst.toint(loc=loc, ip=ip))
    branch = scf.IfOp(inside.ir_value(loc=loc, ip=ip), [], has_else=True, loc=loc, ip=ip)
    with ir.InsertionPoint(branch.then_block):
        for p in peers:
            copy(Int64(p).ir_value())
        scf.YieldOp([])
    with ir.InsertionPoint(branch.else_block):
        copy(dst.toint().ir_value())
        scf.YieldOp([])


def multicast_bulk(em: MulticastEmulation, mc_dst: cute.Pointer, copy: Any, *, loc=None, ip=None) -> None:
    """``multimem.cp.async.bulk`` / ``multimem.cp.reduce.async.bulk`` to ``mc_dst``: the unicast
    bulk operation ``copy(address)`` once per rank's copy (an address outside every window is
    undefined, as for every multimem form)."""
    _, peers = em.translate(mc_dst.toint(loc=loc, ip=ip))
    for p in peers:
        copy(Int64(p).ir_value(loc=loc, ip=ip))


__all__ = ["MulticastEmulation", "active", "emulate_multicast", "translation_table"]
