"""The auto choice follows the measured crossovers."""

from collectives import tuning


def test_small_messages_go_one_shot_and_large_two_shot() -> None:
    for world in range(2, 9):
        for backend in ("peer", "multicast"):
            assert tuning.all_reduce_algorithm(world, 4096, backend) == "one_shot"
            assert tuning.all_reduce_algorithm(world, 256 << 20, backend) == "two_shot"


def test_crossover_falls_with_world_size() -> None:
    limits = [max(n for n in (1 << k for k in range(10, 30))
                  if tuning.all_reduce_algorithm(w, n, "peer") == "one_shot") for w in (2, 4, 8)]
    assert limits == sorted(limits, reverse=True) and limits[0] > limits[-1]
