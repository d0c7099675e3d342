"""Collectives over a group spanning nodes: our kernels inside each node, ``torch.distributed``
(NCCL on GPUs) across nodes, pipelined in chunks so NVLink and the network work at once.

With ``L`` ranks of the group on each of ``N`` nodes (:mod:`collectives.symmetric.topology`):

* ``all_reduce``: per chunk, a reduce-scatter inside the node (each rank gets ``1/L`` of the
  chunk, summed over its node), an all-reduce of that shard across nodes (the ``N`` ranks of
  the same local index), an all-gather inside the node;
* ``reduce_scatter``: per chunk, a reduce-scatter inside the node then one across nodes;
* ``all_gather``: per chunk, an all-gather across nodes then one inside the node.

The steps come from one :func:`schedule` (a software pipeline: at time ``t``, phase ``p`` of
chunk ``t - p``).  The intra-node phases run on the current stream, the inter-node ones on a
side stream; a step whose previous phase ran on the other stream waits for it (a CUDA event),
so chunk ``k``'s network step overlaps chunk ``k + 1``'s NVLink step.  The side stream forks
from the current one at the start of a call and joins it at the end (as in
:mod:`collectives.overlap`).  Each chunk has its own region of the work buffers, so no step
overwrites what another may still read.

Each level is a :class:`Level` (ours, :class:`KernelLevel`; or ``torch.distributed``,
:class:`TorchLevel`): the composition runs with ``torch.distributed`` at both levels on a CPU
(gloo), which tests the composition, not our kernels.  The intra-node kernels take at most half
the SMs (:data:`INTRA_BLOCKS`): the network kernels running beside them need SMs too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from .config import VECTOR_BYTES
from .errors import CollectiveError
from .symmetric import topology
from .symmetric.capability import TorchGroup

if TYPE_CHECKING:
    from .runtime.communicator import Communicator

#: Chunks a call is cut into (fewer when too small).
CHUNKS = 4
#: Thread blocks of the intra-node kernels, as a fraction of the SMs (the rest for NCCL).
INTRA_BLOCKS = 0.5

#: The phases of each collective, in order: (name, whether it crosses nodes).
PHASES = {
    "all_reduce": (("intra_reduce_scatter", False), ("inter_all_reduce", True), ("intra_all_gather", False)),
    "reduce_scatter": (("intra_reduce_scatter", False), ("inter_reduce_scatter", True)),
    "all_gather": (("inter_all_gather", True), ("intra_all_gather", False)),
}


@dataclass(frozen=True)
class Step:
    """Phase ``phase`` (an index into the collective's :data:`PHASES`) of chunk ``chunk``, on the
    side stream when ``side``; ``after`` is the index of the step on the other stream that it
    waits for (None: its previous phase ran on its own stream, or it has none)."""

    phase: int
    chunk: int
    side: bool
    after: int | None


def schedule(collective: str, chunks: int) -> list[Step]:
    """The issue order of ``collective``'s steps over ``chunks`` chunks: at time ``t``, phase
    ``p`` of chunk ``t - p`` for every phase in order, so that consecutive chunks' phases of the
    two levels are in flight together."""
    phases = PHASES[collective]
    steps: list[Step] = []
    where: dict[tuple[int, int], int] = {}
    for t in range(chunks + len(phases) - 1):
        for p, (_, side) in enumerate(phases):
            k = t - p
            if not 0 <= k < chunks:
                continue
            prev = where.get((p - 1, k))
            after = prev if prev is not None and steps[prev].side != side else None
            where[(p, k)] = len(steps)
            steps.append(Step(p, k, side, after))
    return steps


def chunk_bounds(n: int, count: int, quantum: int) -> list[tuple[int, int]]:
    """``[start, end)`` of at most ``count`` consecutive, non-empty chunks covering ``[0, n)``,
    each boundary but ``n`` a multiple of ``quantum``."""
    units = -(-n // quantum)
    count = max(1, min(count, units))
    return [(min(n, c * units // count * quantum), min(n, (c + 1) * units // count * quantum)) for c in range(count)]


class Level(Protocol):
    """One level's collectives (every member calls each with the same sizes)."""

    size: int

    def all_reduce(self, t: torch.Tensor, op: str) -> None: ...

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None: ...

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None: ...


_REDUCE_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX"}


class TorchLevel:
    """A level run by ``torch.distributed`` on process group ``pg`` (NCCL across nodes; gloo on a CPU)."""

    def __init__(self, pg: Any) -> None:
        self.pg, self.size = pg, dist.get_world_size(pg)

    def all_reduce(self, t: torch.Tensor, op: str) -> None:
        dist.all_reduce(t, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]), group=self.pg)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn(out, inp, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]), group=self.pg)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn(out, inp, group=self.pg)


class KernelLevel:
    """A level run by this library's kernels on communicator ``comm`` (one node), each kernel
    on at most ``blocks`` thread blocks."""

    def __init__(self, comm: Communicator, blocks: int | None) -> None:
        self.comm, self.size, self.blocks = comm, comm.world, blocks

    def all_reduce(self, t: torch.Tensor, op: str) -> None:
        from .api import all_reduce

        all_reduce(t, op, group=self.comm)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
        from .api import reduce_scatter

        reduce_scatter(out, inp, op, max_blocks=self.blocks, group=self.comm)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        from .api import all_gather

        all_gather(out, inp, max_blocks=self.blocks, group=self.comm)


@dataclass
class Levels:
    """A group's two levels as seen from this rank: ``intra`` (its node's ranks of the group),
    ``inter`` (the ranks of its local index on every node), and where its blocks go:
    ``order`` lists group ranks by (local index, node)."""

    hierarchy: topology.Hierarchy
    intra: Level
    inter: Level
    order: torch.Tensor  # int64, W entries: order[l * N + n] = hierarchy.intra[n][l]
    world: Any = None  # the default process group they were made under

    @classmethod
    def of(cls, h: topology.Hierarchy, intra: Level, inter: Level) -> Levels:
        order = [h.intra[n][l] for l in range(h.local) for n in range(h.nodes)]
        return cls(h, intra, inter, torch.tensor(order, dtype=torch.int64), dist.group.WORLD)

    def stale(self) -> bool:
        """Whether these levels outlived what they run on: the default process group was
        destroyed and made anew since (their process groups with it), or the intra-node
        communicator's context was closed (``collectives.init`` after ``close``)."""
        closed = isinstance(self.intra, KernelLevel) and self.intra.comm.ctx.closed
        return closed or self.world is not dist.group.WORLD


def levels(group: TorchGroup = None, intra: str = "kernels") -> Levels:
    """The two levels of ``group`` (None: every rank; a ProcessGroup or one-dimensional
    DeviceMesh), on nodes of :func:`collectives.symmetric.topology.node_size` ranks, built on
    first use and again once stale (:meth:`Levels.stale`; collective over the group: its
    members create their node's and their local index's process groups).  ``intra``:
    ``"kernels"`` (ours) or ``"torch"`` (``torch.distributed`` at
    both levels: what a CPU test can run)."""
    from .symmetric.groups import group_ranks

    members = tuple(range(dist.get_world_size())) if group is None else group_ranks(group)
    size = topology.node_size(dist.get_world_size())
    key = (members, size, intra)
    found = _LEVELS.get(key)
    if found is None or found.stale():
        found = _LEVELS[key] = _levels(members, size, intra)
    return found


#: The levels built so far, by (members, node size, intra); rebuilt once stale (Levels.stale).
_LEVELS: dict[tuple[tuple[int, ...], int, str], Levels] = {}


def _levels(members: tuple[int, ...], size: int, intra: str) -> Levels:
    if intra not in ("kernels", "torch"):
        raise CollectiveError(f"intra must be 'kernels' or 'torch', not {intra!r}")
    h = topology.hierarchy(members, size)
    node, local = h.position(members.index(dist.get_rank()))
    # Created by the members alone (use_local_synchronization), each its node's, then its local index's.
    intra_pg = dist.new_group(h.global_ranks(h.intra[node]), use_local_synchronization=True)
    inter_pg = dist.new_group(h.global_ranks(h.inter[local]), use_local_synchronization=True)
    if intra == "torch" or h.local == 1:  # (a communicator needs 2 ranks)
        intra_level: Level = TorchLevel(intra_pg)
    else:
        from .runtime.communicator import communicator

        comm = communicator(intra_pg)
        intra_level = KernelLevel(comm, max(1, int(comm.sms * INTRA_BLOCKS)))
    return Levels.of(h, intra_level, TorchLevel(inter_pg))


class _Streams:
    """Runs steps on the current stream or a side stream, ordered by CUDA events; on a CPU,
    in issue order (each call is synchronous there)."""

    _side: dict[int, torch.cuda.Stream] = {}

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            self.side = self._side.setdefault(device.index, torch.cuda.Stream(device))
            self.side.wait_stream(self.main)  # fork

    def run(self, steps: Sequence[Step], action: Callable[[Step], None]) -> None:
        done: dict[int, Any] = {}
        for i, step in enumerate(steps):
            if not self.cuda:
                action(step)
                continue
            stream = self.side if step.side else self.main
            with torch.cuda.stream(stream):
                if step.after is not None:
                    stream.wait_event(done[step.after])
                action(step)
                done[i] = torch.cuda.Event()
                done[i].record(stream)
        if self.cuda:
            self.main.wait_stream(self.side)  # join


def _quantum(t: torch.Tensor, parts: int = 1) -> int:
    """Chunk boundaries at whole 16-byte vectors of each of ``parts`` blocks."""
    return parts * max(1, VECTOR_BYTES // t.element_size())


def all_reduce(t: torch.Tensor, op: str = "sum", *, group: TorchGroup = None, chunks: int | None = None,
               intra: str = "kernels") -> torch.Tensor:
    """``t`` reduced (sum, min or max) over ``group``'s ranks across nodes, in place
    (:func:`levels` for ``group`` and ``intra``; ``chunks`` default :data:`CHUNKS`)."""
    return run_all_reduce(levels(group, intra), t, op, chunks or CHUNKS)


def run_all_reduce(lv: Levels, t: torch.Tensor, op: str, chunks: int) -> torch.Tensor:
    """:func:`all_reduce` on the levels ``lv``."""
    n, parts = t.numel(), lv.intra.size
    quantum = _quantum(t, parts)
    padded = -(-n // quantum) * quantum
    work = t.view(-1) if padded == n and t.is_contiguous() else torch.zeros(padded, dtype=t.dtype, device=t.device)
    if work.data_ptr() != t.data_ptr():
        work[:n].copy_(t.reshape(-1))
    shards = torch.empty(padded // parts, dtype=t.dtype, device=t.device)
    bounds = chunk_bounds(padded, chunks, quantum)

    def action(step: Step) -> None:
        a, b = bounds[step.chunk]
        shard = shards[a // parts:b // parts]
        if step.phase == 0:
            lv.intra.reduce_scatter(shard, work[a:b], op)
        elif step.phase == 1:
            lv.inter.all_reduce(shard, op)
        else:
            lv.intra.all_gather(work[a:b], shard)

    _Streams(t.device).run(schedule("all_reduce", len(bounds)), action)
    if work.data_ptr() != t.data_ptr():
        t.copy_(work[:n].view(t.shape))
    return t


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, op: str = "sum", *, group: TorchGroup = None,
                   chunks: int | None = None, intra: str = "kernels") -> torch.Tensor:
    """``out`` (M elements) = block ``rank`` of ``inp`` (W*M elements, W blocks by group rank)
    reduced over ``group``'s ranks across nodes (arguments as for :func:`all_reduce`)."""
    return run_reduce_scatter(levels(group, intra), out, inp, op, chunks or CHUNKS)


def run_reduce_scatter(lv: Levels, out: torch.Tensor, inp: torch.Tensor, op: str, chunks: int) -> torch.Tensor:
    """:func:`reduce_scatter` on the levels ``lv``."""
    w, m = len(lv.hierarchy.members), out.numel()
    _check_blocks("reduce_scatter", inp, w, m)
    blocks = inp.reshape(w, m)
    bounds = chunk_bounds(m, chunks, _quantum(out)) if m else []
    # Chunk c's blocks in (local index, node) order: the intra level's L blocks of N blocks each.
    staged = [torch.empty(w * (b - a), dtype=inp.dtype, device=inp.device) for a, b in bounds]
    partial = [torch.empty(lv.inter.size * (b - a), dtype=inp.dtype, device=inp.device) for a, b in bounds]
    order = lv.order.to(inp.device)

    def action(step: Step) -> None:
        a, b = bounds[step.chunk]
        if step.phase == 0:
            torch.index_select(blocks[:, a:b], 0, order, out=staged[step.chunk].view(w, b - a))
            lv.intra.reduce_scatter(partial[step.chunk], staged[step.chunk], op)
        else:
            lv.inter.reduce_scatter(out.view(-1)[a:b], partial[step.chunk], op)

    _Streams(out.device).run(schedule("reduce_scatter", len(bounds)), action)
    return out


def all_gather(out: torch.Tensor, inp: torch.Tensor, *, group: TorchGroup = None, chunks: int | None = None,
               intra: str = "kernels") -> torch.Tensor:
    """Block ``r`` of ``out`` (W*M elements) = group rank ``r``'s ``inp`` (M elements), on every
    rank of ``group`` across nodes (arguments as for :func:`all_reduce`)."""
    return run_all_gather(levels(group, intra), out, inp, chunks or CHUNKS)


def run_all_gather(lv: Levels, out: torch.Tensor, inp: torch.Tensor, chunks: int) -> torch.Tensor:
    """:func:`all_gather` on the levels ``lv``."""
    w, m = len(lv.hierarchy.members), inp.numel()
    _check_blocks("all_gather", out, w, m)
    blocks = out.view(w, m)
    bounds = chunk_bounds(m, chunks, _quantum(inp)) if m else []
    across = [torch.empty(lv.inter.size * (b - a), dtype=inp.dtype, device=inp.device) for a, b in bounds]
    gathered = [torch.empty(w * (b - a), dtype=inp.dtype, device=inp.device) for a, b in bounds]
    order = lv.order.to(inp.device)
    flat = inp.reshape(-1)

    def action(step: Step) -> None:
        a, b = bounds[step.chunk]
        if step.phase == 0:
            lv.inter.all_gather(across[step.chunk], flat[a:b].contiguous())
        else:
            lv.intra.all_gather(gathered[step.chunk], across[step.chunk])
            blocks[:, a:b].index_copy_(0, order, gathered[step.chunk].view(w, b - a))

    _Streams(out.device).run(schedule("all_gather", len(bounds)), action)
    return out


def _check_blocks(collective: str, whole: torch.Tensor, w: int, m: int) -> None:
    """Refuse a whole tensor that is not ``w`` contiguous blocks of ``m`` elements."""
    if whole.numel() != w * m or not whole.is_contiguous():
        raise CollectiveError(
            f"hierarchical {collective}: the whole tensor must be contiguous, {w} ranks x {m} elements, "
            f"not {whole.numel()}")


__all__ = ["CHUNKS", "PHASES", "KernelLevel", "Level", "Levels", "Step", "TorchLevel", "all_gather",
           "all_reduce", "chunk_bounds", "levels", "reduce_scatter", "run_all_gather", "run_all_reduce",
           "run_reduce_scatter", "schedule"]
