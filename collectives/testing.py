"""A world of W ranks on one GPU: test collectives (ours, or your own built with ptxops) at
W = 2..8 on the GPU you have, without NVSHMEM, torchrun or a second GPU.

:func:`run_world` calls ``fn(rank)`` in every rank and returns the results in rank order::

    import torch, collectives
    from collectives.testing import run_world

    def body(rank):
        t = torch.full((4096,), float(rank + 1), device="cuda")
        collectives.all_reduce(t)  # every rank's current context: no group= needed
        collectives.synchronize()
        return t[0].item()

    assert run_world(4, body) == [10.0] * 4

Each rank is a thread of this process with its own CUDA streams (created once, outside torch's
stream pool, each with a hardware queue of its own), its own symmetric-memory context (a loopback heap over plain allocations of the
shared GPU, :mod:`collectives.symmetric.loopback`) bound as the thread's current context, and its own
communicator; the kernels are the real ones, compiled once per process.  Every host wait is
bounded by ``timeout_s``: a rank that raises releases the others with a
:class:`~collectives.symmetric.loopback.WorldError` naming it and its exception is re-raised with its
rank; a rank still running ``timeout_s`` after another finished is reported as hung, and so are
ranks that none finished and that all stayed in the same place for ``timeout_s`` (stuck in waits).  GPU-side
waits are bounded by the communicators' timeout (``collective_timeout_s``).

What differs from a job of one rank per GPU: all ranks' grids share one GPU, so each rank's
kernels take only their share of it (:mod:`collectives.algorithms.residency`; a fixed grid that
cannot fit raises :class:`~collectives.algorithms.residency.CoResidencyError`);
there is no NVLink multicast (backends ``peer`` and ``multicast_emulated``); groups of ranks
(tensor- and data-parallel) come from :func:`new_group`, not ``torch.distributed``; a rank must never
synchronise the device (``torch.cuda.synchronize()`` waits for the other ranks' kernels, which
may wait for this rank: use the stream, as :func:`collectives.synchronize` does), and captures a
CUDA graph with :func:`capture` (``torch.cuda.graph`` synchronises the device).  Loading a CUDA
module also waits for every kernel running on the GPU, the other ranks' included: the runtime
loads each collective kernel when a call is planned, before any rank launches it
(:func:`collectives.runtime.kernels.load`), and CUDA must load torch's modules eagerly and give
the streams their own hardware queues (:data:`ENVIRONMENT`: ``CUDA_MODULE_LOADING=EAGER``,
``CUDA_DEVICE_MAX_CONNECTIONS=32``): :class:`World` sets them where CUDA has not started and
refuses to run where it started without them.  A kernel of your own that waits for other ranks
must be loaded the same way before its first launch (the first call of a CuTeDSL kernel loads
it): call it once under a throwaway stream capture, as
:func:`~collectives.runtime.kernels.load` does, while no rank's kernel waits for this one.
Read results back after :func:`collectives.synchronize`, as above: a thread waiting inside a
copy to the host (``.cpu()``, ``.tolist()``, ``.item()``) for its collectives holds every other
rank's copy from the host, ``cudaMalloc`` and pinning until it ends (one H200:
``tests/collectives/gpu/one_gpu/test_host_copies.py``), and a slower rank may need one of those
before it launches what that copy waits for; a wait for the stream holds nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import CollectiveError, MissingDependency
from .runtime.collection import no_collection
from .symmetric.capability import cuda_missing

try:  # every rank runs torch: without it, say which extra installs it
    from .runtime.driver_streams import create_stream
    from .symmetric.context import bound
    from .symmetric.loopback import LoopbackHeap, Meeting, ThreadAgreement, WorldError
except ModuleNotFoundError as err:
    if (err.name or "").partition(".")[0] not in MissingDependency.EXTRAS:
        raise
    raise MissingDependency("collectives.testing", err.name.partition(".")[0]) from None

__all__ = ["ENVIRONMENT", "Groups", "RankThreads", "World", "WorldError", "capture", "check_loading_mode",
           "group_members", "new_group", "require_environment", "run_world"]

#: The largest world: the kernels are compiled for 2..8 ranks.
MAX_WORLD = 8
_ABSENT = object()
#: The world and rank of this thread, where it is a rank's (:func:`new_group`).
_THREAD = threading.local()


#: What CUDA must be told before it starts in a process that runs a world, and why.
ENVIRONMENT = {
    "CUDA_MODULE_LOADING": ("EAGER", "lazy loading loads a module at a kernel's first launch, and a load waits for "
                            "every kernel running on the GPU, the other ranks' spinning ones included (measured: "
                            "lost communicators within 25 calls)"),
    "CUDA_DEVICE_MAX_CONNECTIONS": ("32", "with fewer hardware queues than streams (8 by default), streams share "
                                    "queues and a rank's kernel can wait behind another rank's spinning kernel "
                                    "(measured: start-barrier timeouts at W = 8)"),
}


def require_environment() -> None:
    """Give CUDA :data:`ENVIRONMENT` (eager module loading, 32 hardware queues): set the
    variables where CUDA has not started in this process; where it has, refuse unless they
    were set so.

    Raises:
        CollectiveError: CUDA started without them (naming each, its value and why).
    """
    import torch

    wrong = {name: value for name, (value, _) in ENVIRONMENT.items() if os.environ.get(name) != value}
    if not wrong:
        return
    if torch.cuda.is_initialized() or _context_started():
        raise CollectiveError("a one-GPU world needs, from before CUDA starts in the process: " + "; ".join(
            f"{name}={value} (not {os.environ.get(name)!r}: {ENVIRONMENT[name][1]})" for name, value in wrong.items()))
    os.environ.update(wrong)


def _context_started() -> bool:
    """Whether a CUDA context of this process is active already (the variables then no longer count)."""
    try:
        from cuda.bindings import driver

        err, current = driver.cuCtxGetCurrent()
        return err == driver.CUresult.CUDA_SUCCESS and bool(int(current))
    except Exception:  # noqa: BLE001 (no driver or bindings: CUDA has not started through them)
        return False


def moved(before: list[tuple[tuple, float]], now: list[tuple[tuple, float]]) -> bool:
    """Whether a thread moved between two :meth:`RankThreads.places`: another stack, or a
    millisecond of CPU time spent (a busy Python loop is caught at the same instruction each
    time, the one where it gives up the GIL; a thread blocked in a wait spends none)."""
    return any(a[0] != b[0] or b[1] - a[1] > 1e-3 for a, b in zip(before, now))


class RankThreads:
    """``size`` threads, one per rank, that run functions on request (:meth:`run`) with every
    wait bounded (see :meth:`run`); ``start(rank)`` runs first in each thread.  A failure
    aborts ``meeting``, so ranks waiting there are released naming the failed rank."""

    def __init__(self, size: int, timeout_s: float, meeting: Meeting,
                 start: Callable[[int], None] = lambda rank: None) -> None:
        self.size, self.timeout_s, self.meeting, self._start = size, timeout_s, meeting, start
        self.broken: CollectiveError | None = None
        self._jobs: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(size)]
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._runs = itertools.count()
        self._threads = [threading.Thread(target=self._serve, args=(r,), name=f"collectives-rank-{r}", daemon=True)
                         for r in range(size)]
        for t in self._threads:
            t.start()

    def _serve(self, rank: int) -> None:
        self._start(rank)
        while True:
            job = self._jobs[rank].get()
            if job is None:
                return
            run, fn = job
            try:
                outcome = (True, fn(rank))
            except BaseException as e:  # noqa: BLE001 (handed to the caller of run, with its rank)
                self.meeting.abort(rank, e)
                outcome = (False, e)
            self._results.put((run, rank, outcome))

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` in every rank (at once, each in its thread); the results in rank order.

        Raises:
            BaseException: the exception of the first rank that raised, with a note naming its
                rank and what the others did.  The threads are then broken (start new ones),
                unless every rank raised the same, at the same host step (a test skipped).
            WorldError: a rank still running ``timeout_s`` after another finished (hung), every
                rank where it was (:meth:`places`) ``timeout_s`` before while none has finished
                (each stuck in a wait: hung), or the threads are stopped or broken.
        """
        if self.broken is not None:
            raise WorldError(f"this world is broken ({self.broken}); open a new one", [])
        run = next(self._runs)
        for jobs in self._jobs:
            jobs.put((run, fn))
        outcomes: list[Any] = [_ABSENT] * self.size
        deadline: float | None = None
        places = self.places(range(self.size))  # while no rank has finished: where each was last
        while _ABSENT in outcomes:
            wait = self.timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got, rank, outcome = self._results.get(timeout=wait)
            except queue.Empty:
                hung = [r for r, o in enumerate(outcomes) if o is _ABSENT]
                if deadline is None:
                    now = self.places(hung)
                    if moved(places, now):  # not stuck: look again a bound later
                        places = now
                        continue
                    why = (f"ranks {hung} did not move for {self.timeout_s:g}s and none finished (each stuck in a wait; "
                           "their threads are left running)")
                else:
                    why = (f"ranks {hung} did not finish within {self.timeout_s:g}s of the first rank that did (hung; "
                           "their threads are left running)")
                self.broken = WorldError(why, hung)
                self.broken.add_note(self.stacks(hung))
                self.meeting.abort(hung[0], self.broken)
                raise self.broken from next((o[1] for o in outcomes if o is not _ABSENT and not o[0]), None)
            if got != run:
                continue  # a late result of an earlier run that failed
            outcomes[rank] = outcome
            if deadline is None:
                deadline = time.monotonic() + self.timeout_s
        failed = {r: e for r, (ok, e) in enumerate(outcomes) if not ok}
        if failed:
            first = self.meeting.first_failure
            rank = first if first in failed else min(failed)
            error = failed[rank]
            alike = len(failed) == self.size and len({(type(e), str(e)) for e in failed.values()}) == 1
            if not (alike and self.meeting.recover()):  # else every rank stopped in step: still usable
                self.broken = WorldError(f"rank {rank} raised {type(error).__name__}: {error}", [rank])
            others = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in failed.items() if r != rank)
            error.add_note(f"[collectives.testing] raised in rank {rank} of a world of {self.size}"
                           + (f"; the others: {others}" if others else "; the others finished"))
            raise error
        return [value for _, value in outcomes]

    def places(self, ranks: Sequence[int]) -> list[tuple[tuple, float]]:
        """Where the threads of ``ranks`` are now: each one's stack as (code, instruction) per
        frame, innermost last, and the CPU time it has used (:func:`moved` compares two)."""
        frames = sys._current_frames()
        places = []
        for r in ranks:
            ident = self._threads[r].ident
            frame, stack = frames.get(ident), []
            while frame is not None:
                stack.append((frame.f_code, frame.f_lasti))
                frame = frame.f_back
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (AttributeError, OSError):  # no per-thread clock here, or the thread ended
                cpu = 0.0
            places.append((tuple(reversed(stack)), cpu))
        return places

    def stacks(self, ranks: Sequence[int], depth: int = 12) -> str:
        """Where the threads of ``ranks`` are now: each one's innermost ``depth`` Python frames
        (a hung rank's thread is most often inside a CUDA call that waits for the GPU, e.g. a
        kernel load or a pinned allocation behind another rank's spinning kernel)."""
        frames = sys._current_frames()
        parts = []
        for r in ranks:
            frame = frames.get(self._threads[r].ident)
            where = "".join(traceback.format_stack(frame)[-depth:]) if frame is not None else "  (thread ended)\n"
            parts.append(f"rank {r}'s thread, innermost call last:\n{where}")
        return "[collectives.testing] " + "".join(parts).rstrip()

    def stop(self) -> list[int]:
        """End the threads (after what they run now); the ranks whose thread is still alive
        ``timeout_s`` later."""
        for jobs in self._jobs:
            jobs.put(None)
        deadline = time.monotonic() + self.timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [r for r, t in enumerate(self._threads) if t.is_alive()]


class World:
    """``world_size`` rank threads on GPU ``device`` that stay open between :meth:`run` calls
    (so that their contexts, communicators and compiled kernels serve many functions); close it
    (or use it as a context manager) to free its memory.  See the module docstring.

    ``timeout_s`` bounds every host wait; ``collective_timeout_s`` (default: the
    communicators' own, ``COLLECTIVES_TIMEOUT_S`` or 30 s) bounds every GPU-side wait."""

    def __init__(self, world_size: int, *, device: int = 0, timeout_s: float = 60.0,
                 collective_timeout_s: float | None = None) -> None:
        if not 1 <= world_size <= MAX_WORLD:
            raise CollectiveError(f"a world has 1..{MAX_WORLD} ranks, not {world_size}")
        missing = cuda_missing()
        if missing is not None:
            raise CollectiveError(f"a one-GPU world needs a CUDA GPU: {missing}")
        require_environment()
        self.size, self.device, self.timeout_s = world_size, device, timeout_s
        self.collective_timeout_s = collective_timeout_s
        self.meeting = Meeting(world_size, timeout_s)
        #: Every rank's allocations by index (:class:`~collectives.symmetric.loopback.LoopbackHeap`).
        self.table: dict[int, list[Any]] = {}
        self.closed = False
        self.contexts: list[Any] = [None] * world_size
        self.communicators: list[Any] = [None] * world_size
        #: The groups of the world's ranks (:func:`new_group`).
        self.groups = Groups(self.meeting)
        self._streams = _Streams(device, world_size)
        check_loading_mode()
        self.threads = RankThreads(world_size, timeout_s, self.meeting, self._start)
        try:
            self.threads.run(self._open)
        except BaseException:
            self.close()
            raise

    @property
    def broken(self) -> CollectiveError | None:
        """Why the world cannot run more (a rank raised or hung), or None."""
        return self.threads.broken

    def _start(self, rank: int) -> None:
        import torch

        torch.cuda.set_device(self.device)
        torch.cuda.set_stream(self._streams.streams[rank])  # the thread's current stream, for all it runs
        _THREAD.world, _THREAD.rank = self, rank

    def _open(self, rank: int) -> None:
        """In rank ``rank``'s thread: its context (bound as the thread's current one) and
        communicator."""
        from .symmetric.context import bind_thread

        ctx = self.contexts[rank] = self._context(rank, rank, self.size, self.meeting, self.table)
        bind_thread(ctx)
        self.communicators[rank] = self._communicator(rank, ctx)

    def _context(self, rank: int, member: int, size: int, meeting: Meeting, table: dict) -> Any:
        """Rank ``rank``'s context as member ``member`` of ``size`` ranks that agree through
        ``meeting`` and allocate in ``table``: the world's, or a group's (every rank of the
        world counts for the GPU's share)."""
        from .symmetric.capability import Capabilities
        from .symmetric.context import Context

        stream = self._streams.streams[rank]
        caps = Capabilities(device=self.device, world_size=size, multicast=False,
                            multicast_reason="a one-GPU world has no NVLink multicast", peer_access=True,
                            peer_reason=None, nvlink_mesh=True)
        heap = LoopbackHeap(meeting, table, member, self.device, lambda: stream)
        return Context(heap=heap, group=None, rank=member, world_size=size, device=self.device, caps=caps,
                       backend="peer", agreement=ThreadAgreement(meeting, member), ranks_on_device=self.size)

    def _communicator(self, rank: int, ctx: Any) -> Any:
        """``ctx``'s communicator, on rank ``rank``'s side stream and the world's GPU-side bound."""
        from .runtime.communicator import communicator

        comm = communicator(ctx)
        comm.stream_flags.use_side(self._streams.side[rank])
        if self.collective_timeout_s is not None:
            comm.errors.timeout_s = self.collective_timeout_s
        return comm

    def new_group(self, rank: int, ranks: Sequence[int]) -> Any:
        """In rank ``rank``'s thread: :func:`new_group`."""
        def build(member: int, size: int, meeting: Meeting, table: dict) -> Any:
            ctx = self._context(rank, member, size, meeting, table)
            self._communicator(rank, ctx)
            return ctx

        return self.groups.make(rank, ranks, build)

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` in every rank; the results in rank order (:meth:`RankThreads.run`).

        Raises:
            WorldError: the world is closed, broken or a rank hung.
            BaseException: the first failing rank's exception, with a note naming its rank.
        """
        if self.closed:
            raise WorldError("this world is closed; open a new one", [])
        try:
            return self.threads.run(fn)
        except BaseException as e:
            e.add_note(self.records())
            raise

    def records(self) -> str:
        """Every rank's kernel error records as they stand
        (:meth:`~collectives.runtime.error_record.ErrorRecord.describe`: a fatal one as its
        kernel wrote it): where a rank's first error is of the host (an agreement, a check),
        what its collectives' kernels saw."""
        lines = [f"rank {r}: " + (c.errors.describe() if c is not None else "no communicator")
                 for r, c in enumerate(self.communicators)]
        return "[collectives.testing] kernel records: " + " | ".join(lines)

    def close(self) -> None:
        """Close every rank's context (collective, where the world is not broken), end the
        threads, wait for the world's GPU work (bounded by the kernels' own timeouts) and free
        its memory.  Idempotent."""
        import torch

        from .runtime.communicator import forget

        if self.closed:
            return
        try:
            if self.broken is None and None not in self.contexts:
                self.threads.run(self._close_rank)
        finally:
            self.closed = True
            self.threads.stop()
            torch.cuda.synchronize(self.device)  # no rank runs now: only the world's kernels, each bounded
            for ctx in self.groups.contexts() + self.contexts:
                if ctx is not None:  # a broken world's contexts: closed without agreeing, forgotten
                    if not ctx.closed:
                        ctx.abandon()
                    forget(ctx)
            self.contexts = [None] * self.size
            self.communicators = [None] * self.size
            self.meeting.linked.clear()
            self.groups = Groups(self.meeting)
            self.table.clear()
            self._streams.close()

    def _close_rank(self, rank: int) -> None:
        """Close rank ``rank``'s contexts: its groups' (:meth:`Groups.close`), then the world's."""
        self.groups.close(rank)
        self.contexts[rank].close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "broken" if self.broken else "open"
        return f"World({self.size} ranks on cuda:{self.device}, {state})"


class _Streams:
    """Two CUDA streams per rank (its current stream and the side stream of GEMM overlap),
    created with ``cuStreamCreate`` (non-blocking) and wrapped as torch ``ExternalStream``s:
    never torch's pooled streams (32 per priority, created together), so the world's streams,
    fewer than ``CUDA_DEVICE_MAX_CONNECTIONS``, each get a hardware queue of their own.

    The streams live as long as the process, like torch's own: a closed world hands them back
    to :data:`_IDLE_STREAMS` for the next world, never to ``cuStreamDestroy``, because torch
    keeps using a stream after the world closed (the caching allocator records an event on
    every stream a tensor was used on when it frees the tensor, at any later garbage collection;
    on a destroyed stream that aborts the process: "context is destroyed")."""

    def __init__(self, device: int, count: int) -> None:
        import torch

        with torch.cuda.device(device):
            torch.cuda.current_stream(device).synchronize()  # torch's context of the device, current here
            with _STREAMS_LOCK:
                idle = _IDLE_STREAMS.setdefault(device, [])
                taken, idle[:] = idle[:2 * count], idle[2 * count:]
            self.handles = taken + [create_stream() for _ in range(2 * count - len(taken))]
        self.device = device
        external = [torch.cuda.ExternalStream(int(h), device=device) for h in self.handles]
        self.streams, self.side = external[:count], external[count:]

    def close(self) -> None:
        """Wait for the streams' work and hand them back for the next world (never destroyed)."""
        for s in self.streams + self.side:
            s.synchronize()
        with _STREAMS_LOCK:
            _IDLE_STREAMS.setdefault(self.device, []).extend(self.handles)
        self.handles, self.streams, self.side = [], [], []


#: Streams of closed worlds by device, kept for the next world (:class:`_Streams`).
_IDLE_STREAMS: dict[int, list[Any]] = {}
_STREAMS_LOCK = threading.Lock()


def check_loading_mode() -> None:
    """Refuse to run where CUDA loads modules lazily (the driver's answer, read once CUDA has
    started: ``CUDA_MODULE_LOADING`` counts only before that).

    Raises:
        CollectiveError: the driver loads modules lazily.
    """
    from cuda.bindings import driver

    query = getattr(driver, "cuModuleGetLoadingMode", None)
    if query is None:
        return
    err, mode = query()
    if err == driver.CUresult.CUDA_SUCCESS and mode != driver.CUmoduleLoadingMode.CU_MODULE_EAGER_LOADING:
        raise CollectiveError(
            "a one-GPU world needs CUDA_MODULE_LOADING=EAGER set before CUDA starts in the process (the driver "
            "loads modules lazily here): lazy loading loads a module at a kernel's first launch, and a load waits "
            "for every kernel running on the GPU, the other ranks' spinning ones included (measured: lost "
            "communicators within 25 calls)")


class Groups:
    """The groups of a world's ranks (:func:`new_group`), and what their members share: a
    meeting and a heap table per group, the meeting linked to the world's ``meeting`` (a rank
    that fails there releases the ranks waiting in its groups)."""

    def __init__(self, meeting: Meeting) -> None:
        self.meeting = meeting
        #: Each rank's contexts of groups, in the order they were made.
        self.by_rank: list[list[Any]] = [[] for _ in range(meeting.world)]
        self._shared: dict[int, tuple[Meeting, dict]] = {}  # group number -> its meeting and heap table
        self._made = [0] * meeting.world
        self._lock = threading.Lock()

    def make(self, rank: int, ranks: Sequence[int], build: Callable[[int, int, Meeting, dict], Any]) -> Any:
        """Rank ``rank``'s part of the world's next group, of ``ranks`` (every rank of the world
        asks for the same, the ``k``-th group of every rank being the same group):
        ``build(member, size, meeting, table)``, its context as group rank ``member``, or None
        where ``rank`` is not in it.

        Raises:
            CollectiveError: bad ``ranks``, or ranks that asked for different groups.
            WorldError: a rank did not ask within the world's bound.
        """
        members = group_members(ranks, self.meeting.world)
        every = self.meeting.gather(rank, "new_group (value: the group's ranks)", members)
        if len(set(every)) != 1:
            raise CollectiveError("new_group: every rank of the world must ask for the same group, in the same "
                                  f"order; asked: {dict(enumerate(every))}")
        number = self._made[rank]
        self._made[rank] += 1
        with self._lock:
            if number not in self._shared:
                self._shared[number] = (Meeting(len(members), self.meeting.timeout_s), {})
                self.meeting.linked.append(self._shared[number][0])
            meeting, table = self._shared[number]
        if rank not in members:
            return None
        ctx = build(members.index(rank), len(members), meeting, table)
        self.by_rank[rank].append(ctx)
        return ctx

    def close(self, rank: int) -> None:
        """Close rank ``rank``'s group contexts, the last made first (so every member closes
        the groups they share in the same order)."""
        for ctx in reversed(self.by_rank[rank]):
            ctx.close()

    def contexts(self) -> list[Any]:
        """Every rank's group contexts."""
        return [ctx for contexts in self.by_rank for ctx in contexts]


def group_members(ranks: Sequence[int], world_size: int) -> tuple[int, ...]:
    """``ranks`` as a group of a world of ``world_size`` ranks: at least one, distinct, each in
    ``0 .. world_size - 1`` (group rank ``i`` is world rank ``ranks[i]``).

    Raises:
        CollectiveError: ranks empty, repeated or outside the world.
    """
    members = tuple(int(r) for r in ranks)
    if not members or len(set(members)) != len(members) or not all(0 <= r < world_size for r in members):
        raise CollectiveError(f"new_group: ranks must be distinct ranks of the world (0..{world_size - 1}), at least "
                              f"one, not {list(ranks)}")
    return members


def new_group(ranks: Sequence[int]) -> Any:
    """A group of ``ranks`` of the world this thread is a rank of, as
    ``torch.distributed.new_group``: every rank of the world calls it with the same ``ranks``
    (those outside the group too), groups in the same order.  Returns this rank's context of
    the group, to pass as ``group=`` to any collective (its communicator is made now), or None
    where this rank is not a member.  Group rank ``i`` is world rank ``ranks[i]``.

    A group has its own symmetric memory (a loopback heap of its members) and host agreement
    (a meeting of its members, bounded as the world's); its kernels' grids count every rank of
    the world (they share the GPU).  Closed with the world, or earlier by every member's
    ``close()``.  A kernel's first call loads it, and a load waits for every kernel on the GPU:
    make each group's first call of a collective (per algorithm, dtype and group size) while no
    other rank's collective waits for a launch, e.g. between world barriers, as
    ``tests/collectives/gpu/world/test_world_groups.py`` does.

    Raises:
        CollectiveError: not in a rank of a world, bad ``ranks``, or ranks that asked for
            different groups.
    """
    world = getattr(_THREAD, "world", None)
    if world is None or world.closed:
        raise CollectiveError("new_group: call it in a rank of an open world (the function of run_world or World.run)")
    return world.new_group(_THREAD.rank, ranks)


def run_world(world_size: int, fn: Callable[[int], Any], *, device: int = 0, timeout_s: float = 60.0,
              collective_timeout_s: float | None = None) -> list[Any]:
    """``fn(rank)`` in each of ``world_size`` ranks on GPU ``device``; the results in rank order
    (a :class:`World` opened for this call and closed after it; see the module docstring).

    Raises:
        BaseException: the first failing rank's exception, with a note naming its rank.
        WorldError: a rank hung (still running ``timeout_s`` after another finished).
        CollectiveError: ``world_size`` outside 1..8, no CUDA GPU, or CUDA started with lazy
            module loading.
    """
    with World(world_size, device=device, timeout_s=timeout_s, collective_timeout_s=collective_timeout_s) as world:
        return world.run(fn)


@contextlib.contextmanager
def capture(graph: Any, *, pool: Any = None) -> Iterator[Any]:
    """Capture what this thread launches inside the block into ``graph`` (a
    ``torch.cuda.CUDAGraph``), in ``thread_local`` capture mode and without the device-wide
    synchronisation and cache flush of ``torch.cuda.graph``: several ranks of a world may
    capture at once, and with Python's automatic garbage collection paused
    (:func:`~collectives.runtime.collection.no_collection`).  It captures on the current
    stream, or, where that is the default stream (a torchrun rank's), on a side stream that
    joins it before and after.  Warm every collective of the capture up eagerly first (compiles
    and plans happen outside it).

    In a rank of a world, the capture is collective: after instantiating its graph (at the end
    of the capture, torch's default), every rank meets the others before going on, so that no
    rank replays (its kernels spinning for the others) while another still instantiates.
    Instantiation can wait for every kernel running on the GPU: CUDA loads what a graph's nodes
    need then (measured on an H100: a graph of one device-to-device copy and one collective
    waited out the other rank's replay, 10 s, until its timeout)."""
    import torch

    current = torch.cuda.current_stream()
    side = current == torch.cuda.default_stream(current.device)
    stream = torch.cuda.Stream(current.device) if side else current
    if side:
        stream.wait_stream(current)
    stream.synchronize()
    with torch.cuda.stream(stream), no_collection():
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            yield graph
        finally:
            graph.capture_end()
    if side:
        current.wait_stream(stream)
    ctx = bound()
    if ctx is not None and isinstance(ctx.agreement, ThreadAgreement):
        ctx.agreement.barrier("a CUDA graph captured and instantiated")
