"""The seam between the algorithms and the host runtime: :class:`Runtime`, exactly what plans
(:mod:`~collectives.algorithms.plan`) and algorithms use from a communicator.

:class:`collectives.runtime.communicator.Communicator` satisfies it (tests check it
structurally), and so must any other host that runs these plans (a one-GPU world of
thread-ranks).  The algorithms name the runtime only through these protocols: they import no
host-runtime module.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Slot
from ..layouts import PadLayout

if TYPE_CHECKING:
    import torch

__all__ = ["Buffer", "Memory", "Pool", "Runtime"]


class Buffer(Protocol):
    """The kernel view of a symmetric buffer (real: :class:`collectives.runtime.views.Buffer`)."""

    table: torch.Tensor  # device table of every rank's address of the buffer (int64)
    mc: int  # the buffer's multicast address (0 without multicast)
    host: torch.Tensor  # the table's host copy
    emulation: torch.Tensor  # the translation table of the multicast emulation
    ptr: int  # this rank's address of the buffer
    storage: Any  # adopted memory's storage (a weak reference), else None


class Memory(Protocol):
    """The symmetric memory a runtime sits on (real: :class:`collectives.symmetric.context.Context`)."""

    def empty(self, shape: int, dtype: torch.dtype) -> torch.Tensor:
        """A symmetric tensor (collective: every rank asks for the same shape)."""
        ...


class Pool(Protocol):
    """The staging pool's pinning under CUDA-graph capture (real: :class:`collectives.runtime.staging.StagingPool`)."""

    def holder(self, ptr: int) -> int | None:
        """The staging buffer (data pointer) address ``ptr`` lies in, or None."""
        ...

    def capture(self, ptrs: tuple[int, ...]) -> None:
        """Keep the staging buffers ``ptrs`` for good: a CUDA graph captured their addresses."""
        ...


class Runtime(Protocol):
    """What plans and algorithms use from a communicator of ``world`` ranks."""

    world: int
    rank: int
    #: Streaming multiprocessors of this rank's GPU (grids are sized from it).
    sms: int
    #: The signal pad's layout, the pad (int32 words) and its kernel view.
    layout: PadLayout
    pad: torch.Tensor
    pad_buffer: Buffer
    #: Which of staging slots ``TURN_0``/``TURN_1`` the next single-barrier collective uses
    #: (a plan of two argument sets launches on it and flips it).
    turn: int
    #: The Lamport all-reduce's receive buffers by element bytes.
    lamport_buffers: dict[int, torch.Tensor]
    ctx: Memory
    pool: Pool
    #: The raw CUDA stream the last collective launched on (None before the first), and whether
    #: it was being captured (:func:`collectives.algorithms.plan.follow`).
    stream: int | None
    stream_captured: bool

    @property
    def device_index(self) -> int:
        """This rank's CUDA device ordinal."""
        ...

    @property
    def error(self) -> torch.Tensor:
        """The error records kernels write (host-mapped int32)."""
        ...

    @property
    def timeout_s(self) -> float:
        """The bound of every cross-GPU wait, in seconds (kernels take it at launch)."""
        ...

    def buffer(self, t: torch.Tensor) -> Buffer:
        """The kernel view of symmetric tensor ``t``."""
        ...

    def staging(self, nbytes: int, which: Slot) -> torch.Tensor:
        """Staging slot ``which``, of at least ``nbytes`` (grown collectively)."""
        ...

    def kernel(self, key: Hashable) -> Callable[..., Any]:
        """The compiled kernel for ``key`` on this GPU (a string key: a stream-flag kernel)."""
        ...

    def agree_growth(self, what: int, nbytes: int) -> None:
        """Agree with every rank before a collective allocation a call makes."""
        ...

    def barrier(self, backend: str, capture: bool) -> None:
        """Launch a device-side barrier of every rank on the current stream (``capture``: whether
        it is capturing a CUDA graph)."""
        ...

    def exchange(self) -> Any:
        """The all-to-all's part (:class:`collectives.runtime.all_to_all.Exchange`: made at the
        first all-to-all, collective); its ``plan(call)`` plans an all-to-all."""
        ...

    def block_cap(self, key: Hashable) -> int | None:
        """The most blocks ``key``'s kernel may launch on this rank so that every rank sharing
        its GPU has its grid resident (None: the rank has its GPU alone)."""
        ...

