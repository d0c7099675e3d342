"""The host side of the MoE layer's local kernels: the dispatch's routing
(:mod:`collectives.algorithms.moe_route`), its placement of received rows
(:mod:`collectives.algorithms.moe_place`) and its fp8 rows (:mod:`collectives.algorithms.moe_pack`),
the combine's rows to send back (:mod:`collectives.algorithms.moe_gather`) and its weighted sum
(:mod:`collectives.algorithms.moe_combine`): which calls they take, and their launches.

On unless ``COLLECTIVES_MOE_FUSED=0`` (read at import; :data:`FUSED`), which brings back the
torch steps they replace (:func:`collectives.moe.place_rows`, :func:`collectives.moe.pack_rows`,
:func:`collectives.moe.gather_rows`, the combine's ``3 * topk`` operations).  The fp8 packing
and the gather kernels are checked on the CPU only (their sources in the device simulation,
``tests/collectives/device/test_moe_pack_source.py`` and ``test_moe_gather_source.py``, their
PTX), not yet on a GPU.  Both kernels give the torch steps' bits: checked on one H100 in worlds of 2, 3, 5
and 8 ranks and under ``torchrun`` on 2 x H100 (``tests/collectives/gpu/ranks/test_moe.py``),
their PTX on the CPU, the placement's source in the CPU simulation of the device
(``tests/collectives/device/test_moe_place_source.py``).  Each is compiled and loaded when a
dispatch or combine starts, before its all-to-alls (a load waits for the GPU's running kernels:
:func:`collectives.runtime.kernels.load`), once ranks sharing the GPU have met
(:meth:`~collectives.runtime.communicator.Communicator.kernel_together`).

With ``COLLECTIVES_MOE_REGIONS=1`` (:data:`REGIONS`) a low-latency combine is two kernels
instead (:func:`regions_combine`: :mod:`~collectives.algorithms.moe_send_back` stores the rows
sent back straight into their sources' receive regions, :mod:`~collectives.algorithms.moe_sum_back`
waits for them and sums): checked in the CPU simulation of the device and by their PTX, not yet
on a GPU.

The MoE dispatch and combine are also PyTorch custom operators here (namespace ``collectives``,
next to those of :mod:`collectives.runtime.torch_ops`), with their fake implementations::

    collectives::moe_dispatch(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts,
                              int max_tokens, int world) -> (Tensor, ...)  # expert_x, counts, the handle's 7
    collectives::moe_combine(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid,
                             Tensor send_splits, Tensor recv_splits, Tensor place, Tensor kept) -> Tensor

The dispatch's handle travels as its tensors (:data:`HANDLE_FIELDS`); every shape follows from
the arguments (``world`` one of them: a fake implementation cannot ask the communicator), so
nothing is data-dependent and ``torch.compile(fullgraph=True)`` traces through.  The CUDA
kernels are the eager functions, on the default communicator (``group=None``), registered by
:mod:`collectives.moe` (:func:`collectives.runtime.torch_ops.implement`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..algorithms.moe_combine import DTYPES_ROUNDED, MAX_TOPK, MOE_COMBINE, MoeCombineKey
from ..algorithms.moe_gather import MOE_GATHER, MoeGatherKey
from ..algorithms.moe_pack import DTYPES_QUANTIZED, MOE_PACK, MoePackKey
from ..algorithms.moe_place import MAX_SEGMENTS, MOE_PLACE, MoePlaceKey
from ..algorithms.moe_route import MAX_EXPERTS, MOE_ROUTE, MoeRouteKey
from ..algorithms.moe_send_back import MOE_SEND_BACK, MoeSendBackKey
from ..algorithms.moe_sum_back import MOE_SUM_BACK, MoeSumBackKey
from ..algorithms.plan import capturing, current_stream, follow
from ..algorithms.protocol import Runtime
from ..dtypes import DTYPES, from_torch
from ..errors import CollectiveError
from ..layouts import U32, RegionLayout, region_facts

#: Whether :func:`collectives.moe.dispatch` and :func:`~collectives.moe.combine` run the kernels
#: (unless ``COLLECTIVES_MOE_FUSED=0``).
FUSED = os.environ.get("COLLECTIVES_MOE_FUSED", "1") != "0"
#: Whether a low-latency :func:`~collectives.moe.combine` runs the two-kernel combine
#: (:func:`regions_combine`: the rows sent back stored straight into their sources' receive
#: regions, then the weighted sum behind the waits) instead of the gather, the all-to-all and the
#: weighted sum (``COLLECTIVES_MOE_REGIONS=1``; off by default: its kernels have run in the CPU
#: simulation of the device only, not yet on a GPU).
REGIONS = os.environ.get("COLLECTIVES_MOE_REGIONS", "0") == "1"

_TORCH_ROUNDED = tuple(DTYPES[name].torch for name in DTYPES_ROUNDED)
_TORCH_QUANTIZED = tuple(DTYPES[name].torch for name in DTYPES_QUANTIZED)
_TORCH_REGISTERED = tuple(d.torch for d in DTYPES.values())


#: Bytes every :class:`Carve` field starts on (the kernels' widest access, 16-byte vectors).
ALIGN = 16


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class Carve:
    """Where a call's small tensors written by the kernels (the handle's, the counts; fp8: the
    placed rows' scales) lie in one allocation of int64 words: ``fields``, ``(name, shape,
    dtype)`` each, in that order, each from a multiple of :data:`ALIGN` bytes; ``carve(device)``:
    a call's :class:`Carved` (one ``torch.empty``); ``carve.apart(device)``: each field its own
    allocation (a torch operator's outputs, which must not alias each other).  An int64 field is
    one view of the allocation (``Tensor.as_strided``), another dtype's three (its dtype view,
    which torch's dispatcher runs as two operators, then that)."""

    def __init__(self, fields: list[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        #: Each field's ``(shape, strides, dtype)``, by name.
        self.at: dict[str, tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = {}
        #: Each field's byte offset, by name.
        self.offsets: dict[str, int] = {}
        end = 0
        for name, shape, dtype in fields:
            self.offsets[name] = -(-end // ALIGN) * ALIGN
            self.at[name] = (shape, _contiguous(shape), dtype)
            end = self.offsets[name] + math.prod(shape) * dtype.itemsize
        #: The allocation's words (whole :data:`ALIGN`-byte blocks: a view of any field's dtype fits).
        self.words = max(-(-end // ALIGN), 1) * ALIGN // 8

    def __call__(self, device: torch.device) -> Carved:
        blob = torch.empty(self.words, dtype=torch.int64, device=device)
        carved = _new_carved(Carved)  # (no __init__: a Python frame less per call)
        carved.carve, carved.blob, carved.base, carved.offsets = self, blob, blob.data_ptr(), self.offsets
        return carved

    def apart(self, device: torch.device) -> Carved:
        """The fields in allocations of their own (its ``base`` 0, its offsets their addresses)."""
        tensors = {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, _, dtype) in self.at.items()}
        return Carved(self, tensors, 0, {name: t.data_ptr() for name, t in tensors.items()})

    def view(self, name: str) -> tuple[torch.dtype | None, tuple[int, ...], tuple[int, ...], int]:
        """Field ``name``'s view of the allocation: (the dtype view first, None for int64; then
        ``as_strided``'s size, strides and offset in elements of that dtype)."""
        shape, strides, dtype = self.at[name]
        return None if dtype == torch.int64 else dtype, shape, strides, self.offsets[name] // dtype.itemsize


#: A :class:`Carved` without its ``__init__`` (:meth:`Carve.__call__` sets its slots).
_new_carved = object.__new__


def route_fields(entries: int, world: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The :class:`Carve` fields the routing kernel writes (:func:`route`) for ``entries``."""
    return [("order", (entries,), torch.int64), ("slots", (entries,), torch.int64), ("rows", (entries,), torch.int64),
            ("send_splits", (world,), torch.int64), ("valid", (entries,), torch.bool)]


def entry_room(world: int, max_tokens: int, topk: int) -> int:
    """The entries a low-latency dispatch's placement has room for (its handle's ``place`` and
    ``kept``): every source's ``max_tokens`` tokens, each with ``topk`` entries here (a token may
    name one expert, or several of this rank's, more than once)."""
    return world * max_tokens * topk


def place_fields(room: int, local: int, world: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The :class:`Carve` fields the placement kernel writes (:func:`placement`) for ``room``
    received rows."""
    return [("place", (room,), torch.int64), ("expert_counts", (local,), torch.int64), ("dropped", (), torch.int64),
            ("recv_splits", (world,), torch.int64), ("kept", (room,), torch.bool)]


class Carved:
    """One call's allocation of a :class:`Carve` (``blob``; or a tensor per field,
    :meth:`Carve.apart`): each field's address, ``base + offsets[name]`` (what the kernels
    take), and where asked its tensor (:meth:`tensor`: a view, made on demand: each costs
    microseconds of host time on a slow GPU host).  Per call, never reused: a handle kept by
    its caller (micro-batches) keeps its own."""

    __slots__ = ("carve", "blob", "base", "offsets")

    def __init__(self, carve: Carve, blob: torch.Tensor | dict[str, torch.Tensor], base: int,
                 offsets: dict[str, int]) -> None:
        self.carve, self.blob, self.base, self.offsets = carve, blob, base, offsets

    def tensor(self, name: str) -> torch.Tensor:
        """Field ``name`` as a tensor (a view of the allocation, or its own)."""
        if isinstance(self.blob, dict):
            return self.blob[name]
        dtype, shape, strides, offset = self.carve.view(name)
        return (self.blob if dtype is None else self.blob.view(dtype)).as_strided(shape, strides, offset)


def combine_key(dtype: torch.dtype, hidden: int, topk: int) -> MoeCombineKey | None:
    """The weighted sum's key for rows of ``hidden`` ``dtype`` elements and ``topk`` entries
    per token (16-byte vectors where ``hidden`` is a multiple of one), None where the kernel
    does not take them (fp8 rows, ``topk`` past :data:`~collectives.algorithms.moe_combine.MAX_TOPK`)."""
    if dtype not in _TORCH_ROUNDED or not 1 <= topk <= MAX_TOPK:
        return None
    name = from_torch(dtype).name
    vector = DTYPES[name].elements(16)
    return MoeCombineKey(name, topk, vector if hidden % vector == 0 else 1)


def place_key(world: int, local: int, layout: Any, exact: bool) -> MoePlaceKey | None:
    """The placement's key for ``world`` ranks of ``local`` experts and rows laid out as
    ``layout`` (:class:`collectives.moe.Wire`: its values placed, an fp8 row's scale apart),
    moved in the widest word that divides the row and its values; None past
    :data:`~collectives.algorithms.moe_place.MAX_SEGMENTS` segments or for empty rows."""
    if world * local > MAX_SEGMENTS or layout.values <= 0:
        return None
    return MoePlaceKey(world, local, exact, MoePlaceKey.word_for(math.gcd(layout.bytes, layout.values)),
                       scales=layout.scale)


def pack_key(dtype: torch.dtype, hidden: int, fp8: bool = True) -> MoePackKey | None:
    """The sent rows' kernel's key for tokens of ``hidden`` ``dtype`` values (16-byte vectors
    where ``hidden`` is a multiple of one), quantized with ``fp8``; None where it does not take
    them (dtypes not registered, or not quantizable with ``fp8``; ``fp8`` and ``hidden`` not a
    positive multiple of 4: the scale's store is 4-byte aligned)."""
    if hidden <= 0 or dtype not in _TORCH_REGISTERED or (fp8 and (dtype not in _TORCH_QUANTIZED or hidden % 4)):
        return None
    name = from_torch(dtype).name
    vector = DTYPES[name].elements(16)
    return MoePackKey(name, vector if hidden % vector == 0 else 1, quantize=fp8)


def pack(comm: Runtime, dtype: torch.dtype, hidden: int, fp8: bool):
    """The kernel's :data:`collectives.moe.Pack` on ``comm``'s GPU (its kernel loaded now), None
    where :data:`FUSED` is off or the kernel does not take the tokens."""
    key = pack_key(dtype, hidden, fp8) if FUSED else None
    if key is None:
        return None
    fn, device = comm.kernel_together(key), comm.device_index
    step = key.vec * dtype.itemsize

    def bind(tokens: int, layout: Any, out: torch.Tensor) -> Callable[[torch.Tensor, int, int, int], None]:
        _aligned(step, out)
        args, (i_x, i_carriers, i_slots, i_splits) = MOE_PACK.template(
            dict(rows=out.data_ptr(), world=comm.world, tokens=tokens, topk=layout.topk, hidden=hidden,
                 header=layout.header, row_bytes=layout.bytes),
            "x", "carriers", "slots", "send_splits")
        args.append(key.blocks(tokens))

        def launch(x: torch.Tensor, carriers: int, slots: int, send_splits: int) -> None:
            x = x.contiguous()
            at = x.data_ptr()
            if at % step:
                _aligned(step, x)
            a = args.copy()
            a[i_x], a[i_carriers], a[i_slots], a[i_splits] = at, carriers, slots, send_splits
            fn(*a, current_stream(device))

        return launch

    return bind


def route_key(dtype: torch.dtype, experts: int, world: int) -> MoeRouteKey | None:
    """The routing kernel's key for ids of ``dtype`` and ``experts`` experts on ``world`` ranks
    (any number of entries; :meth:`~collectives.algorithms.moe_route.MoeRouteKey.for_experts`),
    None where it does not take them (other dtypes, past
    :data:`~collectives.algorithms.moe_route.MAX_EXPERTS`)."""
    ids = {torch.int32: "i32", torch.int64: "i64"}.get(dtype)
    if ids is None or not 1 <= experts <= MAX_EXPERTS:
        return None
    return MoeRouteKey.for_experts(ids, experts, world)


def route(comm: Runtime, dtype: torch.dtype, experts: int):
    """The kernel's :data:`collectives.moe.Route` on ``comm``'s GPU (its kernel loaded now), None
    where :data:`FUSED` is off or the kernel does not take the call (:func:`route_key`)."""
    key = route_key(dtype, experts, comm.world) if FUSED else None
    if key is None:
        return None
    fn, device = comm.kernel_together(key), comm.device_index

    def bind(tokens: int, topk: int, num_experts: int, world: int, bins: torch.Tensor,
             head: tuple[torch.Tensor, int, torch.Tensor] | None = None) -> Callable[[torch.Tensor, Carved], None]:
        args, places = MOE_ROUTE.template(
            dict(topk=max(topk, 1), n=tokens * topk, experts=num_experts, local=num_experts // world,
                 bins=bins.data_ptr(), head_rows=0 if head is None else head[1],
                 sent=0 if head is None else head[0].data_ptr(), row_bytes=0 if head is None else head[0].shape[1],
                 row_splits=0 if head is None else head[2].data_ptr()),
            "ids", "stride", "order", "valid", "send_splits", "slots", "rows")
        i_ids, i_stride, *i_fields = places
        fields = tuple(zip(i_fields, ("order", "valid", "send_splits", "slots", "rows")))
        args.append(1)

        def launch(ids: torch.Tensor, into: Carved) -> None:
            if topk > 1 and ids.stride(1) != 1:  # else read at its row stride: no copy of sliced ids
                ids = ids.contiguous()
            a = args.copy()
            a[i_ids], a[i_stride] = ids.data_ptr(), ids.stride(0) if tokens > 1 else max(topk, 1)
            base, at = into.base, into.offsets
            for i, name in fields:
                a[i] = base + at[name]
            fn(*a, current_stream(device))

        return launch

    return bind


def gather(comm: Runtime, row_bytes: int):
    """The kernel's :data:`collectives.moe.Gather` on ``comm``'s GPU for rows of ``row_bytes``
    (moved in the widest word that divides them; its kernel loaded now) that makes only the
    first ``sum(recv_splits)`` rows (int64 on the GPU: the dispatch's, the rows the combine sends
    back), None where :data:`FUSED` is off or the rows are empty."""
    if not FUSED or row_bytes <= 0:
        return None
    key = MoeGatherKey(MoePlaceKey.word_for(row_bytes))
    fn, device = comm.kernel_together(key), comm.device_index

    args, (i_out, i_rows, i_place, i_kept, i_room, i_splits, i_world, i_send, i_copy) = MOE_GATHER.template(
        dict(row_words=row_bytes // key.word), "out", "rows", "place", "kept", "room", "splits", "world",
        "send_splits", "copy")
    blocks = functools.cache(key.blocks)  # (no Python frame once seen: a call's room is its shape's)

    def run(rows: torch.Tensor, place: int, kept: int, send_splits: int, splits: int, copy: torch.Tensor,
            out: torch.Tensor) -> torch.Tensor:
        rows = rows.contiguous()
        room = out.shape[0]
        a = args.copy()
        a[i_out], a[i_rows], a[i_place], a[i_kept], a[i_room] = out.data_ptr(), rows.data_ptr(), place, kept, room
        a[i_splits], a[i_world], a[i_send], a[i_copy] = splits, copy.shape[1], send_splits, copy.data_ptr()
        if a[i_out] % key.word or a[i_rows] % key.word:
            _aligned(key.word, rows, out)
        fn(*a, blocks(room), current_stream(device))
        return out

    return run


def weighted_sum(comm: Runtime, dtype: torch.dtype, hidden: int, topk: int):
    """The kernel's :data:`collectives.moe.WeightedSum` on ``comm``'s GPU (its kernel loaded
    now), None where :data:`FUSED` is off or the kernel does not take the rows."""
    key = combine_key(dtype, hidden, topk) if FUSED else None
    if key is None:
        return None
    fn, device = comm.kernel_together(key), comm.device_index
    step = key.vec * DTYPES[key.dtype].bytes

    args, (i_out, i_entries, i_slots, i_valid, i_weights, i_tokens) = MOE_COMBINE.template(
        dict(hidden=hidden), "out", "entries", "slots", "valid", "weights", "tokens")
    blocks = functools.cache(lambda tokens: key.blocks(tokens, hidden))  # (no Python frame once seen)

    def run(entries: torch.Tensor, slots: int, valid: int, weights: torch.Tensor, tokens: int, k: int) -> torch.Tensor:
        # allocated for the most tokens of the shape (see collectives.moe.dispatch_with), cut to these
        # (no slice where they are the most: a torch view costs microseconds on a slow host)
        most = entries.shape[0] // k
        # (torch.empty_strided: the same allocation in 1.1-2.0 us less host time than torch.empty of
        # a shape on a 2 x H200 host, collectives.tools.bench_launch)
        out = torch.empty_strided((most, hidden), (hidden, 1), dtype=dtype, device=entries.device)
        out = out if most == tokens else out[:tokens]
        if weights.dtype != torch.float32 or not weights.is_contiguous():
            weights = weights.float().contiguous()
        a = args.copy()
        a[i_out], a[i_entries], a[i_slots], a[i_valid] = out.data_ptr(), entries.data_ptr(), slots, valid
        a[i_weights], a[i_tokens] = weights.data_ptr(), tokens
        if a[i_out] % step or a[i_entries] % step:
            _aligned(step, entries, out)
        fn(*a, blocks(tokens), current_stream(device))
        return out

    return run


def placement(comm: Runtime, local: int, layout: Any, exact: bool, dtype: torch.dtype):
    """The kernel's :data:`collectives.moe.Placement` on ``comm``'s GPU for rows laid out as
    ``layout`` (:class:`collectives.moe.Wire`; see :func:`place_key`; its kernel loaded now),
    whose values it places as ``dtype`` elements, None where :data:`FUSED` is off or the kernel
    does not take the call."""
    key = place_key(comm.world, local, layout, exact) if FUSED else None
    if key is None:
        return None
    fn, device = comm.kernel_together(key), comm.device_index

    def bind(counts: torch.Tensor, received: torch.Tensor, room: int, rows_out: int, capacity: int,
             dropped_before: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
        _aligned(key.word, received)
        rows = received.shape[0]
        args, places = MOE_PLACE.template(
            dict(counts=counts.data_ptr(), received=received.data_ptr(), dropped_before=dropped_before.data_ptr(),
                 room=room, rows=rows, capacity=capacity, row_words=layout.bytes // key.word,
                 out_words=layout.values // key.word, topk=layout.topk, header=layout.header),
            "expert_x", "scales", "place", "kept", "expert_counts", "lost", "recv_splits")
        i_x, i_scales, *i_fields = places
        fields = tuple(zip(i_fields, ("place", "kept", "expert_counts", "dropped", "recv_splits")))
        args.append(key.blocks(max(room, rows)))
        # fixed by the shape (see collectives.moe.dispatch_with; throughput: cut to rows_out + 1)
        alloc = max(rows_out, room) + 1 if exact else rows_out + 1

        def launch(into: Carved, expert_x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
            a = args.copy()
            base, at = into.base, into.offsets
            for i, name in fields:
                a[i] = base + at[name]
            scales = None
            if expert_x is None:
                expert_x = torch.empty((alloc, layout.values // dtype.itemsize), dtype=dtype, device=received.device)
                scales = torch.empty(alloc, dtype=torch.float32, device=received.device) if key.scales else None
                if alloc != rows_out + 1:
                    expert_x, scales = expert_x[:rows_out + 1], None if scales is None else scales[:rows_out + 1]
                a[i_scales] = 0 if scales is None else scales.data_ptr()
            elif key.scales:
                a[i_scales] = base + at["scales"]
            a[i_x] = expert_x.data_ptr()
            if a[i_x] % key.word:
                _aligned(key.word, expert_x)
            fn(*a, current_stream(device))
            return expert_x, scales

        return launch

    return bind


class RegionWords:
    """A communicator's word region of the two-kernel combine's regions' exchange
    (:class:`~collectives.layouts.RegionLayout`: each source's ``arrived`` and ``facts`` of
    each half, the call count, the kernels' tickets): a signal pad (collective, at the first
    such combine), seeded as :meth:`~collectives.layouts.RegionLayout.seeded` says from the
    count ``seed`` (the test hook's :func:`~collectives.runtime.communicator.seed_epoch`), and
    its kernel view (``view.table``: every rank's address of it)."""

    def __init__(self, comm: Runtime, seed: int = 0) -> None:
        self.layout = RegionLayout(comm.world, 16)  # (the words do not depend on the regions' bytes)
        self.pad = comm.ctx.signal_pad(4 * self.layout.words, torch.int32)
        words = self.layout.seeded_words(seed)
        at = torch.tensor(list(words), dtype=torch.int64)
        values = torch.tensor([v - U32 if v >= 1 << 31 else v for v in words.values()], dtype=torch.int32)
        self.pad[at.to(self.pad.device)] = values.to(self.pad.device)
        comm.ctx.host_barrier()  # (syncs this rank's stream first: the words have landed)
        self.view = comm.buffer(self.pad)


def region_bytes(rows: int, row_bytes: int) -> int:
    """The bytes of a source's region that holds ``rows`` rows of ``row_bytes``: the next power
    of two (at least 16), so that the layer's calls share a few receive allocations (at most one
    per power of two; the largest at most twice what its calls need)."""
    return 1 << max(4, (rows * row_bytes - 1).bit_length())


def regions_key(dtype: torch.dtype, hidden: int, topk: int) -> MoeCombineKey | None:
    """The weighted sum's key of a two-kernel combine of rows of ``hidden`` ``dtype`` elements
    and ``topk`` entries a token (:func:`combine_key`), None where it does not run: :data:`FUSED`
    or :data:`REGIONS` off, the kernel not taking the rows, rows not a whole number of 16 bytes."""
    if not (FUSED and REGIONS) or hidden * dtype.itemsize % 16:
        return None
    return combine_key(dtype, hidden, topk)


def regions_combine(comm: Runtime, words: RegionWords, received: torch.Tensor, dtype: torch.dtype, hidden: int,
                    topk: int):
    """The two-kernel low-latency combine on ``comm``'s GPU (:mod:`~collectives.algorithms.moe_send_back`,
    then :mod:`~collectives.algorithms.moe_sum_back`; their kernels loaded now) for rows of
    ``hidden`` ``dtype`` elements and ``topk`` entries a token, receiving into ``received`` (a
    symmetric allocation, the same on every rank: two halves of ``world`` regions, each of a
    power of two bytes, :func:`region_bytes`) over ``words``; None where it does not run
    (:func:`regions_key`).  Returns ``run(expert_out, place, kept, recv_splits, send_splits,
    slots, valid, weights, tokens) -> out``: the handle's fields by address, ``weights`` a
    tensor."""
    total = regions_key(dtype, hidden, topk)
    if total is None:
        return None
    row_bytes = hidden * dtype.itemsize
    world, device = comm.world, comm.device_index
    layout = RegionLayout(world, received.numel() * received.element_size() // (2 * world))
    send_key = MoeSendBackKey(world, MoePlaceKey.word_for(row_bytes))
    sum_key = MoeSumBackKey(world, total.dtype, topk, total.vec)
    send_fn, sum_fn = comm.kernel_together(send_key), comm.kernel_together(sum_key)
    # what the rows are, compared by every receiver: their bytes, dtype and regions' bytes (ranks
    # whose regions differ store and read at other places: a size mismatch, not wrong rows)
    facts = region_facts(row_bytes, list(DTYPES).index(total.dtype) + 256 * layout.region_bytes.bit_length())
    common = dict(region_bytes=layout.region_bytes, words=int(words.view.host[comm.rank]), facts=facts,
                  err=comm.error.data_ptr(), rank=comm.rank, timeout_ns=int(comm.timeout_s * 1e9))
    send_args, (i_rows, i_place, i_kept, i_splits) = MOE_SEND_BACK.template(
        dict(row_words=row_bytes // send_key.word, regions_table=comm.buffer(received).table.data_ptr(),
             words_table=words.view.table.data_ptr(), **common), "rows", "place", "kept", "splits")
    sum_args, (i_out, i_slots, i_valid, i_weights, i_tokens, i_send) = MOE_SUM_BACK.template(
        dict(hidden=hidden, regions=received.data_ptr(), **common), "out", "slots", "valid", "weights", "tokens",
        "send_splits")
    send_blocks = send_key.blocks(world * layout.capacity(row_bytes))
    # Ranks sharing the GPU (a one-GPU world): the receiving kernel spins for the others' sending
    # ones, so its grid stays within what keeps every rank's resident (Runtime.block_cap)
    cap = comm.block_cap(sum_key) or sum_key.blocks(1 << 40, hidden)
    sum_blocks = functools.cache(lambda tokens: min(cap, sum_key.blocks(tokens, hidden)))  # (no frame once seen)
    step = sum_key.vec * dtype.itemsize

    def run(expert_out: torch.Tensor, place: int, kept: int, recv_splits: int, send_splits: int, slots: int,
            valid: int, weights: torch.Tensor, tokens: int) -> torch.Tensor:
        rows = expert_out.contiguous()
        if rows.data_ptr() % send_key.word:
            _aligned(send_key.word, rows)
        stream = current_stream(device)
        a = send_args.copy()
        a[i_rows], a[i_place], a[i_kept], a[i_splits] = rows.data_ptr(), place, kept, recv_splits
        send_fn(*a, send_blocks, stream)
        out = torch.empty_strided((tokens, hidden), (hidden, 1), dtype=dtype, device=rows.device)
        if weights.dtype != torch.float32 or not weights.is_contiguous():
            weights = weights.float().contiguous()
        if out.data_ptr() % step:
            _aligned(step, out)
        a = sum_args.copy()
        a[i_out], a[i_slots], a[i_valid], a[i_weights], a[i_tokens], a[i_send] = (
            out.data_ptr(), slots, valid, weights.data_ptr(), tokens, send_splits)
        sum_fn(*a, sum_blocks(tokens), stream)
        return out

    return run


#: Plans a :class:`Layer` keeps (:meth:`Layer.plan`), at most.
MAX_PLANS = 256


class Layer:
    """A communicator's MoE host state (``comm.moe_layer``, made by its first dispatch or
    combine), so that a call of a shape seen before prepares nothing again: the kernels'
    launches (:func:`pack`, :func:`placement`, :func:`gather`, :func:`weighted_sum`) by their
    stable facts, each made once, and the scratch buffers the calls use inside themselves (the
    rows sent, the counts, the splits, the rows sent back) by name, shape and dtype, so that the
    all-to-alls' tensors, and with them their plan keys, are the same at every call of a shape.
    ``exchange`` and ``empty``: the group's all-to-all and receive buffers
    (:data:`collectives.moe.Exchange`, :data:`~collectives.moe.Empty`).

    A scratch buffer is rewritten by the next call of its shape, in stream order: a call on
    another stream than the last one's first makes its stream wait for that one
    (:meth:`begin`: :func:`~collectives.algorithms.plan.follow`), as the communicator's
    collectives do."""

    def __init__(self, comm: Runtime, exchange: Callable[..., Any], empty: Callable[..., torch.Tensor]) -> None:
        self.comm, self.exchange, self.empty = comm, exchange, empty
        self.device_index = comm.device_index
        self.stream: int | None = None  # the last call's stream, and whether it was captured (follow)
        self.stream_captured = False
        self._launches: dict[tuple, Any] = {}
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._plans: dict[tuple, Any] = {}
        self._region_words: RegionWords | None = None

    def regions_for(self, dtype: torch.dtype, hidden: int, topk: int, most: int, device: torch.device) -> Any:
        """The two-kernel combine of :func:`regions_combine` for at most ``most`` rows from a
        source (the dispatch's ``max_tokens x topk``: a row comes back per entry; None where it
        does not run), its receive regions from this layer's ``empty`` (``"regions"``, of
        :func:`region_bytes`), its words made at the first ask (collective: every rank's first
        low-latency combine asks)."""
        if regions_key(dtype, hidden, topk) is None:
            return None
        if self._region_words is None:
            from .communicator import seed_epoch

            self._region_words = RegionWords(self.comm, seed_epoch())
        nbytes = RegionLayout(self.comm.world, region_bytes(most, hidden * dtype.itemsize)).bytes
        received = self.empty("regions", (nbytes,), torch.uint8, device)
        return self.launch(regions_combine, self._region_words, received, dtype, hidden, topk)

    def begin(self) -> None:
        """Open a call: order its stream after the last call's (its scratch buffers' last use)."""
        stream = current_stream(self.device_index)
        if stream != self.stream:
            follow(self, stream, capturing())

    def launch(self, make: Callable[..., Any], *facts: Any) -> Any:
        """``make(comm, *facts)`` (one of this module's kernel launches, or None), made at the
        first call with these facts (and :data:`FUSED` and :data:`REGIONS`), then reused."""
        key = (make, FUSED, REGIONS, *facts)
        try:
            return self._launches[key]
        except KeyError:
            fn = self._launches[key] = make(self.comm, *facts)
            return fn

    def pack_for(self, dtype: torch.dtype, hidden: int, fp8: bool) -> Any:
        """The :data:`collectives.moe.PackFor` of :func:`pack`, each made once."""
        return self.launch(pack, dtype, hidden, fp8)

    def placement_for(self, local: int, layout: Any, exact: bool, dtype: torch.dtype) -> Any:
        """The :data:`collectives.moe.PlacementFor` of :func:`placement`, each made once."""
        return self.launch(placement, local, layout, exact, dtype)

    def route_for(self, dtype: torch.dtype, experts: int) -> Any:
        """The :data:`collectives.moe.RouteFor` of :func:`route`, each made once."""
        return self.launch(route, dtype, experts)

    def plan(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The :data:`collectives.moe.Plans` of this layer: ``make()`` at the first call of
        ``key`` (and :data:`FUSED` and :data:`REGIONS`), then reused (made of this layer's launches and buffers, so
        that dropping one loses nothing: past :data:`MAX_PLANS`, prefills of many token counts,
        all are dropped and made again)."""
        key = (FUSED, REGIONS, *key)
        p = self._plans.get(key)
        if p is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            p = self._plans[key] = make()
        return p

    def scratch(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device,
                fill: int | None = None) -> torch.Tensor:
        """The scratch buffer ``name`` of ``shape`` and ``dtype`` (contents left by the last
        call), allocated at the first ask (on the host: pinned, so that the GPU copies into it
        while the host waits for the stream, not inside a pageable copy); with ``fill``, a
        constant: made filled with it, and kept only where made eagerly (a fill captured in a
        CUDA graph runs only at its replays)."""
        key = (name, shape, dtype)
        t = self._scratch.get(key)
        if t is None:
            if fill is None:
                t = self._scratch[key] = torch.empty(shape, dtype=dtype, device=device,
                                                     pin_memory=torch.device(device).type == "cpu"
                                                     and torch.cuda.is_available())
            else:
                t = torch.full(shape, fill, dtype=dtype, device=device)
                if not capturing():
                    self._scratch[key] = t
        return t


def layer(comm: Runtime, make: Callable[[], tuple[Callable[..., Any], Callable[..., torch.Tensor]]]) -> Layer:
    """``comm``'s :class:`Layer`, made at the first call with ``make()``'s exchange and
    receive buffers."""
    state = comm.moe_layer
    if state is None:
        state = comm.moe_layer = Layer(comm, *make())
    return state


def _aligned(step: int, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.data_ptr() % step:
            raise CollectiveError(f"moe: a kernel's rows must start {step}-byte aligned, not at {t.data_ptr():#x}")


# -- the MoE dispatch and combine as torch custom operators -----------------------------------------

#: The operators' schemas, by name (namespace ``collectives``).
SCHEMAS = {
    "moe_dispatch": "(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts, int max_tokens, int world) "
                    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "moe_combine": "(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid, Tensor send_splits, "
                   "Tensor recv_splits, Tensor place, Tensor kept) -> Tensor",
}

LIB = torch.library.Library("collectives", "FRAGMENT")
for _name, _schema in SCHEMAS.items():
    LIB.define(_name + _schema)

#: The handle's tensors in the operators' order (the dispatch's, after expert_x and counts;
#: the combine takes all but the last).
HANDLE_FIELDS = ("order", "valid", "send_splits", "recv_splits", "place", "kept", "dropped")
COMBINE_FIELDS = HANDLE_FIELDS[:-1]


@torch.library.register_fake("collectives::moe_dispatch", lib=LIB)
def _(x, topk_ids, topk_weights, num_experts, max_tokens, world):
    tokens, topk = topk_ids.shape
    local = num_experts // world
    room = entry_room(world, max_tokens, topk)
    i64 = dict(dtype=torch.int64)
    return (x.new_empty((local, world * max_tokens, x.shape[1])), x.new_empty((local,), **i64),
            x.new_empty((tokens * topk,), **i64), x.new_empty((tokens * topk,), dtype=torch.bool),
            x.new_empty((world,), **i64), x.new_empty((world,), **i64), x.new_empty((room,), **i64),
            x.new_empty((room,), dtype=torch.bool), x.new_empty((), **i64))


@torch.library.register_fake("collectives::moe_combine", lib=LIB)
def _(expert_out, topk_weights, order, valid, send_splits, recv_splits, place, kept):
    return expert_out.new_empty((topk_weights.shape[0], expert_out.shape[2]))


def traced_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens, world) -> tuple:
    """What :func:`collectives.moe.dispatch` records: ``(expert_x, counts, handle tensors)``."""
    expert_x, counts, *handle = torch.ops.collectives.moe_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens,
                                                                   world)
    return expert_x, counts, tuple(handle)


def traced_combine(expert_out: Tensor, topk_weights: Tensor, handle: tuple) -> Tensor:
    """What :func:`collectives.moe.combine` records (``handle``: its :data:`COMBINE_FIELDS`)."""
    return torch.ops.collectives.moe_combine(expert_out, topk_weights, *handle)


__all__ = ["COMBINE_FIELDS", "FUSED", "HANDLE_FIELDS", "MAX_PLANS", "REGIONS", "SCHEMAS", "Carve", "Carved", "Layer",
           "RegionWords", "combine_key", "entry_room", "gather", "layer", "pack", "pack_key", "place_fields",
           "place_key", "placement", "region_bytes", "regions_combine", "regions_key", "route", "route_fields", "route_key", "traced_combine",
           "traced_dispatch", "weighted_sum"]
