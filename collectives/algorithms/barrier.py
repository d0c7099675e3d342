"""The barrier collective: the start barrier alone (every rank's block ``b`` has arrived)."""

from __future__ import annotations

from ..config import KernelKey
from . import design


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the barrier kernel for ``key``."""
    b = design.blocks(key)
    return design.kernel(key, b, stage=b.stage_whole)


__all__ = ["build"]
