"""The barrier collective: the start barrier alone (every rank's block ``b`` has arrived)."""

from __future__ import annotations

from . import design
from .base import Algorithm
from .key import KernelKey


class Barrier(Algorithm):
    """One warp (:data:`~collectives.config.BARRIER_THREADS`) passing the start barrier: thread
    ``t`` signals and waits for rank ``t``; launched as one block on the signal pad."""

    collectives = ("barrier",)
    name = "one_shot"
    stages_in = "never"

    def build(self, key: KernelKey):
        return design.kernel(key, design.Blocks(key), stage=None)


__all__ = ["Barrier"]
