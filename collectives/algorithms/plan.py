"""A prepared collective launch (:class:`Plan`): the compiled kernel and its runtime arguments
(:mod:`collectives.layouts`) fixed at planning, so that a call only takes the current stream
and launches."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..layouts import COLLECTIVE, Layout
from .protocol import Buffer, Runtime

#: Where a launch's arguments hold the caller's output and input (the same in every collective layout).
OUT, SRC = COLLECTIVE.index["out"], COLLECTIVE.index["src"]

#: torch.cuda.is_current_stream_capturing without its Python wrapper (per-call cost matters).
capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
#: The raw handle of torch's current stream on a device (the cheap way where torch has it).
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)


class Plan:
    """One collective call, prepared: ``run()`` takes the current stream and launches. ``args``: the launch
    arguments, one tuple, or two that calls alternate (the communicator's ``turn``); ``fn``: the
    kernel's TVM-FFI function, bound here to each argument tuple once (``launches``: the launch of each
    turn, 0 and 1: a ``functools.partial`` of ``fn`` and an argument tuple, a function of the stream;
    one tuple's serves both turns); ``holds``: the staging-pool buffers (data pointers) any address of
    the launch lies in; ``uses``: the addresses it reads or writes (its buffers', ``out``, ``src``: a
    free of memory holding one drops the plan); ``alive``: the storages of adopted buffers it uses
    (:attr:`collectives.runtime.views.Buffer.storage`: the plan holds while they live); ``device``: the
    communicator's GPU; ``moves``: the arguments of each turn and the ``uses`` with its caller's
    output and input addresses left out, for a call whose tensors lie elsewhere
    (:meth:`movable_from`; :meth:`run`'s ``at``, :meth:`moved`), None where the plan cannot move;
    ``met``: the addresses (output, input) of the calls launched through it so (a call of them
    again gets a plan of its own: :func:`collectives.api._replan`); ``counted``: whether its
    kernel counts the call on the signal pad and meets every rank in it (a barriered kernel's
    start barrier, a Lamport kernel's wait for every rank's entry or arrival; not the
    all-to-all's): every launch of such a plan passes the turn on, see :meth:`run`;
    ``capture``: whether the stream was capturing a CUDA graph when the plan was made, where its
    arguments depend on it (an eagerly alternating staging:
    :meth:`~collectives.algorithms.base.Algorithm.plan` sets it), else None (a call takes it
    whether a capture is on or not: a plan hit then asks no :func:`capturing`);
    ``used``: launched since the plan cache last swept the marks
    (its recency: :class:`~collectives.runtime.staging.PlanCache`)."""

    __slots__ = ("fn", "args", "comm", "holds", "uses", "alive", "device", "moves", "met", "counted",
                 "capture", "launches", "used")

    def __init__(self, fn: Callable[..., Any], args: list[tuple], comm: Runtime, holds: tuple[int, ...] = (),
                 uses: tuple[int, ...] = (), alive: tuple[Any, ...] = (), counted: bool = False,
                 capture: bool | None = None) -> None:
        self.fn, self.args, self.comm, self.holds, self.uses, self.alive = fn, args, comm, holds, uses, alive
        first = functools.partial(fn, *args[0])
        self.launches = [first, first if len(args) == 1 else functools.partial(fn, *args[1])]
        self.device = comm.device_index
        self.moves: tuple | None = None
        self.met: set[tuple[int, int]] = set()
        self.counted = counted
        self.capture = capture
        self.used = False

    def movable_from(self, out: int, src: int) -> None:
        """Make the plan movable (:attr:`moves`) from the call it was made for, whose output and
        input lie at ``out`` and ``src``: whether the two alias (a call that aliases otherwise
        cannot move it), each turn's arguments split around the two it swaps (:data:`OUT`,
        :data:`SRC`), each of those told as 0 (no address), 1 (the output's) or 2 (the
        input's), and its ``uses`` but those two.  Not movable (None) where an argument that
        takes them holds another address (a view of the caller's memory: not portable)."""
        where = {0: 0, out: 1, src: 2}
        args = self.args * 2 if len(self.args) == 1 else self.args
        if any(a[OUT] not in where or a[SRC] not in where for a in args):
            self.moves = None
            return
        self.moves = (out == src, *((a[:OUT], where[a[OUT]], where[a[SRC]], a[SRC + 1:]) for a in args),
                      tuple(u for u in self.uses if u != out and u != src))
        self.met = set()

    def moved(self, at: tuple[int, int, int]) -> Plan:
        """This plan (movable: :attr:`moves`) for a call like the one it was made for whose
        output and input lie elsewhere (``at``: 0, their addresses): their addresses swapped into
        its arguments and ``uses``, nothing else prepared again (its ``holds`` and ``alive`` this
        plan's)."""
        _, (head, out, src, tail), (head1, out1, src1, tail1), fixed = self.moves
        first = head + (at[out], at[src]) + tail
        args = [first] if len(self.args) == 1 else [first, head1 + (at[out1], at[src1]) + tail1]
        return Plan(self.fn, args, self.comm, self.holds, fixed + (at[1], at[2]), self.alive, self.counted,
                    self.capture)

    def expired(self) -> bool:
        """Whether memory an adopted buffer of the plan lay in has been freed."""
        return any(storage.expired() for storage in self.alive)

    def run(self, capture: bool | None, at: tuple[int, int, int] | None = None) -> None:
        """Launch on the current stream, after the communicator's last collective
        (:func:`follow`, where the stream changed); with ``at`` (0, an output's and an input's
        addresses: a call like the one the plan was made for, the same checked facts, whose
        tensors lie elsewhere), its arguments with those addresses swapped in (:attr:`moves`;
        nothing prepared: the plan's ``holds``, ``alive`` and turn are the call's too).
        ``capture``: whether the current stream is capturing a CUDA graph (:func:`capturing`,
        asked once per call by the caller: the plan's own :attr:`capture`, or asked on a miss),
        or None where the caller did not ask (a plan that does not depend on it): then asked
        here only where needed (the stream changed, or the plan holds staging buffers; about
        0.6 us on an H200 host).  Under capture, first pin what the launch uses: the graph replays these
        addresses for good, whichever call made the plan (an eager warm-up's plan is reused
        under capture).

        An alternating plan (two ``args``) stages into the communicator's ``turn`` slot, and
        every counted launch passes the turn on, alternating or not: the ranks' counted launches
        pair one to one (else a rank waits in vain and the communicator is lost), so their turns
        stay equal even where ranks called different collectives (a recorded mismatch: rank 0 a
        one-buffer all-gather, rank 1 an alternating reduce-scatter; an empty rank's barrier
        against its peers' Lamport kernels; had only alternating plans passed it on, each later
        one-shot call would stage into one slot and read the peers' other, stale one).  A slot is
        rewritten only after a counted launch since its last use, whose wait for every rank
        proves every rank done reading it."""
        comm = self.comm
        stream = current_stream(self.device)
        if stream != comm.stream:
            if capture is None:
                capture = capturing()
            follow(comm, stream, capture)
        if self.holds:
            if capture is None:
                capture = capturing()
            if capture:
                comm.pool.capture(self.holds)
        self.used = True
        turn = comm.turn
        if self.counted:
            comm.turn = turn ^ 1
        if at is None:
            self.launches[turn](stream)
        else:
            head, out, src, tail = self.moves[1 + turn]
            self.fn(*head, at[out], at[src], *tail, stream)


def follow(comm: Runtime, stream: int, capture: bool) -> None:
    """Make ``stream`` (``capture``: whether it is capturing a CUDA graph) the one ``comm``'s
    next collective launches on.  A communicator's
    collectives must run one at a time: they share its call count and tickets in the signal
    pad, and two running at once (on two streams) would take each other's counts, so that the
    ranks pair different calls.  So, eager, the stream first waits for the one the last
    collective launched on (a CUDA event; once per change of stream).  Where either launch is
    captured into a CUDA graph there is nothing to wait for now: a graph's collectives run when
    it is replayed, and its caller orders a replay with the communicator's other collectives."""
    if comm.stream is not None and not capture and not comm.stream_captured:
        order(comm.device_index, comm.stream, stream)
    comm.stream, comm.stream_captured = stream, bool(capture)


def order(device: int, before: int, after: int) -> None:
    """Make raw stream ``after`` wait for the work queued so far on raw stream ``before``."""
    torch.cuda.ExternalStream(after, device=device).wait_stream(torch.cuda.ExternalStream(before, device=device))


def prepare(comm: Runtime, key: Any, layout: Layout, data: Buffer | list[Buffer], out: int, src: int, n: int,
            signature: int, blocks: int, results: Buffer | None = None) -> Plan:
    """A ready launch of ``key`` on ``comm`` with the arguments of ``layout``: everything but
    the stream fixed (``signature``: :attr:`~collectives.algorithms.Call.signature`, the ``kinds``
    argument).  ``data``: the
    kernel view of the data buffer, or of staging slots ``TURN_0`` and ``TURN_1`` (the plan then
    launches on the one whose turn it is and passes the turn on: ``end_barrier=False``
    collectives).  The layout's ``emulated`` argument gets the
    data buffer's multicast address, or ``results``' table where given (the push all-reduce's
    result buffers); emulated, the translation table of either.  Its kernel counts the call
    (:attr:`Plan.counted`)."""
    emulated = key.backend == "multicast_emulated"
    pad = comm.pad_buffer
    fixed = dict(out=out, src=src, n=n, kinds=signature, pad_table=pad.table.data_ptr(), pad_mc=pad.mc,
                 pad=int(pad.host[comm.rank]), err=comm.error.data_ptr(), rank=comm.rank,
                 timeout_ns=int(comm.timeout_s * 1e9))
    buffers = data if isinstance(data, list) else [data]

    def handle(b: Buffer) -> int:
        if results is not None:
            return results.emulation.data_ptr() if emulated else results.table.data_ptr()
        return b.emulation.data_ptr() if emulated else b.mc

    args = [layout.pack(data_table=b.table.data_ptr(), **{layout.emulated: handle(b)}, **fixed) + (blocks,)
            for b in buffers]
    views = [b for b in buffers + [results] if b is not None]
    used = [b.ptr for b in views] + [out, src]
    holds = tuple({h for h in map(comm.pool.holder, used) if h is not None})
    alive = tuple(b.storage for b in views if b.storage is not None)
    return Plan(comm.kernel(key), args, comm, holds, tuple(a for a in used if a), alive, counted=True)


__all__ = ["Plan", "capturing", "current_stream", "follow", "order", "prepare"]
