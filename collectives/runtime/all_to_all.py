"""The host side of the uneven all-to-all (the kernel and its algorithm:
:mod:`collectives.algorithms.all_to_all`; the API: ``collectives.all_to_all``, through the one
call path of every collective: its plan-cache key, :func:`plan_key`; on a miss, the
algorithm asks the communicator's :class:`Exchange` part for a :class:`AllToAllPlan`).

Each communicator's first all-to-all makes its :class:`Exchange` (a part of the communicator,
released with it) and with it two collective allocations, the same on every
rank whatever the call's sizes: the slot region (:class:`~collectives.layouts.ExchangeLayout`,
a zeroed signal pad whose words also count the all-to-all calls) and a staging buffer of
:data:`STAGING_BYTES` that a plain output receives through.  A symmetric output
(:func:`collectives.empty`) receives directly: the senders store into it.  Every rank must
receive the same way at a call (all symmetric, or all plain): a sender can address only the
allocation its own call receives into, and a pair that differs fails on both ends.

Splits count rows of dimension 0 (as :func:`torch.distributed.all_to_all_single`'s): a list of
ints, or an int64 tensor of ``world`` entries on this rank's GPU (read by the kernel: no host
synchronisation).  A list's device copy is cached by value (:data:`SPLIT_TENSORS` of them), so
a repeated routing copies nothing; one that a CUDA graph captured is kept for the
communicator's life.  Sizes are checked on the
device: a split below 0, splits that sum past a tensor (or a plain output's past the staging
buffer), or a sender and a receiver that disagree fail every pair concerned, on both ends,
with a recoverable error raised after the launch; the pairs that agree complete.
"""

from __future__ import annotations

import importlib
import math
import operator
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Union

import torch

from ..algorithms.all_to_all import ALL_TO_ALL, TRANSPORTS, AllToAllCall, AllToAllKey, grid
from ..algorithms.plan import Plan, capturing
from ..algorithms.protocol import Runtime
from ..errors import CollectiveError
from ..layouts import ExchangeLayout, receiving
from ..symmetric.context import address
from .staging import tensor_key
from .views import filled

#: Bytes of the staging buffer through which a plain output receives (each rank's, allocated
#: at its communicator's first all-to-all; ``COLLECTIVES_ALL_TO_ALL_STAGING_BYTES``, the same on
#: every rank).  A plain output that receives more fails its pairs; a symmetric one has no limit.
STAGING_BYTES = int(os.environ.get("COLLECTIVES_ALL_TO_ALL_STAGING_BYTES", str(64 << 20)), 0)
#: Device copies of list splits kept, by value.
SPLIT_TENSORS = 64

#: Split sizes: a list of ints, an int64 tensor of the world size on the GPU, or None (equal chunks).
Splits = Union[Sequence[int], "torch.Tensor", None]


class Exchange:
    """A communicator's all-to-all part: the slot region and its view, the staging buffer, the
    grid (:func:`~collectives.algorithms.all_to_all.grid`) and the device copies of list splits
    (the kernels: the communicator's cache); ``seed``: the call count it starts at
    (:func:`~collectives.runtime.communicator.seed_epoch`)."""

    def __init__(self, comm: Runtime, seed: int = 0) -> None:
        ctx = comm.ctx
        self.comm = comm
        self.parts, self.pdl = grid(comm.world, comm.residency)
        self.layout = ExchangeLayout(comm.world, self.parts)
        self.region = ctx.signal_pad(self.layout.words * 4, torch.int32)  # collective; zeroed everywhere
        if seed:
            self._seed(seed)
        self.slots = comm.buffer(self.region)
        self.staging = ctx.empty(STAGING_BYTES, torch.uint8)  # collective, the same size everywhere
        self.splits: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        #: Split tensors that a CUDA graph's launch reads, by address: kept for the
        #: communicator's life (a replay reads them whatever the split cache has dropped).
        self.pinned: dict[int, torch.Tensor] = {}

    def _seed(self, calls: int) -> None:
        """Test only (the runtime's ``COLLECTIVES_TEST_SEED_EPOCH``): start the count of
        all-to-all calls at ``calls``, and every ready and arrived word at epoch ``calls``
        (as if a call had just ended there), on every rank before any all-to-all."""
        layout, world = self.layout, self.comm.world
        signed = calls - (1 << 32) if calls >= 1 << 31 else calls
        words = [layout.ready(r) for r in range(world)]
        words += [layout.arrived(s, j) for s in range(world) for j in range(self.parts)]
        self.region[torch.tensor(words, device=self.region.device)] = signed
        self.region[layout.counter[0]] = signed
        self.comm.ctx.host_barrier()  # (syncs this rank's stream first: the writes have landed)

    def plan(self, call: AllToAllCall) -> AllToAllPlan:
        """The checked, ready launch of ``call`` (:func:`prepare`)."""
        return prepare(self.comm, self, call.out, call.inp, call.out_splits, call.in_splits, call.transport,
                       call.bounded)

    def device_splits(self, splits: Splits, rows: int, what: str, device: torch.device) -> torch.Tensor:
        """``splits`` as the kernel's int64[W] of rows on ``device``; None: ``rows`` in equal
        chunks."""
        world = self.comm.world
        if isinstance(splits, torch.Tensor):
            if splits.dtype != torch.int64 or splits.shape != (world,) or splits.device != device:
                raise CollectiveError(f"all_to_all: {what} as a tensor must be int64 of shape ({world},) on {device}, "
                                      f"not {splits.dtype} {tuple(splits.shape)} on {splits.device}")
            if not splits.is_contiguous():
                raise CollectiveError(f"all_to_all: {what} as a tensor must be contiguous")
            return splits
        if splits is None:
            if rows % world:
                raise CollectiveError(f"all_to_all: without {what}, dimension 0 ({rows} rows) must divide by the "
                                      f"world size {world}")
            splits = [rows // world] * world
        values = split_values(splits, what)
        if len(values) != world:
            raise CollectiveError(f"all_to_all: {what} must have world size ({world}) entries, not {len(values)}")
        cached = self.splits.get(values)
        if cached is None:
            cached = self.splits[values] = _upload(values, device, shared=self.comm.residency is not None)
            while len(self.splits) > SPLIT_TENSORS:
                self.splits.popitem(last=False)  # stream-ordered free: a queued kernel still reads it
        self.splits.move_to_end(values)
        return cached


def split_values(splits: Sequence[Any], what: str) -> tuple[int, ...]:
    """A list of splits' values, each an integer (``operator.index``: an int, a numpy or 0-dim
    torch integer); a float (``2.7``) or a bool (``True``) raises CollectiveError instead of
    being truncated to another count."""
    values = []
    for s in splits:
        try:
            if isinstance(s, bool) or (isinstance(s, torch.Tensor) and s.dtype == torch.bool):
                raise TypeError
            values.append(operator.index(s))
        except TypeError:
            raise CollectiveError(f"all_to_all: {what} must be integers, not {s!r}") from None
    return tuple(values)


def _upload(values: tuple[int, ...], device: torch.device, shared: bool = False) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``.  Eager: one copy from pinned memory; with
    ``shared`` (ranks sharing the GPU: another rank's host copy may hold this one's pinning or
    copy, :func:`collectives.runtime.views.filled`) and under CUDA-graph capture (a copy would
    be recorded reading a host buffer that the graph does not own), one fill kernel per value."""
    if shared or capturing():
        return filled(values, device)
    return torch.tensor(values, dtype=torch.int64).pin_memory().to(device, non_blocking=True)


class AllToAllPlan(Plan):
    """One all-to-all call, prepared: a :class:`~collectives.algorithms.plan.Plan` (launched on
    the current stream after the communicator's last collective) that also holds the split
    tensors its arguments point to (``keep``: kept alive while the plan is cached, whatever the
    split cache drops, and for good once a CUDA graph captured the launch: ``pinned``).  Its
    ``uses`` are none (its key holds the context's generation: a free of the context changes
    it); its ``alive``: the storage of an adopted receive allocation
    (:attr:`collectives.runtime.views.Buffer.storage`: the plan holds while it lives).  Never
    movable (:meth:`~collectives.algorithms.plan.Plan.movable_from`: its arguments are not the
    collective layout's)."""

    __slots__ = ("keep", "pinned")

    def __init__(self, fn: Callable[..., Any], args: tuple, comm: Runtime, keep: tuple,
                 pinned: dict[int, torch.Tensor], alive: tuple[Any, ...] = ()) -> None:
        super().__init__(fn, [args], comm, alive=alive)
        self.keep, self.pinned = keep, pinned

    def run(self, capture: bool) -> None:
        """Launch (under capture, first pin the split tensors)."""
        if capture and self.keep:
            self.pinned.update((t.data_ptr(), t) for t in self.keep)
        super().run(capture)


def check_tensors(comm: Runtime, out: torch.Tensor, inp: torch.Tensor) -> str:
    """The dtype name of an all-to-all of ``inp`` into ``out``, after checking both."""
    from ..dtypes import from_torch

    for name, t in (("out", out), ("inp", inp)):
        if not t.is_cuda or t.device.index != comm.device_index:
            raise CollectiveError(f"all_to_all: {name} is on {t.device}; this rank's collectives run on "
                                  f"cuda:{comm.device_index}")
        if not t.is_contiguous():
            raise CollectiveError(f"all_to_all: {name} must be contiguous")
        if t.dim() == 0:
            raise CollectiveError(f"all_to_all: {name} needs a dimension 0 to split")
    if out.dtype != inp.dtype:
        raise CollectiveError(f"all_to_all: out is {out.dtype}, inp is {inp.dtype}")
    if out.shape[1:] != inp.shape[1:]:
        raise CollectiveError(f"all_to_all: out's rows {tuple(out.shape[1:])} differ from inp's {tuple(inp.shape[1:])}")
    o, i = out.data_ptr(), inp.data_ptr()
    if out.numel() and inp.numel() and o < i + inp.nbytes and i < o + out.nbytes:
        raise CollectiveError("all_to_all: out and inp overlap (other ranks store into out while this rank still "
                              "reads inp): pass separate tensors")
    return from_torch(inp.dtype).name


def check_transport(comm: Runtime, transport: str) -> None:
    """Refuse an all-to-all ``transport`` (:data:`~collectives.algorithms.all_to_all.TRANSPORTS`)
    that cannot run on ``comm``: an unknown name; ``nvshmem`` without nvshmem4py (and NVSHMEM's
    device library: :mod:`ptxops.nvshmem`), or on a context whose heap is not NVSHMEM's own
    (a put names a peer's memory by the symmetric allocation's offset in NVSHMEM's heap, and the
    peer by its PE: torch's symmetric memory, a one-GPU world's or a sub-group's pool has
    neither)."""
    if transport not in TRANSPORTS:
        raise CollectiveError(f"all_to_all: transport must be one of {', '.join(map(repr, TRANSPORTS))}, "
                              f"not {transport!r}")
    if transport != "nvshmem":
        return
    from ptxops.errors import NvshmemMissing

    try:
        importlib.import_module("ptxops.nvshmem")
    except NvshmemMissing as missing:
        raise CollectiveError(f"all_to_all: transport='nvshmem' needs nvshmem4py and NVSHMEM's device library "
                              f"(pip install -e '.[nvshmem]'): {missing}") from missing
    from ..symmetric.nvshmem_heap import NvshmemHeap

    heap = comm.ctx.heap
    if not isinstance(heap, NvshmemHeap):
        raise CollectiveError(
            f"all_to_all: transport='nvshmem' puts into NVSHMEM symmetric memory, but this communicator's heap is "
            f"{type(heap).__name__}, not NVSHMEM's (collectives.init(heap='nvshmem') over every rank of the "
            "group: a sub-group or a one-GPU world of threads cannot use it); use transport='nvlink'")


def plan_key(comm: Runtime, out: torch.Tensor, inp: torch.Tensor, out_splits: Splits, in_splits: Splits,
             transport: str = "nvlink", bounded: bool = False) -> tuple:
    """The plan-cache key of an all-to-all of ``inp`` into ``out``: a call like an earlier one
    (the same tensors, split values or split tensors, symmetric allocations and bound,
    ``transport`` and ``bounded``) launches that call's :class:`AllToAllPlan`.  Flat: each tensor's fields of
    :func:`~collectives.runtime.staging.tensor_key` inline (a call per tensor saved on every
    call; ``tests/collectives/runtime/test_host_path.py`` holds them to that function's)."""
    return ("all_to_all", out.data_ptr() or address(out), out.dtype, out.shape, out.is_contiguous(), out.get_device(),
            inp.data_ptr() or address(inp), inp.dtype, inp.shape, inp.is_contiguous(), inp.get_device(),
            _splits_key(out_splits), _splits_key(in_splits), comm.ctx.generation, transport, bounded)


#: The one type whose entries a list of splits holds as its values unchecked (:func:`_splits_key`).
_INT = {int}


def _splits_key(splits: Splits) -> Any:
    """What a launch reads of ``splits``: a tensor's place (the kernel reads its values), a
    list's values."""
    if isinstance(splits, torch.Tensor):
        return tensor_key(splits)
    if splits is None:
        return None
    values = tuple(splits)
    # (a list of ints, the common case, is its own values: no Python call on a plan hit; any
    # other entry is checked: a bool or a float refused, a numpy or 0-dim torch integer taken)
    return values if set(map(type, values)) <= _INT else split_values(values, "splits")


def prepare(comm: Runtime, state: Exchange, out: torch.Tensor, inp: torch.Tensor, out_splits: Splits,
            in_splits: Splits, transport: str = "nvlink", bounded: bool = False) -> AllToAllPlan:
    """The checked, ready launch of an all-to-all of ``inp`` into ``out`` over ``transport``
    (:func:`check_transport`), ``bounded`` (:attr:`AllToAllKey.bounded`: ``out_splits`` a
    tensor, which the kernel writes) or exact."""
    if bounded and (transport != "nvlink" or not isinstance(out_splits, torch.Tensor)):
        raise CollectiveError("all_to_all: bounded=True writes the rows each rank sent into out_splits, which must "
                              f"be an int64 tensor of ({comm.world},) on this GPU (not {type(out_splits).__name__}), "
                              f"over transport='nvlink' (not {transport!r})")
    check_transport(comm, transport)
    dtype = check_tensors(comm, out, inp)
    ctx = comm.ctx
    row = math.prod(inp.shape[1:])
    send = state.device_splits(in_splits, inp.shape[0], "in_splits", inp.device)
    receive = state.device_splits(out_splits, out.shape[0], "out_splits", out.device)
    direct = ctx.is_symmetric(out)
    if direct:
        allocation, recv_n = ctx.allocation(out), out.numel()
    else:
        allocation, recv_n = ctx.allocation(state.staging), min(out.numel(), STAGING_BYTES // out.element_size())
    base, number = allocation
    key = AllToAllKey(dtype, comm.world, state.parts, direct=direct, pdl=state.pdl, transport=transport,
                      bounded=bounded)
    slots, receiver = state.slots, comm.buffer(base)
    args = ALL_TO_ALL.pack(
        recv_table=receiver.table.data_ptr(), recv_id=receiving(number, dtype),
        recv=address(out) if direct else state.staging.data_ptr(), out=out.data_ptr(), src=inp.data_ptr(),
        in_splits=send.data_ptr(), out_splits=receive.data_ptr(), row=row, in_n=inp.numel(), out_n=recv_n,
        slot_table=slots.table.data_ptr(), slots=int(slots.host[comm.rank]), err=comm.error.data_ptr(),
        rank=comm.rank, timeout_ns=int(comm.timeout_s * 1e9))
    # The split tensors made here (a caller's own keeps its place and lifetime).
    keep = tuple(t for t, given in ((send, in_splits), (receive, out_splits)) if t is not given)
    # Ranks sharing the GPU may differ in direct: each loads both kernels before launching either.
    fn = comm.kernel_together(key, replace(key, direct=not direct))
    alive = () if receiver.storage is None else (receiver.storage,)
    return AllToAllPlan(fn, (*args, key.blocks), comm, keep, state.pinned, alive)


__all__ = ["STAGING_BYTES", "AllToAllPlan", "Exchange", "check_tensors", "check_transport",
           "plan_key", "prepare"]
