"""Opening symmetric memory (collective): :func:`init` binds the device, exchanges the topology
(every rank's GPU and host), probes and agrees on capabilities, picks the backend and starts the
heap of the base context (NVSHMEM, or PyTorch's symmetric memory: :data:`HEAPS`); with a group it
opens that group's context on the base context's sub-group pool
(:mod:`collectives.symmetric.groups`)."""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from ..errors import CollectiveError, MulticastUnavailable
from . import context
from .capability import MULTICAST_OFF, TorchGroup, agree, choose_backend, cuda_missing, pci_bus_id, probe
from .context import Context
from .groups import GROUP_HEAP_BYTES, PoolHeap, group_ranks, pe_map, process_group
from .topology import node_size

__all__ = ["HEAPS", "choose_heap", "default_device", "init"]

#: The heaps a base context can open: NVSHMEM through nvshmem4py, or PyTorch's symmetric memory.
HEAPS = ("nvshmem", "torch")


def choose_heap(heap: str) -> str:
    """``heap`` itself, or for ``"auto"``: ``"nvshmem"`` where nvshmem4py is installed, else
    ``"torch"``.  CollectiveError for anything else, naming the choices."""
    if heap == "auto":
        return "nvshmem" if importlib.util.find_spec("nvshmem") is not None else "torch"
    if heap not in HEAPS:
        raise CollectiveError(f"heap must be 'auto' or one of {', '.join(map(repr, HEAPS))}, not {heap!r}")
    return heap


def _start_heap(kind: str, device: int, rank: int, world: int, group: TorchGroup, multicast: bool) -> Any:
    """The base context's heap of ``kind`` (collective); unless ``multicast``, the heap's switch
    is set first so that it creates no multicast object."""
    if kind == "nvshmem":
        from .nvshmem_heap import NvshmemHeap

        _multicast_switch(NvshmemHeap.MULTICAST_SWITCH, multicast)
        return NvshmemHeap(device, rank, world, group)
    from .torch_heap import TorchHeap

    _multicast_switch(TorchHeap.MULTICAST_SWITCH, multicast)
    return TorchHeap(device, rank, (group or dist.group.WORLD).group_name)


def _multicast_switch(name: str, multicast: bool) -> None:
    if not multicast:
        os.environ[name] = MULTICAST_OFF[name]


def _topology(group: TorchGroup, device: int, world_size: int) -> tuple[list[int], list[str]]:
    """Local device ordinals of all ranks' GPUs, and problems found (other hosts, invisible GPUs)."""
    mine = (socket.gethostname(), pci_bus_id(device))
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


def init(group: TorchGroup = None, *, backend: str = "auto", device: int | None = None,
         group_heap_bytes: int | None = None, heap: str = "auto") -> Context:
    """Open (or return the open) symmetric-memory context of ``group`` (collective).

    Without ``group``: the base context, the one heap (an NVSHMEM job, or torch's symmetric
    memory) of every process of this NVLink domain (every process, or this node's when the job spans nodes: :mod:`collectives.symmetric.topology`);
    collective over every process.  It initializes ``torch.distributed`` from the torchrun
    environment if needed (and then tears it down in :meth:`Context.close`), binds ``device``
    (default ``LOCAL_RANK``), probes and agrees on capabilities, picks the backend with
    :func:`choose_backend`, starts its ``heap`` (:func:`choose_heap`: ``"nvshmem"``, nvshmem4py
    started with a uid broadcast from rank 0; ``"torch"``, PyTorch's symmetric memory; ``"auto"``,
    NVSHMEM where nvshmem4py is installed, else torch), and
    reserves ``group_heap_bytes`` (default ``COLLECTIVES_GROUP_HEAP_BYTES`` or
    :data:`~collectives.symmetric.groups.GROUP_HEAP_BYTES`; none where no sub-group of 2 is possible) of
    symmetric memory for sub-

    With ``group`` (a ``torch.distributed`` ProcessGroup or a one-dimensional DeviceMesh) of
    fewer ranks: that group's context (collective over its members; the base context is opened
    first if it is not, which every process must then join), on the peer backend, its rank the
    group rank, its allocations in the members' shares of the reserved pool
    (:mod:`collectives.symmetric.groups`).  Contexts are kept per group (by global ranks): asking again
    returns the same one.

    Raises:
        MulticastUnavailable: ``backend="multicast"`` but multicast is unavailable (always on
            a sub-group).
        CollectiveError: no GPU here (the message says what is missing), no usable backend, an
            unknown heap, a context with another backend is open, or a group this process is
            not in, or that reaches outside this domain.
    """
    base = _open_base(backend if group is None else None, device, group_heap_bytes, heap)
    if group is None:
        return base
    members = group_ranks(group)
    if members == _ranks(base):
        return _open_base(backend, device, group_heap_bytes, heap)  # (checks the backend asked for)
    if backend == "multicast":
        raise MulticastUnavailable("a sub-group communicator has no multicast object; use backend='peer' or 'auto'")
    if backend not in ("auto", "peer"):
        raise ValueError(f"backend must be 'auto', 'multicast' or 'peer', not {backend!r}")
    ctx = context._GROUPS.get(members)
    if ctx is None or ctx.closed:
        ctx = context._GROUPS[members] = _open_group(base, group, members)
    return ctx


def _ranks(ctx: Context) -> tuple[int, ...]:
    """The global ranks of ``ctx``'s group, in rank order."""
    return tuple(dist.get_process_group_ranks(ctx.group)) if ctx.group is not None else tuple(range(ctx.world_size))


def _open_group(base: Context, group: TorchGroup, members: tuple[int, ...]) -> Context:
    """A sub-group context on the base context's pool (collective over ``members``)."""
    group = process_group(group)
    pes = pe_map(members, _ranks(base), dist.get_rank())
    if base.pool is None:
        raise CollectiveError(
            "no symmetric memory was reserved for sub-groups: open the base context with "
            "collectives.init(group_heap_bytes=N) (or COLLECTIVES_GROUP_HEAP_BYTES=N) on every process first")
    peers = base.pool_peers()

    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * len(members)
        dist.all_gather_object(out, value, group=group)
        return out

    heap = PoolHeap(base.pool, [peers[p] for p in pes], base.ranges, gather, base.heap.synchronize)
    caps = dataclasses.replace(base.caps, world_size=len(members), multicast=False,
                               multicast_reason="sub-group communicator (peer backend only)")
    return Context(heap=heap, group=group, rank=dist.get_rank(group), world_size=len(members),
                   device=base.device, caps=caps, backend="peer")


def default_device(device: int | None, local_rank: int) -> int:
    """The GPU of a rank that did not name one: ``local_rank`` where that many GPUs are
    visible, else GPU 0 where only one is (every rank of the node shares it).

    Raises:
        CollectiveError: ``local_rank`` names no visible GPU and several are visible.
    """
    if device is not None:
        return device
    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    if count == 1:
        return 0
    raise CollectiveError(f"LOCAL_RANK {local_rank} names no GPU: {count} are visible; pass init(device=...)")


def _open_base(backend: str | None, device: int | None, group_heap_bytes: int | None, heap: str) -> Context:
    """The base context (the one heap of this NVLink domain), opened if needed (collective over
    every process); ``backend`` None: any open one will do, else it must be the open one's."""
    base = context.current()
    if base is not None:
        if backend is not None and choose_backend(backend, base.caps) != base.backend:
            raise CollectiveError(f"a context is already open ({base!r}); close() it first")
        return base
    if context.bound() is not None:
        raise CollectiveError(f"this thread's context, a rank of a one-GPU world, is closed ({context.bound()!r})")
    backend = backend or "auto"
    kind = choose_heap(heap)
    if not dist.is_initialized() and "WORLD_SIZE" not in os.environ:
        raise CollectiveError("torch.distributed is not initialized and this is not a torchrun launch")
    missing = cuda_missing()
    if missing is not None:
        raise CollectiveError(f"collectives.init needs a GPU: {missing}")

    if not dist.is_initialized():
        device = default_device(device, int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        start_process_group()
    group = _domain_group()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = default_device(device, int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    peers, problems = _topology(group, device, world)
    caps = probe(device, world, peers)
    if problems:
        why = "; ".join(problems)
        caps = dataclasses.replace(caps, peer_access=False, peer_reason=why, multicast=False,
                                   multicast_reason="; ".join(filter(None, [caps.multicast_reason, why])))
    caps = agree(caps, group)
    chosen = choose_backend(backend, caps)
    started = _start_heap(kind, device, rank, world, group, chosen == "multicast")
    ctx = Context(heap=started, group=group, rank=rank, world_size=world, device=device,
                  caps=caps, backend=chosen)
    ctx.reserve(_group_heap_bytes(group_heap_bytes, world))
    context._CTX = ctx
    return ctx


def start_process_group(backend: str = "cpu:gloo,cuda:nccl") -> None:
    """Start torch.distributed's default group (env://: a torchrun launch) and keep it until the
    process exits, when it is destroyed; a context's ``close()`` leaves it, and a later
    :func:`init` borrows it. Torch cannot start a default group again under torchrun's store
    once one was destroyed: its new gloo pairs may read the old group's addresses there and
    fail with "Connection refused" or "Connection reset by peer" (found under torchrun on 4
    H200s, two test modules each opening and closing the library; ``test_bootstrap_group``)."""
    dist.init_process_group(backend=backend)
    atexit.register(_end_process_group)


def _end_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _group_heap_bytes(requested: int | None, world: int) -> int:
    """Bytes of the sub-group pool: ``requested``, else ``COLLECTIVES_GROUP_HEAP_BYTES``, else
    :data:`~collectives.symmetric.groups.GROUP_HEAP_BYTES` where a proper sub-group of 2 exists."""
    if requested is None:
        env = os.environ.get("COLLECTIVES_GROUP_HEAP_BYTES")
        requested = int(env) if env else (GROUP_HEAP_BYTES if world > 2 else 0)
    if requested < 0:
        raise CollectiveError(f"group_heap_bytes must be >= 0, not {requested}")
    return requested


def _domain_group() -> Any:
    """The group the heap spans: every process (None) when all share a node, else this
    node's (:func:`collectives.symmetric.topology.node_size`; creating every node's group: collective)."""
    world = dist.get_world_size()
    size = node_size(world, hosts=lambda: _all_hosts(world))
    if size == world:
        return None
    nodes = [dist.new_group(list(range(n * size, (n + 1) * size))) for n in range(world // size)]
    return nodes[dist.get_rank() // size]


def _all_hosts(world: int) -> list[str]:
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts

