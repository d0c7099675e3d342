"""Size-based choices for ``algorithm="auto"`` and for staging, from measured crossovers.

Measured on 2026-11-21 with ``torchrun --nproc-per-node {2,4} -m collectives.bench`` on
NVIDIA H200 (NVLink NV18 full mesh, multicast off, peer backend), eager launches, bf16 and f32:
one-shot beat two-shot up to 1-4 MB on 2 GPUs and up to 4-16 KB on 4 GPUs; two-shot won from
16 MB (2 GPUs) and 64 KB (4 GPUs) on.  8 GPUs and the multicast backend were not measurable
here (no 8-GPU machine; multicast is off on these machines): their entries extrapolate
(one-shot reads W-1 remote copies per element, so its crossover falls as W grows).
"""

from __future__ import annotations

#: (backend, world size) -> largest message (bytes per rank) for which one-shot is chosen.
ONE_SHOT_MAX_BYTES: dict[tuple[str, int], int] = {
    ("peer", 2): 4 << 20,
    ("peer", 3): 256 << 10,
    ("peer", 4): 16 << 10,
    ("peer", 8): 8 << 10,
    ("multicast", 2): 4 << 20,
    ("multicast", 4): 256 << 10,
    ("multicast", 8): 128 << 10,
}

#: reduce_scatter stages inputs up to this size (bytes per rank) even when they are symmetric:
#: the in-kernel copy costs less than the end barrier it saves.
STAGE_MAX_BYTES = 4 << 20


def all_reduce_algorithm(world: int, nbytes: int, backend: str) -> str:
    """``"one_shot"`` up to the crossover for (backend, world), else ``"two_shot"``; world
    sizes without an entry use the next larger measured one."""
    sizes = sorted(w for b, w in ONE_SHOT_MAX_BYTES if b == backend)
    nearest = next((w for w in sizes if w >= world), sizes[-1])
    return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES[(backend, nearest)] else "two_shot"
