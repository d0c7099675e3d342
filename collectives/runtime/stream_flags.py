"""Stream flags: device-side ordering between two streams of one GPU without events or host
syncs.  Slot ``i`` counts its posts (row 0) and the posts its consumer took (row 1); a post is a
one-thread kernel whose ``red.release.gpu`` publishes what its stream's earlier kernels wrote,
a wait a one-thread kernel polling with ``ld.acquire.gpu`` (:mod:`collectives.device.flags`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import FLAG_SLOTS
from .error_record import ErrorRecord
from ..errors import CollectiveError


#: CUDA priority of the side stream (lower is higher; torch maps it into the device's range).
SIDE_PRIORITY = -1


class StreamFlags:
    """The :data:`~collectives.config.FLAG_SLOTS` flag slots of one GPU (``device``) and the side
    stream that GEMM overlap runs its copies on (ordered by CUDA events).  ``kernel(kind)`` is the
    compiled ``"post"`` / ``"wait"`` kernel, ``stream(device)`` the current stream's handle; a
    wait times out after ``record.timeout_s``, recording rank ``rank``'s timeout in ``record``;
    ``priority``: the side stream's CUDA priority."""

    def __init__(self, device: int, kernel: Callable[[str], Callable[..., Any]], record: ErrorRecord, rank: int,
                 stream: Callable[[int], int], priority: int = SIDE_PRIORITY) -> None:
        self.device, self.kernel, self.record, self.rank, self.stream = device, kernel, record, rank, stream
        self.priority = priority
        # Row 0 counts each slot's posts, row 1 the posts its consumer took.
        self.flags = torch.zeros((2, FLAG_SLOTS), dtype=torch.int32, device=device)
        self._side: torch.cuda.Stream | None = None
        self._events: list[torch.cuda.Event] = []

    def post(self, index: int) -> None:
        """Post flag slot ``index`` on the current stream: a one-thread kernel whose
        ``red.release.gpu`` publishes what the stream's earlier kernels wrote
        (:func:`collectives.device.flags.post`).  Every post must be taken by one :meth:`wait`."""
        self._launch("post", index)

    def wait(self, index: int) -> None:
        """Make the current stream wait, on the GPU, for the next post of slot ``index`` (a
        one-thread kernel polling with ``ld.acquire.gpu``, :func:`collectives.device.flags.wait`);
        bounded by the record's ``timeout_s``, after which the error record holds a flag-wait timeout
        (raised as CollectiveTimeout; the communicator stays usable).  One consumer per slot,
        its waits ordered (one stream)."""
        self._launch("wait", index)

    def _launch(self, kind: str, index: int) -> None:
        if not 0 <= index < FLAG_SLOTS:
            raise CollectiveError(f"flag slot {index} out of range (0..{FLAG_SLOTS - 1})")
        posted = self.flags.data_ptr()
        self.kernel(kind)(posted, posted + 4 * FLAG_SLOTS, index, self.record.error.data_ptr(), self.rank,
                          int(self.record.timeout_s * 1e9), self.stream(self.device))

    def events(self, count: int) -> list[torch.cuda.Event]:
        """``count`` CUDA events of this GPU, made once and reused by every GEMM-overlap call (its
        fork, per-block and join events): a stream's wait binds to the event's last record
        before it, so a later call's records leave the waits already queued as they were.
        Eagerly a new event per wait costs host time on every call (``wait_stream`` makes one)."""
        while len(self._events) < count:
            self._events.append(torch.cuda.Event())
        return self._events[:count]

    def rematch(self) -> None:
        """After a flag wait timed out (taking nothing): once this rank's queued work is done on
        its streams (the current one and the side stream: a late post has landed), every
        slot's posts count as taken.  A host synchronisation, on this error path only; never
        of the whole device, which other ranks sharing it may keep busy with kernels waiting
        for ours."""
        current = torch.cuda.current_stream(self.device)
        for stream in (current, self._side):
            if stream is not None:
                stream.synchronize()
        self.flags[1].copy_(self.flags[0])
        current.synchronize()

    def use_side(self, stream: torch.cuda.Stream) -> None:
        """Make ``stream`` the side stream (a one-GPU world gives each rank one of its own,
        outside torch's stream pool)."""
        self._side = stream

    def side(self) -> torch.cuda.Stream:
        """The side stream of this GPU (made on first use): GEMM overlap's communication stream,
        of CUDA priority :attr:`priority`: by default higher than the default stream's
        (:data:`SIDE_PRIORITY`), so that its few small kernels (barriers) are dispatched ahead of a
        GEMM's pending blocks, not after its last wave; the communicator's by its world size
        (:func:`collectives.algorithms.tuning.overlap_side_priority`: default priority on 2 GPUs,
        where that measured faster)."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device, priority=self.priority)
        return self._side
