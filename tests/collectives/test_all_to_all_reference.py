"""The all-to-all reference (collectives.reference.all_to_all) on CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from collectives.reference.all_to_all import all_to_all  # noqa: E402


def test_uneven_splits_by_hand() -> None:
    a, b = torch.arange(5), torch.arange(10, 13)
    out = all_to_all([a, b], in_splits=[[2, 3], [0, 3]], out_splits=[[2, 0], [3, 3]])
    assert out[0].tolist() == [0, 1]
    assert out[1].tolist() == [2, 3, 4, 10, 11, 12]


def test_rows_of_dimension_0_and_equal_splits() -> None:
    x = [torch.arange(12).reshape(4, 3) + 100 * r for r in range(2)]
    out = all_to_all(x)
    assert out[0].tolist() == [[0, 1, 2], [3, 4, 5], [100, 101, 102], [103, 104, 105]]
    with pytest.raises(ValueError, match="divide by the world size 2"):
        all_to_all([torch.arange(3), torch.arange(3)])


def test_a_round_trip_with_transposed_splits_restores_the_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    world = 4
    m = torch.randint(0, 5, (world, world), generator=gen).tolist()
    x = [torch.randint(0, 256, (sum(m[s]), 2), generator=gen, dtype=torch.uint8) for s in range(world)]
    there = all_to_all(x, m, [[m[s][r] for s in range(world)] for r in range(world)])
    back = all_to_all(there, [[m[s][r] for s in range(world)] for r in range(world)], m)
    assert all(torch.equal(a, b) for a, b in zip(x, back))


def test_a_mismatch_names_both_ranks() -> None:
    with pytest.raises(ValueError, match="rank 0 sends 2 rows to rank 1, which expects 1"):
        all_to_all([torch.arange(3), torch.arange(3)], [[1, 2], [1, 2]], [[1, 1], [1, 2]])
