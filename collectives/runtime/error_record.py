"""The error records kernels write and the host protocol that reads them.

Kernels write a record of :data:`~collectives.layouts.ERROR_FIELDS` into host-mapped memory
(pinned, so the host reads it without a GPU sync): record
:data:`~collectives.layouts.FATAL_RECORD` for what leaves the communicator unusable (a
collective timed out), :data:`~collectives.layouts.RECOVERABLE_RECORD` for what the host clears
and raises while the communicator stays usable (a size mismatch, a stream-flag timeout).

Ranks see a record at different calls, so a recoverable error is never raised before a call's
launches (a rank that raised first would skip a call the others make): :meth:`ErrorRecord.poll`
at the start of a call defers it, :meth:`ErrorRecord.finish` after the launches raises it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..algorithms import REGISTRY
from ..errors import CollectiveError, CollectiveTimeout
from ..layouts import (CLAIMED, ERROR_FIELD, ERROR_FIELDS, ERROR_RECORDS, FATAL_RECORD, FLAG_WAIT,
                       RECOVERABLE_RECORD, SIZE_MISMATCH, TIMEOUT)
from ..layouts import PHASES as EXCHANGE_PHASES

#: Where the fatal and the recoverable record's status field lie in the flat record array.
FATAL_STATUS, RECOVERABLE_STATUS = (record * len(ERROR_FIELDS) + ERROR_FIELD["status"]
                                     for record in (FATAL_RECORD, RECOVERABLE_RECORD))
#: The name of each phase code a record's ``barrier`` field holds, for messages: the start and
#: end barriers (0 and 1) and the phases each algorithm declares (:attr:`Algorithm.phases`; the
#: all-to-all's: :data:`collectives.layouts.PHASES`).
PHASE_NAMES = {0: "start barrier", 1: "end barrier",
               **{code: name for impl in REGISTRY.values() for code, name in impl.phases.items()}}


class ErrorRecord:
    """A communicator's error records (:attr:`error`, host-mapped) and what the host knows of
    them: the fatal error that ended the communicator (:attr:`failed`), a recoverable one
    waiting for the end of the call (:attr:`deferred`), the calls made (:attr:`calls`).

    :attr:`timeout_s` bounds every cross-GPU wait (the kernels take it) and its messages;
    ``bound_changed`` runs when it is set to another value (the communicator drops its plans,
    whose launch arguments hold the bound).  ``rematch_flags`` runs after a stream-flag wait
    timed out, before its record is cleared
    (:meth:`collectives.runtime.stream_flags.StreamFlags.rematch`)."""

    def __init__(self, timeout_s: float, rematch_flags: Callable[[], None], pin_memory: bool = True,
                 bound_changed: Callable[[], None] = lambda: None) -> None:
        self._timeout_s = timeout_s
        self.bound_changed = bound_changed
        self.rematch_flags = rematch_flags
        self.error = torch.zeros((ERROR_RECORDS, len(ERROR_FIELDS)), dtype=torch.int32, pin_memory=pin_memory)
        # host-mapped: read without a GPU sync (a flat memoryview: its items are Python ints, read
        # at each call in a fraction of a NumPy scalar's time, by one int index each: half the
        # time of a (record, field) pair's)
        self._status = memoryview(self.error.numpy().reshape(-1))
        #: The fatal error found: every later call raises it.
        self.failed: CollectiveError | None = None
        #: A recoverable error :meth:`poll` found, raised by :meth:`finish`.
        self.deferred: CollectiveError | None = None
        #: Collective calls made so far (counted by :meth:`poll`, not by :meth:`check`, which a
        #: rank may call at will): the same on every rank.
        self.calls = 0
        #: Calls in progress that make collective calls of their own (GEMM overlap): the
        #: innermost calls' :meth:`finish` leaves a deferred error to the outermost.
        self.nested = 0

    @property
    def timeout_s(self) -> float:
        """The bound of every cross-GPU wait, in seconds."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        if value != self._timeout_s:
            self._timeout_s = value
            self.bound_changed()

    def check(self) -> None:
        """Raise the error a kernel recorded, or one deferred (reading host-mapped memory: no
        GPU sync)."""
        self.read()
        self.finish()

    def poll(self) -> None:
        """At the start of a collective call: raise a fatal error (a timeout: the communicator
        is lost); clear a recoverable one (a size mismatch, a stream-flag timeout) and defer it
        to :meth:`finish`, after this call's launches.  Ranks see a kernel's record at different
        calls (the host reads it without a sync): raising before the launch would make the rank
        that sees it first skip a call that the others make, and their kernels wait for it in
        vain."""
        self.calls += 1
        status = self._status  # (read() only where there is something to read: the call's common case costs no call)
        if self.failed is not None or status[FATAL_STATUS] > 0 or status[RECOVERABLE_STATUS] > 0:
            self.read()

    def read(self) -> None:
        """Raise a fatal error recorded or found before; defer a recoverable one.  The fatal
        record is read first (a collective timed out: the communicator is unusable), then the
        recoverable one (cleared here: the communicator stays usable).  A record a kernel is
        still writing (status ``CLAIMED``) is read at a later call."""
        if self.failed is not None:
            raise self.failed
        if self._status[FATAL_STATUS] <= 0 and self._status[RECOVERABLE_STATUS] <= 0:
            return
        fatal = self._status[FATAL_STATUS] > 0
        record = self.error[FATAL_RECORD if fatal else RECOVERABLE_RECORD]
        status, barrier, peer, block, rank = (int(v) for v in record.tolist())
        where = f"rank {rank}, thread block {block}, {PHASE_NAMES.get(barrier, barrier)}"
        if status == TIMEOUT and barrier == FLAG_WAIT:
            # Local to this GPU and no other rank's state involved: match the counts again
            # and stay usable.
            self.rematch_flags()
            record.zero_()
            self.defer(CollectiveTimeout("flag wait", [], self.timeout_s,
                                         f"rank {rank}, slot {block} was never posted"))
        elif status == TIMEOUT:
            missing = [peer] if peer >= 0 else []
            raise self.fail(CollectiveTimeout("collective", missing, self.timeout_s, where))
        elif status == SIZE_MISMATCH:
            # Every rank sees the disagreement (each compares every rank's size with its own),
            # and every rank's call count moved on by the same step whatever ran; a Lamport
            # buffer the mismatch left dirty is emptied on the GPU two calls later
            # (collectives.algorithms.lamport): no host step, the communicator stays usable.
            record.zero_()
            if barrier in EXCHANGE_PHASES:  # (an all-to-all: only the pairs concerned fail)
                rule = ("each sender's in_splits[r] must equal its receiver's out_splits[s], every split be "
                        "0 or more rows of at most 2^32-2 elements in all, the splits fit their tensors (a "
                        "plain out: the staging buffer), and every rank's tensors be of one dtype (bounded=True: "
                        "each chunk at most its receiver's slot, out.shape[0] // world rows; a low-latency MoE "
                        "dispatch: max_tokens rows and its counts' rows)")
                what = "different sizes"
            else:
                rule = ("every rank must make the same call (collective, dtype, op) with the same shape, and "
                        "tensors of the same kind: all symmetric or all from torch's allocator, in place or with out "
                        "alike, 16-byte aligned alike")
                what = "different sizes or tensors of different kinds (or different collectives, dtypes or ops)"
            self.defer(CollectiveError(
                f"ranks called the collective with {what}: rank {peer} disagrees with rank {rank} ({where}); {rule}"
            ))
        else:
            raise self.fail(CollectiveError(f"kernel error record {self.error.tolist()}"))

    def describe(self) -> str:
        """The records as they stand (host-mapped: read without a GPU sync), for a failure's
        report: each record's status, phase, thread block and the peer waited for or
        disagreeing.  A fatal record stays as its kernel wrote it, whatever the host raised
        since; a recoverable one the host has read is cleared (its error was raised)."""
        names = {TIMEOUT: "timeout", SIZE_MISMATCH: "size mismatch", CLAIMED: "being written"}
        parts = []
        for which, record in (("fatal", FATAL_RECORD), ("recoverable", RECOVERABLE_RECORD)):
            status, barrier, peer, block, rank = (int(v) for v in self.error[record].tolist())
            parts.append(f"{which}: none" if status == 0 else
                         f"{which}: {names.get(status, status)} in {PHASE_NAMES.get(barrier, barrier)}, thread block "
                         f"{block}, peer {peer}")
        return "; ".join(parts)

    def fail(self, error: CollectiveError) -> CollectiveError:
        """Mark the communicator lost with ``error`` (every later call raises it); returns it."""
        self.failed = error
        return error

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """One call made of collective calls (GEMM overlap): :meth:`poll` before, :meth:`finish`
        after; its collectives' own :meth:`finish` leaves a deferred error to it, so that every
        rank makes all of them."""
        self.poll()
        self.nested += 1
        try:
            yield
        finally:
            self.nested -= 1
        self.finish()

    def defer(self, error: CollectiveError) -> None:
        """Keep ``error`` for :meth:`finish` (the first one deferred wins)."""
        if self.deferred is None:
            self.deferred = error

    def finish(self) -> None:
        """At the end of a collective call (after its launches): raise the error :meth:`poll`
        deferred, unless this call is part of an outer one (:attr:`nested`)."""
        if self.deferred is not None and not self.nested:
            error, self.deferred = self.deferred, None
            raise error
