"""Symmetric memory on nvshmem4py, bootstrapped from ``torch.distributed`` (torchrun).

Every allocation is collective: all ranks of the context's group call :meth:`Context.empty`
(or :meth:`Context.signal_pad`, :meth:`Context.free`) in the same order with the same size.
The sizes are all-gathered and compared *before* nvshmem is called, so a mismatch raises
:class:`SymmetricMemoryError` on every rank instead of hanging in ``nvshmem_malloc``.

Allocations live until :meth:`Context.free` or :meth:`Context.close`; dropping the Python
tensor does not free them. Peer and multicast views die with their allocation.

NVLink multicast: unless the agreed backend is ``"multicast"``, :func:`init` sets
``NVSHMEM_DISABLE_NVLS=1`` before nvshmem starts, so nvshmem never creates a multicast
object; :meth:`Context.multicast_tensor` re-checks env and capabilities before asking.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from . import capability, groups
from .capability import Backend, Capabilities
from .errors import CollectiveError, MulticastUnavailable, SymmetricMemoryError

__all__ = ["ALIGN", "Context", "Heap", "current", "init", "is_symmetric"]

ALIGN = 16
"""Byte alignment guaranteed for every allocation and required by :meth:`Context.peer_pointers`."""

_CTX: Context | None = None
#: Open sub-group contexts by their members' global ranks (:func:`init` with a group).
_GROUPS: dict[tuple[int, ...], Context] = {}


class Heap(Protocol):
    """What :class:`Context` needs from the allocator (real: nvshmem4py; tests: a fake)."""

    def alloc(self, nbytes: int) -> torch.Tensor: ...  # collective; flat uint8 tensor

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor: ...  # rank's raw view

    def multicast(self, raw: torch.Tensor) -> torch.Tensor: ...

    def free(self, raw: torch.Tensor) -> None: ...  # collective

    def synchronize(self) -> None: ...

    def finalize(self) -> None: ...


class _Nvshmem:
    """:class:`Heap` on ``nvshmem.core`` (uid bootstrap broadcast over ``torch.distributed``)."""

    def __init__(self, device: int, rank: int, nranks: int, group: Any) -> None:
        import numpy as np
        import nvshmem.core as nvshmem
        from cuda.core import Device

        self._nv = nvshmem
        dev = Device(device)
        dev.set_current()
        uid = nvshmem.get_unique_id(empty=rank != 0)
        raw = uid._data.view(np.uint8)
        t = torch.from_numpy(raw.copy()).to(_coll_device(group))
        dist.broadcast(t, src=_global_rank(group, 0), group=group)
        raw[:] = t.cpu().numpy()
        nvshmem.init(device=dev, uid=uid, rank=rank, nranks=nranks, initializer_method="uid")
        if (nvshmem.my_pe(), nvshmem.n_pes()) != (rank, nranks):
            raise SymmetricMemoryError(
                f"nvshmem PE {nvshmem.my_pe()}/{nvshmem.n_pes()} != group rank {rank}/{nranks}")

    def alloc(self, nbytes: int) -> torch.Tensor:
        return self._nv.tensor((nbytes,), dtype=torch.uint8)

    def peer(self, raw: torch.Tensor, rank: int) -> torch.Tensor:
        return self._nv.get_peer_tensor(raw, rank)

    def multicast(self, raw: torch.Tensor) -> torch.Tensor:
        return self._nv.get_multicast_tensor(self._nv.Teams.TEAM_WORLD, raw)

    def free(self, raw: torch.Tensor) -> None:
        self._nv.free_tensor(raw)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def finalize(self) -> None:
        self._nv.finalize()


@dataclasses.dataclass
class _Alloc:
    seq: int
    raw: torch.Tensor  # flat uint8, nbytes rounded up to ALIGN
    nbytes: int
    peers: list[torch.Tensor] | None = None
    mc: torch.Tensor | None = None

    @property
    def ptr(self) -> int:
        return self.raw.data_ptr()


def _coll_device(group: Any) -> torch.device:
    return capability._collective_device(group)


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


class Context:
    """An open symmetric heap over ``group``; create it with :func:`init`.

    Attributes: ``rank``, ``world_size``, ``device`` (CUDA ordinal), ``group``,
    ``caps`` (agreed :class:`Capabilities`), ``backend`` (``"multicast"`` or ``"peer"``).
    """

    def __init__(self, *, heap: Heap, group: Any, rank: int, world_size: int, device: int,
                 caps: Capabilities, backend: Backend, owns_group: bool = False) -> None:
        self.heap, self.group, self.rank, self.world_size = heap, group, rank, world_size
        self.device, self.caps, self.backend = device, caps, backend
        self._owns_group = owns_group
        self._allocs: dict[int, _Alloc] = {}
        self._seq = 0
        self._bounded = 0  # agree_bounded calls so far
        self.closed = False
        # The sub-group pool (base context only, :meth:`reserve`) and this rank's free ranges of it.
        self.pool: torch.Tensor | None = None
        self.ranges = groups.Ranges(0)

    def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` (rounded down to :data:`ALIGN`) of symmetric memory that
        sub-group contexts allocate in (collective; once, at start; 0 reserves nothing)."""
        nbytes -= nbytes % ALIGN
        if nbytes:
            self.pool = self.empty(nbytes, torch.uint8)
            self.ranges = groups.Ranges(nbytes)

    # ---- collective agreement -------------------------------------------------------
    def _agree(self, what: str, values: Sequence[int]) -> None:
        """All-gather ``values``; raise SymmetricMemoryError on every rank if any differ."""
        if self.world_size == 1:
            return
        mine = torch.tensor(list(values), dtype=torch.int64, device=_coll_device(self.group))
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine, group=self.group)
        got = [r.tolist() for r in rows]
        if any(g != got[0] for g in got):
            raise SymmetricMemoryError(f"{what}: ranks disagree, per rank {got}")

    def agree_any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (collective: every rank asks, in the same order)."""
        self._check_open()
        if self.world_size == 1:
            return flag
        mine = torch.tensor([int(flag)], dtype=torch.int64, device=_coll_device(self.group))
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine, group=self.group)
        return any(int(r.item()) for r in rows)

    def agree_bounded(self, what: str, values: Sequence[int], timeout_s: float) -> None:
        """Every rank's ``values`` through the process group's key-value store, waiting at most
        ``timeout_s``; raise SymmetricMemoryError where ranks disagree or some do not arrive.
        The ``k``-th call of each rank meets only the ``k``-th of the others, and a rank that
        never arrives blocks nothing of the group's (unlike a collective it would later pair
        with something else)."""
        self._check_open()
        if self.world_size == 1:
            return
        ranks = [_global_rank(self.group, r) for r in range(self.world_size)]
        keys = [f"collectives/agree/{ranks}/{self._bounded}/{r}" for r in range(self.world_size)]
        self._bounded += 1
        store = dist.distributed_c10d._get_default_store()
        store.set(keys[self.rank], json.dumps(list(values)))
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as e:  # the store's timeout error type varies by store
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise SymmetricMemoryError(f"{what}: ranks {missing} did not arrive within {timeout_s:g}s") from e
        got = [json.loads(store.get(k)) for k in keys]
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
        self._agree("free() (value: allocation #)", [a.seq])
        self.heap.synchronize()
        self._release(a)

    def _release(self, a: _Alloc) -> None:
        self._allocs.pop(a.ptr, None)
        a.peers = a.mc = None  # drop child views before the parent goes
        self.heap.free(a.raw)

    # ---- lookup ---------------------------------------------------------------------
    def _find(self, t: torch.Tensor) -> tuple[_Alloc, int]:
        """Allocation containing all of ``t`` and ``t``'s byte offset in it."""
        self._check_open()
        if not isinstance(t, torch.Tensor):
            raise SymmetricMemoryError(f"expected a torch.Tensor, got {type(t).__name__}")
        p, n = t.data_ptr(), _extent(t)
        pool = self.pool.data_ptr() if self.pool is not None else None
        for a in self._allocs.values():  # (not the sub-group pool: symmetric over its groups only)
            if a.ptr <= p and p + n <= a.ptr + a.nbytes and (n or p < a.ptr + a.nbytes) and a.ptr != pool:
                return a, p - a.ptr
        raise SymmetricMemoryError(
            f"tensor at {p:#x} ({n} bytes, {t.device}) is not (entirely) in this context's symmetric heap")

    def is_symmetric(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lies entirely within one live allocation of this context."""
        try:
            self._find(t)
            return True
        except SymmetricMemoryError:
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

        Each view is a load/store mapping of the peer's memory (``nvshmem_ptr``).
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
                    peers.append(a.raw)  # never via nvshmem: that would bump the parent's refcount
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
        ptrs = [p.data_ptr() for p in self.peer_tensors(t)]
        bad = [(r, hex(p)) for r, p in enumerate(ptrs) if p % align]
        if bad:
            raise SymmetricMemoryError(f"peer pointers not {align}-byte aligned: {bad}")
        return ptrs

    def multicast_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Multicast (NVLS) view of ``t``, for ``multimem.*`` kernels only.

        Raises MulticastUnavailable unless the environment allows multicast, the agreed
        capabilities say it is available and this context's backend is ``"multicast"``.
        """
        reason = capability.multicast_disabled_by_env()
        if reason is None and not self.caps.multicast:
            reason = self.caps.multicast_reason or "capabilities say multicast is unavailable"
        if reason is None and self.backend != "multicast":
            reason = f"context backend is {self.backend!r}; init(backend='multicast') to use multicast"
        if reason is not None:
            raise MulticastUnavailable(reason)
        a, off = self._find(t)
        if a.mc is None:
            try:
                a.mc = self.heap.multicast(a.raw)
            except Exception as e:
                raise MulticastUnavailable(f"nvshmem multicast view failed: {e}") from e
        return self._view_like(a.mc, t, off)

    # ---- lifecycle ------------------------------------------------------------------
    def host_barrier(self) -> None:
        """Finish this rank's queued GPU work, then wait for every rank (host side)."""
        self._check_open()
        self.heap.synchronize()
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Free every allocation (collective, reverse order), finalize nvshmem. Idempotent."""
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
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._allocs)} allocations"
        return (f"Context(rank={self.rank}/{self.world_size}, device={self.device}, "
                f"backend={self.backend!r}, {state})")


def _topology(group: Any, device: int, world_size: int) -> tuple[list[int], list[str]]:
    """Local device ordinals of all ranks' GPUs, and problems found (other hosts, invisible GPUs)."""
    mine = (socket.gethostname(), capability._pci_bus_id(device))
    everyone: list[Any] = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(everyone, mine, group=group)
    else:
        everyone = [mine]
    hosts = {h for h, _ in everyone}
    if len(hosts) > 1:
        return [], [f"ranks span {len(hosts)} hosts; the peer backend needs one NVLink domain"]
    from cuda.bindings import driver

    peers, problems = [], []
    for r, (_, bus) in enumerate(everyone):
        err, dev = driver.cuDeviceGetByPCIBusId(bus.encode())
        if err != driver.CUresult.CUDA_SUCCESS:
            problems.append(f"rank {r}'s GPU {bus} is not visible here (CUDA_VISIBLE_DEVICES?)")
        else:
            peers.append(int(dev))
    return peers, problems


def init(group: Any = None, *, backend: str = "auto", device: int | None = None,
         group_heap_bytes: int | None = None) -> Context:
    """Open (or return the open) symmetric-memory context of ``group`` (collective).

    Without ``group``: the base context, the NVSHMEM job of every process of this NVLink
    domain (every process, or this node's when the job spans nodes: :mod:`collectives.topology`);
    collective over every process.  It initializes ``torch.distributed`` from the torchrun
    environment if needed (and then tears it down in :meth:`Context.close`), binds ``device``
    (default ``LOCAL_RANK``), probes and agrees on capabilities, picks the backend with
    :func:`capability.choose_backend`, starts nvshmem with a uid broadcast from rank 0, and
    reserves ``group_heap_bytes`` (default ``COLLECTIVES_GROUP_HEAP_BYTES`` or
    :data:`~collectives.groups.GROUP_HEAP_BYTES`; none where no sub-group of 2 is possible) of
    symmetric memory for sub-groups.

    With ``group`` (a ``torch.distributed`` ProcessGroup or a one-dimensional DeviceMesh) of
    fewer ranks: that group's context (collective over its members; the base context is opened
    first if it is not, which every process must then join), on the peer backend, its rank the
    group rank, its allocations in the members' shares of the reserved pool
    (:mod:`collectives.groups`).  Contexts are kept per group (by global ranks): asking again
    returns the same one.

    Raises:
        MulticastUnavailable: ``backend="multicast"`` but multicast is unavailable (always on
            a sub-group).
        CollectiveError: no usable backend, a context with another backend is open, or a group
            this process is not in, or that reaches outside this domain.
    """
    base = _open_base(backend if group is None else None, device, group_heap_bytes)
    if group is None:
        return base
    members = groups.group_ranks(group)
    if members == _ranks(base):
        return _open_base(backend, device, group_heap_bytes)  # (checks the backend asked for)
    if backend == "multicast":
        raise MulticastUnavailable("a sub-group communicator has no multicast object; use backend='peer' or 'auto'")
    if backend not in ("auto", "peer"):
        raise ValueError(f"backend must be 'auto', 'multicast' or 'peer', not {backend!r}")
    ctx = _GROUPS.get(members)
    if ctx is None or ctx.closed:
        ctx = _GROUPS[members] = _open_group(base, group, members)
    return ctx


def _ranks(ctx: Context) -> tuple[int, ...]:
    """The global ranks of ``ctx``'s group, in rank order."""
    return tuple(dist.get_process_group_ranks(ctx.group)) if ctx.group is not None else tuple(range(ctx.world_size))


def _open_group(base: Context, group: Any, members: tuple[int, ...]) -> Context:
    """A sub-group context on the base context's pool (collective over ``members``)."""
    group = groups.process_group(group)
    pes = groups.pe_map(members, _ranks(base), dist.get_rank())
    if base.pool is None:
        raise CollectiveError(
            "no symmetric memory was reserved for sub-groups: open the base context with "
            "collectives.init(group_heap_bytes=N) (or COLLECTIVES_GROUP_HEAP_BYTES=N) on every process first")
    peers = base.pool_peers()

    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * len(members)
        dist.all_gather_object(out, value, group=group)
        return out

    heap = groups.PoolHeap(base.pool, [peers[p] for p in pes], base.ranges, gather, base.heap.synchronize)
    caps = dataclasses.replace(base.caps, world_size=len(members), multicast=False,
                               multicast_reason="sub-group communicator (peer backend only)")
    return Context(heap=heap, group=group, rank=dist.get_rank(group), world_size=len(members),
                   device=base.device, caps=caps, backend="peer")


def _open_base(backend: str | None, device: int | None, group_heap_bytes: int | None) -> Context:
    """The base context (the one NVSHMEM job), opened if needed (collective over every
    process); ``backend`` None: any open one will do, else it must be the open one's."""
    global _CTX
    if _CTX is not None and not _CTX.closed:
        if backend is not None and capability.choose_backend(backend, _CTX.caps) != _CTX.backend:
            raise CollectiveError(f"a context is already open ({_CTX!r}); close() it first")
        return _CTX
    backend = backend or "auto"

    owns = False
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            raise CollectiveError("torch.distributed is not initialized and this is not a torchrun launch")
        if device is None:
            device = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(device)
        dist.init_process_group(backend="cpu:gloo,cuda:nccl")
        owns = True
    try:
        group = _domain_group()
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if device is None:
            device = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(device)
        peers, problems = _topology(group, device, world)
        caps = capability.probe(device, world, peers)
        if problems:
            why = "; ".join(problems)
            caps = dataclasses.replace(caps, peer_access=False, peer_reason=why, multicast=False,
                                       multicast_reason="; ".join(filter(None, [caps.multicast_reason, why])))
        caps = capability.agree(caps, group)
        chosen = capability.choose_backend(backend, caps)
        if chosen != "multicast":
            os.environ["NVSHMEM_DISABLE_NVLS"] = "1"  # nvshmem must not create multicast objects
        heap = _Nvshmem(device, rank, world, group)
    except BaseException:
        if owns:
            dist.destroy_process_group()
        raise
    ctx = Context(heap=heap, group=group, rank=rank, world_size=world, device=device,
                  caps=caps, backend=chosen, owns_group=owns)
    ctx.reserve(_group_heap_bytes(group_heap_bytes, world))
    _CTX = ctx
    return _CTX


def _group_heap_bytes(requested: int | None, world: int) -> int:
    """Bytes of the sub-group pool: ``requested``, else ``COLLECTIVES_GROUP_HEAP_BYTES``, else
    :data:`~collectives.groups.GROUP_HEAP_BYTES` where a proper sub-group of 2 exists."""
    if requested is None:
        env = os.environ.get("COLLECTIVES_GROUP_HEAP_BYTES")
        requested = int(env) if env else (groups.GROUP_HEAP_BYTES if world > 2 else 0)
    if requested < 0:
        raise CollectiveError(f"group_heap_bytes must be >= 0, not {requested}")
    return requested


def _domain_group() -> Any:
    """The group the NVSHMEM job spans: every process (None) when all share a node, else this
    node's (:func:`collectives.topology.node_size`; creating every node's group: collective)."""
    from . import topology

    world = dist.get_world_size()
    size = topology.node_size(world, hosts=lambda: _all_hosts(world))
    if size == world:
        return None
    nodes = [dist.new_group(list(range(n * size, (n + 1) * size))) for n in range(world // size)]
    return nodes[dist.get_rank() // size]


def _all_hosts(world: int) -> list[str]:
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts


def current() -> Context | None:
    """The open base context, if any."""
    return _CTX if _CTX is not None and not _CTX.closed else None


def is_symmetric(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in the open context's symmetric heap."""
    ctx = current()
    return ctx is not None and ctx.is_symmetric(t)
