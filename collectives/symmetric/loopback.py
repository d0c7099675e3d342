"""Symmetric memory of a world of ranks that are threads of one process on one GPU.

:class:`Meeting` is the world's host agreement: the ``k``-th :meth:`~Meeting.gather` of every
rank meets the ``k``-th of the others (what a process group's all-gather does), every wait
bounded: a rank that does not arrive within the bound, or that failed (:meth:`~Meeting.abort`),
gives every waiting rank a :class:`WorldError` naming it, never a hang.

:class:`LoopbackHeap` is the :class:`~collectives.symmetric.heap.Heap` of one rank: an allocation is a
plain torch allocation on the shared GPU, recorded in the world's table by allocation index and
met (collective, like ``nvshmem_malloc``); ``peer(raw, r)`` is rank ``r``'s allocation of the
same index (the ranks share one address space); ``free`` meets first (every rank has finished
its work on the allocation) and then drops it; ``synchronize`` waits for this rank's current
stream only (never the device: the other ranks' kernels may be waiting for ours).  There is no
NVLink multicast: the world runs the ``peer`` and ``multicast_emulated`` backends only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import CollectiveError, MulticastUnavailable

__all__ = ["LoopbackHeap", "Meeting", "ThreadAgreement", "WorldError"]

_ABSENT = object()


class WorldError(CollectiveError):
    """A rank of the world failed, or did not arrive at a host step in time; ``ranks`` names
    the ranks at fault."""

    def __init__(self, message: str, ranks: Sequence[int]) -> None:
        self.ranks = tuple(ranks)
        super().__init__(message)


class Meeting:
    """Bounded rendezvous of ``world`` threads, by call order (see the module docstring).
    ``timeout_s`` bounds each wait."""

    def __init__(self, world: int, timeout_s: float) -> None:
        self.world, self.timeout_s = world, timeout_s
        self._cond = threading.Condition()
        self._rounds: dict[tuple[str, int], list[Any]] = {}  # (channel, round) -> (what, value) per rank
        self._read: dict[tuple[str, int], int] = {}  # ranks done with a round
        self._joined: dict[str, list[int]] = {}  # rounds each rank has entered, per channel
        self._failed: WorldError | None = None
        #: The rank that failed first (:meth:`abort`), or None.
        self.first_failure: int | None = None
        #: Meetings of groups of these ranks: aborted and recovered with this one.
        self.linked: list[Meeting] = []

    def abort(self, rank: int, error: BaseException) -> None:
        """Rank ``rank`` failed with ``error``: every wait, now and later, raises naming it
        (the linked meetings' too)."""
        with self._cond:
            if self._failed is None:
                self.first_failure = rank
                self._failed = WorldError(f"rank {rank} failed: {type(error).__name__}: {error}", [rank])
            self._cond.notify_all()
        for group in self.linked:
            group.abort(rank, error)

    def in_step(self) -> bool:
        """Whether every rank stopped at the same step of every channel, here and in the
        linked meetings."""
        with self._cond:
            if any(len(set(joined)) > 1 for joined in self._joined.values()) or self._rounds:
                return False
        return all(group.in_step() for group in self.linked)

    def recover(self) -> bool:
        """Lift a failure (here and in the linked meetings) where every rank stopped at the same
        step of every channel (each raised on its own, the same way: a test skipped in every
        rank); False, and the failure stays, where ranks stopped at different steps."""
        if not self.in_step():
            return False
        for meeting in [self, *self.linked]:
            with meeting._cond:
                meeting._failed, meeting.first_failure = None, None
        return True

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise WorldError(str(self._failed), self._failed.ranks)

    def gather(self, rank: int, what: str, value: Any, timeout_s: float | None = None,
               channel: str = "host") -> list[Any]:
        """Every rank's ``value`` of this round of ``channel`` (each channel counts its own
        rounds), in rank order.

        The values say whether ranks are in step (a context compares what it agrees on).

        Raises:
            WorldError: a rank failed, or ranks did not arrive within ``timeout_s`` (default:
                the meeting's bound; the message names them, ``what`` and the steps they are at).
        """
        bound = self.timeout_s if timeout_s is None else timeout_s
        with self._cond:
            self._raise_if_failed()
            joined = self._joined.setdefault(channel, [0] * self.world)
            k = (channel, joined[rank])
            joined[rank] += 1
            slot = self._rounds.setdefault(k, [_ABSENT] * self.world)
            slot[rank] = (what, value)
            self._cond.notify_all()
            deadline = time.monotonic() + bound
            while any(v is _ABSENT for v in slot) and self._failed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r, v in enumerate(slot) if v is _ABSENT]
                    raise WorldError(f"{what}: ranks {missing} did not arrive within {bound:g}s ({channel} step {k[1]} "
                                     f"of rank {rank}; they are at steps {[joined[r] for r in missing]})", missing)
                self._cond.wait(left)
            if any(v is _ABSENT for v in slot):  # released by a failure (a complete round still counts)
                self._raise_if_failed()
            self._read[k] = self._read.get(k, 0) + 1
            if self._read[k] == self.world:  # every rank has its copy
                del self._rounds[k], self._read[k]
        return [v for _, v in slot]

    def barrier(self, rank: int, what: str) -> None:
        """Wait until every rank reaches this round (bounded as :meth:`gather`)."""
        self.gather(rank, what, None)


class LoopbackHeap:
    """The :class:`~collectives.symmetric.heap.Heap` of rank ``rank`` of a world (see the module
    docstring); ``table`` is the world's, shared: allocation index -> every rank's tensor."""

    def __init__(self, meeting: Meeting, table: dict[int, list[torch.Tensor | None]], rank: int,
                 device: int, stream: Callable[[], Any] | None = None) -> None:
        self.meeting, self.table, self.rank, self.device = meeting, table, rank, device
        self._stream = stream or (lambda: torch.cuda.current_stream(device))
        self._index: dict[int, int] = {}  # data_ptr -> allocation index
        self._next = 0
        self._lock = threading.Lock()  # the table is shared by every rank's thread

    def alloc(self, nbytes: int) -> torch.Tensor:
        raw = torch.empty(nbytes, dtype=torch.uint8, device=self._device())
        k = self._next
        self._next += 1
        with self._lock:
            self.table.setdefault(k, [None] * self.meeting.world)[self.rank] = raw
        self._index[raw.data_ptr()] = k
        self.meeting.gather(self.rank, f"alloc #{k}", nbytes)  # every rank's tensor is in the table now
        return raw

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        peer = self.table[self._index[raw.data_ptr()]][rank]
        if peer is None:
            raise CollectiveError(f"rank {rank} has freed allocation #{self._index[raw.data_ptr()]}")
        return peer

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        raise MulticastUnavailable("a one-GPU world has no NVLink multicast (backends: peer, multicast_emulated)")

    def adopt(self, t: torch.Tensor) -> None:
        return None  # a world's symmetric memory is its heap's own allocations only

    def free(self, raw: torch.Tensor) -> None:
        k = self._index.pop(raw.data_ptr())
        self.meeting.barrier(self.rank, f"free #{k}")  # every rank's work on it is done
        with self._lock:
            entry = self.table[k]
            entry[self.rank] = None
            if all(t is None for t in entry):
                del self.table[k]

    def synchronize(self) -> None:
        self._stream().synchronize()

    def finalize(self) -> None:
        pass  # the world's harness frees the GPU memory after every rank's kernels ended

    def _device(self) -> torch.device:
        return torch.device("cuda", self.device) if isinstance(self.device, int) else torch.device(self.device)


class ThreadAgreement:
    """The host agreement of rank ``rank`` of a world (the :class:`~collectives.symmetric.agreement.Agreement`
    a :class:`~collectives.symmetric.context.Context` asks): collective steps on the meeting's ``host``
    channel, bounded agreements on their own (the ``k``-th of each rank meets only the ``k``-th
    of the others, as through a process group's store)."""

    def __init__(self, meeting: Meeting, rank: int) -> None:
        self.meeting, self.rank = meeting, rank

    def all_gather(self, what: str, values: Sequence[int]) -> list[list[int]]:
        return self.meeting.gather(self.rank, what, list(values))

    def bounded(self, what: str, values: Sequence[int], timeout_s: float) -> list[list[int]]:
        return self.meeting.gather(self.rank, what, list(values), timeout_s, channel="bounded")

    def barrier(self, what: str) -> None:
        self.meeting.barrier(self.rank, what)
