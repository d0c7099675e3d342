"""Sub-group symmetric memory: one NVSHMEM job, a :class:`~collectives.symmetric.context.Context` per group.

``nvshmem_malloc`` is collective over *every* PE of the job, so a group of fewer ranks cannot
allocate on the NVSHMEM heap by itself (a TP group growing its staging buffer would hang
waiting for the ranks outside it).  Instead the base context reserves one **pool** at start
(``init(group_heap_bytes=...)``: symmetric over every PE, so its address at any PE is known),
and each group carves its allocations out of its members' shares of the pool:

* an allocation of a group is collective over the group only: the members all-gather their
  free ranges of the pool (:class:`Ranges`), and all take the first range free on every
  member (:func:`common_fit`), so its offset is the same on every member: group-symmetric;
* ranks that belong to several groups (a TP group and the world) keep one :class:`Ranges`,
  so no two live allocations of any groups ever overlap on a rank;
* a member's peer address is the pool's address at that member's PE plus the offset
  (:class:`PoolHeap`), so kernels get the group's size, the group rank and a peer table
  indexed by group rank, as on the base context.

Sub-group contexts use the peer backend only (no multicast object spans a sub-group).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import CollectiveError, MulticastUnavailable, SymmetricMemoryError
from .capability import TorchGroup

#: Bytes of the pool the base context reserves for sub-group communicators (per rank) unless
#: ``init(group_heap_bytes=...)`` or ``COLLECTIVES_GROUP_HEAP_BYTES`` says otherwise.
GROUP_HEAP_BYTES = 256 << 20

Range = tuple[int, int]  # [start, end) in bytes


class Ranges:
    """The free byte ranges of this rank's share of the pool (sorted, disjoint, merged)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free: list[Range] = [(0, size)] if size > 0 else []

    def take(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` used; it must lie within one free range."""
        i = bisect.bisect_right(self.free, (start, float("inf"))) - 1
        if i < 0 or not (self.free[i][0] <= start and end <= self.free[i][1]):
            raise SymmetricMemoryError(f"pool range [{start}, {end}) is not free on this rank")
        lo, hi = self.free.pop(i)
        self.free[i:i] = [r for r in ((lo, start), (end, hi)) if r[0] < r[1]]

    def give(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` free again (it must be used), merging with its neighbours."""
        i = bisect.bisect_left(self.free, (start, start))
        if (i > 0 and self.free[i - 1][1] > start) or (i < len(self.free) and self.free[i][0] < end):
            raise SymmetricMemoryError(f"pool range [{start}, {end}) freed twice")
        lo, hi = start, end
        if i < len(self.free) and self.free[i][0] == end:
            hi = self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][1] == start:
            lo = self.free.pop(i - 1)[0]
            i -= 1
        self.free.insert(i, (lo, hi))

    @property
    def used(self) -> int:
        return self.size - sum(e - s for s, e in self.free)


def common_fit(frees: Sequence[Sequence[Range]], nbytes: int) -> int | None:
    """The lowest offset at which ``nbytes`` are free in every list of ``frees`` (one per
    member), or None.  Deterministic: every member computes the same offset from the same lists."""
    common: list[Range] = list(frees[0]) if frees else []
    for other in frees[1:]:
        merged, i, j = [], 0, 0
        while i < len(common) and j < len(other):
            lo, hi = max(common[i][0], other[j][0]), min(common[i][1], other[j][1])
            if lo < hi:
                merged.append((lo, hi))
            if common[i][1] < other[j][1]:
                i += 1
            else:
                j += 1
        common = merged
    return next((s for s, e in common if e - s >= nbytes), None)


class PoolHeap:
    """The :class:`~collectives.symmetric.heap.Heap` of a sub-group: allocations in the members'
    shares of the pool (``pool``: this rank's uint8 view; ``peers[r]``: the pool at group rank
    ``r``'s PE).  ``gather(x)`` all-gathers a picklable ``x`` over the group (one list entry per
    group rank); ``ranges`` is this rank's free list, shared by every group it belongs to."""

    def __init__(self, pool: torch.Tensor, peers: Sequence[torch.Tensor], ranges: Ranges,
                 gather: Callable[[Any], list[Any]], synchronize: Callable[[], None]) -> None:
        self.pool, self.peers, self.ranges, self.gather = pool, list(peers), ranges, gather
        self.synchronize = synchronize

    def _offset(self, raw: torch.Tensor) -> int:
        return raw.data_ptr() - self.pool.data_ptr()

    def alloc(self, nbytes: int) -> torch.Tensor:
        start = common_fit(self.gather(self.ranges.free), nbytes)
        if start is None:
            raise SymmetricMemoryError(
                f"the sub-group pool ({self.ranges.size} bytes per rank, {self.ranges.used} in use here) has no "
                f"{nbytes} bytes free on every member; reserve more with collectives.init(group_heap_bytes=...) "
                "or COLLECTIVES_GROUP_HEAP_BYTES before the first init")
        self.ranges.take(start, start + nbytes)
        return self.pool[start:start + nbytes]

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        off = self._offset(raw)
        return self.peers[rank][off:off + raw.numel()]

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        raise MulticastUnavailable("a sub-group communicator has no multicast object (peer backend only)")

    def adopt(self, t: torch.Tensor) -> None:
        return None  # a sub-group's symmetric memory is its pool's allocations only

    def free(self, raw: torch.Tensor) -> None:
        off = self._offset(raw)
        self.ranges.give(off, off + raw.numel())

    def finalize(self) -> None:
        pass  # the pool belongs to the base context


def process_group(group: TorchGroup) -> Any:
    """The ``torch.distributed`` ProcessGroup ``group`` names: itself, or a one-dimensional
    DeviceMesh's (``mesh["tp"]``).  Raises CollectiveError where this process is not in it."""
    import torch.distributed as dist

    if hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise CollectiveError(
                f"a DeviceMesh of {group.ndim} dimensions names several groups: pass one dimension "
                "(mesh['tp']) or mesh.get_group('tp')")
        group = group.get_group()
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        raise CollectiveError("this process is not a member of the group it passed (torch.distributed.new_group "
                              "returns NON_GROUP_MEMBER to the ranks outside it)")
    return group


def group_ranks(group: TorchGroup) -> tuple[int, ...]:
    """The global ranks of ``group`` (see :func:`process_group`) in group-rank order."""
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(process_group(group)))


def global_rank(group: TorchGroup, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (``group`` None: every process)."""
    import torch.distributed as dist

    return rank if group is None else dist.get_global_rank(group, rank)


def pe_map(members: Sequence[int], base: Sequence[int], me: int) -> list[int]:
    """Base-context ranks (NVSHMEM PEs) of a group's members (global ranks, group order), for
    a base context over global ranks ``base`` (rank order) on the process of global rank ``me``.

    Raises CollectiveError for a group this process is not in, one with a repeated rank, one
    reaching outside the base context (another NVLink domain), or one of fewer than 2 ranks."""
    if me not in members:
        raise CollectiveError(f"global rank {me} is not in the group {list(members)}")
    if len(set(members)) != len(members):
        raise CollectiveError(f"group {list(members)} names a rank twice")
    outside = [r for r in members if r not in base]
    if outside:
        raise CollectiveError(
            f"group {list(members)} reaches ranks {outside} outside this NVLink domain's symmetric memory "
            f"(ranks {list(base)}); a group spanning nodes runs through collectives.hierarchical")
    if len(members) < 2:
        raise CollectiveError(f"a communicator needs 2 or more ranks, not group {list(members)}")
    index = {r: i for i, r in enumerate(base)}
    return [index[r] for r in members]


__all__ = ["GROUP_HEAP_BYTES", "PoolHeap", "Ranges", "common_fit", "global_rank", "group_ranks", "pe_map", "process_group"]
