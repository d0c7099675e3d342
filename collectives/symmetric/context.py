"""Symmetric memory over a :class:`~collectives.symmetric.heap.Heap` (NVSHMEM through nvshmem4py,
or PyTorch's symmetric memory), bootstrapped from ``torch.distributed`` (torchrun).

Every allocation is collective: all ranks of the context's group call :meth:`Context.empty`
(or :meth:`Context.signal_pad`, :meth:`Context.free`) in the same order with the same size.
The sizes are all-gathered and compared *before* the heap is called, so a mismatch raises
:class:`SymmetricMemoryError` on every rank instead of hanging in ``nvshmem_malloc``.

Allocations live until :meth:`Context.free` or :meth:`Context.close`; dropping the Python
tensor does not free them. Peer and multicast views die with their allocation.  Memory the
heap's allocator made outside the context (torch's ``symm_mem.empty`` + ``rendezvous``, on the
torch heap) is symmetric too, owned and freed by the caller (:meth:`Heap.adopt`).

NVLink multicast: unless the agreed backend is ``"multicast"``,
:func:`~collectives.symmetric.bootstrap.init` sets the heap's switch (``NVSHMEM_DISABLE_NVLS=1``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``) before it starts, so it never creates a multicast
object; :meth:`Context.multicast_tensor` re-checks env and capabilities before asking.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import threading
from collections.abc import Callable, Iterable, Sequence

import torch

from ..errors import MulticastUnavailable, SymmetricMemoryError
from .agreement import Agreement, DistAgreement
from .capability import Backend, Capabilities, TorchGroup, multicast_disabled_by_env
from .groups import Ranges
from .heap import Heap

__all__ = ["ALIGN", "Context", "address", "bind_thread", "bound", "current", "is_symmetric"]

ALIGN = 16
"""Byte alignment guaranteed for every allocation and required by :meth:`Context.peer_pointers`."""

#: The open base context (:func:`~collectives.symmetric.bootstrap.init` sets it).
_CTX: Context | None = None


class _Thread(threading.local):
    """A thread's own current context (a rank of a one-GPU world, :mod:`collectives.testing`),
    before the process's :data:`_CTX`; None by default (a class attribute: reading it in a
    thread that set none raises and catches no AttributeError, 0.4 us of every collective call)."""

    ctx: Context | None = None


_THREAD = _Thread()
#: Open sub-group contexts by their members' global ranks (:func:`~collectives.symmetric.bootstrap.init` with a group).
_GROUPS: dict[tuple[int, ...], Context] = {}


@dataclasses.dataclass
class _Alloc:
    seq: int
    raw: torch.Tensor  # flat uint8, nbytes rounded up to ALIGN
    nbytes: int
    peers: list[torch.Tensor] | None = None
    mc: torch.Tensor | None = None
    adopted: bool = False  # the heap's memory from outside the context (Heap.adopt): the caller's to free
    no_multicast: str | None = None  # an adopted one without a multicast view: why
    ptr: int = dataclasses.field(init=False)  # raw's address (asked once: a lookup compares it)

    def __post_init__(self) -> None:
        self.ptr = self.raw.data_ptr()


class _Allocations(dict[int, _Alloc]):
    """A context's allocations by address, their addresses also kept in order, so that the one
    holding an address is found by bisection (:meth:`holding`), not by a scan: the API asks
    at each call on tensors it has not seen (:meth:`Context.is_symmetric`), with as many
    allocations as the program made.  Allocations never overlap."""

    def __init__(self) -> None:
        super().__init__()
        self._starts: list[int] = []

    def __setitem__(self, ptr: int, a: _Alloc) -> None:
        if ptr not in self:
            bisect.insort(self._starts, ptr)
        super().__setitem__(ptr, a)

    def pop(self, ptr: int, default: _Alloc | None = None) -> _Alloc | None:  # type: ignore[override]
        if ptr in self:
            del self._starts[bisect.bisect_left(self._starts, ptr)]
        return super().pop(ptr, default)

    def clear(self) -> None:
        self._starts.clear()
        super().clear()

    def holding(self, p: int) -> _Alloc | None:
        """The allocation whose bytes (``nbytes`` from its address) hold address ``p``, if any."""
        i = bisect.bisect_right(self._starts, p) - 1
        if i < 0:
            return None
        a = self[self._starts[i]]
        return a if p < a.ptr + a.nbytes else None


def address(t: torch.Tensor) -> int:
    """The device address of ``t``'s first element, also where ``t`` is empty: torch reports
    ``data_ptr()`` 0 for a tensor of no elements (a view of 0 rows of a symmetric tensor would
    otherwise look like memory outside every allocation)."""
    if t.numel():
        return t.data_ptr()
    return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()


def _extent(t: torch.Tensor) -> int:
    """Bytes from :func:`address` ``(t)`` to one past its last element."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


class Context:
    """An open symmetric heap over ``group``; create it with :func:`init`.

    Attributes: ``rank``, ``world_size``, ``device`` (CUDA ordinal), ``group``,
    ``caps`` (agreed :class:`Capabilities`), ``backend`` (``"multicast"`` or ``"peer"``),
    ``agreement`` (the host agreement: :class:`~collectives.symmetric.agreement.DistAgreement`
    over ``group`` by default), ``ranks_on_device`` (ranks of the context sharing this rank's
    GPU within one CUDA context, the threads of a one-GPU world: their kernels must then be
    resident together, :mod:`collectives.algorithms.residency`; processes sharing a GPU
    time-slice it instead).
    """

    def __init__(self, *, heap: Heap, group: TorchGroup, rank: int, world_size: int, device: int,
                 caps: Capabilities, backend: Backend,
                 agreement: Agreement | None = None, ranks_on_device: int = 1) -> None:
        self.heap, self.group, self.rank, self.world_size = heap, group, rank, world_size
        self.device, self.caps, self.backend = device, caps, backend
        self.agreement = agreement or DistAgreement(group, rank, world_size)
        self.ranks_on_device = ranks_on_device
        self._allocs = _Allocations()
        self._seq = 0
        #: Advances at every allocation and free: what was looked up in this context's
        #: allocations (a tensor's symmetry, its allocation) holds while it stands still.
        self.generation = 0
        #: Called with (address, bytes) of each allocation as it is freed, before the heap may
        #: hand its addresses out again: the communicators' caches of peer tables and plans
        #: (a new allocation at the same local address has other ranks' addresses elsewhere).
        self.on_free: list[Callable[[int, int], None]] = []
        self.closed = False
        # The sub-group pool (base context only, :meth:`reserve`) and this rank's free ranges of it.
        self.pool: torch.Tensor | None = None
        self._pool_at: int | None = None  # its address
        self.ranges = Ranges(0)

    def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` (rounded down to :data:`ALIGN`) of symmetric memory that
        sub-group contexts allocate in (collective; once, at start; 0 reserves nothing)."""
        nbytes -= nbytes % ALIGN
        if nbytes:
            self.pool = self.empty(nbytes, torch.uint8)
            self._pool_at = self.pool.data_ptr()
            self.ranges = Ranges(nbytes)

    # ---- collective agreement -------------------------------------------------------
    def _agree(self, what: str, values: Sequence[int]) -> None:
        """All-gather ``values``; raise SymmetricMemoryError on every rank if any differ."""
        if self.world_size == 1:
            return
        got = self.agreement.all_gather(what, values)
        if any(g != got[0] for g in got):
            raise SymmetricMemoryError(f"{what}: ranks disagree, per rank {got}")

    def agree_any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (collective: every rank asks, in the same order)."""
        self._check_open()
        if self.world_size == 1:
            return flag
        return any(row[0] for row in self.agreement.all_gather("agree_any", [int(flag)]))

    def agree_bounded(self, what: str, values: Sequence[int], timeout_s: float) -> None:
        """Every rank's ``values``, waiting at most ``timeout_s``
        (:meth:`~collectives.symmetric.agreement.Agreement.bounded`: through the process group's
        key-value store, or a one-GPU world's meeting); raise a CollectiveError where ranks
        disagree or some do not arrive.  The ``k``-th call of each rank meets only the ``k``-th
        of the others of the same context, and a rank that never arrives blocks nothing of the
        group's (unlike a collective it would later pair with something else)."""
        self._check_open()
        if self.world_size == 1:
            return
        got = self.agreement.bounded(what, values, timeout_s)
        if any(g != got[0] for g in got):
            raise SymmetricMemoryError(f"{what}: ranks disagree, per rank {got}")

    def _check_open(self) -> None:
        if self.closed:
            raise SymmetricMemoryError("symmetric memory context is closed")

    # ---- allocation -----------------------------------------------------------------
    def _alloc(self, what: str, nbytes: int) -> _Alloc:
        self._check_open()
        self._agree(f"{what} (values: nbytes, allocation #)", [nbytes, self._seq])
        if nbytes <= 0:
            raise SymmetricMemoryError(f"{what}: cannot allocate {nbytes} bytes of symmetric memory")
        padded = -(-nbytes // ALIGN) * ALIGN
        raw = self.heap.alloc(padded)
        a = _Alloc(self._seq, raw, nbytes)
        self._allocs[a.ptr] = a
        self._seq += 1
        self.generation += 1
        if a.ptr % ALIGN:
            raise SymmetricMemoryError(f"{what}: heap returned pointer {a.ptr:#x}, not {ALIGN}-byte aligned")
        return a

    def empty(self, shape: int | Iterable[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Uninitialized symmetric tensor (collective: same shape bytes on every rank)."""
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        a = self._alloc(f"empty({shape}, {dtype})", nbytes)
        return a.raw[:nbytes].view(dtype).view(shape)

    def signal_pad(self, nbytes: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """Zeroed 1-D int32/uint32 symmetric tensor for barrier flags (collective).

        Returns after every rank has zeroed its pad. The host never resets it again:
        kernels are expected to use monotonic epochs.
        """
        if dtype not in (torch.int32, torch.uint32):
            raise SymmetricMemoryError(f"signal_pad dtype must be int32 or uint32, not {dtype}")
        if nbytes <= 0 or nbytes % 4:
            raise SymmetricMemoryError(f"signal_pad nbytes must be a positive multiple of 4, not {nbytes}")
        a = self._alloc(f"signal_pad({nbytes})", nbytes)
        a.raw.view(torch.int32).zero_()
        self.host_barrier()
        return a.raw[:nbytes].view(dtype)

    def free(self, t: torch.Tensor) -> None:
        """Free the allocation ``t`` belongs to (collective); its views become invalid."""
        a, _ = self._find(t)
        if a.adopted:
            raise SymmetricMemoryError(
                "this tensor is symmetric memory its caller allocated (torch's symm_mem.empty), not this "
                "context: it is freed when its last reference goes")
        self._agree("free() (value: allocation #)", [a.seq])
        self.heap.synchronize()
        self._release(a)

    def _release(self, a: _Alloc) -> None:
        self._allocs.pop(a.ptr, None)
        self.generation += 1
        for forget in list(self.on_free):
            forget(a.ptr, a.raw.numel())
        a.peers = a.mc = None  # drop child views before the parent goes
        self.heap.free(a.raw)

    # ---- lookup ---------------------------------------------------------------------
    def _find(self, t: torch.Tensor) -> tuple[_Alloc, int]:
        """Allocation containing all of ``t`` and ``t``'s byte offset in it (:meth:`_lookup`);
        raise SymmetricMemoryError where there is none."""
        found = self._lookup(t)
        if found is None:
            raise SymmetricMemoryError(f"tensor at {address(t):#x} ({_extent(t)} bytes, {t.device}) is not (entirely) "
                                       "in this context's symmetric heap")
        return found

    def _lookup(self, t: torch.Tensor) -> tuple[_Alloc, int] | None:
        """Allocation containing all of ``t`` and ``t``'s byte offset in it: one of this
        context's, else the heap's memory from outside it (:meth:`Heap.adopt`, looked up anew
        each time: its owner may free it); None where ``t`` is in neither."""
        if self.closed:  # (asked at each call on new tensors: no call where open)
            self._check_open()
        if not isinstance(t, torch.Tensor):
            raise SymmetricMemoryError(f"expected a torch.Tensor, got {type(t).__name__}")
        p = t.data_ptr() or address(t)  # (address: an empty tensor's)
        a = self._allocs.holding(p)
        # (not the sub-group pool: symmetric over its groups only)
        if a is not None and a.ptr != self._pool_at and p + _extent(t) <= a.ptr + a.nbytes:
            return a, p - a.ptr
        adopted = self.heap.adopt(t)
        if adopted is not None:
            a = _Alloc(-1, adopted.raw, adopted.raw.numel(), peers=adopted.peers, mc=adopted.multicast,
                       adopted=True, no_multicast=adopted.no_multicast)
            return a, p - a.ptr
        return None

    def is_adopted(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is symmetric memory from outside this context (:meth:`Heap.adopt`):
        freed by its owner, with its last reference, without telling the context."""
        return self._find(t)[0].adopted

    def allocation(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The whole allocation ``t`` lies in (its bytes as allocated, without the heap's
        alignment padding: a symmetric tensor in its own right) and its number (the same on
        every rank: allocations are collective and numbered in order)."""
        a, _ = self._find(t)
        return a.raw[:a.nbytes], a.seq

    def is_symmetric(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lies entirely within one live allocation of this context, or in the
        heap's symmetric memory from outside it (torch's ``symm_mem.empty`` + ``rendezvous``)."""
        try:  # (no exception where it is not: the API asks at every call on new tensors)
            return self._lookup(t) is not None
        except SymmetricMemoryError:  # a closed context, not a tensor, a torch block it overruns
            return False

    def _view_like(self, base: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
        es = t.element_size()
        if offset % es:
            raise SymmetricMemoryError(f"tensor offset {offset} is not a multiple of its element size {es}")
        bv = base.view(t.dtype)
        return bv.as_strided(t.shape, t.stride(), bv.storage_offset() + offset // es)

    # ---- peer / multicast views -----------------------------------------------------
    def peer_tensors(self, t: torch.Tensor) -> list[torch.Tensor]:
        """``t`` as seen in every rank's buffer (index = rank; own rank is ``t``'s memory).

        Each view is a load/store mapping of the peer's memory (``nvshmem_ptr``, torch's ``get_buffer``).
        """
        a, off = self._find(t)
        return [self._view_like(p, t, off) for p in self._peers(a)]

    def pool_peers(self) -> list[torch.Tensor]:
        """The sub-group pool (:meth:`reserve`) at every rank (index = rank)."""
        if self.pool is None:
            raise SymmetricMemoryError("no sub-group pool was reserved")
        return self._peers(self._allocs[self.pool.data_ptr()])

    def _peers(self, a: _Alloc) -> list[torch.Tensor]:
        """Allocation ``a`` at every rank (index = rank), mapped once."""
        if a.peers is None:
            peers = []
            for r in range(self.world_size):
                if r == self.rank:
                    peers.append(a.raw)  # never via the heap (nvshmem would bump the parent's refcount)
                    continue
                try:
                    peers.append(self.heap.peer(a.raw, r))
                except Exception as e:
                    raise SymmetricMemoryError(
                        f"rank {r}'s buffer is not load/store addressable from rank {self.rank} "
                        f"(no P2P/NVLink mapping): {e}") from e
            a.peers = peers
        return a.peers

    def peer_pointers(self, t: torch.Tensor, align: int = ALIGN) -> list[int]:
        """Device addresses of ``t`` in every rank's buffer (index = rank), for kernels.

        Raises SymmetricMemoryError if an address is not ``align``-byte aligned.
        """
        ptrs = [address(p) for p in self.peer_tensors(t)]
        bad = [(r, hex(p)) for r, p in enumerate(ptrs) if p % align]
        if bad:
            raise SymmetricMemoryError(f"peer pointers not {align}-byte aligned: {bad}")
        return ptrs

    def multicast_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Multicast (NVLS) view of ``t``, for ``multimem.*`` kernels only.

        Raises MulticastUnavailable unless the environment allows multicast, the agreed
        capabilities say it is available and this context's backend is ``"multicast"``.
        """
        reason = multicast_disabled_by_env()
        if reason is None and not self.caps.multicast:
            reason = self.caps.multicast_reason or "capabilities say multicast is unavailable"
        if reason is None and self.backend != "multicast":
            reason = f"context backend is {self.backend!r}; init(backend='multicast') to use multicast"
        if reason is not None:
            raise MulticastUnavailable(reason)
        a, off = self._find(t)
        if a.mc is None and a.adopted:
            raise MulticastUnavailable(a.no_multicast)
        if a.mc is None:
            try:
                a.mc = self.heap.multicast(a.raw)
            except Exception as e:
                raise MulticastUnavailable(f"the heap's multicast view failed: {e}") from e
        return self._view_like(a.mc, t, off)

    # ---- lifecycle ------------------------------------------------------------------
    def host_barrier(self) -> None:
        """Finish this rank's queued GPU work, then wait for every rank (host side)."""
        self._check_open()
        self.heap.synchronize()
        if self.world_size > 1:
            self.agreement.barrier("host_barrier")

    def close(self) -> None:
        """Free every allocation (collective, reverse order), finalize the heap. Idempotent."""
        global _CTX
        if self.closed:
            return
        allocs = sorted(self._allocs.values(), key=lambda a: -a.seq)
        self._agree("close() (values: live allocations, next allocation #)", [len(allocs), self._seq])
        try:
            self.heap.synchronize()
            for a in allocs:
                self._release(a)
            self.heap.finalize()
        finally:
            self.closed = True
            if _CTX is self:  # every sub-group context lived in its pool: gone with it
                _CTX = None
                for sub in _GROUPS.values():
                    sub.closed = True
                    sub._allocs.clear()
                _GROUPS.clear()
            for members in [m for m, c in _GROUPS.items() if c is self]:
                del _GROUPS[members]

    def abandon(self) -> None:
        """Mark the context closed and drop its allocations without agreeing with the other
        ranks: for a one-GPU world that broke (no collective step is possible any more), after
        every kernel of the world has ended.  Its memory goes back with the last reference."""
        self.closed = True
        for a in self._allocs.values():
            a.peers = a.mc = None
        self._allocs.clear()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._allocs)} allocations"
        return (f"Context(rank={self.rank}/{self.world_size}, device={self.device}, "
                f"backend={self.backend!r}, {state})")


def current() -> Context | None:
    """The open base context, if any: this thread's (:func:`bind_thread`), else the process's."""
    bound = _THREAD.ctx
    if bound is not None:
        return bound if not bound.closed else None
    return _CTX if _CTX is not None and not _CTX.closed else None


def bound() -> Context | None:
    """This thread's own context (:func:`bind_thread`), if any (open or not)."""
    return _THREAD.ctx


def bind_thread(ctx: Context) -> None:
    """Make ``ctx`` this thread's current context (:func:`current`,
    :func:`~collectives.symmetric.bootstrap.init` without a group, and so every collective
    without ``group=``): a rank of a one-GPU world.  It stays the thread's once closed (then
    :func:`current` is None and ``init`` refuses to open another)."""
    _THREAD.ctx = ctx


def is_symmetric(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in the open context's symmetric heap."""
    ctx = current()
    return ctx is not None and ctx.is_symmetric(t)
