"""GEMM overlapped with communication: ``gemm_reduce_scatter`` and ``all_gather_gemm``.

The GEMM is cuBLAS (through torch) on row chunks, on the current stream; the communication of
each chunk is this library's ``reduce_scatter`` / ``all_gather`` kernel on a side stream, so the
communication of one chunk runs while the GEMM of the next computes.  The side stream forks
from the current one at the start of a call and joins it at the end (CUDA stream waits: they
order the call against the work around it and keep it capturable in a CUDA graph).  Between
them, each chunk's producer and consumer are synchronised by device-side flags built from
ptxops (:meth:`~collectives.runtime.stream_flags.StreamFlags.post` after the producer on its stream,
:meth:`~collectives.runtime.stream_flags.StreamFlags.wait` before the consumer on the other: one-thread
kernels, ``red.release.gpu`` / ``ld.acquire.gpu``, bounded by the communicator's timeout), not
by events or host syncs; across GPUs the collectives' own ptxops barriers order everything.
The communication kernels use TMA (at most a quarter of the SMs) when every chunk is 16-byte
aligned, else one-shot.

Forward progress: the producer of every wait was queued (on the other stream) before the wait
itself, and a spinning wait holds one warp of one SM, so the producer always has the rest of
the GPU.  Where ranks share a GPU (a one-GPU world), a GEMM's first call for a shape or dtype
can block its host thread until every kernel on the GPU ends (cuBLAS loading kernels), other
ranks' spinning collectives included, and CUDA holds the other ranks' launches behind that
load.  So the ranks meet on the host
(:meth:`~collectives.runtime.communicator.Communicator.meet_ranks_on_device`) wherever a rank
would otherwise run a GEMM while another rank may still have collectives to launch, or launch
a collective while another may still be in a GEMM: before a call's first GEMM (the previous
call's collectives are then launched on every rank), between the GEMMs and the collectives
that follow them, and between ``all_gather_gemm``'s all-gathers and the GEMMs that wait for
them.  Each meeting is a host agreement, made in a world only.

Reuse: a call's side-stream work ends before the current stream passes the join, and the
next call's side stream forks after the current stream's work of this call, so neither stream
overwrites a workspace chunk the other may still read (calls ordered by one stream).

Ownership of rows (``W`` ranks, ``M`` rows of ``a`` per rank, ``M % W == 0``):

- ``gemm_reduce_scatter(a, b)`` returns ``(M / W, N)``: rows ``[rank * M / W, (rank + 1) * M / W)``
  of ``sum_r a_r @ b_r``;
- ``all_gather_gemm(a_shard, b)`` returns ``(W * M_shard, N)``: ``concat_r(a_shard_r) @ b``.

Traced by ``torch.compile``, each function records its custom operator
(``collectives::gemm_reduce_scatter`` / ``collectives::all_gather_gemm``, :mod:`collectives.runtime.torch_ops`).
Like the collectives, a call is capturable in a CUDA graph once the same call ran eagerly
(that call allocates the symmetric workspace and compiles the kernels).  The workspaces are
staging-pool slots (:class:`~collectives.runtime.staging.StagingPool`): grown collectively, and never
freed once a captured graph used them (the collectives' launches under capture pin what they use).
"""

from __future__ import annotations


import torch

from .config import VECTOR_BYTES, Slot
from .dtypes import DTYPES
from .errors import CollectiveError
from .runtime import torch_ops
from .runtime.communicator import Communicator, Group, communicator, traceable

#: The dtypes the overlapped GEMM (``torch.mm``) takes (registry names).
GEMM_DTYPES = ("bf16", "f16")
#: Row chunks per call (fewer when a rank's block has fewer rows), at most :data:`MAX_CHUNKS`.
CHUNKS = 4
MAX_CHUNKS = 8
#: Thread blocks each chunk's communication kernel may take (None: the collective's own
#: choice, a quarter of the SMs for TMA); the rest of the GPU stays with the GEMM.
COMM_BLOCKS: int | None = None
#: ``all_gather_gemm`` gathers each chunk with copy engines instead of the all-gather kernel
#: (:func:`_copy_engine_gather`): no SM is taken from the GEMM, at the cost of two barriers and
#: W copies per chunk.  Off by default until timed on 4 GPUs (``gemm_overlap_bench --gather-ce``).
GATHER_COPY_ENGINE = False

#: The staging-pool slot of each function's symmetric workspace.
_WORKSPACE_SLOT = {"gemm_reduce_scatter": Slot.GEMM_REDUCE_SCATTER, "all_gather_gemm": Slot.ALL_GATHER_GEMM}
#: The first stream-flag slot of each function's chunks (its chunk ``c`` posts slot base + c).
_FLAG_BASE = {"gemm_reduce_scatter": 0, "all_gather_gemm": MAX_CHUNKS}


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


def _bounds(rows: int) -> list[tuple[int, int]]:
    """Row ranges of the :data:`CHUNKS` chunks of ``rows`` rows (as even as possible, none
    empty)."""
    if not 1 <= CHUNKS <= MAX_CHUNKS:
        raise CollectiveError(f"overlap.CHUNKS must be 1..{MAX_CHUNKS} (one flag slot each), not {CHUNKS}")
    count = max(1, min(CHUNKS, rows))
    return [(c * rows // count, (c + 1) * rows // count) for c in range(count)]


def _algorithm(*tensors: torch.Tensor) -> str:
    """TMA (few SMs) when every tensor is 16-byte aligned in address and size, else one-shot."""
    ok = all(t.data_ptr() % VECTOR_BYTES == 0 and t.numel() * t.element_size() % VECTOR_BYTES == 0 for t in tensors)
    return "tma" if ok else "one_shot"


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
    ``(kind, chunk, start, end)`` CUDA events around each chunk's GEMM and communication
    (``collectives.tools.overlap_timeline``).  Chunk ``c``: GEMMs then a post on the current
    stream; a wait then the reduce-scatter on the side stream."""
    comm = communicator(group)
    with comm.errors.call():
        return _gemm_reduce_scatter_on(comm, a, b, out, timeline)


def _gemm_reduce_scatter_on(comm: Communicator, a, b, out, timeline: list | None) -> torch.Tensor:
    from .api import reduce_scatter

    rows, _, n = _check("gemm_reduce_scatter", comm, a, b)
    world = comm.world
    if rows % world:
        raise CollectiveError(f"gemm_reduce_scatter: a has {rows} rows, not a multiple of world_size ({world})")
    m = rows // world
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if out.shape != (m, n) or out.dtype != a.dtype or not out.is_contiguous():
        raise CollectiveError(f"gemm_reduce_scatter: out must be a contiguous ({m}, {n}) {a.dtype} tensor")
    # Chunk c's partial products, every owner's rows of the chunk together: (W, rows_c, N).
    partial = _workspace(comm, "gemm_reduce_scatter", rows * n, a.dtype)
    main = torch.cuda.current_stream()
    side = comm.stream_flags.side()
    side.wait_stream(main)
    slot = _FLAG_BASE["gemm_reduce_scatter"]
    comm.meet_ranks_on_device("gemm_reduce_scatter: before the GEMMs (values: rows, N)", [rows, n])
    # Every owner's rows of a chunk in one batched GEMM (b broadcast: batch stride 0).
    owners, shared_b = a.view(world, m, a.shape[1]), b.expand(world, *b.shape)
    chunks = []
    at = 0
    for c, (r0, r1) in enumerate(_bounds(m)):
        p = partial[at:at + world * (r1 - r0) * n].view(world, r1 - r0, n)
        at += world * (r1 - r0) * n
        marks = _marks(timeline, "gemm", c, main)
        torch.bmm(owners[:, r0:r1], shared_b, out=p)
        _close(marks, main)
        comm.stream_flags.post(slot + c)
        chunks.append((c, out[r0:r1].view(-1), p))
    comm.meet_ranks_on_device("gemm_reduce_scatter: GEMMs enqueued (values: rows, N)", [rows, n])
    # Enqueued after the GEMMs (one switch of streams): the flags, not the host's order, make
    # each reduce-scatter wait for its chunk.
    with torch.cuda.stream(side):
        for c, target, p in chunks:
            comm.stream_flags.wait(slot + c)
            marks = _marks(timeline, "comm", c, side)
            reduce_scatter(target, p.view(-1), algorithm=_algorithm(target, p), max_blocks=COMM_BLOCKS, group=comm)
            _close(marks, side)
    main.wait_stream(side)
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
    :func:`eager_gemm_reduce_scatter`.  This rank's own rows are multiplied first, while the side
    stream gathers the first chunk of the others'.  Chunk ``c``: the all-gather then a post on
    the side stream; a wait then the GEMMs on the current stream."""
    comm = communicator(group)
    with comm.errors.call():
        return _all_gather_gemm_on(comm, a_shard, b, out, timeline)


def _all_gather_gemm_on(comm: Communicator, a_shard, b, out, timeline: list | None) -> torch.Tensor:
    from .api import all_gather

    m, k, n = _check("all_gather_gemm", comm, a_shard, b)
    world, rank = comm.world, comm.rank
    if out is None:
        out = torch.empty((world * m, n), dtype=a_shard.dtype, device=a_shard.device)
    if out.shape != (world * m, n) or out.dtype != a_shard.dtype or not out.is_contiguous():
        raise CollectiveError(f"all_gather_gemm: out must be a contiguous ({world * m}, {n}) {a_shard.dtype} tensor")
    if m == 0:
        return out
    # Chunk c of every rank's shard, gathered: (W, rows_c, K).
    gathered = _workspace(comm, "all_gather_gemm", world * m * k, a_shard.dtype)
    main = torch.cuda.current_stream()
    side = comm.stream_flags.side()
    side.wait_stream(main)
    bounds = _bounds(m)
    slot = _FLAG_BASE["all_gather_gemm"]
    # This rank's own rows first: they need no communication, and the GPU starts on them while
    # the host enqueues the gathers (the flags, not the host's order, order the rest).
    comm.meet_ranks_on_device("all_gather_gemm: before the own rows' GEMM (values: rows, K)", [m, k])
    marks = _marks(timeline, "gemm", -1, main)
    torch.mm(a_shard, b, out=out[rank * m:(rank + 1) * m])
    _close(marks, main)
    comm.meet_ranks_on_device("all_gather_gemm: own rows' GEMM enqueued (values: rows, K)", [m, k])
    views = []
    at = 0
    with torch.cuda.stream(side):
        for c, (r0, r1) in enumerate(bounds):
            g = gathered[at:at + world * (r1 - r0) * k].view(world, r1 - r0, k)
            at += world * (r1 - r0) * k
            marks = _marks(timeline, "comm", c, side)
            if GATHER_COPY_ENGINE:
                _copy_engine_gather(comm, g, a_shard[r0:r1])
            else:
                src = a_shard[r0:r1].view(-1)
                all_gather(g.view(-1), src, algorithm=_algorithm(g, src), max_blocks=COMM_BLOCKS, group=comm)
            _close(marks, side)
            comm.stream_flags.post(slot + c)
            views.append(g)
    comm.meet_ranks_on_device("all_gather_gemm: all-gathers launched (values: rows, K)", [m, k])
    for c, (r0, r1) in enumerate(bounds):
        comm.stream_flags.wait(slot + c)
        marks = _marks(timeline, "gemm", c, main)
        for q in range(world):
            if q != rank:
                torch.mm(views[c][q], b, out=out[q * m + r0:q * m + r1])
        _close(marks, main)
    main.wait_stream(side)
    return out


def _copy_engine_gather(comm: Communicator, g: torch.Tensor, rows: torch.Tensor) -> None:
    """Block ``comm.rank`` of ``g`` (W x rows x K, a view of the symmetric workspace) on every
    rank = ``rows``, by copy engines: one ``copy_`` (``cudaMemcpyAsync`` through the peer
    mapping) per rank's workspace, between a start barrier (every rank's reads of ``g`` from its
    previous call are done: its side stream forked after them) and an end barrier (every rank's
    rows have landed before the post that releases this chunk's GEMMs)."""
    from .api import barrier

    barrier(group=comm)
    for peer in comm.ctx.peer_tensors(g):
        peer[comm.rank].copy_(rows)
    barrier(group=comm)


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


__all__ = ["all_gather_gemm", "eager_all_gather_gemm", "eager_gemm_reduce_scatter", "gemm_reduce_scatter"]
