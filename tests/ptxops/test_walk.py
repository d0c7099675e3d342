"""The spec's walks (:meth:`Family.enumerate`, :meth:`Family.space`, :meth:`Family.complete`:
a memoised, iterative walk since the walks of the docs and the oracle grew to millions of
forms) yield exactly what the plain recursive walk below yields, in its order, for every
family: the same forms, each dict with its keys in the same order."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Mapping

import pytest

from ptxops import spec
from ptxops.spec.engine import Family, Rule, Value


def reference_walk(family: Family, fixed: Mapping[str, Value], rules: Iterable[Rule], *,
                   fixed_first: bool = False) -> Iterator[dict[str, Value]]:
    """The walk as first written: keys in opcode order (``fixed_first``: the fixed ones, then the
    free ones from the last back), each rule checked at every value once its last key is set."""
    rules = tuple(rules)
    keys = ("target",) + tuple(q.key for q in family.settable)
    if fixed_first:
        keys = tuple(k for k in keys if k in fixed) + tuple(k for k in reversed(keys) if k not in fixed)
    ready: list[list[Rule]] = [[] for _ in keys]
    for r in rules:
        ready[max(keys.index(k) for k in r.keys)].append(r)

    def walk(i: int, q: dict[str, Value]) -> Iterator[dict[str, Value]]:
        if i == len(keys):
            yield dict(q)
            return
        key = keys[i]
        for v in (fixed[key],) if key in fixed else family.domain(key):
            q[key] = v
            if not any(r.broken_keys(q) for r in ready[i]):
                yield from walk(i + 1, q)
        del q[key]

    yield from walk(0, {})


def same(a: list[dict], b: list[dict]) -> bool:
    """Equal forms, each with its keys in the same order."""
    return a == b and [list(x) for x in a] == [list(x) for x in b]


#: Targets whose legal forms differ most (sm_90 without the a-features, a Blackwell one).
TARGETS = ("sm_90", "sm_100a")


@pytest.mark.parametrize("name", list(spec.FAMILIES))
def test_enumerate_and_space_walk_as_the_reference(name: str) -> None:
    family = spec.FAMILIES[name]
    for target in TARGETS:
        assert same(list(family.enumerate(target=target)), list(reference_walk(family, {"target": target}, family.rules)))
        assert family.count(target=target) == sum(1 for _ in family.enumerate(target=target))
        space = list(itertools.islice(family.space(target=target), 4000))
        assert same(space, list(itertools.islice(reference_walk(family, {"target": target}, ()), 4000)))


@pytest.mark.parametrize("name", list(spec.FAMILIES))
def test_partial_walks_and_completions_as_the_reference(name: str) -> None:
    """Some keys fixed (legal values or not), a subset of the rules: the first forms of a walk in
    either order, and each completion."""
    family = spec.FAMILIES[name]
    rng = random.Random(name)
    free = [k for k in family.keys if k != "target"]
    for _ in range(40):
        fixed = {k: rng.choice(family.domain(k)) for k in rng.sample(free, min(len(free), rng.randint(0, 3)))}
        fixed["target"] = rng.choice(spec.TARGETS)
        rules = [r for r in family.rules if rng.random() < 0.7]
        for fixed_first in (False, True):
            ours = list(itertools.islice(family._walk(fixed, rules, fixed_first=fixed_first), 200))
            ref = list(itertools.islice(reference_walk(family, fixed, rules, fixed_first=fixed_first), 200))
            assert same(ours, ref), (fixed, fixed_first)
        ours, ref = family.complete(rules, **fixed), next(reference_walk(family, fixed, rules, fixed_first=True), None)
        assert ours == ref and (ref is None or list(ours) == list(ref)), fixed
