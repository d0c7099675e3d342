"""The NVSHMEM :class:`~collectives.symmetric.heap.Heap`: nvshmem4py's ``nvshmem.core`` started with a
unique id broadcast over ``torch.distributed`` (one NVSHMEM job per NVLink domain)."""

from __future__ import annotations


import torch
import torch.distributed as dist

from ..errors import SymmetricMemoryError
from .capability import TorchGroup, collective_device
from .groups import global_rank
from .heap import Adopted

__all__ = ["NvshmemHeap"]


class NvshmemHeap:
    """:class:`Heap` on ``nvshmem.core`` (uid bootstrap broadcast over ``torch.distributed``)."""

    #: The variable that keeps NVSHMEM from creating multicast objects (set before it starts).
    MULTICAST_SWITCH = "NVSHMEM_DISABLE_NVLS"

    def __init__(self, device: int, rank: int, nranks: int, group: TorchGroup) -> None:
        import numpy as np
        import nvshmem.core as nvshmem
        from cuda.core import Device

        self._nv = nvshmem
        dev = Device(device)
        dev.set_current()
        uid = nvshmem.get_unique_id(empty=rank != 0)
        raw = uid._data.view(np.uint8)
        t = torch.from_numpy(raw.copy()).to(collective_device(group))
        dist.broadcast(t, src=global_rank(group, 0), group=group)
        raw[:] = t.cpu().numpy()
        nvshmem.init(device=dev, uid=uid, rank=rank, nranks=nranks, initializer_method="uid")
        if (nvshmem.my_pe(), nvshmem.n_pes()) != (rank, nranks):
            raise SymmetricMemoryError(
                f"nvshmem PE {nvshmem.my_pe()}/{nvshmem.n_pes()} != group rank {rank}/{nranks}")

    def alloc(self, nbytes: int) -> torch.Tensor:
        return self._nv.tensor((nbytes,), dtype=torch.uint8)

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        return self._nv.get_peer_tensor(raw, rank)

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        return self._nv.get_multicast_tensor(self._nv.Teams.TEAM_WORLD, raw)

    def adopt(self, t: torch.Tensor) -> Adopted | None:
        return None  # symmetric only through the context's own allocations

    def free(self, raw: torch.Tensor) -> None:
        self._nv.free_tensor(raw)

    def synchronize(self) -> None:
        torch.cuda.current_stream().synchronize()  # this rank's work only, never the whole device

    def finalize(self) -> None:
        self._nv.finalize()

