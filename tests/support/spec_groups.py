"""Qualifier groups for families too large for their whole cross product (ld, st), shared by
the ptxas oracle and the device-forms test."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

from ptxops import spec
from ptxops.spec.engine import Family

#: Qualifier groups whose products the oracle walks for families too large for their whole
#: cross product (ld: 36 million forms a target).  Every rule reads keys of one group only
#: (``test_oracle_groups_hold_every_rule`` asserts it from the rule data), so a form breaks a
#: rule exactly when its restriction to that rule's group does.
ORDER = ("sem", "scope", "space", "vec", "type")
ORACLE_GROUPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "ld": (
        ORDER,
        ("sem", "space", "cache", "nc", "l1_eviction", "l2_eviction"),
        ("sem", "space", "nc", "cache", "cache_hint", "prefetch"),
        ("cache", "nc", "l1_eviction", "l2_eviction", "cache_hint", "prefetch"),
        ("space", "vec", "type", "l2_eviction"),
    ),
    "st": (
        ORDER,
        ("sem", "space", "cache", "l1_eviction", "l2_eviction", "cache_hint"),
        ("space", "vec", "type", "l2_eviction"),
    ),
}


def groups(family: Family) -> tuple[tuple[str, ...], ...]:
    return ORACLE_GROUPS.get(family.name, (tuple(q.key for q in family.settable),))


def domain(family: Family, target: str) -> Iterator[dict]:
    """The forms the oracle asks ptxas about: each group's whole product, every other key
    completed to values that keep the rules reading them (the first such completion; the
    first value of each domain where none exists).  A family without groups: its whole
    cross product.  A family of :data:`spec.FAMILIES` is walked once a process (the oracle,
    its crash records and :func:`legal_forms` ask for the same targets): copies of its forms."""
    if spec.FAMILIES.get(family.name) is not family:
        yield from _domain(family, target)
        return
    for q in _known_domain(family.name, target):
        yield dict(q)


@functools.cache
def _known_domain(name: str, target: str) -> tuple[dict, ...]:
    return tuple(_domain(spec.FAMILIES[name], target))


def _domain(family: Family, target: str) -> Iterator[dict]:
    if family.name not in ORACLE_GROUPS:
        yield from family.space(target=target)
        return
    seen = set()
    order = ("target", *(q.key for q in family.settable))
    for group in groups(family):
        others = [r for r in family.rules if not r.keys <= {*group, "target"}]
        reads = [k for k in group if any(k in r.keys for r in others)]
        completions: dict[tuple, dict | None] = {}  # the completion depends on ``reads`` only
        first = {k: family.domain(k)[0] for k in order}
        for values in itertools.product(*(family.domain(k) for k in group)):
            fixed = dict(zip(group, values), target=target)
            read = tuple(fixed[k] for k in reads)
            if read not in completions:
                completions[read] = family.complete(others, target=target, **dict(zip(reads, read)))
            base = completions[read] or first  # (no completion: the first value of each domain)
            q = {k: fixed[k] if k in fixed else base[k] for k in order}
            key = tuple(q.items())
            if key not in seen:
                seen.add(key)
                yield q


def legal_forms(name: str, target: str) -> list:
    """Every legal form of a family; for a grouped family, the legal forms of :func:`domain`
    (each group's legal combinations, with the other keys at a legal completion).  Found once
    a process (the oracle and the device-forms test ask for the same): a new list each call."""
    return list(_legal_forms(name, target))


@functools.cache
def _legal_forms(name: str, target: str) -> tuple:
    family = spec.FAMILIES[name]
    if name not in ORACLE_GROUPS:
        return tuple(spec.forms(name, target=target))
    return tuple(spec.instruction(name, **q) for q in domain(family, target) if family.is_legal(q))
