"""The per-process communicator: the signal pad and the parts a collective call uses.

One :class:`Communicator` sits on the open symmetric-memory :class:`~collectives.symmetric.Context`
(``collectives.init()``) and holds one of each part: the error record
(:class:`~collectives.error_record.ErrorRecord`), the kernel views of symmetric buffers
(:class:`~collectives.views.BufferViews`), the staging buffers
(:class:`~collectives.staging.StagingPool`) and plans, the compiled kernels
(:class:`~collectives.kernels.KernelCache`) and the stream flags
(:class:`~collectives.stream_flags.StreamFlags`).  Everything a launch needs that is not a
runtime argument is cached: compiled kernels per :class:`~collectives.config.KernelKey`, device
tables of peer addresses per buffer.  Build those before a CUDA-graph capture (one eager call
warms them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from . import config, symmetric
from .capability import resolve_backend
from .config import (
    BARRIER_THREADS,
    CALL_EPOCHS,
    LAMPORT_BLOCKS,
    LAMPORT_CALLS,
    LAMPORT_MAX_BYTES,
    VECTOR_BYTES,
    KernelKey,
    PadLayout,
)
from .error_record import ErrorRecord
from .errors import CollectiveError
from .kernels import KernelCache, compile_target
from .staging import PlanCache, Slot, StagingPool
from .stream_flags import StreamFlags
from .views import Buffer, BufferViews

#: Default bound of every cross-GPU wait, in seconds (``COLLECTIVES_TIMEOUT_S`` overrides).
DEFAULT_TIMEOUT_S = float(os.environ.get("COLLECTIVES_TIMEOUT_S", "30"))
#: Test only: a communicator made while this is set starts every Lamport call count there
#: (below :data:`~collectives.config.LAMPORT_CALLS`; ``LAMPORT_CALLS - 2`` crosses the wrap in
#: a few calls).  Every rank must set the same value.
SEED_CALL_ENV = "COLLECTIVES_TEST_SEED_CALL"

#: Test only: ``COLLECTIVES_TEST_SEED_EPOCH`` starts every communicator's call count at this
#: value (a multiple of :data:`~collectives.config.CALL_EPOCHS`, e.g. ``2**32 - 4 * 64``) instead
#: of 0, so that a test crosses the 2^32 wrap of the epochs in a few calls.  Read once, here.
TEST_SEED_EPOCH = int(os.environ.get("COLLECTIVES_TEST_SEED_EPOCH", "0"), 0)
TORCH_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


class Communicator:
    """Collective state of this process over ``ctx``."""

    def __init__(self, ctx: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.ctx = ctx
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.layout = PadLayout()
        self.pad = ctx.signal_pad(self.layout.words * 4, torch.int32)
        self.errors = ErrorRecord(timeout_s, lambda: self.stream_flags.rematch())
        self.plans = PlanCache()
        self.kernels = KernelCache(ctx.backend)
        self.views = BufferViews(ctx)
        self.pool = StagingPool(ctx, self.plans, self.views.forget, self.agree_growth)
        self._lamport: dict[int, torch.Tensor] = {}
        self.seed_lamport(int(os.environ.get(SEED_CALL_ENV, "0")))
        self.turn = 0  # which of staging slots TURN_0/TURN_1 the next single-barrier collective uses
        self.pad_buffer = self.buffer(self.pad)
        if TEST_SEED_EPOCH:
            self._seed_epochs(TEST_SEED_EPOCH)
        self.stream_flags = StreamFlags(ctx.device, self.kernel, self.errors, self.rank,
                                        lambda device: current_stream(device))
        self.sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count

    def _seed_epochs(self, calls: int) -> None:
        """Test only (:data:`TEST_SEED_EPOCH`): start the call count at ``calls`` and every
        arrival word at epoch ``calls`` (as if a call had just ended there: no wait takes
        it for a later one), on every rank before any rank's first collective."""
        if calls % CALL_EPOCHS or not 0 <= calls < 1 << 32:
            raise ValueError(f"COLLECTIVES_TEST_SEED_EPOCH must be a uint32 multiple of {CALL_EPOCHS}, not {calls}")
        layout = PadLayout(world=self.world)
        signed = calls - (1 << 32) if calls >= 1 << 31 else calls
        self.pad[0:layout.calls:2] = signed  # the epoch half of every arrival word (size 0)
        self.pad[layout.calls] = signed
        torch.cuda.synchronize(self.device_index)
        self.ctx.host_barrier()

    # -- errors: ErrorRecord ------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        """The bound of every cross-GPU wait, in seconds (kernels take it at launch)."""
        return self.errors.timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.errors.timeout_s = value

    @property
    def error(self) -> torch.Tensor:
        """The error records kernels write (host-mapped)."""
        return self.errors.error

    @property
    def failed(self) -> CollectiveError | None:
        """The error that ended this communicator, if one did."""
        return self.errors.failed

    def check(self) -> None:
        """Raise the error a kernel recorded, or one deferred (:meth:`~collectives.error_record.ErrorRecord.check`)."""
        self.errors.check()

    def poll(self) -> None:
        """At the start of a collective call (:meth:`~collectives.error_record.ErrorRecord.poll`)."""
        self.errors.poll()

    def finish(self) -> None:
        """At the end of a collective call, after its launches (:meth:`~collectives.error_record.ErrorRecord.finish`)."""
        self.errors.finish()

    def call(self) -> AbstractContextManager[None]:
        """One call made of collective calls (:meth:`~collectives.error_record.ErrorRecord.call`)."""
        return self.errors.call()

    # -- stream flags: StreamFlags ------------------------------------------------------------

    @property
    def flags(self) -> torch.Tensor:
        """The stream flags' counts (row 0 posts, row 1 posts taken)."""
        return self.stream_flags.flags

    def post(self, index: int) -> None:
        """Post flag slot ``index`` on the current stream (:meth:`~collectives.stream_flags.StreamFlags.post`)."""
        self.stream_flags.post(index)

    def wait(self, index: int) -> None:
        """Make the current stream wait for slot ``index``'s next post (:meth:`~collectives.stream_flags.StreamFlags.wait`)."""
        self.stream_flags.wait(index)

    # -- buffers: BufferViews, StagingPool ----------------------------------------------------

    def buffer(self, t: torch.Tensor) -> Buffer:
        """The kernel view of symmetric tensor ``t`` (cached by address)."""
        return self.views.get(t)

    def agree_growth(self, what: int, nbytes: int) -> None:
        """Before a collective allocation that a call makes (staging slot ``what`` growing to
        ``nbytes``; ``-element_bytes`` for the Lamport buffers of a width): every rank must
        make the same one at the same call.  A caller's size mismatch can make some ranks grow
        and others not: agreed through
        :meth:`~collectives.symmetric.Context.agree_bounded` (bounded by :attr:`timeout_s`), it
        raises CollectiveError instead of pairing the allocation's collective steps with
        something else or hanging.  The communicator is then lost (a rank that did not grow
        launched a kernel that waits for this one)."""
        try:
            self.ctx.agree_bounded("collective allocation (values: call, slot, bytes)",
                                   [self.errors.calls, int(what), nbytes], self.timeout_s)
        except CollectiveError as e:
            raise self.errors.fail(CollectiveError(
                f"ranks called collectives with different sizes (a buffer grew on some ranks only): {e}")) from e

    def staging(self, nbytes: int, which: Slot) -> torch.Tensor:
        """Internal symmetric byte buffer of staging slot ``which`` (a :class:`~collectives.staging.Slot`),
        of at least ``nbytes``, grown collectively: every rank reaches here with the same size,
        or the allocation's size check raises.  The slots ``TURN_0`` and ``TURN_1`` serve the
        single-barrier collectives strictly in turn across all of them (:attr:`turn`): a rank
        may rewrite one only after every rank has started a later collective, which proves it
        finished reading.  Growing frees the superseded buffer and drops the plans that hold
        it, unless a CUDA graph may use it (:class:`~collectives.staging.StagingPool`)."""
        return self.pool.get(nbytes, which)

    def lamport(self, element_bytes: int) -> torch.Tensor:
        """The three rotating Lamport receive buffers for elements of ``element_bytes`` bytes
        (``3 x world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`, symmetric),
        allocated on first use (collectively) and filled with -0.0 of that width; a barrier
        after the fill keeps every rank from sending before every rank's fill is done."""
        if element_bytes not in self._lamport:
            self.agree_growth(-element_bytes, 3 * self.world * LAMPORT_MAX_BYTES)
            buf = self._lamport[element_bytes] = self.ctx.empty(3 * self.world * LAMPORT_MAX_BYTES, torch.uint8)
            _fill_empty(buf, element_bytes)
            self.barrier()
        return self._lamport[element_bytes]

    def seed_lamport(self, call: int) -> None:
        """Start every Lamport call count at ``call`` (test only, :data:`SEED_CALL_ENV`; 0, the
        zeroed pad's, needs no write).  The counts are the kernels' words: the layout of this
        world size, not the pad's allocation layout (:attr:`layout`, of the largest world)."""
        if not 0 <= call < LAMPORT_CALLS:
            raise CollectiveError(f"{SEED_CALL_ENV}={call}: a Lamport call count is 0..{LAMPORT_CALLS - 1}")
        if call:
            kernel_layout = PadLayout(world=self.world)
            as_int32 = call - (1 << 32) if call >= 1 << 31 else call  # the pad holds int32 words
            for width in range(3):
                start = kernel_layout.lamport_step(width, 0)
                self.pad[start:start + LAMPORT_BLOCKS].fill_(as_int32)

    # -- kernels ------------------------------------------------------------------------------

    def choose_backend(self, requested: str, dtype: str, op: str = "sum") -> str:
        """The backend a collective reducing ``dtype`` by ``op`` uses on this context
        (:func:`collectives.capability.resolve_backend`)."""
        return resolve_backend(requested, self.ctx.caps, self.ctx.backend, dtype, op,
                               lambda: compile_target(self.device_index))

    def barrier(self, backend: str = "auto") -> None:
        """Launch a device-side barrier of every rank on the current stream (see
        :func:`collectives.barrier`)."""
        plan = self.plans.get(("barrier", backend, config.PDL))
        if plan is None:
            key = KernelKey("barrier", "one_shot", self.choose_backend(backend, "bf16"), "bf16", self.world,
                            threads=BARRIER_THREADS)
            plan = self.plans[("barrier", backend, config.PDL)] = self.plan(key, self.pad_buffer, 0, 0, 0, 1)
        plan.run()

    def kernel(self, key: KernelKey | str) -> Callable[..., Any]:
        """The compiled kernel for ``key`` on this GPU (:meth:`~collectives.kernels.KernelCache.get`), as the
        positional TVM-FFI function.  A string key names a stream-flag kernel."""
        return self.kernels.get(key, compile_target(self.device_index))

    def blocks(self, key: KernelKey, work: int, limit: int | None = None) -> int:
        """Thread blocks for ``work`` vector accesses per rank: enough to cover them, at most
        two per SM, never more than the pad has slots for, nor than ``limit`` (a caller
        sharing the GPU with other kernels; every rank must pass the same).  A TMA kernel
        takes at most a quarter of the SMs (bulk copies need few); a Lamport one always has
        :data:`~collectives.config.LAMPORT_BLOCKS` (each block owns fixed vectors of the
        rotating buffers; all are resident at once: each waits for data other ranks' blocks
        send)."""
        if key.algorithm == "lamport":
            return LAMPORT_BLOCKS  # a fixed grid (the kernel launches this many regardless)
        if key.algorithm == "tma":
            blocks = min(-(-work * VECTOR_BYTES // key.tile_bytes), self.sms // 4)
        else:
            blocks = min(-(-work // key.threads), 2 * self.sms, self.layout.max_blocks)
        return max(1, min(blocks, limit or blocks))

    def plan(self, key: KernelKey, data: Buffer | list[Buffer], out: int, src: int, n: int, blocks: int,
             results: Buffer | None = None) -> Plan:
        """A ready launch of ``key``: everything but the stream fixed.  Given staging buffers
        0 and 1, the plan launches on the one whose :attr:`turn` it is and passes the turn on
        (``end_barrier=False`` collectives).  ``results`` (the push all-reduce's result
        buffer) goes to the kernel in place of the data buffer's multicast address: its table
        (its translation table, emulated)."""
        fn = self.kernel(key)
        buffers = data if isinstance(data, list) else [data]
        common = (out, src, n, self.pad_buffer.table.data_ptr(), self.pad_buffer.mc,
                  int(self.pad_buffer.host[self.rank]), self.error.data_ptr(), self.rank,
                  int(self.timeout_s * 1e9), blocks)
        used = [b.ptr for b in buffers + [results] if b is not None] + [out, src]
        holds = tuple({h for h in map(self.pool.holder, used) if h is not None})
        emulated = key.backend == "multicast_emulated"

        def second(b: Buffer) -> int:
            if results is not None:
                return results.emulation.data_ptr() if emulated else results.table.data_ptr()
            return b.emulation.data_ptr() if emulated else b.mc

        return Plan(fn, [(b.table.data_ptr(), second(b)) + common for b in buffers], self, holds)

    @property
    def device_index(self) -> int:
        return self.ctx.device


def _fill_empty(buf: torch.Tensor, element_bytes: int) -> None:
    """Fill a Lamport buffer with -0.0 of the element width (an empty slot)."""
    view, value = {1: (torch.uint8, 0x80), 2: (torch.int16, -(1 << 15)), 4: (torch.int32, -(1 << 31))}[element_bytes]
    buf.view(view).fill_(value)


#: torch.cuda.is_current_stream_capturing without its Python wrapper (per-call cost matters).
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


class Plan:
    """One collective call, prepared: ``run()`` takes the current stream and launches.
    ``holds``: the staging-pool buffers (data pointers) any address of the launch lies in."""

    __slots__ = ("fn", "args", "comm", "holds")

    def __init__(self, fn: Callable[..., Any], args: list[tuple], comm: Communicator,
                 holds: tuple[int, ...] = ()) -> None:
        self.fn, self.args, self.comm, self.holds = fn, args, comm, holds

    def run(self) -> None:
        """Launch on the current stream.  Under CUDA-graph capture, first pin what the launch
        uses: the graph replays these addresses for good, whichever call made the plan (an
        eager warm-up's plan is reused under capture)."""
        comm = self.comm
        if self.holds and _capturing():
            comm.pool.capture(self.holds)
        if len(self.args) > 1:
            args = self.args[comm.turn]
            comm.turn ^= 1
        else:
            args = self.args[0]
        self.fn(*args, current_stream(comm.device_index))


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: int) -> int:
    """The raw handle of torch's current stream on ``device`` (the cheap way where torch has it)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device)
    return torch.cuda.current_stream(device).cuda_stream


#: Communicators by the symmetric-memory context they sit on (the base one and each sub-group's).
_COMMS: dict[int, Communicator] = {}
#: The communicator each ProcessGroup / DeviceMesh object named last (a per-call shortcut).
_BY_GROUP: dict[int, tuple[Any, Communicator]] = {}


def communicator(group: Any = None) -> Communicator:
    """The communicator of ``group``: None (the base context's, opening symmetric memory with
    ``collectives.init()`` if needed), a ``torch.distributed`` ProcessGroup or a one-dimensional
    DeviceMesh (its context opened with ``collectives.init(group=...)`` on first use: collective
    over the group), a context from ``collectives.init``, or a Communicator (itself)."""
    if group is None:
        ctx = symmetric.current() or symmetric.init()
        if ctx.group is not None:
            raise CollectiveError(
                "this job spans nodes: symmetric memory covers one node's ranks; pass group= (a group "
                "within a node) or use collectives.hierarchical for a group spanning nodes")
    elif isinstance(group, Communicator):
        ctx = group.ctx
    elif isinstance(group, symmetric.Context):
        ctx = group
    else:  # a ProcessGroup or DeviceMesh: the last answer for this very object, if still open
        hit = _BY_GROUP.get(id(group))
        if hit is not None and hit[0] is group and not hit[1].ctx.closed:
            return hit[1]
        comm = communicator(symmetric.init(group=group))
        _BY_GROUP[id(group)] = (group, comm)  # (holding the group: its id is not reused)
        return comm
    if ctx.closed:
        raise CollectiveError(f"the communicator's context is closed ({ctx!r})")
    comm = _COMMS.get(id(ctx))
    if comm is None or comm.ctx is not ctx:
        for key in [k for k, c in _COMMS.items() if c.ctx.closed]:  # contexts closed since
            del _COMMS[key]
        comm = _COMMS[id(ctx)] = Communicator(ctx)
    return comm


def traceable(group: Any, what: str) -> None:
    """Refuse ``group`` while torch.compile traces ``what``: its custom operator
    (:mod:`collectives.torch_ops`) runs on the default communicator, so a sub-group's call
    would silently run on all ranks."""
    if group is not None:
        raise CollectiveError(
            f"{what}(group=...) inside torch.compile: the compiled operators use the default "
            "communicator (group=None) only; call it outside the compiled region, or on all ranks")
