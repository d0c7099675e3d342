"""The barrier collective: the start barrier alone (every rank's block ``b`` has arrived)."""

from __future__ import annotations

from typing import Any

from ..config import BARRIER_THREADS
from ..layouts import COLLECTIVE
from . import design
from .base import Algorithm, Call
from .key import KernelKey
from .protocol import Runtime


class Barrier(Algorithm):
    """One warp (:data:`~collectives.config.BARRIER_THREADS`) passing the start barrier: thread
    ``t`` signals and waits for rank ``t``; launched as one block on the signal pad."""

    collectives = ("barrier",)
    name = "one_shot"
    stages_in = "never"

    def plan(self, comm: Runtime, call: Call) -> Any:
        """One block on the signal pad (no data, no output)."""
        from .plan import prepare

        key = KernelKey("barrier", self.name, call.backend, call.dtype, call.world, threads=BARRIER_THREADS)
        return prepare(comm, key, COLLECTIVE, comm.pad_buffer, 0, 0, 0, call.signature, 1)

    def build(self, key: KernelKey):
        return design.kernel(key, design.Blocks(key), stage=None)


__all__ = ["Barrier"]
