"""The per-process communicator: the signal pad and the parts a collective call uses.

One :class:`Communicator` sits on the open symmetric-memory :class:`~collectives.symmetric.context.Context`
(``collectives.init()``) and holds one of each part: the error record
(:class:`~collectives.runtime.error_record.ErrorRecord`), the kernel views of symmetric buffers
(:class:`~collectives.runtime.views.BufferViews`), the staging buffers
(:class:`~collectives.runtime.staging.StagingPool`) and plans, the compiled kernels
(:class:`~collectives.runtime.kernels.KernelCache`), the stream flags
(:class:`~collectives.runtime.stream_flags.StreamFlags`), and, made at their first use, the
all-to-all's slots and staging (:class:`~collectives.runtime.all_to_all.Exchange`) and the MoE
layer's receive buffers (:meth:`Communicator.receive_buffer`).  They live as long as the
communicator: one whose context closed is dropped (:func:`communicator`), and its parts with it.  Everything a launch needs that is not a
runtime argument is cached: compiled kernels per :class:`~collectives.algorithms.KernelKey`, device
tables of peer addresses per buffer.  Build those before a CUDA-graph capture (one eager call
warms them).  The communicator itself holds the per-call protocol: what plans read
(:class:`~collectives.algorithms.protocol.Runtime`) and the backend choice; the rest is its
parts' (``comm.errors.poll()``, ``comm.stream_flags.post(i)``, ...).
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Union

import torch

from .. import config
from ..algorithms import REGISTRY, Call, tuning
from ..algorithms.plan import current_stream
from ..algorithms.rules import resolve_backend
from ..config import CALL_EPOCHS, Slot
from ..errors import CollectiveError
from ..layouts import PadLayout
from ..symmetric.bootstrap import init
from ..symmetric.capability import choose_backend
from ..symmetric.context import Context, current
from ..symmetric.capability import TorchGroup
from .all_to_all import Exchange
from .error_record import ErrorRecord
from ..algorithms.residency import Occupancy, Residency, SmLimits
from .kernels import KernelCache, compile_target, occupancy
from .staging import PlanCache, StagingPool
from .stream_flags import SIDE_PRIORITY, StreamFlags
from .views import Buffer, BufferViews

#: What every ``group=`` argument of the API takes: None (every rank), a ``torch.distributed``
#: ProcessGroup or one-dimensional DeviceMesh (:data:`~collectives.symmetric.capability.TorchGroup`),
#: a :class:`~collectives.symmetric.context.Context` or a :class:`Communicator`.
Group = Union[TorchGroup, Context, "Communicator", None]

#: Default bound of every cross-GPU wait, in seconds (``COLLECTIVES_TIMEOUT_S`` overrides).
DEFAULT_TIMEOUT_S = float(os.environ.get("COLLECTIVES_TIMEOUT_S", "30"))
#: Test only: ``COLLECTIVES_TEST_SEED_EPOCH`` starts a communicator's call count at this value (a
#: multiple of :data:`~collectives.config.CALL_EPOCHS`, e.g. ``2**32 - 4 * 64``) instead of 0,
#: so that a test crosses the 2^32 wrap of the epochs in a few calls.  Read by each new
#: communicator (:func:`seed_epoch`).
SEED_EPOCH_ENV = "COLLECTIVES_TEST_SEED_EPOCH"


def seed_epoch() -> int:
    """The call count a new communicator starts at (:data:`SEED_EPOCH_ENV`; 0 without it)."""
    return int(os.environ.get(SEED_EPOCH_ENV, "0"), 0)


class Communicator:
    """Collective state of this rank over ``ctx`` (a process's, or a one-GPU world's thread's)."""

    #: The co-residency rule where ranks share this GPU (None: this rank has it alone).
    residency: Residency | None = None
    #: The MoE layer's host state (:class:`collectives.runtime.moe.Layer`), made by its first call.
    moe_layer: Any = None

    def __init__(self, ctx: Context, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.ctx = ctx
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.layout = PadLayout()
        self.pad = ctx.signal_pad(self.layout.words * 4, torch.int32)
        # (a new bound drops the plans: their launch arguments hold the old one)
        self.errors = ErrorRecord(timeout_s, lambda: self.stream_flags.rematch(), bound_changed=lambda: self.plans.clear())
        self.plans = PlanCache()
        self.kernels = KernelCache(ctx.backend, lambda: self.timeout_s)
        self.views = BufferViews(ctx)
        self.follow_frees()
        self.pool = StagingPool(ctx, self.plans, self.agree_growth)
        #: The Lamport all-reduce's receive buffers by element bytes (:mod:`collectives.algorithms.lamport`).
        self.lamport_buffers: dict[int, torch.Tensor] = {}
        #: The MoE layer's receive buffers by (name, shape, dtype) (:meth:`receive_buffer`).
        self.receive_buffers: dict[tuple, torch.Tensor] = {}
        self._exchange: Exchange | None = None
        self.turn = 0  # which of staging slots TURN_0/TURN_1 the next single-barrier collective uses (Plan.run)
        self.stream: int | None = None  # the last collective's stream (algorithms.plan.follow)
        self.stream_captured = False
        self.pad_buffer = self.buffer(self.pad)
        seed = seed_epoch()
        if seed:
            self._seed_epochs(seed)
        self.stream_flags = StreamFlags(ctx.device, self.kernel, self.errors, self.rank,
                                        lambda device: current_stream(device),
                                        tuning.overlap_side_priority(self.world, SIDE_PRIORITY))
        properties = torch.cuda.get_device_properties(ctx.device)
        self.sms = properties.multi_processor_count
        self.residency = (Residency(SmLimits.of(properties), ctx.ranks_on_device)
                          if ctx.ranks_on_device > 1 else None)

    def _seed_epochs(self, calls: int) -> None:
        """Test only (:data:`SEED_EPOCH_ENV`): start the call count at ``calls`` and every
        arrival word at epoch ``calls`` (as if a call had just ended there: no wait takes
        it for a later one), on every rank before any rank's first collective."""
        if calls % CALL_EPOCHS or not 0 <= calls < 1 << 32:
            raise ValueError(f"COLLECTIVES_TEST_SEED_EPOCH must be a uint32 multiple of {CALL_EPOCHS}, not {calls}")
        layout = PadLayout(world=self.world)
        signed = calls - (1 << 32) if calls >= 1 << 31 else calls
        self.pad[0:layout.calls:2] = signed  # the epoch half of every arrival word (size 0)
        self.pad[layout.calls] = signed
        self.ctx.host_barrier()  # (syncs this rank's stream first: the writes have landed)

    # -- what plans read (collectives.algorithms.protocol.Runtime); the parts do the rest ----------

    @property
    def timeout_s(self) -> float:
        """The bound of every cross-GPU wait, in seconds (kernels take it at launch; set it on
        :attr:`errors`)."""
        return self.errors.timeout_s

    @property
    def error(self) -> torch.Tensor:
        """The error records kernels write (host-mapped)."""
        return self.errors.error

    # -- buffers: BufferViews, StagingPool ----------------------------------------------------

    def buffer(self, t: torch.Tensor) -> Buffer:
        """The kernel view of symmetric tensor ``t`` (cached by address)."""
        return self.views.get(t)

    def follow_frees(self) -> None:
        """Have every free of the context reach :meth:`forget_allocation` (while this
        communicator lives: the context does not keep it alive)."""
        ref = weakref.ref(self)

        def forget(ptr: int, nbytes: int) -> None:
            live = ref()
            if live is not None:
                live.forget_allocation(ptr, nbytes)

        self.ctx.on_free.append(forget)

    def forget_allocation(self, ptr: int, nbytes: int) -> None:
        """The context freed the ``nbytes`` at ``ptr``: drop the views into them and the plans
        using them (the heap may hand the local address out again, the other ranks' elsewhere)."""
        self.views.forget(ptr, nbytes)
        self.plans.drop_using(ptr, nbytes)

    def exchange(self) -> Exchange:
        """The all-to-all's part (made at the first all-to-all: collective; its call count
        starts at :func:`seed_epoch`)."""
        if self._exchange is None:
            self._exchange = Exchange(self, seed_epoch())
        return self._exchange

    def receive_buffer(self, name: str, shape: tuple, dtype: torch.dtype, slot: int) -> torch.Tensor:
        """The symmetric receive buffer ``name`` of ``shape`` and ``dtype`` (the MoE layer's,
        :mod:`collectives.moe`), allocated at its first ask, after every rank agreed the growth
        of ``slot`` (:meth:`agree_growth`: every rank asks for the same), and then reused: the
        next all-to-all into it waits for its receiver, which has finished with it by then
        (stream order)."""
        key = (name, shape, dtype)
        buffer = self.receive_buffers.get(key)
        if buffer is None:
            self.agree_growth(slot, math.prod(shape) * dtype.itemsize)
            buffer = self.receive_buffers[key] = self.ctx.empty(shape, dtype)
        return buffer

    def agree_growth(self, what: int, nbytes: int) -> None:
        """Before a collective allocation that a call makes (staging slot ``what`` growing to
        ``nbytes``; ``-element_bytes`` for the Lamport buffers of a width): every rank must
        make the same one at the same call.  A caller's size mismatch can make some ranks grow
        and others not: agreed through
        :meth:`~collectives.symmetric.context.Context.agree_bounded` (bounded by :attr:`timeout_s`), it
        raises CollectiveError instead of pairing the allocation's collective steps with
        something else or hanging.  The communicator is then lost (a rank that did not grow
        launched a kernel that waits for this one)."""
        self._agree_or_fail("collective allocation (values: call, slot, bytes)", [self.errors.calls, int(what), nbytes],
                            "ranks called collectives with different sizes (a buffer grew on some ranks only)")

    def staging(self, nbytes: int, which: Slot) -> torch.Tensor:
        """Internal symmetric byte buffer of staging slot ``which`` (a :class:`~collectives.config.Slot`),
        of at least ``nbytes``, grown collectively: every rank reaches here with the same size,
        or the allocation's size check raises.  The slots ``TURN_0`` and ``TURN_1`` serve the
        single-barrier collectives in turn (:attr:`turn`, passed on by every collective launch,
        :attr:`~collectives.algorithms.plan.Plan.counted`): a rank may rewrite one only after
        every rank has started a later collective,
        which proves it finished reading.  Growing frees the superseded buffer and drops the plans that hold
        it, unless a CUDA graph may use it (:class:`~collectives.runtime.staging.StagingPool`)."""
        return self.pool.get(nbytes, which)

    def meet_ranks_on_device(self, what: str, values: Sequence[int]) -> None:
        """Where ranks share this GPU (a one-GPU world): every rank reaches here with the same
        ``values`` before any goes on, waiting on the host at most :attr:`timeout_s`
        (:meth:`~collectives.symmetric.context.Context.agree_bounded`); else nothing.  For host
        calls that may wait for every kernel on the GPU and hold the other ranks' launches
        (cuBLAS loads a GEMM's kernels at its first call for a shape or dtype): meet before
        such a call, so that every collective already on the GPU has all its ranks launched,
        and after it, before launching a collective that the other ranks' kernels would spin
        for.  In a world of 4 ranks a rank blocked in cuBLAS while the others' collectives
        waited for its next launch, until their timeout; at 5, a rank in cuBLAS held back a
        slower rank's last reduce-scatter that its own spun for.  A rank that
        does not come, or comes with other values, fails the communicator (as
        :meth:`agree_growth`)."""
        if self.residency is not None:
            self._agree_or_fail(what, values, "ranks sharing the GPU did not meet")

    def _agree_or_fail(self, what: str, values: Sequence[int], failure: str) -> None:
        """Every rank's ``values`` agreed within :attr:`timeout_s`
        (:meth:`~collectives.symmetric.context.Context.agree_bounded`), else the communicator
        fails with ``failure`` and the agreement's reason."""
        try:
            self.ctx.agree_bounded(what, values, self.timeout_s)
        except CollectiveError as e:
            raise self.errors.fail(CollectiveError(f"{failure}: {e}")) from e

    # -- kernels ------------------------------------------------------------------------------

    def choose_backend(self, requested: str, dtype: str, op: str = "sum") -> str:
        """The backend a collective reducing ``dtype`` by ``op`` uses on this context
        (:func:`collectives.algorithms.rules.resolve_backend`)."""
        return resolve_backend(requested, lambda r: choose_backend(r, self.ctx.caps), self.ctx.backend, dtype, op,
                               lambda: compile_target(self.device_index))

    def barrier(self, backend: str, capture: bool) -> None:
        """Launch a device-side barrier of every rank on the current stream (see
        :func:`collectives.barrier`; ``capture``: as for :meth:`~collectives.algorithms.plan.Plan.run`)."""
        self.barrier_plan(backend).run(capture)

    def barrier_plan(self, backend: str = "auto") -> Any:
        """The plan of :meth:`barrier` on ``backend``, made (its kernel compiled and loaded) on
        first use, cached under ``("barrier", backend, config.PDL)`` (:func:`collectives.barrier`'s
        plan hit looks it up there)."""
        plan = self.plans.get(("barrier", backend, config.PDL))
        if plan is None:
            call = Call.bare("barrier", self.choose_backend(backend, "bf16"), self.world)
            plan = self.plans[("barrier", backend, config.PDL)] = REGISTRY["barrier", "one_shot"].plan(self, call)
        return plan

    def kernel_together(self, key: Any, *also: Any) -> Callable[..., Any]:
        """:meth:`kernel` for a key that every rank of this communicator asks for in the same
        call (with ``also``: keys it may need instead, loaded with it where ranks share the GPU).

        Where ranks share this GPU (a one-GPU world) and one of these keys is new to this
        communicator, every rank meets on the host first (:meth:`meet_ranks_on_device`), then
        the kernels are loaded.  A load waits for every kernel on the GPU, and CUDA holds
        another rank's launch behind it: on an H100 (W = 2), one rank loading the MoE
        combine's kernel while the other launched the dispatch's last all-to-all, which the
        first rank's kernels spun for, timed both out after 20 s.  Once every rank has met,
        every kernel on the GPU belongs to a call each rank has launched, so the load's wait
        ends; each rank then meets the others once per key set, whichever rank loads."""
        target, device = compile_target(self.device_index), self.device_index
        if self.residency is not None and not all(self.kernels.has(k, target) for k in (key, *also)):
            self.meet_ranks_on_device("loading a kernel (a load waits for every kernel on the GPU)", [len(also)])
            for k in also:
                self.kernels.get(k, target, device)
        return self.kernels.get(key, target, device)

    def kernel(self, key: Any) -> Callable[..., Any]:
        """The compiled kernel for ``key`` on this GPU (:meth:`~collectives.runtime.kernels.KernelCache.get`), as the
        positional TVM-FFI function, loaded onto the GPU on first use (before any launch: see
        :func:`~collectives.runtime.kernels.load`).  A string key names a stream-flag kernel."""
        return self.kernels.get(key, compile_target(self.device_index), self.device_index)

    # -- co-residency: ranks sharing one GPU ------------------------------------------------

    def block_cap(self, key: Any) -> int | None:
        """The most blocks ``key``'s kernel may launch on this rank so that every rank sharing
        the GPU has its grid resident (:mod:`collectives.algorithms.residency`); None where this
        rank has its GPU alone."""
        if self.residency is None:
            return None
        return self.residency.cap(key, self._occupancy(key))

    def _occupancy(self, key: Any) -> Occupancy:
        self.kernel(key)  # compiled and loaded (once per process), its occupancy measured then
        return occupancy(key, compile_target(self.device_index), self.device_index)

    @property
    def device_index(self) -> int:
        return self.ctx.device


#: Communicators by the symmetric-memory context they sit on (the base one and each sub-group's;
#: in a one-GPU world, every rank's), guarded by :data:`_LOCK` (ranks may be threads).
_COMMS: dict[int, Communicator] = {}
#: The communicator each ProcessGroup / DeviceMesh object named last (a per-call shortcut).
_BY_GROUP: dict[int, tuple[Any, Communicator]] = {}
_LOCK = threading.Lock()


def communicator(group: Group = None) -> Communicator:
    """The communicator of ``group``: None (the base context's, opening symmetric memory with
    ``collectives.init()`` if needed), a ``torch.distributed`` ProcessGroup or a one-dimensional
    DeviceMesh (its context opened with ``collectives.init(group=...)`` on first use: collective
    over the group), a context from ``collectives.init``, or a Communicator (itself)."""
    if group is None:
        ctx = current() or init()
        if ctx.group is not None:
            raise CollectiveError(
                "this job spans nodes: symmetric memory covers one node's ranks; pass group= (a group "
                "within a node) or use collectives.hierarchical for a group spanning nodes")
    elif isinstance(group, Communicator):
        if group.ctx.closed:
            raise CollectiveError(f"the communicator's context is closed ({group.ctx!r})")
        return group
    elif isinstance(group, Context):
        ctx = group
        if ctx.closed:
            raise CollectiveError(f"the communicator's context is closed ({ctx!r})")
    else:  # a ProcessGroup or DeviceMesh: the last answer for this very object, if still open
        hit = _BY_GROUP.get(id(group))
        if hit is not None and hit[0] is group and not hit[1].ctx.closed:
            return hit[1]
        comm = communicator(init(group=group))
        _BY_GROUP[id(group)] = (group, comm)  # (holding the group: its id is not reused)
        return comm
    comm = _COMMS.get(id(ctx))  # (ctx is open: current() and init() give only open ones)
    if comm is None or comm.ctx is not ctx:
        comm = Communicator(ctx)  # collective over ctx's ranks: never under the lock
        with _LOCK:
            for key in [k for k, c in _COMMS.items() if c.ctx.closed]:  # contexts closed since
                del _COMMS[key]
            _COMMS[id(ctx)] = comm
    return comm


def forget(ctx: Any) -> None:
    """Drop ``ctx``'s communicator: the next :func:`communicator` of ``ctx`` builds a new one
    (which reads the test seeds afresh).  Test only."""
    with _LOCK:
        _COMMS.pop(id(ctx), None)


def traceable(group: Group, what: str) -> None:
    """Refuse ``group`` while torch.compile traces ``what``: its custom operator
    (:mod:`collectives.runtime.torch_ops`) runs on the default communicator, so a sub-group's call
    would silently run on all ranks."""
    if group is not None:
        raise CollectiveError(
            f"{what}(group=...) inside torch.compile: the compiled operators use the default "
            "communicator (group=None) only; call it outside the compiled region, or on all ranks")
