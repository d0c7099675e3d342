"""``ptxops.reach(ptr, kind)``: tag a pointer with where its memory is observed from, so that
every ordered access through it is checked against the scope that memory needs
(:mod:`ptxops.spec.reach` holds the rules).

The tag lives in the IR, not in the Python object, so it survives pointer arithmetic, tensors
built on the pointer and their ``.iterator``: :func:`reach` emits an identity
``cute.recast_iter`` carrying the reach and its origin as attributes, and :func:`reach_of`
walks from a pointer back through the operations that derive one pointer or tensor from another
(``cute.add_offset``, ``cute.make_view``, ``cute.get_iter``, tiling, recasts), and from a pointer
a dynamic loop carries to every value it may hold (the one it entered the loop with and the ones
each iteration passes on), to the nearest tags: a pointer that is local in one iteration and a
peer's in the next has the reach of both (:func:`join`).  The identity recast folds away when the
kernel is lowered: tagging changes no PTX.
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
#: Inside :func:`required`: the accesses judged while a loop that carries their pointer was still
#: being traced (what it passes on to its next iteration not yet known), judged again later.
_PENDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("ptxops_reach_pending", default=None)


@contextlib.contextmanager
def required(by: str) -> Iterator[None]:
    """While the body traces, every memory access through a ptxops device function whose
    pointer has no reach raises :class:`~ptxops.QualifierError` (rule ``reach-required``):
    for code that promises to tag all of its pointers (``by`` names it in the error).  An
    access inside a loop that carries its pointer is judged again once the loop is traced
    whole (at the next access checked, and when the body ends), by every pointer the loop may
    pass on to its next iteration (:func:`join`)."""
    token, pending = _REQUIRED.set(by), _PENDING.set([])
    try:
        yield
        _settle(final=True)
    finally:
        _PENDING.reset(pending)
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
    """The reach of the nearest tags ``ptr`` was derived from (:func:`join` of them: a pointer
    a loop carries may come from several), or None for an untagged pointer."""
    return _reach(_plain(ptr))[0]


def _reach(start: ir.Value) -> tuple[Tag | None, bool]:
    """:func:`reach_of` of ``start``, and whether it went through a loop still being traced."""
    tags: list[Tag] = []
    todo, seen, open_loop = [start], set(), False
    for _ in range(BUDGET):
        if not todo:
            break
        value = todo.pop()
        if value in seen:  # a loop's value passed on from itself (p = p + 8)
            continue
        seen.add(value)
        op = value.owner
        if isinstance(op, ir.Block):
            arg = ir.BlockArgument(value)
            loop = arg.owner.owner
            if loop is not None and loop.name in LOOPS:  # else a kernel or function argument: untagged
                todo += _carried(loop, arg.arg_number - (1 if loop.name == "scf.for" else 0), value.type)
                open_loop = open_loop or not _closed(loop)
            continue
        if KIND in op.attributes:
            tags.append(Tag(ir.StringAttr(op.attributes[KIND]).value, ir.StringAttr(op.attributes[ORIGIN]).value))
            continue
        if op.name in LOOPS:
            todo += _carried(op, ir.OpResult(value).result_number, value.type)
        elif (source := _derived_from(op)) is not None:
            todo.append(source)
    return (join(tags) if tags else None), open_loop


def _closed(loop: ir.Operation) -> bool:
    """Whether every block of ``loop`` ends in its terminator (the loop traced whole)."""
    return all((ops := list(block.operations)) and ops[-1].name in ("scf.yield", "scf.condition")
               for region in loop.regions for block in region.blocks)


def _settle(final: bool = False) -> None:
    """Judge again the pending accesses (:data:`_PENDING`) whose loops are traced whole now
    (``final``: all of them, the body has ended)."""
    pending = _PENDING.get()
    if not pending:
        return
    waiting = []
    for inst, value, before in pending:
        tag, still_open = _reach(value)
        if still_open and not final:
            waiting.append((inst, value, before))
        elif tag != before:
            check_tag(inst, tag)
    pending[:] = waiting


def join(tags: list[Tag]) -> Tag:
    """One reach for a pointer that may hold pointers of each of ``tags`` (a loop swapping a
    local and a peer pointer): the reach that needs the widest scope, which every access then
    must meet; reaches of one width but of different memory (a peer buffer and host memory:
    the state spaces or the NVSHMEM rules may differ) are refused."""
    kinds = {t.kind: t for t in tags}
    if len(kinds) == 1:
        return tags[0]
    width = max(rules.SCOPE_ORDER.index(rules.REACHES[k].needs) for k in kinds)
    widest = [t for k, t in kinds.items() if rules.SCOPE_ORDER.index(rules.REACHES[k].needs) == width]
    origins = "; ".join(f"{t.kind} ({t.origin})" for t in kinds.values())
    if len(widest) > 1:
        raise QualifierError(
            "reach",
            f"reach: a pointer that a loop carries may be of reaches {origins}: no one reach covers them.\n"
            "  rule [reach-join]: a loop-carried pointer holds one kind of memory, or kinds of which one needs "
            "the widest scope (its reach then).",
            offending={"reach": sorted(kinds)},
            rule="reach-join",
            legal={"reach": list(rules.REACHES)},
        )
    return Tag(widest[0].kind, f"the widest of {origins}")


#: Dynamic loops, and the operand index of the initial value of their first carried value.
LOOPS = {"scf.for": 3, "scf.while": 0}


def _carried(loop: ir.Operation, carried: int, type_: ir.Type) -> list[ir.Value]:
    """Every value of ``type_`` that ``loop`` may hold as its ``carried``-th carried value (an
    ``scf.for`` iteration argument or result, an ``scf.while`` region argument or result): the
    one it enters with and those its regions pass on (``scf.yield``, ``scf.condition``)."""
    index = LOOPS[loop.name] + carried
    if carried < 0 or index >= len(loop.operands):
        return []
    values = [loop.operands[index]]
    for region in loop.regions:
        for block in region.blocks:
            ops = list(block.operations)
            if ops and ops[-1].name in ("scf.yield", "scf.condition"):
                at = carried + (1 if ops[-1].name == "scf.condition" else 0)  # condition's first: the flag
                if at < len(ops[-1].operands):
                    values.append(ops[-1].operands[at])
    return [v for v in map(_plain, values) if v.type == type_]


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
    narrower than ``ptr``'s reach needs (or addresses a state space its memory is not in).
    Inside :func:`required`, an access through a pointer of a loop still being traced is judged
    again once the loop is whole (and the pending ones are, at each check)."""
    _settle()
    if tag is None:
        value = _plain(ptr)
        tag, open_loop = _reach(value)
        if open_loop and (pending := _PENDING.get()) is not None:
            pending.append((inst, value, tag))
    check_tag(inst, tag)


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


__all__ = ["Tag", "check", "check_tag", "join", "reach", "reach_of", "required"]
