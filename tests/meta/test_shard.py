"""``--shard I/N`` (tests/conftest.py): the N parts of a collection are disjoint, cover it, and
interleave it; a malformed or out-of-range spec is a usage error."""

from __future__ import annotations

import pytest

from tests.conftest import shard


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_the_parts_cover_the_items_once_each(count: int) -> None:
    items = list(range(20))
    parts = [shard(items, f"{i}/{count}") for i in range(count)]
    kept = sorted(x for k, _ in parts for x in k)
    assert kept == items
    for k, d in parts:
        assert sorted(k + d) == items and not set(k) & set(d)
    assert parts[0][0][:2] == ([0, count] if count < 20 else [0])


@pytest.mark.parametrize("spec", ["2/2", "-1/3", "a/b", "1"])
def test_a_bad_spec_is_a_usage_error(spec: str) -> None:
    with pytest.raises(pytest.UsageError):
        shard([1, 2, 3], spec)


def test_a_heavy_item_fills_its_part_as_its_weight_of_items_would() -> None:
    items = list(range(13))
    weight = {4: 6}.get
    parts = [shard(items, f"{i}/3", lambda x: weight(x, 1))[0] for i in range(3)]
    assert parts == [[4], [0, 2, 5, 7, 9, 11], [1, 3, 6, 8, 10, 12]]  # loads 6, 6, 6
    assert sorted(x for p in parts for x in p) == items
