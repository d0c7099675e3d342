"""Bounded memory of the collectives: the plan cache and the staging buffers (pure Python).

Plans are keyed on data pointers, so a program that keeps allocating new tensors would grow
an unbounded dict: :class:`PlanCache` keeps the :data:`~collectives.config.PLAN_CACHE_SIZE`
most recently used.  Evicting a plan frees nothing (it holds no memory of its own), so ranks
may evict differently without consequence.

Staging buffers are symmetric, and symmetric allocations and frees are collective: every rank
must make the same ones in the same order.  :class:`StagingPool` therefore allocates and frees
only at points every rank reaches in the same call: the first call whose size exceeds a
slot's capacity (the capacity is a function of the sizes called so far, which every rank
shares, never of plan-cache hits, which are not shared).  There the slot grows to the next
power of two and the plans holding its superseded buffer are dropped (every rank's next call
plans again on the new buffer).  The superseded buffer is freed once every rank's queued
kernels have finished (a host barrier), unless a launch under CUDA-graph capture on any rank
used it (agreed across ranks): then a graph may replay it and it stays allocated for good, but
no plan uses it again (a rank whose plan-cache hit kept it would move its data through it
while the others used the new buffer).

Why for good: a graph's lifetime cannot be seen from inside its capture (torch gives the
capturing code no handle on the ``CUDAGraph``), ranks destroy their graphs at different times
(garbage collection) while a free must be collective, and what stays is bounded: a slot grows
by doubling, so the buffers it keeps sum to less than its current one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import torch

from ..config import PLAN_CACHE_SIZE, Slot
from ..symmetric.context import address

#: Smallest staging buffer (bytes).
STAGING_MIN_BYTES = 1 << 20


class Holder(Protocol):
    """What the cache needs of a plan: the data pointers of the pool buffers it holds, the
    addresses it uses, whether memory it relies on was freed, and whether it was launched since
    the cache last looked (``used``: :class:`PlanCache`'s recency)."""

    holds: tuple[int, ...]
    uses: tuple[int, ...]
    alive: tuple[Any, ...]
    used: bool

    def expired(self) -> bool: ...


def tensor_key(t: torch.Tensor) -> tuple:
    """What a plan and the checks read of a caller's tensor, as a plan-cache key: address,
    dtype, shape, contiguity, device (``get_device()``: its index, -1 off CUDA; cheaper than
    ``device.index``, which builds a ``torch.device``).  A hit is a call whose tensors
    passed the same checks (a new tensor at a freed one's address, of another size or dtype,
    misses).  An empty tensor's address is its storage's (:func:`~collectives.symmetric.context.address`):
    ``data_ptr()`` is 0 for every empty view, so 0 rows of one receive buffer would hit the plan
    of 0 rows of another (found by the MoE soak on 4 H200s: a combine of 0 tokens launched
    with an earlier buffer's allocation id).  (``data_ptr()`` first: no call to
    :func:`~collectives.symmetric.context.address` for a tensor with elements, whose address
    it is; the key is built at every call.)  The all-reduce, reduce-scatter and all-gather
    build these fields inline in their flat keys (:func:`collectives.api._replan`; a function
    call per tensor saved on every call), which ``tests/collectives/runtime/test_host_path.py``
    holds to this function's."""
    return t.data_ptr() or address(t), t.dtype, t.shape, t.is_contiguous(), t.get_device()


class PlanCache:
    """Prepared plans by call key, at most ``capacity``; past it, the least recently used are
    evicted, approximately and at no cost to a plan hit (:attr:`hit`: no bookkeeping): a
    launch marks its plan used (:attr:`~collectives.algorithms.plan.Plan.used`), and eviction
    drops the oldest unmarked plans, moving each marked one it passes to the newest end; where
    every plan is marked, it clears every mark (a sweep: "used" then means since the last one)
    and drops the oldest.  A plan cached under two keys (a call's and its facts') keeps its
    mark for both."""

    __slots__ = ("_plans", "capacity", "hit")

    def __init__(self, capacity: int = PLAN_CACHE_SIZE) -> None:
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self.capacity = capacity
        #: The plan-hit lookup: the plan stored under a key, or None (the dictionary's own
        #: ``get``: no Python call).  A plan with ``alive`` storages may be expired: the caller
        #: takes it only through :meth:`get`.
        self.hit = self._plans.get

    def get(self, key: Hashable) -> Any:
        """The plan of ``key``, None if there is none or the memory of an adopted buffer it
        uses was freed (then it is dropped); marked used."""
        plan = self._plans.get(key)
        if plan is not None:
            if plan.alive and plan.expired():
                del self._plans[key]
                return None
            plan.used = True
        return plan

    def __setitem__(self, key: Hashable, plan: Any) -> None:
        plans = self._plans
        plans[key] = plan
        plans.move_to_end(key)
        if len(plans) > self.capacity:
            oldest, old = plans.popitem(last=False)
            if old.used:  # (else the common case: the oldest plan, not launched since the last sweep, dropped)
                plans[oldest] = old
                self._evict(key)

    def _evict(self, newest: Hashable) -> None:
        """Drop one plan other than ``newest``'s (just cached, not launched yet): the oldest not
        launched since the last sweep, passing each launched one to the newest end; where every
        one was launched, sweep (clear every mark) and drop the oldest.  (Entered with the oldest
        plan, launched, just passed: ``newest`` is second to last.)"""
        plans = self._plans
        for _ in range(len(plans) - 2):  # (the plans older than newest's)
            oldest, plan = next(iter(plans.items()))
            if not plan.used:
                del plans[oldest]
                return
            plans.move_to_end(oldest)
        for plan in plans.values():
            plan.used = False
        plans.move_to_end(newest)
        plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        """Forget every plan (the next call of each plans anew)."""
        self._plans.clear()

    def drop_using(self, ptr: int, nbytes: int) -> None:
        """Forget every plan that uses an address in the ``nbytes`` at ``ptr`` (freed memory)."""
        for key in [k for k, p in self._plans.items() if any(ptr <= a < ptr + nbytes for a in p.uses)]:
            del self._plans[key]

    def drop_holding(self, ptr: int) -> None:
        """Forget every plan that holds the staging buffer at ``ptr``."""
        for key in [k for k, p in self._plans.items() if ptr in p.holds]:
            del self._plans[key]


class Allocator(Protocol):
    """What the pool needs of the symmetric-memory context (real: :class:`~collectives.symmetric.context.Context`)."""

    def empty(self, shape: int, dtype: torch.dtype) -> torch.Tensor: ...  # collective

    def free(self, t: torch.Tensor) -> None: ...  # collective

    def host_barrier(self) -> None: ...  # every rank's queued GPU work done

    def agree_any(self, flag: bool) -> bool: ...  # collective OR


def capacity(nbytes: int) -> int:
    """Bytes of the staging buffer that serves ``nbytes``: the next power of two, at least
    :data:`STAGING_MIN_BYTES` (so a slot grows O(log size) times, to under twice the largest call)."""
    return max(STAGING_MIN_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())


class StagingPool:
    """The staging buffer of each :class:`~collectives.config.Slot`, grown (and its superseded buffer freed
    or pinned) collectively.

    A freed buffer's views and plans go with the context's notice of the free
    (:attr:`~collectives.symmetric.context.Context.on_free`).  ``agree(slot, nbytes)`` before
    each growth: it raises unless every rank grows the same
    slot to the same size at the same call (a caller's size mismatch makes some ranks grow and
    others not, and the collective steps of growth must not pair with anything else)."""

    SLOTS = len(Slot)

    def __init__(self, ctx: Allocator, plans: PlanCache, agree: Callable[[int, int], None]) -> None:
        self.ctx, self.plans, self.agree = ctx, plans, agree
        self.current: list[torch.Tensor | None] = [None] * self.SLOTS
        self.pinned: list[torch.Tensor] = []  # superseded, used by a captured graph: never freed
        self._captured: set[int] = set()  # data pointers of current buffers a capture used

    def get(self, nbytes: int, which: Slot) -> torch.Tensor:
        """Slot ``which``'s buffer, of at least ``nbytes`` (grown collectively: every rank
        reaches here with the same sizes, or the allocation's size check raises)."""
        old = self.current[which]
        if old is not None and old.numel() >= nbytes:
            return old
        self.agree(which, capacity(nbytes))
        if old is not None:
            self._retire(old)
        self.current[which] = self.ctx.empty(capacity(nbytes), torch.uint8)
        return self.current[which]

    def holder(self, ptr: int) -> int | None:
        """The data pointer of the current buffer that address ``ptr`` lies in, if any."""
        for t in self.current:
            if t is not None and t.data_ptr() <= ptr < t.data_ptr() + t.numel():
                return t.data_ptr()
        return None

    def capture(self, ptrs: tuple[int, ...]) -> None:
        """A launch under CUDA-graph capture used the buffers at ``ptrs`` (from :meth:`holder`):
        never free them."""
        self._captured.update(ptrs)

    def _retire(self, old: torch.Tensor) -> None:
        ptr = old.data_ptr()
        # Every rank plans its next call anew on the new buffer, a pinned one's too: plan-cache
        # hits follow each rank's own tensor addresses and evictions, so a plan kept here would
        # move some ranks' data through the old buffer and the others' through the new one.
        self.plans.drop_holding(ptr)
        if self.ctx.agree_any(ptr in self._captured):
            self._captured.discard(ptr)
            self.pinned.append(old)
            return
        self.ctx.host_barrier()  # no rank's queued kernel still reads or writes it
        self.ctx.free(old)

    @property
    def live_bytes(self) -> int:
        return sum(t.numel() for t in self.current if t is not None) + sum(t.numel() for t in self.pinned)
