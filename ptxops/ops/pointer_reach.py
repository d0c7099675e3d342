"""``ptxops.reach(ptr, kind)``: tag a pointer with where its memory is observed from, so that
every ordered access through it is checked against the scope that memory needs
(:mod:`ptxops.spec.reach` holds the rules).

The tag lives in the IR, not in the Python object, so it survives pointer arithmetic, tensors
built on the pointer and their ``.iterator``: :func:`reach` emits an identity
``cute.recast_iter`` carrying the reach and its origin as attributes, and :func:`reach_of`
walks from a pointer back through the operations that derive one pointer or tensor from another
(``cute.add_offset``, ``cute.make_view``, ``cute.get_iter``, tiling, recasts), and from a pointer
a dynamic loop carries to the one it entered the loop with, to the nearest tag.  The identity recast folds away when the kernel is lowered: tagging changes no PTX.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import cute as cute_ir
from cutlass.cutlass_dsl import dsl_user_op

from .. import spec
from ..errors import QualifierError
from ..render import Instruction
from ..spec import reach as rules
from .alignment import _plain

#: Attribute names of the tagging operation.
KIND, ORIGIN = "ptxops.reach", "ptxops.reach_origin"
#: How many operations :func:`reach_of` walks back at most.
BUDGET = 256
#: Source trees whose frames are not a call site (ptxops's device functions, CuTeDSL).
_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    os.path.dirname(os.path.abspath(cute.__file__ or "")).rsplit(os.sep, 1)[0],
)


#: Whether an access through an untagged pointer is refused (inside :func:`required`).
_REQUIRED: contextvars.ContextVar[str | None] = contextvars.ContextVar("ptxops_reach_required", default=None)


@contextlib.contextmanager
def required(by: str) -> Iterator[None]:
    """While the body traces, every memory access through a ptxops device function whose
    pointer has no reach raises :class:`~ptxops.QualifierError` (rule ``reach-required``):
    for code that promises to tag all of its pointers (``by`` names it in the error)."""
    token = _REQUIRED.set(by)
    try:
        yield
    finally:
        _REQUIRED.reset(token)


@dataclass(frozen=True)
class Tag:
    """A pointer's reach (a :data:`ptxops.spec.reach.REACHES` kind) and where it got it."""

    kind: str
    origin: str


def call_site() -> str:
    """``file:line`` of the innermost frame outside ptxops and CuTeDSL (the user's call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
    if frame is None:
        return "an unknown call site"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@dsl_user_op
def reach(ptr: cute.Pointer, kind: str, *, by: str | None = None, loc=None, ip=None) -> cute.Pointer:
    """``ptr`` tagged with reach ``kind``: ``"cta"`` (this CTA's shared memory), ``"cluster"``
    (shared memory other CTAs of the cluster access), ``"gpu"`` (this GPU's global memory),
    ``"peer"`` (memory another GPU accesses: a peer's buffer, or ours that peers write),
    ``"multicast"`` (an NVLink multicast address), ``"host"`` (host-mapped memory) or
    ``"symmetric"`` (this PE's NVSHMEM-heap memory, which :mod:`ptxops.nvshmem` requires of a
    remote operand).

    Pass a tensor's ``.iterator`` to tag a tensor's memory.  Pointers computed from the result
    (``reach(p, "peer") + tidx * 8``, a tensor made on it) keep the tag; every relaxed,
    acquire, release or atomic access through them whose scope is narrower than the reach needs
    raises :class:`~ptxops.ScopeError` at trace time, and so does an access in a state space
    that memory is not in (a peer pointer used as shared memory).  ``by`` names who tagged the pointer in
    that error (a library's view, say); the call site is always given.  Emits no PTX.
    """
    r = rules.reach(kind)
    origin = f"{by + ' at ' if by else 'ptxops.reach at '}{call_site()}"
    tagged = cute_ir.recast_iter(ptr.type, ptr.value, loc=loc, ip=ip)
    op = _plain(tagged).owner
    op.attributes[KIND] = ir.StringAttr.get(r.kind)
    op.attributes[ORIGIN] = ir.StringAttr.get(origin)
    return tagged


def reach_of(ptr: cute.Pointer) -> Tag | None:
    """The reach of the nearest tag ``ptr`` was derived from, or None for an untagged pointer."""
    value = _plain(ptr)
    for _ in range(BUDGET):
        op = value.owner
        if isinstance(op, ir.Block):
            value = _loop_entry(value)
            if value is None:
                return None
            continue
        if KIND in op.attributes:
            return Tag(ir.StringAttr(op.attributes[KIND]).value, ir.StringAttr(op.attributes[ORIGIN]).value)
        source = _initial(op, ir.OpResult(value).result_number, value.type) if op.name in LOOPS else _derived_from(op)
        if source is None:
            return None
        value = source
    return None


#: Dynamic loops, and the operand index of the initial value of their first carried value.
LOOPS = {"scf.for": 3, "scf.while": 0}


def _loop_entry(value: ir.Value) -> ir.Value | None:
    """The value a pointer carried by a dynamic loop (an ``scf.for`` iteration argument, an
    ``scf.while`` region argument) enters the loop with: a loop changes a pointer only by
    arithmetic, which keeps its reach.  None for a kernel or function argument."""
    arg = ir.BlockArgument(value)
    loop = arg.owner.owner
    if loop is None or loop.name not in LOOPS:
        return None
    carried = arg.arg_number - (1 if loop.name == "scf.for" else 0)  # scf.for's first: the index
    return _initial(loop, carried, value.type)


def _initial(loop: ir.Operation, carried: int, type_: ir.Type) -> ir.Value | None:
    """The initial value of the ``carried``-th value ``loop`` carries, if it has ``type_``."""
    index = LOOPS[loop.name] + carried
    if carried < 0 or index >= len(loop.operands):
        return None
    entry = _plain(loop.operands[index])
    return entry if entry.type == type_ else None


def _derived_from(op: ir.Operation) -> ir.Value | None:
    """The pointer or tensor an operation derives its result from: its first operand, when
    that is one (an offset, a view, a tile, a recast, an iterator)."""
    if not len(op.operands):
        return None
    first = _plain(op.operands[0])
    if cute_ir.PtrType.isinstance(first.type) or cute_ir.MemRefType.isinstance(first.type):
        return first
    return None


def check(inst: Instruction, ptr: cute.Pointer, *, tag: Tag | None = None) -> None:
    """Raise :class:`~ptxops.ScopeError` if ``inst``, accessing ``ptr``, orders at a scope
    narrower than ``ptr``'s reach needs (or addresses a state space its memory is not in)."""
    check_tag(inst, tag or reach_of(ptr))


def check_tag(inst: Instruction, found: Tag | None) -> None:
    """:func:`check` for an access ``inst`` through a pointer whose reach is ``found`` (None:
    untagged, refused inside :func:`required`); for a caller that tracks tags itself (the
    collectives' CPU simulation of their device source)."""
    if found is None:
        if (who := _REQUIRED.get()) is not None:
            raise QualifierError(
                inst.family,
                f"{inst.opcode}: the pointer has no reach, and {who} tags every pointer it "
                f"accesses (target {inst.target}).\n  rule [reach-required]: tag it with "
                f"ptxops.reach(ptr, kind), kind one of {', '.join(rules.REACHES)}.",
                offending={"reach": None},
                rule="reach-required",
                legal={"reach": list(rules.REACHES)},
                target=inst.target,
            )
        return
    fam = spec.family(inst.family)
    space = inst.qualifiers.get("space")
    if "space" in fam.keys:
        rules.check_space(inst.family, found.kind, space, found.origin, inst.target)
    rules.check(fam, inst.qualifiers, inst.effective, found.kind, found.origin, inst.opcode)


__all__ = ["Tag", "check", "check_tag", "reach", "reach_of", "required"]
