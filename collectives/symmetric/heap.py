"""What a symmetric-memory :class:`~collectives.symmetric.context.Context` needs from its
allocator: the :class:`Heap` protocol (real: :class:`~collectives.symmetric.nvshmem_heap.NvshmemHeap`;
sub-groups: :class:`~collectives.symmetric.groups.PoolHeap`; tests: a fake).  An allocation is
collective: every rank of the heap's group allocates (and frees) the same sizes in the same order."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Heap"]


class Heap(Protocol):
    """What :class:`Context` needs from the allocator (real: nvshmem4py; tests: a fake)."""

    def alloc(self, nbytes: int) -> torch.Tensor: ...  # collective; flat uint8 tensor

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor: ...  # rank's raw view

    def multicast(self, raw: torch.Tensor) -> torch.Tensor: ...

    def free(self, raw: torch.Tensor) -> None: ...  # collective

    def synchronize(self) -> None: ...

    def finalize(self) -> None: ...
