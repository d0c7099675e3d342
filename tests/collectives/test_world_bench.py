"""The world bench's byte counts (pure Python): what every rank must at least read and write."""

from __future__ import annotations

from collectives.tools.world_bench import CASES, moved_bytes


def test_each_collective_moves_its_inputs_and_outputs() -> None:
    mb = 1 << 20
    assert moved_bytes("all_reduce", 4, mb) == 8 * mb  # each rank reads and writes N
    assert moved_bytes("all_to_all", 4, mb) == 8 * mb  # each rank sends N and receives N
    assert moved_bytes("reduce_scatter", 4, mb) == 5 * mb  # W inputs of N, outputs of N / W
    assert moved_bytes("all_gather", 4, mb) == 5 * mb


def test_the_all_to_all_is_measured_into_symmetric_and_plain_outputs() -> None:
    assert [(a, p) for c, a, p in CASES if c == "all_to_all"] == [("direct", "symmetric"), ("staged", "plain")]
