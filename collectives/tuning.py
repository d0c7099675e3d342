"""Size-based algorithm choice for ``algorithm="auto"``.

The crossovers are measured with ``python -m collectives.bench`` (see the table in its output:
the smallest size at which two-shot beats one-shot, per world size and backend) and recorded
here; the values below and the run that produced them are in the issue notes.
"""

from __future__ import annotations

#: (backend, world size) -> largest message (bytes per rank) for which one-shot is chosen.
ONE_SHOT_MAX_BYTES: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 20,
    ("peer", 4): 256 << 10,
    ("peer", 8): 128 << 10,
    ("multicast", 2): 256 << 10,
    ("multicast", 4): 128 << 10,
    ("multicast", 8): 64 << 10,
}


def all_reduce_algorithm(world: int, nbytes: int, backend: str) -> str:
    """``"one_shot"`` up to the measured crossover for (backend, world), else ``"two_shot"``."""
    limit = ONE_SHOT_MAX_BYTES.get((backend, world), ONE_SHOT_MAX_BYTES[(backend, 8)])
    return "one_shot" if nbytes <= limit else "two_shot"


#: reduce_scatter stages inputs up to this size (bytes per rank) even when they are symmetric:
#: the in-kernel copy costs less than the end barrier it saves.
STAGE_MAX_BYTES = 4 << 20
