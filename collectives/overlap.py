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
(that call allocates the symmetric workspace and compiles the barrier).  The workspaces are
staging-pool slots (:class:`~collectives.runtime.staging.StagingPool`): grown collectively, and never
freed once a captured graph used them (the collectives' launches under capture pin what they use).
"""

from __future__ import annotations


import torch

from . import config
from .config import Slot
from .dtypes import DTYPES
from .errors import CollectiveError
from .runtime import torch_ops
from .runtime.communicator import Communicator, Group, communicator, traceable

#: The dtypes the overlapped GEMM (``torch.mm``) takes (registry names).
GEMM_DTYPES = ("bf16", "f16")

#: The staging-pool slot of each function's symmetric workspace.
_WORKSPACE_SLOT = {"gemm_reduce_scatter": Slot.GEMM_REDUCE_SCATTER, "all_gather_gemm": Slot.ALL_GATHER_GEMM}


def _workspace(comm: Communicator, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Symmetric workspace ``name`` of ``numel`` elements: the front of its staging-pool slot
    (grown collectively; a superseded one is freed only if no captured graph used it)."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
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
    ``(kind, block, start, end)`` CUDA events around each block's GEMM (``"gemm"``, current
    stream) and copy (``"comm"``, side stream), ``block`` the rank it is for (-1: this rank's own)
    (``collectives.tools.overlap_timeline``)."""
    comm = communicator(group)
    with comm.errors.call():
        return _gemm_reduce_scatter_on(comm, a, b, out, timeline)


def _gemm_reduce_scatter_on(comm: Communicator, a, b, out, timeline: list | None) -> torch.Tensor:
    from .api import barrier

    rows, _, n = _check("gemm_reduce_scatter", comm, a, b)
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
    # received[p]: rank p's product of this rank's rows (pushed by p; this rank's own written
    # here); sent[d]: this rank's product of rank d's rows, pushed from there (local: read on the
    # side stream, which the current stream joins before any later use of its memory).
    received = _workspace(comm, "gemm_reduce_scatter", rows * n, a.dtype).view(world, m, n)
    sent = torch.empty_like(received)
    owners = comm.ctx.peer_tensors(received)
    main, side = torch.cuda.current_stream(), comm.stream_flags.side()
    fork, join, *done = comm.stream_flags.events(world + 1)
    comm.meet_ranks_on_device("gemm_reduce_scatter: before the start barrier (values: rows, N)", [rows, n])
    _order(fork, main, side)
    with torch.cuda.stream(side):  # before the GEMMs are enqueued (see "Host order" above)
        barrier(group=comm)  # every rank's previous call has summed its received blocks
    comm.meet_ranks_on_device("gemm_reduce_scatter: start barrier launched (values: rows, N)", [rows, n])
    for d, event in zip(peer_order(world, rank), done):
        marks = _marks(timeline, "gemm", d, main)
        torch.mm(a[d * m:(d + 1) * m], b, out=sent[d])
        _close(marks, main)
        event.record(main)
    marks = _marks(timeline, "gemm", -1, main)
    torch.mm(a[rank * m:(rank + 1) * m], b, out=received[rank])  # hides the last push
    _close(marks, main)
    with torch.cuda.stream(side):
        for d, event in zip(peer_order(world, rank), done):
            side.wait_event(event)
            marks = _marks(timeline, "comm", d, side)
            owners[d][rank].copy_(sent[d])
            _close(marks, side)
    comm.meet_ranks_on_device("gemm_reduce_scatter: GEMMs enqueued (values: rows, N)", [rows, n])
    with torch.cuda.stream(side):  # (the start barrier's stream: see "Host order" above)
        barrier(group=comm)  # every rank's pushes have landed
    comm.meet_ranks_on_device("gemm_reduce_scatter: end barrier launched (values: rows, N)", [rows, n])
    _order(join, side, main)
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
    with comm.errors.call():
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
    # gathered[q]: rank q's shard (this rank's own copied in, the peers' pulled from theirs).
    gathered = _workspace(comm, "all_gather_gemm", world * m * k, a_shard.dtype).view(world, m, k)
    owners = comm.ctx.peer_tensors(gathered)
    start = config.OVERLAP_START
    if start not in config.OVERLAP_STARTS:
        raise CollectiveError(f"all_gather_gemm: config.OVERLAP_START is {start!r}, not one of {config.OVERLAP_STARTS}")
    main, side = torch.cuda.current_stream(), comm.stream_flags.side()
    fork, join, *arrived = comm.stream_flags.events(world + 1)
    comm.meet_ranks_on_device("all_gather_gemm: before the barriers (values: rows, K)", [m, k])
    if start == "side":
        _order(fork, main, side)
    with torch.cuda.stream(side if start == "side" else main):  # before the GEMMs (see "Host order" above)
        barrier(group=comm)  # every rank's previous call has read its block
        gathered[rank].copy_(a_shard)
        barrier(group=comm)  # every rank's block is in place
    if start == "first":
        _order(fork, main, side)  # the pulls follow the start
    with torch.cuda.stream(side):
        for q, event in zip(peer_order(world, rank), arrived):
            marks = _marks(timeline, "comm", q, side)
            gathered[q].copy_(owners[q][q])
            _close(marks, side)
            event.record(side)
    comm.meet_ranks_on_device("all_gather_gemm: barriers launched (values: rows, K)", [m, k])
    marks = _marks(timeline, "gemm", -1, main)
    torch.mm(a_shard, b, out=out[rank * m:(rank + 1) * m])  # hides the first pull (start "side": the start too)
    _close(marks, main)
    for q, event in zip(peer_order(world, rank), arrived):
        main.wait_event(event)
        marks = _marks(timeline, "gemm", q, main)
        torch.mm(gathered[q], b, out=out[q * m:(q + 1) * m])
        _close(marks, main)
    _order(join, side, main)
    return out


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


def _order(event: torch.cuda.Event, before: torch.cuda.Stream, after: torch.cuda.Stream) -> None:
    """Make ``after`` wait for the work queued so far on ``before`` (``wait_stream`` with a
    reused event: no new one per call)."""
    event.record(before)
    after.wait_event(event)


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


__all__ = ["all_gather_gemm", "eager_all_gather_gemm", "eager_gemm_reduce_scatter", "gemm_reduce_scatter", "peer_order"]
