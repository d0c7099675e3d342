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
from ..algorithms.plan import capturing, current_stream, follow
from ..algorithms.protocol import Runtime
from ..dtypes import DTYPES, from_torch
from ..errors import CollectiveError

#: Whether :func:`collectives.moe.dispatch` and :func:`~collectives.moe.combine` run the kernels
#: (unless ``COLLECTIVES_MOE_FUSED=0``).
FUSED = os.environ.get("COLLECTIVES_MOE_FUSED", "1") != "0"

_TORCH_ROUNDED = tuple(DTYPES[name].torch for name in DTYPES_ROUNDED)
_TORCH_QUANTIZED = tuple(DTYPES[name].torch for name in DTYPES_QUANTIZED)
_TORCH_REGISTERED = tuple(d.torch for d in DTYPES.values())


def _words(n: int, dtype: torch.dtype) -> int:
    """The int64 words of ``n`` elements of ``dtype`` (int64, or bool: eight to a word) in a :class:`Carve`."""
    return n if dtype == torch.int64 else -(-n // 8)


class Carve:
    """Where a call's small int64 and bool tensors (the handle's, the counts) lie in one
    allocation of int64 words: ``fields``, ``(name, shape, dtype)`` each, the int64 ones first
    (8-byte aligned), each bool one from a word's start; ``carve(device)``: a call's
    :class:`Carved` (one ``torch.empty``); ``carve.apart(device)``: each field its own
    allocation (a torch operator's outputs, which must not alias each other)."""

    def __init__(self, fields: list[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        #: Each field's first word, shape and dtype, by name.
        self.at: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
        words = 0
        for name, shape, dtype in sorted(fields, key=lambda f: f[2] == torch.bool):
            self.at[name] = (words, shape, dtype)
            words += _words(math.prod(shape), dtype)
        self.words = max(words, 1)
        #: Each field's byte offset, by name.
        self.offsets = {name: 8 * word for name, (word, _, _) in self.at.items()}

    def __call__(self, device: torch.device) -> Carved:
        blob = torch.empty(self.words, dtype=torch.int64, device=device)
        return Carved(self, blob, blob.data_ptr(), self.offsets)

    def apart(self, device: torch.device) -> Carved:
        """The fields in allocations of their own (its ``base`` 0, its offsets their addresses)."""
        tensors = {name: torch.empty(shape, dtype=dtype, device=device) for name, (_, shape, dtype) in self.at.items()}
        return Carved(self, tensors, 0, {name: t.data_ptr() for name, t in tensors.items()})


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
        word, shape, dtype = self.carve.at[name]
        n = math.prod(shape)
        if dtype == torch.bool:
            return self.blob[word:word + _words(n, dtype)].view(torch.bool)[:n]
        return self.blob[word] if shape == () else self.blob[word:word + n]


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

    def run(x: torch.Tensor, carriers: int, slots: int, send_splits: int, layout: Any, out: torch.Tensor) -> None:
        x = x.contiguous()
        _aligned(key.vec * x.element_size(), x, out)
        args = MOE_PACK.take(dict(rows=out.data_ptr(), x=x.data_ptr(), carriers=carriers, slots=slots,
                                  send_splits=send_splits, world=comm.world, tokens=x.shape[0], topk=layout.topk,
                                  hidden=hidden, header=layout.header, row_bytes=layout.bytes))
        fn(*args, key.blocks(x.shape[0]), current_stream(device))

    return run


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

    def run(ids: torch.Tensor, num_experts: int, world: int, bins: torch.Tensor, into: Carved,
            head: tuple[torch.Tensor, int, torch.Tensor] | None = None) -> None:
        n = ids.numel()
        rows = ids if ids.dim() == 2 else ids.reshape(1, -1)  # read at its row stride: no copy of sliced ids
        if rows.shape[1] > 1 and rows.stride(1) != 1:
            rows = rows.contiguous()
        topk = max(rows.shape[1], 1)
        stride = rows.stride(0) if rows.shape[0] > 1 else topk
        base, at = into.base, into.offsets
        args = MOE_ROUTE.take(dict(ids=rows.data_ptr(), topk=topk, stride=stride, n=n, experts=num_experts,
                                   local=num_experts // world, order=base + at["order"], valid=base + at["valid"],
                                   bins=bins.data_ptr(), send_splits=base + at["send_splits"],
                                   slots=base + at["slots"], rows=base + at["rows"],
                                   head_rows=0 if head is None else head[1],
                                   sent=0 if head is None else head[0].data_ptr(),
                                   row_bytes=0 if head is None else head[0].shape[1],
                                   row_splits=0 if head is None else head[2].data_ptr()))
        fn(*args, 1, current_stream(device))

    return run


def gather(comm: Runtime, row_bytes: int):
    """The kernel's :data:`collectives.moe.Gather` on ``comm``'s GPU for rows of ``row_bytes``
    (moved in the widest word that divides them; its kernel loaded now) that makes only the
    first ``sum(recv_splits)`` rows (int64 on the GPU: the dispatch's, the rows the combine sends
    back), None where :data:`FUSED` is off or the rows are empty."""
    if not FUSED or row_bytes <= 0:
        return None
    key = MoeGatherKey(MoePlaceKey.word_for(row_bytes))
    fn, device = comm.kernel_together(key), comm.device_index

    def run(rows: torch.Tensor, place: int, kept: int, send_splits: int, splits: int, copy: torch.Tensor,
            out: torch.Tensor) -> torch.Tensor:
        rows = rows.contiguous()
        room = out.shape[0]
        _aligned(key.word, rows, out)
        args = MOE_GATHER.take(dict(out=out.data_ptr(), rows=rows.data_ptr(), place=place, kept=kept, room=room,
                                    splits=splits, world=copy.shape[1], send_splits=send_splits, copy=copy.data_ptr(),
                                    row_words=row_bytes // key.word))
        fn(*args, key.blocks(room), current_stream(device))
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

    def run(entries: torch.Tensor, slots: int, valid: int, weights: torch.Tensor, tokens: int, k: int) -> torch.Tensor:
        # allocated for the most tokens of the shape (see collectives.moe.dispatch_with), cut to these
        # (no slice where they are the most: a torch view costs microseconds on a slow host)
        most = entries.shape[0] // k
        out = torch.empty((most, hidden), dtype=dtype, device=entries.device)
        out = out if most == tokens else out[:tokens]
        _aligned(step, entries, out)
        if weights.dtype != torch.float32 or not weights.is_contiguous():
            weights = weights.float().contiguous()
        args = MOE_COMBINE.take(dict(out=out.data_ptr(), entries=entries.data_ptr(), slots=slots, valid=valid,
                                     weights=weights.data_ptr(), tokens=tokens, hidden=hidden))
        fn(*args, key.blocks(tokens, hidden), current_stream(device))
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

    def run(counts: torch.Tensor, received: torch.Tensor, room: int, rows_out: int, capacity: int, _exact: bool,
            dropped_before: torch.Tensor, into: Carved) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows, at = received.shape[0], received.device
        # fixed by the shape (see collectives.moe.dispatch_with; throughput: cut to rows_out + 1)
        alloc = max(rows_out, room) + 1 if exact else rows_out + 1
        expert_x = torch.empty((alloc, layout.values // dtype.itemsize), dtype=dtype, device=at)
        scales = torch.empty(alloc, dtype=torch.float32, device=at) if key.scales else None
        if alloc != rows_out + 1:
            expert_x, scales = expert_x[:rows_out + 1], None if scales is None else scales[:rows_out + 1]
        _aligned(key.word, received, expert_x)
        base, at = into.base, into.offsets
        args = MOE_PLACE.take(dict(counts=counts.data_ptr(), received=received.data_ptr(),
                                   expert_x=expert_x.data_ptr(), scales=0 if scales is None else scales.data_ptr(),
                                   place=base + at["place"], kept=base + at["kept"],
                                   expert_counts=base + at["expert_counts"], lost=base + at["dropped"],
                                   dropped_before=dropped_before.data_ptr(), recv_splits=base + at["recv_splits"],
                                   room=room, rows=rows, capacity=capacity, row_words=layout.bytes // key.word,
                                   out_words=layout.values // key.word, topk=layout.topk, header=layout.header))
        fn(*args, key.blocks(max(room, rows)), current_stream(device))
        return expert_x, scales

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

    def begin(self) -> None:
        """Open a call: order its stream after the last call's (its scratch buffers' last use)."""
        stream = current_stream(self.device_index)
        if stream != self.stream:
            follow(self, stream, capturing())

    def launch(self, make: Callable[..., Any], *facts: Any) -> Any:
        """``make(comm, *facts)`` (one of this module's kernel launches, or None), made at the
        first call with these facts (and :data:`FUSED`), then reused."""
        key = (make, FUSED, *facts)
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
        ``key`` (and :data:`FUSED`), then reused (made of this layer's launches and buffers, so
        that dropping one loses nothing: past :data:`MAX_PLANS`, prefills of many token counts,
        all are dropped and made again)."""
        key = (FUSED, *key)
        p = self._plans.get(key)
        if p is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            p = self._plans[key] = make()
        return p

    def scratch(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device,
                fill: int | None = None) -> torch.Tensor:
        """The scratch buffer ``name`` of ``shape`` and ``dtype`` (contents left by the last
        call), allocated at the first ask; with ``fill``, a constant: made filled with it, and
        kept only where made eagerly (a fill captured in a CUDA graph runs only at its replays)."""
        key = (name, shape, dtype)
        t = self._scratch.get(key)
        if t is None:
            if fill is None:
                t = self._scratch[key] = torch.empty(shape, dtype=dtype, device=device)
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


__all__ = ["COMBINE_FIELDS", "FUSED", "HANDLE_FIELDS", "MAX_PLANS", "SCHEMAS", "Carve", "Carved", "Layer", "combine_key",
           "entry_room", "gather", "layer", "pack", "pack_key", "place_fields", "place_key", "placement", "route",
           "route_fields", "route_key", "traced_combine", "traced_dispatch", "weighted_sum"]
