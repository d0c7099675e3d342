"""A pointer's reach, and the narrowest scope an ordered access through it may have.

A pointer's *reach* says where the memory it addresses is observed from: this CTA's shared
memory, the cluster's distributed shared memory, this GPU's global memory, a peer GPU's memory,
an NVLink multicast address, host-mapped memory, or this PE's symmetric memory (the NVSHMEM
heap, which other PEs write through :mod:`ptxops.nvshmem`).  The PTX memory model orders a relaxed,
acquire or release access (and an atomic, which is relaxed by default) only with threads inside
its scope (PTX ISA 9.0, section 8.5 "Scope"): a release store at ``.gpu`` scope to a flag that
another GPU polls does not synchronise with that GPU, although ptxas accepts it and a test may
pass.  :data:`REACHES` is the table of reaches and the scope each one needs;
:data:`SCOPED_ACCESSES` the families whose ordered forms are checked against it.  Weak accesses
take no scope and are never checked; a pointer without a reach is not checked either.

Pure data and pure functions: :func:`check` raises :class:`~ptxops.ScopeError`;
``ptxops.reach(ptr, kind)`` (:mod:`ptxops.ops.reach`) tags a CuTeDSL pointer and every device
function calls :func:`check` with the tag it finds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import QualifierError, ScopeError
from .engine import Family, Value

#: Scopes from the narrowest to the widest: each contains the threads of the ones before it.
SCOPE_ORDER: tuple[str, ...] = ("cta", "cluster", "gpu", "sys")


@dataclass(frozen=True)
class Reach:
    """One reach: ``kind`` (the name ``ptxops.reach`` takes), the ``memory`` it describes,
    the narrowest scope an ordered access to it needs (``needs``), ``outside``: the observers
    a narrower scope leaves out, and the state spaces (``None``: generic addressing) a pointer
    with this reach may be in."""

    kind: str
    memory: str
    needs: str
    outside: str
    spaces: tuple[Value, ...]

    def legal(self, scope: str) -> bool:
        """Whether an access at ``scope`` is ordered with every observer of this memory."""
        return SCOPE_ORDER.index(scope) >= SCOPE_ORDER.index(self.needs)


_SHARED = ("shared::cta", "shared::cluster")
_GLOBAL = ("global", None)

#: Every reach, narrowest first: the rules ``ptxops.reach`` checks scopes against.
REACHES: dict[str, Reach] = {
    r.kind: r
    for r in (
        Reach("cta", "this CTA's shared memory", "cta", "no one", ("shared::cta", None)),
        Reach(
            "cluster", "cluster shared memory", "cluster", "the other CTAs of the cluster",
            (*_SHARED, None),
        ),
        Reach("gpu", "this GPU's global memory", "gpu", "the other CTAs and clusters of this GPU", _GLOBAL),
        Reach("peer", "peer memory", "sys", "other GPUs", _GLOBAL),
        Reach("symmetric", "symmetric (NVSHMEM heap) memory", "sys", "other PEs", _GLOBAL),
        Reach("multicast", "multicast memory", "sys", "the other GPUs of the multicast group", _GLOBAL),
        Reach("host", "host-mapped memory", "sys", "the threads of the CPU", _GLOBAL),
    )
}


@dataclass(frozen=True)
class Access:
    """What an ordered form of a family does to the memory at its address, for messages:
    ``noun`` (``"store"``, ``"atomic"``) and the ``preposition`` before the memory."""

    noun: str
    preposition: str = "to"


#: The families whose ordered forms (those with a scope, given or implied) are checked against
#: their address's reach.  The scoped families left out order no access through a pointer the
#: caller tags: ``fence`` (no address, or a tensor map's), ``tensormap.cp_fenceproxy`` (a fence
#: after copying a tensor map).
SCOPED_ACCESSES: dict[str, Access] = {
    "ld": Access("load", "from"),
    "st": Access("store"),
    "atom": Access("atomic", "on"),
    "red": Access("reduction", "into"),
    "multimem.ld_reduce": Access("multimem load-reduce", "from"),
    "multimem.st": Access("multimem store"),
    "multimem.red": Access("multimem reduction", "into"),
    "mbarrier.arrive": Access("arrive", "on"),
    "mbarrier.try_wait": Access("wait", "on"),
    "st.async": Access("async store"),
    "red.async": Access("async reduction", "into"),
}
#: Scoped families that :data:`SCOPED_ACCESSES` leaves out, and why (the tests hold every
#: family with a scope to one of the two).
UNCHECKED_SCOPES: dict[str, str] = {
    "fence": "a fence orders this thread's accesses and addresses no data (its operand, where "
    "it has one, is a tensor map)",
    "tensormap.cp_fenceproxy": "a proxy fence after a tensor-map copy; its addresses are "
    "tensor maps, not data",
}


def reach(kind: str) -> Reach:
    """The :class:`Reach` named ``kind``; a :class:`QualifierError` listing the kinds if none."""
    try:
        return REACHES[kind]
    except KeyError:
        raise QualifierError(
            "reach",
            f"reach: {kind!r} is not a reach; the reaches are {', '.join(REACHES)}.\n"
            "  rule [known-reaches]: a pointer's reach says where its memory is observed from.",
            offending={"reach": kind},
            rule="known-reaches",
            legal={"reach": list(REACHES)},
        ) from None


def rule_name(r: Reach) -> str:
    """The name errors and ``python -m ptxops rules`` give the rule of reach ``r``."""
    return f"reach-{r.kind}-needs-{r.needs}"


def rule_text(r: Reach) -> str:
    """The rule of reach ``r`` in words."""
    at = SCOPE_ORDER.index(r.needs)
    if at == 0:
        return f"An ordered access to {r.memory} may take any scope."
    wider = " or ".join("." + s for s in SCOPE_ORDER[at:])
    return (
        f"An ordered access (relaxed, acquire, release, an atomic) to {r.memory} needs "
        f"{wider}: {r.outside} are outside .{SCOPE_ORDER[at - 1]} and every narrower scope."
    )


def ordered_scope(fam: Family, effective: Mapping[str, Value]) -> str | None:
    """The scope an ordered form of a checked family orders at, or None for a weak form (or a
    family :data:`SCOPED_ACCESSES` does not check)."""
    if fam.name not in SCOPED_ACCESSES:
        return None
    scope = effective.get("scope")
    return scope if scope in SCOPE_ORDER else None


def widened(fam: Family, q: Mapping[str, Value], effective: Mapping[str, Value], scope: str) -> dict[str, Value] | None:
    """Form ``q`` at ``scope`` (its implied sem written out where a given scope needs one),
    or None if that is not a legal form."""
    for form in ({**q, "scope": scope}, {**q, "scope": scope, "sem": effective.get("sem")}):
        if fam.is_legal(form):
            return form
    return None


def legal_scopes(fam: Family, q: Mapping[str, Value], effective: Mapping[str, Value], r: Reach) -> list[str]:
    """The scopes wide enough for reach ``r`` that make form ``q`` legal, every other
    qualifier kept (an implied sem written out)."""
    return [s for s in fam.domain("scope") if s in SCOPE_ORDER and r.legal(s) and widened(fam, q, effective, s)]


def check(
    fam: Family,
    q: Mapping[str, Value],
    effective: Mapping[str, Value],
    kind: str,
    origin: str,
    opcode: str,
) -> None:
    """Raise :class:`~ptxops.ScopeError` if form ``q`` of ``fam`` (``effective``: with PTX's
    defaults filled in; ``opcode`` as emitted) orders at a scope narrower than reach ``kind``
    needs; ``origin`` says where the pointer got its reach."""
    scope = ordered_scope(fam, effective)
    r = reach(kind)
    if scope is None or r.legal(scope):
        return
    access = SCOPED_ACCESSES[fam.name]
    sem = effective.get("sem")
    what = f"{sem} {access.noun}" if sem not in (None, "weak") else access.noun
    article = "an" if what[0] in "aeiou" else "a"
    given = "given" if q.get("scope") is not None else "PTX's default"
    legal = legal_scopes(fam, q, effective, r)
    if not legal:
        options = f"none: no form of {fam.name} orders at .{r.needs} or wider with these qualifiers"
    else:
        options = f"scope in {{{', '.join(legal)}}}"
        if widened(fam, q, effective, legal[0]) != {**q, "scope": legal[0]}:
            options += f" (write sem={sem!r} with it)"
    target = str(q["target"])
    raise ScopeError(
        fam.name,
        f"{opcode}: {article} {what} {access.preposition} {r.memory} needs .{r.needs}: "
        f"{r.outside} are outside .{scope} (scope .{scope} is {given}; target {target}).\n"
        f"  rule [{rule_name(r)}]: {rule_text(r)}\n"
        f"  the pointer's reach: {r.kind} ({r.memory}), set by {origin}\n"
        f"  legal here: {options}",
        offending={"scope": scope},
        rule=rule_name(r),
        legal={"scope": legal},
        target=target,
        reach=r.kind,
        origin=origin,
    )


def check_space(family: str, kind: str, space: Value, origin: str, target: str) -> None:
    """Raise :class:`~ptxops.ScopeError` if a pointer of reach ``kind`` is used in state
    ``space`` (``None``: generic) where that memory cannot be (a peer pointer as shared memory)."""
    r = reach(kind)
    if ("shared::cta" if space == "shared" else space) in r.spaces:
        return
    shown = "generic" if space is None else space
    raise ScopeError(
        family,
        f"{family}: a pointer to {r.memory} cannot address the .{shown} state space (target "
        f"{target}).\n"
        f"  rule [reach-space]: {r.memory} is in "
        f"{', '.join('generic addressing' if s is None else '.' + str(s) for s in r.spaces)}.\n"
        f"  the pointer's reach: {r.kind}, set by {origin}",
        offending={"space": space},
        rule="reach-space",
        legal={"space": list(r.spaces)},
        target=target,
        reach=r.kind,
        origin=origin,
    )


__all__ = [
    "REACHES", "SCOPED_ACCESSES", "SCOPE_ORDER", "UNCHECKED_SCOPES", "Access", "Reach", "check",
    "check_space", "legal_scopes", "ordered_scope", "reach", "rule_name", "rule_text", "widened",
]
