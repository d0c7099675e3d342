"""What a symmetric-memory :class:`~collectives.symmetric.context.Context` needs from its
allocator: the :class:`Heap` protocol (real: :class:`~collectives.symmetric.nvshmem_heap.NvshmemHeap`
and :class:`~collectives.symmetric.torch_heap.TorchHeap`; sub-groups:
:class:`~collectives.symmetric.groups.PoolHeap`; tests: fakes).  An allocation is collective: every
rank of the heap's group allocates (and frees) the same sizes in the same order."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

__all__ = ["Adopted", "Heap"]


@dataclasses.dataclass(frozen=True)
class Adopted:
    """Symmetric memory the heap's allocator made outside the context (the caller owns it and
    frees it): ``raw`` its bytes here (flat uint8), ``peers[r]`` the same bytes at rank ``r``
    (``raw`` itself at this rank), ``multicast`` their multicast view, or None and
    ``no_multicast`` saying why."""

    raw: torch.Tensor
    peers: list[torch.Tensor]
    multicast: torch.Tensor | None
    no_multicast: str | None = None


class Heap(Protocol):
    """What :class:`Context` needs from the allocator."""

    def alloc(self, nbytes: int) -> torch.Tensor: ...  # collective; flat uint8 tensor

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor: ...  # rank's raw view

    def multicast(self, raw: torch.Tensor) -> torch.Tensor: ...

    def adopt(self, t: torch.Tensor) -> Adopted | None: ...  # t's memory, if symmetric outside the context

    def free(self, raw: torch.Tensor) -> None: ...  # collective

    def synchronize(self) -> None: ...

    def finalize(self) -> None: ...
