"""The :class:`~collectives.symmetric.heap.Heap` on PyTorch's symmetric memory
(``torch.distributed._symmetric_memory``): the collectives with PyTorch alone, without NVSHMEM or
nvshmem4py.

An allocation is ``symm_mem.empty`` then ``symm_mem.rendezvous`` over the context's group
(collective, like ``nvshmem_malloc``: every rank, same order, same size).  Rank ``r``'s copy is
``handle.get_buffer(r, ...)`` at the allocation's offset in its block: a load/store mapping of
that GPU's memory, imported by torch at the rendezvous.  The multicast view is the handle's
``multicast_ptr``, where torch made a multicast object; it makes none where
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, which :func:`~collectives.symmetric.bootstrap.init` sets
before the first rendezvous unless the agreed backend is ``"multicast"``.

A tensor the caller allocated with ``symm_mem.empty`` and rendezvoused over the same group is
symmetric too (:meth:`TorchHeap.adopt`): collectives use it in place, with no staging copy.  Its
rendezvous handle is torch's, cached per block and group (a tensor not yet rendezvoused makes
the lookup a collective rendezvous: every rank must then pass its own).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..errors import MulticastUnavailable, SymmetricMemoryError
from .heap import Adopted

__all__ = ["TorchHeap", "device_tensor"]


def device_tensor(ptr: int, nbytes: int, device: int) -> torch.Tensor:
    """A flat uint8 tensor over ``nbytes`` of device memory at ``ptr`` that torch did not
    allocate (a multicast mapping), through the CUDA array interface; it owns nothing."""

    class _Memory:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    return torch.as_tensor(_Memory(), device=torch.device("cuda", device))


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


class TorchHeap:
    """:class:`~collectives.symmetric.heap.Heap` on ``torch.distributed._symmetric_memory``
    (``symm_mem``; tests pass a fake) over the process group named ``group_name``."""

    #: The variable that keeps torch's rendezvous from creating multicast objects.
    MULTICAST_SWITCH = "TORCH_SYMM_MEM_DISABLE_MULTICAST"

    def __init__(self, device: int, rank: int, group_name: str, symm_mem: Any = None) -> None:
        if symm_mem is None:
            from torch.distributed import _symmetric_memory as symm_mem
        self._sm = symm_mem
        #: torch's ``is_symm_mem_tensor`` (None in older releases, where only the rendezvous tells).
        self._is_symmetric = getattr(symm_mem, "is_symm_mem_tensor", None)
        self.device, self.rank, self.group_name = device, rank, group_name
        self._handles: dict[int, Any] = {}  # raw.data_ptr() -> the rendezvous handle of its allocation

    def alloc(self, nbytes: int) -> torch.Tensor:
        raw = self._sm.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", self.device))
        self._handles[raw.data_ptr()] = self._sm.rendezvous(raw, self.group_name)
        return raw

    def _offset(self, handle: Any, ptr: int) -> int:
        """Bytes from this rank's buffer of ``handle``'s block to ``ptr`` (the same at every rank)."""
        return ptr - handle.buffer_ptrs[self.rank]

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        handle = self._handles[raw.data_ptr()]
        return handle.get_buffer(rank, (raw.numel(),), torch.uint8, self._offset(handle, raw.data_ptr()))

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        handle = self._handles[raw.data_ptr()]
        view, why = self._multicast(handle, self._offset(handle, raw.data_ptr()), raw.numel())
        if view is None:
            raise MulticastUnavailable(why)
        return view

    def _multicast(self, handle: Any, offset: int, nbytes: int) -> tuple[torch.Tensor | None, str | None]:
        """The multicast view of ``nbytes`` at ``offset`` in ``handle``'s block, or why none."""
        if not handle.multicast_ptr:
            return None, ("torch made no multicast object at the rendezvous (TORCH_SYMM_MEM_DISABLE_MULTICAST, "
                          "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES, or a rank without multicast support)")
        if offset:  # torch releases differ on whether multicast_ptr adds a handle's offset in its block
            return None, (f"the memory starts {offset} bytes into its torch symmetric block; "
                          "a multicast view is made only at a block's start")
        return device_tensor(handle.multicast_ptr, nbytes, self.device), None

    def adopt(self, t: torch.Tensor) -> Adopted | None:
        """``t``'s bytes, every rank's copy and their multicast view, where ``t`` is torch
        symmetric memory (``symm_mem.empty`` rendezvoused over this heap's group), else None."""
        if self._is_symmetric is not None and not self._is_symmetric(t):  # (a plain tensor's common case)
            return None
        handle = self._handle_of(t)
        if handle is None:
            return None
        offset, nbytes = self._offset(handle, t.data_ptr()), _extent(t)
        if offset < 0 or offset + nbytes > handle.buffer_size:
            raise SymmetricMemoryError(
                f"torch symmetric tensor at {t.data_ptr():#x} ({nbytes} bytes) is not inside its rendezvous "
                f"buffer ({handle.buffer_size} bytes at {handle.buffer_ptrs[self.rank]:#x})")
        peers = [handle.get_buffer(r, (nbytes,), torch.uint8, offset) for r in range(handle.world_size)]
        view, why = self._multicast(handle, offset, nbytes)
        return Adopted(peers[self.rank], peers, view, why)

    def _handle_of(self, t: torch.Tensor) -> Any:
        """``t``'s rendezvous handle over this heap's group, or None where torch did not
        allocate ``t``.  Where ``symm_mem`` has no ``is_symm_mem_tensor`` (older releases), the
        rendezvous itself tells: it refuses such a tensor (or warns and returns None)."""
        if self._is_symmetric is not None:
            return self._sm.rendezvous(t, self.group_name) if self._is_symmetric(t) else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return self._sm.rendezvous(t, self.group_name)
            except RuntimeError:
                return None

    def free(self, raw: torch.Tensor) -> None:
        """Forget ``raw``'s handle; torch frees the memory with the context's last reference."""
        del self._handles[raw.data_ptr()]

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def finalize(self) -> None:
        self._handles.clear()
