"""The declarative spec of every instruction family ptxops wraps, and its pure API.

Importable without CuTeDSL.  ``instruction(family, **qualifiers)`` validates a form and renders
it; ``forms(family, target=...)`` enumerates every legal form.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import QualifierError
from ..render import Instruction, render
from . import (
    atomics, bulk, cluster, clusterlaunchcontrol, elect, fence, griddepcontrol, mbarrier, membar,
    memory, multimem, multimem_bulk, nanosleep, prefetch, st_bulk, tensor, tensormap,
)
from .engine import Family, PtxasRecord, Qualifier, Rule, Value
from .targets import DEFAULT_TARGET, PTXAS_RELEASES, TARGETS

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        *multimem.FAMILIES, *atomics.FAMILIES, *memory.FAMILIES, *fence.FAMILIES,
        *bulk.FAMILIES, *mbarrier.FAMILIES, *cluster.FAMILIES, *nanosleep.FAMILIES,
        *griddepcontrol.FAMILIES, *membar.FAMILIES, *elect.FAMILIES, *prefetch.FAMILIES,
        *st_bulk.FAMILIES, *clusterlaunchcontrol.FAMILIES,
        *tensor.FAMILIES, *tensormap.FAMILIES, *multimem_bulk.FAMILIES,
    )
}


def family(name: str) -> Family:
    """The :class:`Family` for a PTX mnemonic such as ``"multimem.ld_reduce"``."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise QualifierError(
            str(name),
            f"unknown instruction family {name!r}; ptxops knows {', '.join(FAMILIES)}",
            offending={"family": name},
            rule="known-families",
            legal={"family": list(FAMILIES)},
        ) from None


def instruction(family_name: str, /, **qualifiers: Value) -> Instruction:
    """Validate one form of ``family_name`` and render it.

    Keys are ``sem``, ``scope``, ``space``, ``op``, ``type``, ``vec``, ``acc``, ``target`` (and
    ``proxy``, ``op_restrict``, ``sync_restrict`` for ``fence``; ``dst``, ``src``, ``completion``
    for ``cp.async.bulk``; ``cache``, ``nc``, ``l1_eviction``, ``l2_eviction``, ``cache_hint``
    and ``prefetch`` for ``ld``/``st``; ``read`` for ``cp.async.bulk.wait_group``; ``expect_tx`` and
    ``parity`` for ``mbarrier.arrive`` and ``mbarrier.try_wait``; ``level`` for ``membar``,
    ``prefetch`` and ``prefetchu``; ``query`` for ``clusterlaunchcontrol.query_cancel``), with PTX
    spellings without the dot.  A key left out means what PTX means when the qualifier is left
    out; a missing target means ``sm_90``.  Raises :class:`~ptxops.QualifierError` for any
    illegal combination.
    """
    fam = family(family_name)
    q = fam.normalise(qualifiers)
    fam.check(q)
    return render(fam, q, fam.effective(q))


def forms(family_name: str, /, target: str = DEFAULT_TARGET, **fixed: Value) -> Iterator[Instruction]:
    """Every legal form of ``family_name`` on ``target``, optionally with some qualifiers fixed."""
    fam = family(family_name)
    given = {**fixed, "target": target}
    spelled = fam.normalise(given, partial=True)
    for q in fam.enumerate(**{k: spelled[k] for k in given}):
        yield render(fam, q, fam.effective(q))


__all__ = [
    "DEFAULT_TARGET",
    "FAMILIES",
    "PTXAS_RELEASES",
    "TARGETS",
    "Family",
    "Instruction",
    "PtxasRecord",
    "Qualifier",
    "QualifierError",
    "Rule",
    "family",
    "forms",
    "instruction",
]
