"""GEMM overlapped with communication: ``gemm_reduce_scatter`` and ``all_gather_gemm``.

The GEMM is cuBLAS (through torch), one GEMM per rank's block of rows, back to back on the
current stream; the communication is copy engines (``cudaMemcpyAsync`` through the peer
mappings of a symmetric workspace) on a side stream, so it takes no SM from the GEMMs and each
block's copy runs while the next block is multiplied:

- ``gemm_reduce_scatter``: the products for the peers ``rank + 1, rank + 2, ...`` first, each
  pushed into its owner's workspace as soon as it is written, this rank's own product last
  (it hides the last push); then one barrier (every push landed) and one sum of the ``W``
  received blocks into ``out``;
- ``all_gather_gemm``: this rank's own rows first (they need no communication, and hide the
  start: a barrier, the copy of the shard into the workspace, a barrier), while the side
  stream pulls the peers' shards ``rank + 1, rank + 2, ...``; each peer's GEMM follows its pull.
  :data:`~collectives.config.OVERLAP_START` ``"first"`` launches the start on the current
  stream before the own GEMM instead (as torch's fused all-gather matmul): exposed, but no
  pull then waits for a barrier kernel dispatched behind a GEMM that holds every SM.

:data:`~collectives.config.OVERLAP_SCHEDULE` ``"alternate"`` (by default, ``"auto"``: for an
all-gather GEMM up to :data:`~collectives.algorithms.tuning.OVERLAP_ALTERNATE_MAX_MNK`, where it
was measured faster on 2 and 4 x H200) runs the blocks as torch's fused
ops do (``torch.distributed._symmetric_memory``: ``_pipelined_all_gather_and_consume``,
``_pipelined_produce_and_all2all``): a peer block's copy and GEMM both on one stream, the side
stream for the first peer, the current stream for the second, and so on, this rank's own GEMM
on the current stream, so that two blocks' GEMMs may run at once (one's tiles filling the
other's last wave, which one stream of GEMMs leaves idle).  The start barrier's stream hands its
end to the other stream by one event (the pushes and pulls there wait for it), and the
reduce-scatter's end barrier waits for the current stream's last push by another.  Unlike
torch's reduce-scatter (pulls from double-buffered workspaces, two barriers per step) the
pushes and the two barriers per call stay.

The side stream forks from the current one at the start of a call and joins it at the end;
between them each block's producer and consumer are ordered by CUDA events (a stream wait
resolved by the GPU's scheduler: no kernel, no SM, no host sync, an edge of a captured graph);
across GPUs the collectives' ptxops barriers (bounded waits) order everything.

Host order: eagerly, a collective launched on another stream than the communicator's previous
one first makes its stream wait for all the work queued so far on that stream
(:func:`collectives.algorithms.plan.follow`: a communicator's collectives run one at a time).
So the side stream's start barriers are launched before the GEMMs are enqueued on the current
stream: launched after them, the side stream would wait for every GEMM of the call, and the
communication would follow the GEMMs instead of running beside them.  The reduce-scatter's end
barrier follows the GEMMs on the side stream, the stream of the call's previous launch (so
``follow`` orders nothing; on the current stream it would cost two orders per call); the
current stream joins after it.

Eager calls: the host's work for the blocks (W GEMMs, the copies, two barriers, W + 1 event
records and waits, the switches between the streams) took ~150 us a block on the 4 x H200
host, longer than a block's GEMM at M = N = K = 4096 (45 us): the host, not the GPU, bounded
such calls.  So an eager call (not captured) runs blocks only where the GEMM outlasts
that host time (:func:`eager_blocks`); else one GEMM and one collective of the library
(``gemm_reduce_scatter``: the whole product, then :func:`collectives.reduce_scatter` of it;
``all_gather_gemm``: :func:`collectives.all_gather` of the shards, then the GEMM), every rank
choosing alike (the shapes and knobs decide).  Such a call still makes the workspace and the
barrier's plan that a capture of it needs.  The blocks' host path takes the current stream by
its raw handle and switches it with torch's raw setter (:func:`_current`, :func:`_switch`):
``torch.cuda.current_stream()`` and ``torch.cuda.stream()`` cost 8 us or more each on that host.
The reduce-scatter enqueues each push right after its block's GEMM: enqueued after all of them,
the pushes of a host-bound call started only after the last GEMM (4 x H200, 4096^3: at 263 us,
the GEMMs 0-267 us, ``docs/data/overlap-timeline-4xH200.json``); in a graph the order is the same
either way (the same edges).

Forward progress: every event is recorded (on the other stream) before the wait on it is
queued (a wait on an event not yet recorded would not wait at all), and nothing on either stream spins but the barriers, whose ranks all launch them.
Where ranks share a GPU (a one-GPU world), a GEMM's (or a reduction's) first call for a shape
or dtype can block its host thread until every kernel on the GPU ends (cuBLAS loading
kernels), other ranks' spinning barriers included, and CUDA holds the other ranks' launches
behind that load.  So the ranks meet on the host
(:meth:`~collectives.runtime.communicator.Communicator.meet_ranks_on_device`) between the
GEMMs a call launches and the barriers that follow them, and the other way round (a copy
neither spins nor loads): each meeting is a host agreement, made in a world only.

Reuse: a call's side-stream work ends before the current stream passes the join, and the
next call's side stream forks after the current stream's work of this call; a rank reads or
writes a peer's workspace only between two barriers of the same call, so no rank overwrites a
block another may still read (calls ordered by one stream).

Ownership of rows (``W`` ranks, ``M`` rows of ``a`` per rank, ``M % W == 0``):

- ``gemm_reduce_scatter(a, b)`` returns ``(M / W, N)``: rows ``[rank * M / W, (rank + 1) * M / W)``
  of ``sum_r a_r @ b_r``;
- ``all_gather_gemm(a_shard, b)`` returns ``(W * M_shard, N)``: ``concat_r(a_shard_r) @ b``.

Traced by ``torch.compile``, each function records its custom operator
(``collectives::gemm_reduce_scatter`` / ``collectives::all_gather_gemm``, :mod:`collectives.runtime.torch_ops`).
Like the collectives, a call is capturable in a CUDA graph once the same call ran eagerly
(that call allocates the symmetric workspace and compiles the barrier, whichever way it ran);
a captured call always runs the blocks.  The workspaces are
staging-pool slots (:class:`~collectives.runtime.staging.StagingPool`): grown collectively, and never
freed once a captured graph used them (the collectives' launches under capture pin what they use).
"""

from __future__ import annotations

import contextlib

import torch

from . import config
from .config import Slot
from .dtypes import DTYPES
from .errors import CollectiveError
from .algorithms import tuning
from .algorithms.plan import capturing, current_stream
from .runtime import torch_ops
from .runtime.communicator import Communicator, Group, communicator, traceable

#: The dtypes the overlapped GEMM (``torch.mm``) takes (registry names).
GEMM_DTYPES = ("bf16", "f16")

#: The staging-pool slot of each function's symmetric workspace.
_WORKSPACE_SLOT = {"gemm_reduce_scatter": Slot.GEMM_REDUCE_SCATTER, "all_gather_gemm": Slot.ALL_GATHER_GEMM}


def _workspace(comm: Communicator, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Symmetric workspace ``name`` of ``numel`` elements: the front of its staging-pool slot
    (grown collectively; a superseded one is freed only if no captured graph used it)."""
    nbytes = numel * dtype.itemsize
    return comm.staging(nbytes, _WORKSPACE_SLOT[name])[:nbytes].view(dtype)


def _check(name: str, comm: Communicator, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """(rows, K, N) of ``a`` (rows x K) and ``b`` (K x N), refusing what the GEMM cannot take."""
    for t in (a, b):
        if not t.is_cuda or t.device.index != comm.device_index:
            raise CollectiveError(f"{name}: tensors must be on cuda:{comm.device_index}, not {t.device}")
        if t.dim() != 2 or not t.is_contiguous():
            raise CollectiveError(f"{name}: a and b must be contiguous row-major matrices")
    if a.dtype not in [DTYPES[d].torch for d in GEMM_DTYPES] or b.dtype != a.dtype:
        raise CollectiveError(f"{name}: a and b must both be {' or '.join(GEMM_DTYPES)}, not {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise CollectiveError(f"{name}: a is {tuple(a.shape)}, b {tuple(b.shape)}: inner sizes differ")
    return a.shape[0], a.shape[1], b.shape[1]


def peer_order(world: int, rank: int) -> list[int]:
    """The peers whose blocks a call handles, in order: ``rank + 1, rank + 2, ...`` (mod ``world``),
    so that at each step every rank sends to (or reads from) a different one."""
    return [(rank + step) % world for step in range(1, world)]


def gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                        group: Group = None) -> torch.Tensor:
    """Rows ``[rank * M / W, (rank + 1) * M / W)`` of ``sum over ranks of a @ b`` (``a``: M x K,
    ``b``: K x N, bf16 or f16, per rank), as an ``(M / W, N)`` tensor (``out`` if given);
    ranks, ``W`` and ``rank`` those of ``group`` (as for :func:`collectives.all_reduce`)."""
    if torch.compiler.is_compiling():
        traceable(group, "gemm_reduce_scatter")
        return torch_ops.traced_gemm("gemm_reduce_scatter", a, b, _world(), out)
    return eager_gemm_reduce_scatter(a, b, out, group=group)


def eager_gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                              timeline: list | None = None, group: Group = None) -> torch.Tensor:
    """:func:`gemm_reduce_scatter` run now (never traced); given ``timeline``, appends
    ``(kind, block, start, end)`` CUDA events around each block's GEMM (``"gemm"``) and copy
    (``"comm"``) on the stream each ran on, ``block`` the rank it is for (-1: this rank's own)
    (``collectives.tools.overlap_timeline``)."""
    comm = communicator(group)
    with comm.errors.call(), _on_device(comm.device_index):
        return _gemm_reduce_scatter_on(comm, a, b, out, timeline)


def _gemm_reduce_scatter_on(comm: Communicator, a, b, out, timeline: list | None) -> torch.Tensor:
    from .api import barrier

    rows, k, n = _check("gemm_reduce_scatter", comm, a, b)
    world, rank = comm.world, comm.rank
    if rows % world:
        raise CollectiveError(f"gemm_reduce_scatter: a has {rows} rows, not a multiple of world_size ({world})")
    m = rows // world
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if out.shape != (m, n) or out.dtype != a.dtype or not out.is_contiguous():
        raise CollectiveError(f"gemm_reduce_scatter: out must be a contiguous ({m}, {n}) {a.dtype} tensor")
    if m == 0:
        return out
    capture = capturing()
    engine = _engine("gemm_reduce_scatter") and not capture  # (copy-engine copies: eager only)
    alternate = _alternate("gemm_reduce_scatter", rows * n * k)
    workspace = _workspace(comm, "gemm_reduce_scatter", rows * n, a.dtype)  # (either way: a capture needs it)
    values = [rows, n]
    if timeline is None and not capture and not eager_blocks(world, rows, k, n):
        from .api import reduce_scatter

        comm.meet_ranks_on_device("gemm_reduce_scatter: before the GEMM (values: rows, N)", values)
        comm.barrier_plan()  # (unused here, made as the blocks would: a capture of this call needs it)
        product = torch.mm(a, b)
        comm.meet_ranks_on_device("gemm_reduce_scatter: GEMM enqueued (values: rows, N)", values)
        return reduce_scatter(out, product, group=comm)
    # received[p]: rank p's product of this rank's rows (pushed by p; this rank's own written
    # here); sent[d]: this rank's product of rank d's rows, pushed from there (local: read on the
    # side stream, which the current stream joins before any later use of its memory).
    received = workspace.view(world, m, n)
    sent = torch.empty_like(received).unbind(0)
    mine = received[rank]
    owners = comm.ctx.peer_tensors(mine)  # owners[d]: block ``rank`` of rank d's received
    blocks, peers = a.split(m), peer_order(world, rank)
    main, side = _current(comm.device_index), comm.stream_flags.side()
    fork, join, started, pushed, *done = comm.stream_flags.events(world + 3)
    # "comm": GEMM d on main, push d on side after it (event done[d]); "alternate": both on lanes[d]
    lanes = _lanes(alternate, len(peers), main, side)
    comm.meet_ranks_on_device("gemm_reduce_scatter: before the start barrier (values: rows, N)", values)
    to = _At(main)
    try:
        fork.record(main)
        fork.wait(side)
        to(side)  # before the GEMMs are enqueued (see "Host order" above)
        barrier(group=comm)  # every rank's previous call has summed its received blocks
        if main in lanes:
            started.record(side)  # main's pushes follow the start barrier
        to(main)
        comm.meet_ranks_on_device("gemm_reduce_scatter: start barrier launched (values: rows, N)", values)
        waited = False
        for d, event, lane in zip(peers, done, lanes):  # each push enqueued right after its GEMM (see "Eager calls")
            to(lane or main)
            marks = _marks(timeline, "gemm", d, to.stream)
            torch.mm(blocks[d], b, out=sent[d])
            _close(marks, to.stream)
            if lane is None:
                event.record(main)
                to(side)
                event.wait(side)
            elif lane is main and not waited:
                started.wait(main)
                waited = True
            marks = _marks(timeline, "comm", d, to.stream)
            _copy(engine, owners[d], sent[d], to.stream)
            _close(marks, to.stream)
        if waited:
            pushed.record(main)  # main's last push (the end barrier need not wait for the own GEMM)
        to(main)
        marks = _marks(timeline, "gemm", -1, main)
        torch.mm(blocks[rank], b, out=mine)  # hides the last push
        _close(marks, main)
        to(side)
        if waited:
            pushed.wait(side)
        comm.meet_ranks_on_device("gemm_reduce_scatter: GEMMs enqueued (values: rows, N)", values)
        barrier(group=comm)  # every rank's pushes have landed (the start barrier's stream: see "Host order")
    finally:
        _switch(main)
    comm.meet_ranks_on_device("gemm_reduce_scatter: end barrier launched (values: rows, N)", values)
    join.record(side)
    join.wait(main)
    torch.sum(received, dim=0, out=out)
    return out


def all_gather_gemm(a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                    group: Group = None) -> torch.Tensor:
    """``concat over ranks of a_shard @ b`` (``a_shard``: M_shard x K, ``b``: K x N, bf16 or f16),
    as a ``(W * M_shard, N)`` tensor (``out`` if given); ranks those of ``group``."""
    if torch.compiler.is_compiling():
        traceable(group, "all_gather_gemm")
        return torch_ops.traced_gemm("all_gather_gemm", a_shard, b, _world(), out)
    return eager_all_gather_gemm(a_shard, b, out, group=group)


def eager_all_gather_gemm(a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                          timeline: list | None = None, group: Group = None) -> torch.Tensor:
    """:func:`all_gather_gemm` run now (never traced); ``timeline`` as for
    :func:`eager_gemm_reduce_scatter` (``"comm"``: a peer's pull)."""
    comm = communicator(group)
    with comm.errors.call(), _on_device(comm.device_index):
        return _all_gather_gemm_on(comm, a_shard, b, out, timeline)


def _all_gather_gemm_on(comm: Communicator, a_shard, b, out, timeline: list | None) -> torch.Tensor:
    from .api import barrier

    m, k, n = _check("all_gather_gemm", comm, a_shard, b)
    world, rank = comm.world, comm.rank
    if out is None:
        out = torch.empty((world * m, n), dtype=a_shard.dtype, device=a_shard.device)
    if out.shape != (world * m, n) or out.dtype != a_shard.dtype or not out.is_contiguous():
        raise CollectiveError(f"all_gather_gemm: out must be a contiguous ({world * m}, {n}) {a_shard.dtype} tensor")
    if m == 0:
        return out
    start = config.OVERLAP_START
    if start not in config.OVERLAP_STARTS:
        raise CollectiveError(f"all_gather_gemm: config.OVERLAP_START is {start!r}, not one of {config.OVERLAP_STARTS}")
    capture = capturing()
    engine = _engine("all_gather_gemm") and not capture  # (copy-engine copies: eager only)
    alternate = _alternate("all_gather_gemm", world * m * n * k)
    workspace = _workspace(comm, "all_gather_gemm", world * m * k, a_shard.dtype)  # (either way: a capture needs it)
    values = [m, k]
    if timeline is None and not capture and not eager_blocks(world, world * m, k, n):
        from .api import all_gather

        comm.meet_ranks_on_device("all_gather_gemm: before the all-gather (values: rows, K)", values)
        whole = all_gather(torch.empty((world * m, k), dtype=a_shard.dtype, device=a_shard.device), a_shard,
                           group=comm)
        comm.meet_ranks_on_device("all_gather_gemm: all-gather launched (values: rows, K)", values)
        comm.barrier_plan()  # (unused here, made as the blocks would: a capture of this call needs it)
        return torch.mm(whole, b, out=out)
    gathered = workspace.view(world, m, k)  # gathered[q]: rank q's shard (this rank's own copied in, the peers' pulled)
    owners = comm.ctx.peer_tensors(gathered)
    shards, products, peers = gathered.unbind(0), out.split(m), peer_order(world, rank)
    main, side = _current(comm.device_index), comm.stream_flags.side()
    fork, join, started, *arrived = comm.stream_flags.events(world + 2)
    # "comm": pull q on side (event arrived[q]), GEMM q on main after it; "alternate": both on lanes[q]
    lanes = _lanes(alternate, len(peers), main, side)
    comm.meet_ranks_on_device("all_gather_gemm: before the barriers (values: rows, K)", values)
    to = _At(main)
    try:
        if start == "side":
            fork.record(main)
            fork.wait(side)
            to(side)  # before the GEMMs (see "Host order" above)
        barrier(group=comm)  # every rank's previous call has read its block
        shards[rank].copy_(a_shard)
        barrier(group=comm)  # every rank's block is in place
        if start == "first":
            fork.record(main)  # the pulls follow the start
            fork.wait(side)
        elif main in lanes:
            started.record(side)  # main's pulls follow the start
        for q, event, lane in zip(peers, arrived, lanes):
            if lane is None:
                to(side)
                marks = _marks(timeline, "comm", q, side)
                _copy(engine, shards[q], owners[q][q], side)
                _close(marks, side)
                event.record(side)
    finally:
        to(main)
    comm.meet_ranks_on_device("all_gather_gemm: barriers launched (values: rows, K)", values)
    marks = _marks(timeline, "gemm", -1, main)
    torch.mm(a_shard, b, out=products[rank])  # hides the first pull (start "side": the start too)
    _close(marks, main)
    try:
        for q, event, lane in zip(peers, arrived, lanes):
            if lane is None:
                event.wait(main)
            else:  # the pull, then the GEMM, on the block's stream
                to(lane)
                if lane is main and start == "side" and q == peers[1]:  # (main's first pull)
                    started.wait(main)
                marks = _marks(timeline, "comm", q, lane)
                _copy(engine, shards[q], owners[q][q], lane)
                _close(marks, lane)
            marks = _marks(timeline, "gemm", q, to.stream)
            torch.mm(shards[q], b, out=products[q])
            _close(marks, to.stream)
    finally:
        to(main)
    join.record(side)
    join.wait(main)
    return out


def _engine(name: str) -> bool:
    """Whether :data:`~collectives.config.OVERLAP_COPY` asks for copy-engine copies (refusing
    another value than its choices)."""
    how = config.OVERLAP_COPY
    if how not in config.OVERLAP_COPIES:
        raise CollectiveError(f"{name}: config.OVERLAP_COPY is {how!r}, not one of {config.OVERLAP_COPIES}")
    return how == "engine"


def _engine_copy(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """``dst.copy_(src)`` (contiguous, of one size and dtype) by ``cuMemcpyBatchAsync`` on
    ``stream``, hinted to a copy engine (``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE``)."""
    from cuda.bindings import driver

    attrs = driver.CUmemcpyAttributes()
    attrs.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attrs.flags = driver.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    err = driver.cuMemcpyBatchAsync([driver.CUdeviceptr(dst.data_ptr())], [driver.CUdeviceptr(src.data_ptr())],
                                    [dst.numel() * dst.element_size()], 1, [attrs], [0], 1, stream.cuda_stream)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CollectiveError(f"cuMemcpyBatchAsync (config.OVERLAP_COPY 'engine') failed: {err}")


def _copy(engine: bool, dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """``dst.copy_(src)`` on ``stream``, the current one (``engine``: by :func:`_engine_copy`)."""
    if engine:
        _engine_copy(dst, src, stream)
    else:
        dst.copy_(src)


def _alternate(name: str, mnk: int) -> bool:
    """Whether ``name``'s blocks run in the ``"alternate"`` schedule: as
    :data:`~collectives.config.OVERLAP_SCHEDULE` says (refusing another value than its choices);
    ``"auto"``: an all-gather GEMM of ``mnk`` (``M x N x K``) at most
    :data:`~collectives.algorithms.tuning.OVERLAP_ALTERNATE_MAX_MNK` (the measured crossover)."""
    schedule = config.OVERLAP_SCHEDULE
    if schedule not in config.OVERLAP_SCHEDULES:
        raise CollectiveError(f"{name}: config.OVERLAP_SCHEDULE is {schedule!r}, "
                              f"not one of {config.OVERLAP_SCHEDULES}")
    if schedule == "auto":
        return name == "all_gather_gemm" and mnk <= tuning.OVERLAP_ALTERNATE_MAX_MNK
    return schedule == "alternate"


def _lanes(alternate: bool, count: int, main: torch.cuda.Stream,
           side: torch.cuda.Stream) -> list[torch.cuda.Stream | None]:
    """The stream of each of ``count`` peer blocks' copy and GEMM: ``alternate``, the side stream
    for the first, the current one (``main``) for the second, and so on (as torch's fused ops);
    else None each (the copy on the side stream, the GEMM on the current one)."""
    return [(side, main)[step % 2] if alternate else None for step in range(count)]


class _At:
    """The current stream as a call last set it: :func:`_switch` only where it changes."""

    __slots__ = ("stream",)

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream

    def __call__(self, stream: torch.cuda.Stream) -> None:
        if stream is not self.stream:
            _switch(stream)
            self.stream = stream


#: :data:`~collectives.config.OVERLAP_EAGER_HOST_US_PER_BLOCK` that makes every eager call run
#: the blocks (``"blocks"``) or one GEMM and one collective (``"one"``), whatever its shape (the
#: tests' and the bench's ways to take either path).
EAGER_PATHS = {"blocks": 0.0, "one": float("inf")}


def eager_blocks(world: int, rows: int, k: int, n: int) -> bool:
    """Whether an eager call (not captured) of a GEMM of ``rows`` x ``k`` by ``k`` x ``n`` on
    ``world`` ranks runs as one block per rank: whether that GEMM, at
    :data:`~collectives.config.OVERLAP_GEMM_FLOPS`, lasts at least the host's time to issue the
    blocks (``world`` x :data:`~collectives.config.OVERLAP_EAGER_HOST_US_PER_BLOCK`).  Else the
    host, not the GPU, would bound the call, and one GEMM and one collective take less.  The
    same on every rank (the shapes and the knobs are)."""
    return 2e6 * rows * k * n >= world * config.OVERLAP_EAGER_HOST_US_PER_BLOCK * config.OVERLAP_GEMM_FLOPS


@torch.compiler.assume_constant_result
def _world() -> int:
    """The communicator's world size: a constant of a compiled graph (read once, while tracing),
    which the operators' kernels check."""
    return communicator().world


def _check_world(name: str, world: int) -> None:
    """Refuse a graph traced for another world size (its output shape would be wrong)."""
    current = _world()
    if world != current:
        raise CollectiveError(f"{name}: traced for {world} ranks, but the communicator has {current}")


@torch_ops.implement("gemm_reduce_scatter")
def _gemm_reduce_scatter_kernel(a: torch.Tensor, b: torch.Tensor, world: int) -> torch.Tensor:
    _check_world("gemm_reduce_scatter", world)
    return eager_gemm_reduce_scatter(a, b)


@torch_ops.implement("all_gather_gemm")
def _all_gather_gemm_kernel(a_shard: torch.Tensor, b: torch.Tensor, world: int) -> torch.Tensor:
    _check_world("all_gather_gemm", world)
    return eager_all_gather_gemm(a_shard, b)


#: torch's setter of a device's current stream, by its ids (``torch.cuda.set_stream`` without
#: its Python wrapper, which asks the device and CUDA's availability at each call: microseconds
#: on a slow host CPU); None in a CPU build.
_set_stream = getattr(torch._C, "_cuda_setStream", None)
#: torch's streams by (device, raw handle): :func:`_current`'s answers (at most :data:`_KNOWN_MAX`).
_known: dict[tuple[int, int], torch.cuda.Stream] = {}
_KNOWN_MAX = 64


#: torch's current device, without ``torch.cuda.current_device``'s wrapper where torch has it.
_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _on_device(device: int) -> contextlib.AbstractContextManager:
    """Make ``device`` the current device inside, where it is not (:func:`_switch` needs it)."""
    return contextlib.nullcontext() if _get_device() == device else torch.cuda.device(device)


def _current(device: int) -> torch.cuda.Stream:
    """torch's current stream of ``device``: found by its raw handle
    (:func:`~collectives.algorithms.plan.current_stream`, 0.1 us), made by
    ``torch.cuda.current_stream`` (8 us on the 4 x H200 host) once per stream.  (A handle names
    one stream for good: torch never destroys its pooled streams, and an external stream's id is its handle.)"""
    key = (device, current_stream(device))
    stream = _known.get(key)
    if stream is None:
        if len(_known) >= _KNOWN_MAX:
            _known.clear()
        stream = _known[key] = torch.cuda.current_stream(device)
    return stream


def _switch(stream: torch.cuda.Stream) -> None:
    """Make ``stream`` torch's current stream of its device, which must be the current device
    (the eager functions make it so; torch's setter would make it current)."""
    if _set_stream is None:
        torch.cuda.set_stream(stream)
    else:
        _set_stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


def _marks(timeline: list | None, kind: str, chunk: int, stream: torch.cuda.Stream):
    """A started timeline entry (its start event recorded on ``stream``), or None."""
    if timeline is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    timeline.append((kind, chunk, start, end))
    return end


def _close(end: torch.cuda.Event | None, stream: torch.cuda.Stream) -> None:
    if end is not None:
        end.record(stream)


__all__ = ["EAGER_PATHS", "all_gather_gemm", "eager_all_gather_gemm", "eager_blocks", "eager_gemm_reduce_scatter",
           "gemm_reduce_scatter", "peer_order"]
