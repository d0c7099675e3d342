"""The per-process communicator: signal pad, error record, staging buffers, compiled kernels,
stream flags.

One :class:`Communicator` sits on the open symmetric-memory :class:`~collectives.symmetric.Context`
(``collectives.init()``).  Everything a launch needs that is not a runtime argument is cached:
compiled kernels per :class:`~collectives.algorithms.KernelKey`, device tables of peer addresses per
buffer.  Build those before a CUDA-graph capture (one eager call warms them).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import config, symmetric
from .algorithms.key import KernelKey
from .capability import choose_backend
from .config import (
    BARRIER_THREADS,
    CALL_EPOCHS,
    DATA_PHASE,
    ERROR_FIELDS,
    ERROR_RECORDS,
    FATAL_RECORD,
    FLAG_SLOTS,
    FLAG_WAIT,
    LAMPORT_BLOCKS,
    LAMPORT_CALLS,
    LAMPORT_EXCHANGE,
    LAMPORT_MAX_BYTES,
    MULTICAST_PATHS,
    PTX_OP,
    PUSH_ROUND,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
    VECTOR_BYTES,
    PadLayout,
    multimem_reduces,
)
from .dtypes import DTYPES
from .errors import CollectiveError, CollectiveTimeout, MulticastUnavailable
from .ptx import refuse_multimem
from .staging import PlanCache, StagingPool

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
#: Added to a buffer's local address to make the fake multicast base of ``multicast_emulated``:
#: above every real device address, so a translation window never covers real memory.
FAKE_MULTICAST = 1 << 62
#: Bytes of a data buffer's translation window: past any tensor, since buffers are cached by
#: address and a later, larger tensor may start there; the signal pad's window (exact, and
#: checked last, so it wins) is the only other one, and no data access falls in it.
DATA_WINDOW_BYTES = 1 << 40


def compile_target(device: int | None = None) -> str:
    """``sm_90a`` on Hopper, ``sm_100a`` on Blackwell data-centre parts: what GPU ``device``
    (default: the current one) runs."""
    return _target(torch.cuda.current_device() if device is None else device)


@functools.cache
def _target(device: int) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


@dataclass
class Buffer:
    """A symmetric buffer as kernels see it: the table of every rank's address (and the pinned
    host copy it came from), the multicast address (0 unless the backend is multicast), and for
    ``multicast_emulated`` the translation table of its window and the signal pad's (the
    kernels' ``data_mc``; its pinned host copy kept alive with it)."""

    table: torch.Tensor
    mc: int
    host: torch.Tensor
    window: tuple[int, int, list[int]]
    emulation: torch.Tensor
    emulation_host: torch.Tensor
    ptr: int  # this rank's address of the buffer


class Communicator:
    """Collective state of this process over ``ctx``."""

    def __init__(self, ctx: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.ctx = ctx
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.timeout_s = timeout_s
        self.layout = PadLayout()
        self.pad = ctx.signal_pad(self.layout.words * 4, torch.int32)
        self.error = torch.zeros((ERROR_RECORDS, len(ERROR_FIELDS)), dtype=torch.int32, pin_memory=True)
        self._status = self.error.numpy()  # host-mapped: read without a GPU sync
        self.failed: CollectiveError | None = None
        self.plans = PlanCache()
        self._kernels: dict[tuple[KernelKey | str, str], Any] = {}
        self._buffers: dict[int, Buffer] = {}
        self.pool = StagingPool(ctx, self.plans, self._forget, self.agree_growth)
        self.lamport_buffers: dict[int, torch.Tensor] = {}  # Lamport receive buffers by element bytes
        self.seed_lamport(int(os.environ.get(SEED_CALL_ENV, "0")))
        self.turn = 0  # which of staging buffers 0/1 the next single-barrier collective uses
        self.pad_buffer = self.buffer(self.pad)
        if TEST_SEED_EPOCH:
            self._seed_epochs(TEST_SEED_EPOCH)
        # Stream flags: row 0 counts each slot's posts, row 1 the posts its consumer took.
        self.flags = torch.zeros((2, FLAG_SLOTS), dtype=torch.int32, device=ctx.device)
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

    # -- errors -------------------------------------------------------------------------------

    #: A recoverable error :meth:`poll` found, raised by :meth:`finish`.
    deferred: CollectiveError | None = None
    #: Collective calls made so far (counted by :meth:`poll`, not by :meth:`check`, which a
    #: rank may call at will): the same on every rank.
    calls = 0
    #: Calls in progress that make collective calls of their own (GEMM overlap): the innermost
    #: calls' :meth:`finish` leaves a deferred error to the outermost.
    nested = 0

    def check(self) -> None:
        """Raise the error a kernel recorded, or one deferred (reading host-mapped memory: no
        GPU sync)."""
        self._read()
        self.finish()

    def poll(self) -> None:
        """At the start of a collective call: raise a fatal error (a timeout: the communicator
        is lost); clear a recoverable one (a size mismatch, a stream-flag timeout) and defer it
        to :meth:`finish`, after this call's launches.  Ranks see a kernel's record at different
        calls (the host reads it without a sync): raising before the launch would make the rank
        that sees it first skip a call that the others make, and their kernels wait for it in
        vain."""
        self.calls += 1
        self._read()

    def _read(self) -> None:
        """Raise a fatal error recorded or found before; defer a recoverable one.  The fatal
        record is read first (a collective timed out: the communicator is unusable), then the
        recoverable one (cleared here: the communicator stays usable).  A record a kernel is
        still writing (status ``CLAIMED``) is read at a later call."""
        if self.failed is not None:
            raise self.failed
        if self._status[FATAL_RECORD, 0] <= 0 and self._status[RECOVERABLE_RECORD, 0] <= 0:
            return
        fatal = self._status[FATAL_RECORD, 0] > 0
        record = self.error[FATAL_RECORD if fatal else RECOVERABLE_RECORD]
        status, barrier, peer, block, rank = (int(v) for v in record.tolist())
        phase = {0: "start barrier", 1: "end barrier", LAMPORT_EXCHANGE: "Lamport data exchange",
                 DATA_PHASE: "TMA bulk copies", PUSH_ROUND: "push round"}
        where = f"rank {rank}, thread block {block}, {phase.get(barrier, barrier)}"
        if status == TIMEOUT and barrier == FLAG_WAIT:
            # Local to this GPU and no other rank's state involved: match the counts again
            # and stay usable.
            self._rematch_flags(record)
            self._defer(CollectiveTimeout("flag wait", [], self.timeout_s,
                                          f"rank {rank}, slot {block} was never posted"))
        elif status == TIMEOUT:
            missing = [peer] if peer >= 0 else []
            self.failed = CollectiveTimeout("collective", missing, self.timeout_s, where)
            raise self.failed
        elif status == SIZE_MISMATCH:
            # Every rank sees the disagreement (each compares every rank's size with its own),
            # and every rank's call count moved on by the same step whatever ran; a Lamport
            # buffer the mismatch left dirty is emptied on the GPU two calls later
            # (collectives.algorithms.lamport): no host step, the communicator stays usable.
            record.zero_()
            self._defer(CollectiveError(
                f"ranks called the collective with different sizes: rank {peer} disagrees with "
                f"rank {rank} ({where}); every rank must pass the same shape"
            ))
        else:
            self.failed = CollectiveError(f"kernel error record {self.error.tolist()}")
            raise self.failed

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

    def _defer(self, error: CollectiveError) -> None:
        if self.deferred is None:
            self.deferred = error

    def finish(self) -> None:
        """At the end of a collective call (after its launches): raise the error :meth:`poll`
        deferred, unless this call is part of an outer one (:attr:`nested`)."""
        if self.deferred is not None and not self.nested:
            error, self.deferred = self.deferred, None
            raise error

    def _rematch_flags(self, record: torch.Tensor) -> None:
        """After a flag wait timed out (taking nothing): once this GPU's queued work is done
        (a late post has landed), every slot's posts count as taken, and the record is
        cleared.  A host synchronisation, on this error path only."""
        torch.cuda.synchronize(self.device_index)
        self.flags[1].copy_(self.flags[0])
        torch.cuda.synchronize(self.device_index)
        record.zero_()

    # -- stream flags -------------------------------------------------------------------------

    def post(self, index: int) -> None:
        """Post flag slot ``index`` on the current stream: a one-thread kernel whose
        ``red.release.gpu`` publishes what the stream's earlier kernels wrote
        (:func:`collectives.device.flags.post`).  Every post must be taken by one :meth:`wait`."""
        self._flag("post", index)

    def wait(self, index: int) -> None:
        """Make the current stream wait, on the GPU, for the next post of slot ``index`` (a
        one-thread kernel polling with ``ld.acquire.gpu``, :func:`collectives.device.flags.wait`);
        bounded by :attr:`timeout_s`, after which :meth:`check` raises CollectiveTimeout and
        the communicator stays usable.  One consumer per slot, its waits ordered (one stream)."""
        self._flag("wait", index)

    def _flag(self, kind: str, index: int) -> None:
        if not 0 <= index < FLAG_SLOTS:
            raise CollectiveError(f"flag slot {index} out of range (0..{FLAG_SLOTS - 1})")
        posted = self.flags.data_ptr()
        self.kernel(kind)(posted, posted + 4 * FLAG_SLOTS, index, self.error.data_ptr(), self.rank,
                          int(self.timeout_s * 1e9), current_stream(self.device_index))

    # -- buffers ------------------------------------------------------------------------------

    def buffer(self, t: torch.Tensor) -> Buffer:
        """The kernel view of symmetric tensor ``t`` (cached by address)."""
        key = t.data_ptr()
        if key not in self._buffers:
            # Copied from pinned memory: allowed (and recorded) inside a CUDA-graph capture.
            import ptxops

            peers = self.ctx.peer_pointers(t, align=1)
            host = torch.tensor(peers, dtype=torch.int64).pin_memory()
            table = host.to("cuda", non_blocking=True)
            mc = self.ctx.multicast_tensor(t).data_ptr() if self.ctx.backend == "multicast" else 0
            base = FAKE_MULTICAST + peers[self.rank]
            if self._buffers:
                window, pad = (base, DATA_WINDOW_BYTES, peers), self._buffers[self.pad.data_ptr()].window
            else:  # the signal pad, the first buffer
                window = pad = (base, t.nbytes, peers)
            emulation_host = torch.tensor(ptxops.translation_table([window, pad]), dtype=torch.int64).pin_memory()
            emulation = emulation_host.to("cuda", non_blocking=True)
            self._buffers[key] = Buffer(table, mc, host, window, emulation, emulation_host, key)
        return self._buffers[key]

    def _forget(self, ptr: int, nbytes: int) -> None:
        """Drop the kernel views of a freed symmetric buffer of ``nbytes`` at ``ptr``, and of
        every view into it (its addresses may be reused)."""
        for key in [k for k in self._buffers if ptr <= k < ptr + nbytes]:
            del self._buffers[key]

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
                                   [self.calls, what, nbytes], self.timeout_s)
        except CollectiveError as e:
            self.failed = CollectiveError(
                f"ranks called collectives with different sizes (a buffer grew on some ranks only): {e}")
            raise self.failed from e

    def staging(self, nbytes: int, which: int) -> torch.Tensor:
        """Internal symmetric byte buffer ``which`` of at least ``nbytes`` (grown collectively:
        every rank reaches here with the same size, or the allocation's size check raises).

        Buffers 0 and 1 serve the single-barrier collectives, strictly in turn across all of
        them (:attr:`turn`): a rank may rewrite a buffer only after every rank has started a
        later collective, which proves it finished reading.  Buffer 2 serves the staged
        collectives that keep their end barrier, buffer 3 the push reduce-scatters that do, buffer 4
        the push all-reduces, buffer 5 their result regions (one per rank), buffers 6 and 7
        the GEMM-overlap workspaces (:mod:`collectives.overlap`).  Growing frees the
        superseded buffer and drops the plans that hold it, unless a CUDA graph may use it
        (:class:`~collectives.staging.StagingPool`)."""
        return self.pool.get(nbytes, which)

    def lamport(self, element_bytes: int) -> torch.Tensor:
        """The three rotating Lamport receive buffers for elements of ``element_bytes`` bytes
        (``3 x world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`, symmetric),
        allocated on first use (collectively) and filled with -0.0 of that width; a barrier
        after the fill keeps every rank from sending before every rank's fill is done."""
        if element_bytes not in self.lamport_buffers:
            self.agree_growth(-element_bytes, 3 * self.world * LAMPORT_MAX_BYTES)
            buf = self.lamport_buffers[element_bytes] = self.ctx.empty(3 * self.world * LAMPORT_MAX_BYTES, torch.uint8)
            _fill_empty(buf, element_bytes)
            self.barrier()
        return self.lamport_buffers[element_bytes]

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
        """The backend a collective reducing ``dtype`` by ``op`` uses: ``requested`` resolved
        against this context (``"auto"`` picks by capability, and the peer backend where
        multimem has no such reduction; ``"multicast_emulated"`` runs on peer access alone and
        is never picked by ``"auto"``); refused where this GPU or context lacks it."""
        if requested == "multicast_emulated":
            backend = requested
        else:
            backend = choose_backend(requested, self.ctx.caps)
            if backend == "multicast" and self.ctx.backend != "multicast":
                raise MulticastUnavailable(f"this context was opened with the {self.ctx.backend!r} backend")
        if backend in MULTICAST_PATHS and not multimem_reduces(dtype, op):
            if requested == "auto":
                return "peer"
            raise CollectiveError(
                f"multimem.ld_reduce has no {PTX_OP[op]} of {dtype} (PTX: .min/.max reduce integers, "
                f"16-bit floats and fp8, not .f32); use backend='peer' or 'auto'"
            )
        if backend in MULTICAST_PATHS and DTYPES[dtype].fp8 and not compile_target(self.device_index).startswith("sm_10"):
            raise MulticastUnavailable(
                f"multimem on {dtype} needs sm_100a or newer, not {compile_target(self.device_index)}")
        return backend

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
        """The compiled kernel for ``key`` on this GPU (compiled on first use), as the
        positional TVM-FFI function: CuTeDSL's low-overhead call path.  A string key names a
        stream-flag kernel (:mod:`collectives.algorithms.flags`).

        Raises:
            CollectiveError: the kernel's PTX holds a ``multimem`` instruction and this context
                has no NVLink multicast (a safety net, checked once per compiled kernel).
        """
        target = compile_target(self.device_index)
        compiled = self._kernels.get((key, target))  # the per-call path: a lookup
        if compiled is None:
            compiled = self._kernels[(key, target)] = self._compile(key, target)
        return compiled[1]

    def _compile(self, key: KernelKey | str, target: str) -> tuple[Any, Callable[..., Any]]:
        """(CuTeDSL's compiled kernel, its TVM-FFI function) for ``key`` on ``target``."""
        import cutlass.cute as cute

        from . import algorithms
        from .algorithms import flags
        from .launch import flag_example_arguments

        if isinstance(key, str):
            launch, args = flags.build(key), flag_example_arguments()
        else:
            launch, args = algorithms.build(key), algorithms.example_arguments()
        with tempfile.TemporaryDirectory() as dump:
            compiled = cute.compile[cute.GPUArch(target)](
                launch, *args, options=f"--enable-tvm-ffi --keep-ptx --dump-dir={dump}",
            )
            refuse_multimem(compiled.__ptx__, key, self.ctx.backend)
        return compiled, compiled.__tvm_ffi_object__()

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
