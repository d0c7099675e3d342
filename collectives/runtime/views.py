"""The kernel views of symmetric buffers: each rank's address of a buffer (a device table),
its multicast address, and for ``multicast_emulated`` the translation table that maps the
buffer's fake multicast window onto every rank's copy (:func:`ptxops.translation_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..algorithms.plan import capturing

#: Added to a buffer's local address to make the fake multicast base of ``multicast_emulated``:
#: above every real device address, so a translation window never covers real memory.
FAKE_MULTICAST = 1 << 62
#: Bytes of a data buffer's translation window: past any tensor, since buffers are cached by
#: address and a later, larger tensor may start there; the signal pad's window (exact, and
#: checked last, so it wins) is the only other one, and no data access falls in it.
DATA_WINDOW_BYTES = 1 << 40


def filled(values: Sequence[int], device: str | torch.device = "cuda") -> torch.Tensor:
    """``values`` as an int64 tensor on ``device`` made by one fill kernel per value (the value
    in the kernel's arguments): no copy.  Where ranks share the GPU (a one-GPU world), a thread
    waiting inside a host copy for its stream holds every other thread's copy from pageable
    memory, ``cudaMalloc`` and pinning, not its fills (one H200:
    ``tests/collectives/gpu/one_gpu/test_host_copies.py``): a rank's upload of a new buffer's
    table waited there for ranks whose copies waited for its launch, until every kernel timed
    out (the MoE soak at W = 6 to 8).  Under CUDA-graph capture the fills are recorded: they run
    at each replay."""
    t = torch.empty(len(values), dtype=torch.int64, device=device)
    for i, v in enumerate(values):
        t[i].fill_(v)
    return t


def device_table(values: list[int], device: str = "cuda", shared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` as an int64 tensor on ``device`` (the current GPU), and its host copy.  Eagerly
    the copy is pageable (no pinned allocation: in a world of 4 ranks on one H200 a rank pinning
    a new buffer's table waited until the kernels' timeout), and with ``shared`` (ranks share
    the GPU) there is no copy at all, :func:`filled` (why: there).  Inside a CUDA-graph capture
    the copy is from pinned memory, the only copy a capture records, which the graph reads at
    each replay: the returned host copy must live as long as the device table."""
    host = torch.tensor(values, dtype=torch.int64)
    if not capturing():
        return (filled(values, device) if shared else host.to(device)), host
    host = host.pin_memory()
    return host.to(device, non_blocking=True), host


@dataclass
class Buffer:
    """A symmetric buffer as kernels see it: the table of every rank's address (and the host
    copy it came from, read by the host), the multicast address (0 unless the backend is
    multicast), and for ``multicast_emulated`` the translation table of its window and the
    signal pad's (the kernels' ``data_mc``; its host copy kept alive with it, see
    :func:`device_table`).  ``storage``: for memory from outside the context (torch's
    ``symm_mem.empty``, freed by reference count with no call), a weak reference to its
    storage: the view holds while it lives."""

    table: torch.Tensor
    mc: int
    host: torch.Tensor
    window: tuple[int, int, list[int]]
    emulation: torch.Tensor
    emulation_host: torch.Tensor
    ptr: int  # this rank's address of the buffer
    storage: StorageWeakRef | None = None

    def expired(self) -> bool:
        """Whether the memory of an adopted buffer has been freed (its address may now be
        another allocation's, with other peer addresses)."""
        return self.storage is not None and self.storage.expired()


class BufferViews:
    """The :class:`Buffer` of each symmetric tensor of context ``ctx``, cached by address, for
    as long as the allocation lives: the context's own frees reach :meth:`forget` (through
    :attr:`~collectives.symmetric.context.Context.on_free`), an adopted buffer's view expires
    with its storage.  The first one made must be the signal pad's: every later translation
    table ends with its window."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._buffers: dict[int, Buffer] = {}
        self._pad: Buffer | None = None

    def get(self, t: torch.Tensor) -> Buffer:
        """The kernel view of symmetric tensor ``t`` (cached by address)."""
        key = t.data_ptr()
        buffer = self._buffers.get(key)
        if buffer is None or buffer.expired():
            import ptxops

            peers = self.ctx.peer_pointers(t, align=1)
            shared = self.ctx.ranks_on_device > 1
            table, host = device_table(peers, shared=shared)
            mc = self.ctx.multicast_tensor(t).data_ptr() if self.ctx.backend == "multicast" else 0
            base = FAKE_MULTICAST + peers[self.ctx.rank]
            if self._pad is not None:
                window, pad = (base, DATA_WINDOW_BYTES, peers), self._pad.window
            else:  # the signal pad, the first buffer
                window = pad = (base, t.nbytes, peers)
            emulation, emulation_host = device_table(ptxops.translation_table([window, pad]),
                                                     shared=shared)
            storage = StorageWeakRef(t.untyped_storage()) if self.ctx.is_adopted(t) else None
            buffer = self._buffers[key] = Buffer(table, mc, host, window, emulation, emulation_host, key, storage)
            if self._pad is None:
                self._pad = buffer
        return buffer

    def forget(self, ptr: int, nbytes: int) -> None:
        """Drop the views of a freed symmetric buffer of ``nbytes`` at ``ptr``, and of every
        view into it (its addresses may be reused)."""
        for key in [k for k in self._buffers if ptr <= k < ptr + nbytes]:
            del self._buffers[key]
