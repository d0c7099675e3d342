"""Mixture-of-experts dispatch and combine over the uneven all-to-all
(:func:`collectives.all_to_all`), in two modes: ``"low_latency"`` (decode: fixed capacity, no
host synchronisation, CUDA-graph capturable) and ``"throughput"`` (prefill: exact sizes, one
host synchronisation per dispatch).

``dispatch`` sends every token to the ranks of its top-k experts (expert ``e`` lives on rank
``e // L``, as its local expert ``e % L``, ``L = num_experts / world``) and returns, per local
expert, its tokens in a fixed-capacity layout a grouped GEMM takes: ``expert_x[L, W * max_tokens,
H]``, expert ``l``'s tokens in rows ``[0, counts[l])`` ordered by source rank, then by the
source's ``(token, k)`` order (rows past the count are unspecified), with ``counts[L]`` on the
GPU.  ``combine`` sends every expert's output rows back and returns each token's
``sum_k weight[t, k] * expert_out(t, k)``, accumulated in f32 in ``k`` order and rounded once to
the input's dtype.

Low latency: no step reads a value back to the host, and every shape is fixed by
``max_tokens`` (the same on every rank): a CUDA graph captures both calls, and replays with new
routings.  The device work is one all-to-all per dispatch (each rank's chunk to a rank its
per-expert counts, then its rows: the bounded all-to-all, into a region per source; a combine:
the rows), whose rows land directly in receive buffers of symmetric memory
(allocated by the first call of each shape: make it eagerly before a capture), and local
steps: the dispatch's routing (a stable sort of the ``(token, k)`` entries by expert, their
counts), its sent rows and its placement of the received rows, the combine's rows sent back and
its weighted sum, one kernel each unless ``COLLECTIVES_MOE_FUSED=0``
(:mod:`collectives.runtime.moe`; else index arithmetic in torch).  A communicator's calls
of a shape seen before prepare nothing again: their kernels' launches and the buffers they use
inside themselves (the rows sent, the counts and splits) are its
:class:`~collectives.runtime.moe.Layer`'s.  Entries whose expert id is out of range, and rows past an
expert's capacity (possible only when a token names one expert twice), are dropped and counted
(``handle.dropped``, on the GPU; ``validate=True`` checks the ids on the host first and raises);
a receive buffer too small for the rows sent fails the all-to-all's pairs with a size mismatch,
never silently.  A token travels once to each rank that has >= 1 of its entries, its row's
header naming them (:class:`Wire`); the receiver expands each row into its entries, placed as
one row per entry would be.

Throughput: ``expert_x`` is exact, ``[sum(counts), H]``, local expert ``l``'s rows at
``[sum(counts[:l]), +counts[l])`` in the same order (the packed layout of a grouped GEMM), and
no entry is dropped but those of out-of-range ids.  The dispatch reads back, once, every rank's
number of rows and entries to receive and of tokens (an all-gather through the all-to-all), so that its
receive buffers have the same size on every rank, as symmetric ones must: the next power of two
of the largest, each size allocated once and reused.  Not capturable in a CUDA graph (the sizes
come from the routing) and not inside ``torch.compile``.

:func:`dispatch_with` and :func:`combine_with` take the all-to-all as a function, so that the
same code runs over the reference in a simulated world (the CPU tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .config import E4M3_MAX
from .runtime import communicator as comms, moe as runtime_moe, torch_ops
from .errors import CollectiveError
from .runtime.moe import COMBINE_FIELDS, HANDLE_FIELDS

if TYPE_CHECKING:
    from .runtime.communicator import Communicator, Group

#: ``exchange(out, inp, out_splits, in_splits, bounded=False)``: an all-to-all of rows (device
#: int64 splits; ``bounded``: :func:`collectives.all_to_all`'s bounded mode, passed only where set).
Exchange = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Any]


def bind(exchange: Exchange, out: torch.Tensor, inp: torch.Tensor, out_splits: torch.Tensor | None,
          in_splits: torch.Tensor | None, bounded: bool = False) -> Callable[[], Any]:
    """``exchange`` of these tensors (a plan's buffers, the same at every call of its shape) as a
    call without arguments: ``exchange.bind``'s where it has one (the communicator's
    all-to-all, :class:`GroupExchange`: its plan kept and launched directly), else a partial;
    ``bounded``: the all-to-all's bounded mode (``collectives.all_to_all(..., bounded=True)``:
    ``out`` cut in a slot per source, ``out_splits`` written with the rows each sent)."""
    kw = {"bounded": True} if bounded else {}
    method = getattr(exchange, "bind", None)
    if method is None:
        return functools.partial(exchange, out, inp, out_splits, in_splits, **kw)
    return method(out, inp, out_splits, in_splits, **kw)


#: ``empty(name, shape, dtype, device)``: the receive buffer ``name`` (the same shape on every
#: rank; reused by the next call of the same shape).
Empty = Callable[[str, tuple, torch.dtype, torch.device], torch.Tensor]
#: ``placement(counts, received, room, rows_out, capacity, dropped_before)``: the placement
#: kernel's launch for these (a plan's, the same at each call of its shape: low latency; in
#: throughput mode the call's), ``launch(into, expert_x=None)``: ``(expert_x, scales)``, and
#: ``place, kept, expert_counts, dropped, recv_splits`` into ``into``'s fields
#: (:class:`~collectives.runtime.moe.Carved`; :func:`place_rows`, the torch steps: the seven as
#: tensors, from the same arguments and ``exact``), for the received rows (uint8,
#: :class:`Wire`; ``counts``: ``[W, L + 1]``, each source's message: what it sent each local
#: expert, then its rows; low latency: a view of the messages at the head of each source's
#: region of ``received``): each row's entries (its header: entry ``j`` of the source's, of
#: ``room`` entries) placed: ``expert_x`` of each entry's values, each kept entry at its
#: ``place`` (given: the call's ``[rows_out]`` rows, the scales into ``into``'s field ``scales``;
#: else allocated, ``rows_out + 1`` rows, the last the trash row, which the kernel never
#: writes, with the scales; the torch steps' uint8), the dropped entries' place the trash row,
#: the arrived entries dropped plus ``dropped_before`` (a GPU scalar: the entries dropped before
#: the exchange; ``dropped``, a GPU scalar); with fp8 rows, their scales (f32, ``rows_out +
#: 1``; else None); the entries each source sent (``counts``' sums); see
#: :mod:`collectives.algorithms.moe_place`.
Placement = Callable[[torch.Tensor, torch.Tensor, int, int, int, torch.Tensor], Callable[[Any], tuple]]
#: ``placement_for(local, layout, exact, dtype)``: the :data:`Placement` of a dispatch to
#: ``local`` experts per rank whose rows travel as :class:`Wire` ``layout``, its ``expert_x`` of
#: ``dtype``, or None for :func:`place_rows` (asked once the call's arguments are checked, before
#: its first all-to-all).
PlacementFor = Callable[[int, "Wire", bool, torch.dtype], "Placement | None"]
#: ``pack(tokens, layout, out)``: the packing kernel's launch for a plan's ``tokens`` tokens
#: and rows sent ``out`` (uint8 ``[rows, layout.bytes]``), ``launch(x, carriers, slots,
#: send_splits)``: the rows a dispatch sends into ``out``, one per (token, rank) with >= 1 of its
#: entries, as the :class:`Wire` ``layout`` lays them out (fp8: quantized, :func:`quantize`),
#: from the routing's outputs by address (int64: each entry's row, ``carriers``; :func:`inverse`
#: of the entries' sort, ``slots``; the entries per rank, ``send_splits``): :func:`pack_rows`'
#: steps in one kernel (:mod:`collectives.algorithms.moe_pack`).
Pack = Callable[[int, "Wire", torch.Tensor], Callable[[torch.Tensor, int, int, int], None]]
#: ``pack_for(dtype, hidden, fp8)``: the :data:`Pack` of a dispatch of ``hidden`` values of
#: ``dtype`` per token, or None for torch steps (asked once the call's arguments are checked).
PackFor = Callable[[torch.dtype, int, bool], "Pack | None"]
#: ``route(tokens, topk, num_experts, world, bins, head=None)``: the routing kernel's launch for
#: a plan's ``[tokens, topk]`` ids, ``launch(ids, into)``: ``order, valid, send_splits, slots,
#: rows`` into ``into``'s fields (:class:`~collectives.runtime.moe.Carved`; :func:`route_ids`,
#: the torch steps: ``(order, valid, bins, send_splits, slots, rows)`` as tensors) and ``bins``,
#: of the expert ids of a dispatch's ``(token, k)`` entries, flattened in that order (int32 or
#: int64, any strides: the kernel reads sliced ids where they lie; an id out of
#: ``0..num_experts-1`` is counted last): the entries sorted by expert, stably; which are in
#: range; the counts' message (into ``bins``, int64[:func:`message_size`]: each rank's experts'
#: entries and rows, then the out-of-range entries); the entries of each rank's experts; the
#: sort's :func:`inverse` (None: not made); the row that carries each entry; with ``head`` (low
#: latency), each rank's message heading its chunk of the rows sent and the chunks' rows
#: (:func:`route_ids`; one kernel: :mod:`collectives.algorithms.moe_route`).
Route = Callable[[int, int, int, int, torch.Tensor, Any], Callable[[torch.Tensor, Any], None]]
#: ``route_for(dtype, num_experts)``: the :data:`Route` of a dispatch of ids of ``dtype`` (any
#: number of entries, either mode), or None for :func:`route_ids` (asked once the call's
#: arguments are checked).
RouteFor = Callable[[torch.dtype, int], "Route | None"]
#: ``gather(rows, place, kept, send_splits, recv_splits, copy, out)``: the rows a combine sends
#: back into ``out`` (``[room, hidden]``, returned): row ``i`` is ``rows[place[i]]`` where
#: ``kept[i]``, else zeros, and both splits copied into ``copy`` (``[2, W]``) (the handle's
#: fields by address; :func:`gather_rows`: as tensors; one kernel:
#: :mod:`collectives.algorithms.moe_gather`, which leaves the rows past the first
#: ``sum(recv_splits)``, those that arrived, never sent back, unwritten).
Gather = Callable[[torch.Tensor, int, int, int, int, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``weighted_sum(entries, slots, valid, weights, tokens, topk)``: the combine's output,
#: ``[tokens, hidden]`` in ``entries``' dtype (allocated for ``entries.shape[0] // topk`` tokens,
#: the most of any call of the shape, and cut to ``tokens``: see :func:`dispatch_with`): token
#: ``t``'s sum over ``k`` in order of ``entries[slots[t * topk + k]] * weights[t * topk + k]``
#: (f32 weights; both taken as zeros where not ``valid``), each product and sum rounded to f32
#: (an entry that is not ``valid`` was not sent, and counts as zeros whatever its row holds),
#: rounded once to the dtype (:mod:`collectives.algorithms.moe_combine`'s kernel).
WeightedSum = Callable[[torch.Tensor, int, int, torch.Tensor, int, int], torch.Tensor]


#: ``scratch(name, shape, dtype, device, fill=None)``: a buffer the call uses inside itself only
#: (``name``'s; with ``fill``, filled with it), which the next call of the shape may reuse:
#: :func:`plain`, or a communicator's :meth:`~collectives.runtime.moe.Layer.scratch`,
#: whose reuse keeps the all-to-alls' tensors, and so their plans, the same at every call.
Scratch = Callable[..., torch.Tensor]


def plain(name: str, shape: tuple, dtype: torch.dtype, device: torch.device, fill: int | None = None) -> torch.Tensor:
    """A new plain tensor (received through the all-to-all's staging buffer), filled with
    ``fill`` where given."""
    if fill is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.full(shape, fill, dtype=dtype, device=device)


MODES = ("low_latency", "throughput")


class _Carved:
    """A :class:`Handle` field that its dispatch's kernels may have written into the call's one
    allocation (:class:`~collectives.runtime.moe.Carved`): the tensor given, else a view of the
    allocation made at the first read (views cost microseconds of host time on a slow GPU host;
    the combine's kernels take the addresses: :meth:`Handle.ptr`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, h: Handle | None, owner: type | None = None) -> Any:
        if h is None:
            return self
        t = h.__dict__.get(self.name)
        if t is None and h.carved is not None and self.name in h.carved.carve.at:
            t = h.__dict__[self.name] = h.carved.tensor(self.name)
        return t

    def __set__(self, h: Handle, value: torch.Tensor | None) -> None:
        h.__dict__[self.name] = value


class Handle:
    """What :func:`combine` needs of a :func:`dispatch`: the entries' sort by expert
    (``order``), which entries were sent (``valid``), their weights, both sides' splits, each
    received row's place in ``expert_x`` (``place``; a dropped row's is the trash row), the
    shapes, and the count of dropped entries (``dropped``, a GPU scalar; a combine needs
    none of it); with fp8, ``scales`` ``[L, W * max_tokens]`` (f32: a row's values are
    ``expert_x * scale``); in throughput mode, ``most``: the rows of the combine's receive
    buffer; ``slots``: each entry's row among the rows sent (``slots[order[i]] = i``) where the
    dispatch's kernels made it (the routing's, or for the packing's), else None (the combine
    computes it); ``shape`` and ``dtype``: the ``expert_out`` :func:`combine` takes, the shape
    of the dispatch's ``expert_x`` and the dtype of its ``x`` (None: unchecked, a handle
    rebuilt from a traced graph's tensors).  The tensors the kernels wrote lie in the call's
    one allocation ``carved`` (its own: a handle kept for a later combine stays valid), each
    made a tensor where read."""

    order = _Carved()
    valid = _Carved()
    send_splits = _Carved()
    recv_splits = _Carved()
    place = _Carved()
    kept = _Carved()
    dropped = _Carved()
    slots = _Carved()
    scales = _Carved()

    def __init__(self, order: torch.Tensor | None, valid: torch.Tensor | None, weights: torch.Tensor,
                 send_splits: torch.Tensor | None, recv_splits: torch.Tensor | None, place: torch.Tensor | None,
                 kept: torch.Tensor | None, tokens: int, topk: int, dropped: torch.Tensor | None = None,
                 scales: torch.Tensor | None = None, most: int = 0, slots: torch.Tensor | None = None,
                 shape: tuple | None = None, dtype: torch.dtype | None = None, carved: Any = None,
                 world: int | None = None) -> None:
        # (into the instance's dictionary: the fields' _Carved read it, no setter called)
        self.__dict__.update(order=order, valid=valid, send_splits=send_splits, recv_splits=recv_splits, place=place,
                             kept=kept, dropped=dropped, slots=slots, scales=scales)
        self.carved, self.weights, self.tokens, self.topk = carved, weights, tokens, topk
        self.most, self.shape, self.dtype = most, shape, dtype
        #: The ranks (the splits' entries).
        self.world = send_splits.numel() if world is None else world

    def ptrs(self, *names: str) -> list[int | None]:
        """Fields ``names``' addresses (no view made; None: neither given nor carved)."""
        given, carved = self.__dict__, self.carved
        at = {} if carved is None else carved.offsets
        out: list[int | None] = []
        for n in names:
            t = given[n]
            out.append(t.data_ptr() if t is not None else carved.base + at[n] if n in at else None)
        return out


def _scatter_count(index: torch.Tensor, out: torch.Tensor, scratch: Scratch, most: int) -> torch.Tensor:
    """``bincount(index, minlength=out.numel())`` into ``out`` without a host sync (torch's
    reads the maximum back; ``index``: at most ``most`` entries, ones from ``scratch``)."""
    ones = scratch("ones", (most,), torch.int64, index.device, 1)[:index.numel()]
    return out.zero_().scatter_add_(0, index, ones)


def _tallies(scratch: Scratch, bins: int, device: torch.device) -> torch.Tensor:
    """A dispatch's ``[2, bins]`` scratch buffer: its counts' message (:func:`route_ids`' ``bins``),
    then (throughput) the messages the counts' exchange brings, so that one copy makes the rows'
    all-to-all's splits."""
    return scratch("tallies", (2, bins), torch.int64, device)


def _capacity(rows: int) -> int:
    """Rows of a throughput-mode receive buffer for ``rows``: the next power of two (at least 1),
    so that a run of prefills allocates a few sizes, not one per routing."""
    return 1 << max(rows - 1, 0).bit_length()


def _read_back(t: torch.Tensor, scratch: Scratch) -> list:
    """``t`` (int64) as Python values: from the GPU through a host buffer of ``scratch`` (a
    communicator's is pinned: the copy is the GPU's) after a wait for the stream, never by a
    copy into pageable memory.  Where ranks share the GPU, a thread waiting inside such a copy
    held every other thread's pageable copy, ``cudaMalloc`` and pinning (measured on one H200:
    ``tests/collectives/gpu/one_gpu/test_host_copies.py``), and the copy waits for this rank's
    collectives, which may wait for a slower rank's launch after one of those steps."""
    if t.is_cuda:
        host = scratch("readback", tuple(t.shape), t.dtype, torch.device("cpu"))
        host.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        t = host
    return t.tolist()


def _everyone(exchange: Exchange, world: int, values: list[torch.Tensor],
              scratch: Scratch) -> tuple[list[int], list[list[int]]]:
    """(this rank's ``values``, every rank's), int64 scalars on the GPU read back to the host in
    one sync (:func:`_read_back`): an all-gather through the all-to-all (each rank sends its row
    to every rank)."""
    mine = torch.stack(values).view(1, -1)
    sent = mine.expand(world, -1).contiguous()
    got = torch.empty_like(sent)
    exchange(got.view(torch.float32), sent.view(torch.float32), None, None)
    rows = _read_back(torch.cat([mine, got]), scratch)
    return rows[0], rows[1:]


class Wire(NamedTuple):
    """How a dispatch's row travels: one row per (token, destination rank) that has >= 1 of the
    token's entries (see :func:`route_ids`), as bytes: the token's ``values`` bytes (fp8: its
    ``hidden`` e4m3 values, then its f32 scale's 4 bytes), zeros to ``header`` (a multiple of
    4), the header: ``topk`` int32, slot ``k`` the index ``j`` of the token's entry ``k`` in
    the per-entry stream to the rank (its place in the entries' sort by expert less the rank's
    first: the receiver places it as entry ``j`` of the source's entries) or -1 where entry
    ``k`` is not in the row, then zeros to ``bytes``, a whole number of 16-byte vectors (the
    all-to-all copies 16-byte vectors only where source and destination agree modulo 16, else
    single elements).  The header travels on the row, not beside it: the row's tail is written
    by the block that writes the row, read by the block that places it, and needs no exchange
    or buffer of its own (``4 * topk`` bytes: 0.2 % of a 7168-wide bf16 row at top-8)."""

    values: int
    scale: bool
    header: int
    topk: int
    bytes: int


def wire(hidden: int, element_size: int, fp8: bool, topk: int) -> Wire:
    """The :class:`Wire` of a dispatch of ``hidden`` values of ``element_size`` bytes per token
    (fp8: quantized, a byte each and the scale) and ``topk`` entries per token."""
    values = hidden if fp8 else hidden * element_size
    header = -(-(values + (4 if fp8 else 0)) // 4) * 4
    return Wire(values, fp8, header, topk, -(-(header + 4 * topk) // 16) * 16)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ([tokens, hidden]) as float8_e4m3fn with one f32 scale per token (its largest
    magnitude over :data:`E4M3_MAX`; 1 for a zero row): ``x ~ q * scale``."""
    amax = x.abs().amax(dim=1).float() if x.shape[1] else x.new_zeros(x.shape[0], dtype=torch.float32)
    # A tensor divisor, not a Python number: CUDA's division by a scalar multiplies by its
    # reciprocal (last-bit differences from the CPU's true division, found on one H100).
    scale = torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))
    return (x.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def _check(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, world: int,
           max_tokens: int, mode: str) -> None:
    """The arguments' checks (each of their facts in the dispatch's plan key: a key seen before
    passed them)."""
    if mode not in MODES:
        raise CollectiveError(f"moe.dispatch: mode must be one of {MODES}, not {mode!r}")
    if num_experts % world or num_experts <= 0:
        raise CollectiveError(f"moe.dispatch: num_experts ({num_experts}) must be a positive multiple of the world "
                              f"size ({world})")
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise CollectiveError(f"moe.dispatch: x must be [tokens, hidden] and topk_ids, topk_weights [tokens, k], not "
                              f"{tuple(x.shape)}, {tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}")
    if x.shape[0] > max_tokens:
        raise CollectiveError(f"moe.dispatch: {x.shape[0]} tokens exceed max_tokens={max_tokens}")
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_weights.is_floating_point():
        raise CollectiveError(f"moe.dispatch: topk_ids must be int32/int64 and topk_weights floating, not "
                              f"{topk_ids.dtype}, {topk_weights.dtype}")
    if len({x.device, topk_ids.device, topk_weights.device}) != 1:
        raise CollectiveError("moe.dispatch: x, topk_ids and topk_weights must be on one device")


def _check_ids(topk_ids: torch.Tensor, num_experts: int, scratch: Scratch) -> None:
    """``validate=True``'s check of the ids' values (read back: at every call, :func:`_read_back`)."""
    if topk_ids.numel():
        low, high = _read_back(torch.stack([topk_ids.min(), topk_ids.max()]).long(), scratch)
        if low < 0 or high >= num_experts:
            raise CollectiveError(f"moe.dispatch: expert ids must be in 0..{num_experts - 1}, found {low}..{high}")


#: ``plans(key, make)``: the :class:`DispatchPlan` (or a combine's plan) of ``key``: ``make()``
#: (:func:`unplanned`), or a communicator's :meth:`~collectives.runtime.moe.Layer.plan`, made at
#: the first call of the key and reused.
Plans = Callable[[tuple, Callable[[], Any]], Any]


def unplanned(key: tuple, make: Callable[[], Any]) -> Any:
    """A :data:`Plans` that keeps nothing: a new plan at every call."""
    return make()


class DispatchPlan:
    """What a dispatch derives from its shape alone (see :func:`dispatch_with`'s arguments, by
    the same names): its steps (routing, rows sent, placement: the kernels' launches bound to
    the plan's buffers), its buffers (from ``scratch`` and, in low-latency mode, ``empty``) with
    the views and slices of them that the steps and all-to-alls take, the call's one allocation
    (:class:`~collectives.runtime.moe.Carve`) with its returned tensors' views, and the handle's
    facts, so that a call of a shape seen before only allocates once and launches.  Holds no
    tensor of a call (a CUDA graph captures its calls)."""

    def __init__(self, exchange: Exchange, world: int, x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                 max_tokens: int, mode: str, empty: Empty, fp8: bool, placement_for: PlacementFor | None,
                 pack_for: PackFor | None, scratch: Scratch, route_for: RouteFor | None) -> None:
        self.tokens, self.topk = topk_ids.shape
        hidden, device = x.shape[1], x.device
        self.local = local = num_experts // world
        self.capacity = world * max_tokens  # rows per local expert: each source sends it each token once
        # rows sent at most (a row per token and rank): the allocation's size, whatever the routing
        bound = _capacity(max_tokens * min(self.topk, world))
        self.exact = exact = mode == "throughput"
        tallies = _tallies(scratch, message_size(num_experts, world), device)
        self.bins, self.dropped_before = tallies[0], tallies[0, -1]
        # The sent rows (Wire: the values, the header), as bytes (which torch indexes), and the
        # dtype they travel as; one more: the torch steps' trash row.
        self.layout = wire(hidden, x.element_size(), fp8, self.topk)
        self.wire = torch.float8_e4m3fn if fp8 else x.dtype
        self.width = self.layout.bytes // (1 if fp8 else x.element_size())
        # Low latency: one exchange, each rank's chunk its message (header_rows(), written by the
        # routing) then its rows; throughput: the message apart (its own all-to-all)
        head = 0 if exact else header_rows(local, self.layout)
        self.rows = scratch("rows", (bound + world * head + 1, self.layout.bytes), torch.uint8, device)
        self.rows_wire = self.rows[:self.tokens * min(self.topk, world) + world * head].view(self.wire)
        self.splits = scratch("splits", (2, world), torch.int64, device)
        self.send_splits, self.recv_splits = self.splits[0], self.splits[1]
        # the routing's writes of the messages and the rows' splits (low latency)
        self.head = None if exact else (self.rows, head, self.send_splits)
        route = route_for(topk_ids.dtype, num_experts) if route_for else None
        self.routed = route is not None
        self.route = route(self.tokens, self.topk, num_experts, world, self.bins, self.head) if route else \
            functools.partial(route_ids, scratch=scratch, most=_capacity(max_tokens * self.topk))
        pack = pack_for(x.dtype, hidden, fp8) if pack_for else None
        self.pack = pack and pack(self.tokens, self.layout, self.rows)
        placement = placement_for(local, self.layout, exact, self.wire) if placement_for else None
        self.placed = placement is not None
        self.placement = placement  # (throughput: bound at each call, to its sizes)
        # Low latency: the rows a rank can receive (each source's tokens once), the same on every
        # rank, asked for before any launch with the combine's (its rows: the entries), so that a
        # shape's first call (its buffers allocated collectively) refuses ranks that differ in
        # hidden size, top-k or max_tokens on every rank before any all-to-all; the entries they
        # carry at most (the handle's places).
        self.received = self.received_rows = None
        self.room = 0
        if not exact:  # a region per source: its message, then its max_tokens rows at most
            self.received = empty("dispatch", (world * (max_tokens + head), self.width), self.wire, device)
            empty("combine", (max_tokens * self.topk, hidden), x.dtype, device)
            self.received_rows = self.received.view(torch.uint8)
            self.room = runtime_moe.entry_room(world, max_tokens, self.topk)
        self.rows_out = 0 if exact else local * self.capacity
        # (shape, strides) of the torch steps' placed rows and scales but the trash row (low latency)
        self.experts_view = ((local, self.capacity, hidden), (self.capacity * hidden, hidden, 1))
        self.scales_view = ((local, self.capacity), (self.capacity, 1))
        # what each source sent: each local expert's entries, then its rows (low latency: read where
        # they arrived, the head of each source's region: a strided view)
        message = tallies[:, :-1].view(2, world, local + 1)
        self.counts = message[1]
        if not exact:
            self.counts = self.received_rows.view(world, -1)[:, :8 * (local + 1)].view(torch.int64)
        self.rows_tallied = message[:, :, local]
        # The kernels' small outputs in a call's one allocation: the routing's, and in low latency
        # the placement's with the fp8 scales (throughput: the placement's apart, for the call's
        # entries received); the placed rows (low latency) allocated apart, exactly their [L,
        # capacity, hidden] (the kernel never writes the trash row): no view of them made, the
        # counts one view by its precomputed arguments.
        fields = runtime_moe.route_fields(self.tokens * self.topk, world) if self.routed else []
        self.carried = self.placed and not exact  # the placement's outputs in the call's allocation
        if self.carried:
            fields += runtime_moe.place_fields(self.room, local, world)
            if fp8:
                fields.append(("scales", self.scales_view[0], torch.float32))
            self.place = placement(self.counts, self.received_rows, self.room, self.rows_out, self.capacity,
                                   self.dropped_before)
        elif not self.placed:
            self.place = functools.partial(place_rows, layout=self.layout)
        self.carve = runtime_moe.Carve(fields) if fields else None
        if self.carried:
            _, *self.counts_view = self.carve.view("expert_counts")
        # The handle's facts (its fields' tensors: the call's, set or carved)
        self.handle = dict(order=None, valid=None, send_splits=None, recv_splits=None, place=None, kept=None,
                           dropped=None, slots=None, scales=None, tokens=self.tokens, topk=self.topk, most=0,
                           shape=self.experts_view[0], dtype=x.dtype, world=world)
        # The all-to-alls of these buffers (:func:`bind`): low latency, the one of the rows (bounded:
        # a region per source, the rows each sent written into recv_splits); throughput, the counts'
        # (each rank's message as float32 pairs: the all-to-all moves the library's dtypes).
        self.send_counts = self.send_rows = None
        if exact:
            self.send_counts = bind(exchange, self.counts.view(torch.float32), message[0].view(torch.float32), None,
                                    None)
            # (its tokens on the GPU for the sizes' all-gather, made here: a copy from the host at
            # the call would wait for the counts' all-to-all, see collectives.runtime.views.filled)
            self.tokens_held = torch.full((), self.tokens, dtype=torch.int64, device=device)
        else:
            self.send_rows = bind(exchange, self.received, self.rows_wire, self.recv_splits, self.send_splits,
                                  bounded=True)


def _plan(exchange: Exchange, world: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
          num_experts: int, max_tokens: int, mode: str, empty: Empty, fp8: bool,
          placement_for: PlacementFor | None, pack_for: PackFor | None, scratch: Scratch,
          route_for: RouteFor | None) -> DispatchPlan:
    """The :class:`DispatchPlan` of a call whose arguments pass :func:`_check` (a plan miss)."""
    _check(x, topk_ids, topk_weights, num_experts, world, max_tokens, mode)
    return DispatchPlan(exchange, world, x, topk_ids, num_experts, max_tokens, mode, empty, fp8, placement_for,
                        pack_for, scratch, route_for)


#: A handle without its ``__init__`` (a dispatch sets its dictionary from its plan's facts).
_new_handle = object.__new__


def dispatch_with(exchange: Exchange, world: int, x: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor, num_experts: int, max_tokens: int, mode: str = "low_latency",
                  validate: bool = False, empty: Empty = plain, fp8: bool = False,
                  placement_for: PlacementFor | None = None, pack_for: PackFor | None = None,
                  scratch: Scratch = plain, route_for: RouteFor | None = None,
                  plans: Plans = unplanned, apart: bool = False) -> tuple[torch.Tensor, torch.Tensor, Handle]:
    """:func:`dispatch` over ``exchange`` in a world of ``world`` ranks, receiving rows into
    ``empty``'s buffer; the received rows placed by ``placement_for``'s placement (None:
    :func:`place_rows`, some twenty torch operations); the rows sent made by ``pack_for``'s
    :data:`Pack` (None: a gather; with fp8 :func:`pack_rows`, some fifteen operations); the
    entries sorted and counted by ``route_for``'s :data:`Route` (None: :func:`route_ids`, some
    eight operations); the buffers used inside the call (the rows sent, the counts and splits
    of the all-to-alls) from ``scratch`` (:data:`Scratch`); all of them, with their views, in the
    shape's :class:`DispatchPlan` from ``plans`` (:data:`Plans`), made once the arguments pass
    their checks: the plan's key holds every fact checked (the shapes, dtypes and devices of
    the three tensors, the sizes, the mode), so a key seen before passed them; ``validate``
    checks them and reads the ids back at every call, before the plan.  The kernels' outputs (the handle's tensors, the counts;
    low latency: expert_x and the fp8 scales too) lie in one allocation of the call, or with
    ``apart`` each in its own (the torch operator's: its outputs must not alias each other).

    Every allocation above torch's small-block pool (1 MB) has a size the shape fixes (its
    bounds: ``max_tokens`` and top-k, the receive buffers' rows), never the routing: the rows
    sent are allocated for ``_capacity(max_tokens * min(topk, world)) + 1`` of them (low latency:
    and the messages' :func:`header_rows` for each rank) and cut.  A run of calls
    of one shape then finds each such block in torch's cache, freed by the call before, instead
    of calling ``cudaMalloc``, which may wait for the device (other ranks' kernels spin there
    for this rank's next launch)."""
    if validate:  # (the ids read back, before any plan is made: the arguments checked first)
        _check(x, topk_ids, topk_weights, num_experts, world, max_tokens, mode)
        _check_ids(topk_ids, num_experts, scratch)
    key = ("dispatch", x.shape, x.dtype, x.device, topk_ids.shape, topk_ids.dtype, topk_ids.device, topk_weights.shape,
           topk_weights.dtype, topk_weights.device, num_experts, world, max_tokens, mode, fp8)
    p: DispatchPlan = plans(key, lambda: _plan(exchange, world, x, topk_ids, topk_weights, num_experts, max_tokens,
                                               mode, empty, fp8, placement_for, pack_for, scratch, route_for))
    # The kernels' outputs in one allocation, the call's own.
    carved = None if p.carve is None else p.carve.apart(x.device) if apart else p.carve(x.device)
    handle = _new_handle(Handle)
    handle.__dict__.update(p.handle, weights=topk_weights, carved=carved)
    rows = None
    if p.routed:
        p.route(topk_ids, carved)
    else:
        handle.order, handle.valid, _, handle.send_splits, _, rows = p.route(topk_ids, num_experts, world, p.bins,
                                                                             head=p.head)
        handle.slots = inverse(handle.order)
    if p.pack is not None:  # a row per (token, rank), its header naming its entries (Wire), by address
        if rows is None:
            base, at = carved.base, carved.offsets
            p.pack(x, base + at["rows"], base + at["slots"], base + at["send_splits"])
        else:
            p.pack(x, rows.data_ptr(), handle.slots.data_ptr(), handle.send_splits.data_ptr())
    else:
        pack_rows(x, carved.tensor("rows") if rows is None else rows, handle.slots, handle.send_splits, p.topk,
                  p.layout, p.rows)
    if p.carried:  # low latency, placed into the call's allocations: the counts a view (the handle's where read)
        # (torch's strided forms: 1.1-2.0 us less host time than torch.empty of a shape, 0.2-1.7
        # less than Tensor.as_strided, on a 2 x H200 host: collectives.tools.bench_launch)
        expert_x = torch.empty_strided(*p.experts_view, dtype=p.wire, device=x.device)
        p.send_rows()
        p.place(carved, expert_x)
        counts = carved.tensor("expert_counts") if apart else torch.as_strided(carved.blob, *p.counts_view)
        return expert_x, counts, handle
    most, received_rows, rows_out, room = 0, p.received_rows, p.rows_out, p.room
    if p.exact:
        # Each rank's message (its experts' entries, its rows); the rows' splits, sent and received, in
        # one scratch buffer by one copy (its place in the rows' plan key the same at each call; the
        # handle's splits are the entries', its own); every rank's rows and entries to receive, and
        # tokens: the buffers' sizes, the same everywhere; then the rows.
        p.send_counts()
        p.splits.copy_(p.rows_tallied)
        (_, rows_out, _), sizes = _everyone(exchange, world, [p.splits[1].sum(), p.counts[:, :p.local].sum(),
                                                              p.tokens_held], scratch)
        received = empty("dispatch", (_capacity(max(r for r, _, _ in sizes)), p.width), p.wire, x.device)
        received_rows = received.view(torch.uint8)
        room = _capacity(max(e for _, e, _ in sizes))
        most = _capacity(max(t for _, _, t in sizes) * p.topk)
        exchange(received, p.rows_wire, p.recv_splits, p.send_splits)
    else:  # one exchange: each source's message and rows into its region (low latency)
        p.send_rows()
    handle.most = most
    # (dropped: the ids out of range and the entries past a capacity)
    if p.placed:  # throughput: its fields for this call's entries received, set on the handle as tensors
        into = runtime_moe.Carve(runtime_moe.place_fields(room, p.local, world))(x.device)
        expert_x, scales = p.placement(p.counts, received_rows, room, rows_out, p.capacity, p.dropped_before)(into)
        expert_counts = into.tensor("expert_counts")
        handle.place, handle.kept, handle.dropped, handle.recv_splits = (
            into.tensor(f) for f in ("place", "kept", "dropped", "recv_splits"))
    else:
        expert_x, handle.place, handle.kept, expert_counts, handle.dropped, scales, handle.recv_splits = p.place(
            p.counts, received_rows, room, rows_out, p.capacity, p.exact, p.dropped_before)
    # (the torch steps' bytes in their dtype; low latency: but the trash row, as [L, capacity, hidden], by one
    # torch view)
    if expert_x.dtype != p.wire:
        expert_x = expert_x.view(p.wire)
    expert_x = expert_x[:-1] if p.exact else expert_x.as_strided(*p.experts_view)
    if fp8:  # placed apart: the values and the scales, each contiguous
        handle.scales = scales[:-1] if p.exact else scales.as_strided(*p.scales_view)
    handle.shape = tuple(expert_x.shape)
    return expert_x, expert_counts, handle


def route_ids(ids: torch.Tensor, num_experts: int, world: int, bins: torch.Tensor | None = None,
              scratch: Scratch = plain, most: int | None = None,
              head: tuple[torch.Tensor, int, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """The torch steps of a :data:`Route` (``ids``: ``[tokens, topk]``; ``bins`` None: a new
    tensor; ``most``: the entries of any call of the shape, ``ids.numel()`` by default: the ones
    counted from ``scratch``): ``(order, valid, bins, send_splits, slots, rows)``, ``slots``
    None (not made).  ``bins`` is the counts' message (:func:`message_size`): for each rank ``r``
    its ``L`` experts' entries, then the rows sent to it (its tokens with >= 1 entry there),
    and last the out-of-range entries; ``rows[t * topk + k]``: the row that carries entry
    ``(t, k)``, its token's row to the entry's rank (rows by rank, then by token), -1 where out of
    range.  ``head`` (low latency: ``(sent, h, splits)``): each rank's chunk of the rows sent is
    headed by ``h`` rows (:func:`header_rows`) holding its message (``bins``' ``L + 1`` words; the
    head's other bytes are not written), written into ``sent`` (uint8 rows), the rows numbered
    after them (rank ``r``'s rows ``(r + 1) h`` further on), and ``splits`` (int64[W]) the rows of
    each rank's chunk, ``h`` and its rows."""
    local = num_experts // world
    tokens, topk = ids.shape
    # An id out of range goes to a bin past the last rank's (below 0: clamped to -1, which the
    # remainder maps there).
    expert = ids.reshape(-1).to(torch.int64).clamp(-1, num_experts).remainder(num_experts + 1)
    counts = _scatter_count(expert, scratch("route_bins", (num_experts + 1,), torch.int64, ids.device), scratch,
                            ids.numel() if most is None else most)
    rank = (expert // local).view(tokens, topk)  # out of range: world
    has = torch.zeros((tokens, world + 1), dtype=torch.int64, device=ids.device).scatter_(1, rank, 1)[:, :world]
    rows_to = has.sum(0)
    h = 0 if head is None else head[1]
    heads = torch.cumsum(rows_to, 0) - rows_to + torch.arange(world, device=ids.device) * h  # each chunk's first row
    row = torch.cumsum(has, 0) - has + heads + h  # (token, rank)'s row
    rows = torch.where(rank < world, row.gather(1, rank.clamp(max=world - 1)), -1).view(-1)
    bins = torch.empty(message_size(num_experts, world), dtype=torch.int64, device=ids.device) if bins is None else bins
    message = bins[:-1].view(world, local + 1)
    message[:, :local] = counts[:num_experts].view(world, local)
    message[:, local] = rows_to
    bins[-1] = counts[num_experts]
    if head is not None:  # each rank's message's bytes at the head of its chunk (the head's other bytes unwritten)
        sent, _, splits = head
        at = heads[:, None] * sent.shape[1] + torch.arange(8 * (local + 1), device=ids.device)
        sent.view(-1)[at.view(-1)] = message.contiguous().view(torch.uint8).view(-1)
        splits.copy_(rows_to + h)
    return (torch.sort(expert, stable=True).indices, expert < num_experts, bins,
            counts[:num_experts].view(world, local).sum(1), None, rows)


def header_rows(local: int, layout: Wire) -> int:
    """Rows of :class:`Wire` ``layout`` that a low-latency dispatch's message to a rank takes at
    the head of its chunk (its ``local + 1`` int64 words: the rank's experts' entries, the rows)."""
    return -(-8 * (local + 1) // layout.bytes)


def message_size(num_experts: int, world: int) -> int:
    """The int64 words of a dispatch's counts' message (:func:`route_ids`' ``bins``): ``L + 1``
    to each rank, then the out-of-range entries' count (not sent)."""
    return num_experts + world + 1


def inverse(order: torch.Tensor) -> torch.Tensor:
    """The permutation ``order``'s inverse: ``slots[order[i]] = i`` (each entry's sent row)."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


def pack_rows(x: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, send_splits: torch.Tensor, topk: int,
              layout: Wire, out: torch.Tensor) -> None:
    """The torch steps of a :data:`Pack`: into ``out`` (uint8 ``[rows sent + 1, layout.bytes]``
    at least: its last row the trash row, written by entries out of range; no other row written)
    each row sent, as
    :class:`Wire` lays it out (fp8: quantized, :func:`quantize`), from :func:`route_ids`'
    ``rows``, the entries' sort's :func:`inverse` ``slots`` and ``send_splits`` (entries per
    rank)."""
    tokens, hidden = x.shape
    if layout.scale:
        q, scale = quantize(x)
        values = torch.cat((q.view(torch.uint8), scale.view(torch.uint8).view(tokens, 4)), 1)
    else:
        values = x.contiguous().view(torch.uint8).view(tokens, layout.values)
    n, trash = rows.numel(), out.shape[0] - 1
    ends = torch.cumsum(send_splits, 0)
    rank = torch.searchsorted(ends, slots, right=True).clamp(max=send_splits.numel() - 1)
    j = (slots - (ends - send_splits)[rank]).to(torch.int32)
    target = torch.where(rows >= 0, rows, trash)
    entry = torch.arange(n, device=x.device)
    header = torch.full((out.shape[0], topk), -1, dtype=torch.int32, device=x.device)
    header.index_put_((target, entry % topk), j)
    made = torch.zeros_like(out)
    made[:, :values.shape[1]].index_put_((target,), values.repeat_interleave(topk, 0))
    made[:, layout.header:layout.header + 4 * topk] = header.view(torch.uint8)
    # only the rows sent (and the trash row): the others keep what the routing wrote (the messages)
    sent = torch.zeros(out.shape[0], dtype=torch.bool, device=x.device).index_fill_(0, target, True)
    out.copy_(torch.where(sent[:, None], made, out))


def place_rows(counts: torch.Tensor, received: torch.Tensor, room: int, rows_out: int, capacity: int, exact: bool,
               dropped_before: torch.Tensor | None = None, *, layout: Wire) -> tuple[torch.Tensor | None, ...]:
    """The torch steps of a :data:`Placement`: each arrived row (``received``: uint8 rows of
    :class:`Wire` ``layout``, by source, ``counts[s, L]`` of source ``s``) expanded into the
    entries its header names (entry ``j`` of source ``s``: entry ``sum(counts[:s, :L]) + j`` of
    ``room``), then each entry's place, expert ``l``'s entries by source, then in the source's
    order (see :mod:`collectives.algorithms.moe_place`): ``expert_x`` (uint8, the rows' values),
    ``place``, ``kept``, ``expert_counts``, ``dropped`` (without ``dropped_before`` where None),
    ``scales`` (fp8) and ``recv_splits`` (entries each source sent).  Low latency (not ``exact``):
    ``received`` is a region per source (``received.shape[0] / W`` rows: :func:`header_rows` of
    its message, which ``counts`` views, then its rows; a source's rows past its region are not
    read)."""
    world, local = counts.shape[0], counts.shape[1] - 1
    device = received.device
    row_counts, counts = counts[:, local], counts[:, :local]
    # each entry's row: from the headers of the rows that arrived
    if exact:  # in arrival order
        q = torch.arange(received.shape[0], device=device)
        source = torch.searchsorted(torch.cumsum(row_counts, 0), q, right=True)
    else:  # each source's rows after its message, in its region
        head = header_rows(local, layout)
        slot = received.shape[0] // world - head
        width = received.shape[1]
        received = received.view(world, slot + head, width)[:, head:].reshape(world * slot, width)
        q = torch.arange(received.shape[0], device=device)
        source = q // slot
        source = torch.where(q - source * slot < row_counts[source], source, world)
    entries_of = counts.sum(1)
    header = received[:, layout.header:layout.header + 4 * layout.topk].contiguous().view(torch.int32).long()
    entry = (torch.cumsum(entries_of, 0) - entries_of)[source.clamp(max=world - 1)][:, None] + header
    named = (source < world)[:, None] & (header >= 0) & (entry < room)
    row_of = torch.zeros(room + 1, dtype=torch.int64, device=device)
    row_of.index_put_((torch.where(named, entry, room).view(-1),), q.repeat_interleave(layout.topk))
    # (no row arrived: every entry unnamed, read as zeros)
    entries = received[row_of[:room]] if received.shape[0] else received.new_zeros((room, received.shape[1]))
    room_out = max(rows_out, room) + 1 if exact else rows_out + 1  # expert_x's rows: fixed by the shape (dispatch_with)
    segments = counts.reshape(-1)  # (source, expert) in arrival order
    ends = torch.cumsum(segments, 0)
    i = torch.arange(room, device=device)
    segment = torch.searchsorted(ends, i, right=True)
    arrived = segment < world * local
    segment = segment.clamp(max=world * local - 1)
    within = i - (ends - segments)[segment]
    before = (torch.cumsum(counts, 0) - counts).reshape(-1)[segment]  # earlier sources' rows of the expert
    slot = before + within
    expert_counts = counts.sum(0)
    if exact:  # expert l's rows from the sum of the earlier experts' counts on: none dropped
        kept = arrived
        first = torch.cumsum(expert_counts, 0) - expert_counts
        place = torch.where(kept, first[segment % local] + slot, rows_out)  # else: the trash row
    else:
        kept = arrived & (slot < capacity)
        place = torch.where(kept, (segment % local) * capacity + slot, rows_out)  # else: the trash row
    expert_x = torch.empty((room_out, layout.values), dtype=torch.uint8, device=device)[:rows_out + 1]
    expert_x.index_copy_(0, place, entries[:, :layout.values])
    scales = None
    if layout.scale:
        scales = torch.empty((room_out, 4), dtype=torch.uint8, device=device)[:rows_out + 1]
        scales.index_copy_(0, place, entries[:, layout.values:layout.values + 4])
        scales = scales.view(torch.float32)[:, 0]
    dropped = (arrived & ~kept).sum()
    if dropped_before is not None:
        dropped = dropped + dropped_before
    return expert_x, place, kept, expert_counts, dropped, scales, entries_of


def gather_rows(rows: torch.Tensor, place: torch.Tensor, kept: torch.Tensor, send_splits: torch.Tensor,
                recv_splits: torch.Tensor, copy: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The torch steps of a :data:`Gather` (every row made)."""
    torch.stack((send_splits, recv_splits), out=copy)
    if rows.shape[0]:
        back = rows.index_select(0, place.clamp(max=rows.shape[0] - 1))
    else:  # nothing was received: every row sent back is a zero
        back = rows.new_zeros((place.shape[0], rows.shape[1]))
    return torch.where(kept[:, None], back, back.new_zeros(()), out=out)


class CombinePlan:
    """What a combine derives from its shape alone (see :func:`combine_with`'s arguments): the
    splits' scratch buffer (one, its place in the all-to-all's plan key
    the same at each call) and the receive buffer with its slice of the entries that arrive;
    in low-latency mode the rows sent back (a scratch buffer of a size the shape fixes) and
    their all-to-all (:func:`bind`); ``kernels()``' ``(weighted_sum, gather)`` (no ``kernels``: both
    None)."""

    def __init__(self, exchange: Exchange, expert_out: torch.Tensor, h: Handle, empty: Empty,
                 scratch: Scratch, kernels: Callable[[], tuple] | None = None) -> None:
        self.kernels = kernels() if kernels else (None, None, None)
        self.received = self.entries = self.back = self.send_back = None
        if self.kernels[2] is not None:  # the two-kernel combine: its own receive regions, no all-to-all
            return
        hidden, device = expert_out.shape[-1], expert_out.device
        if expert_out.dim() == 3:  # low latency: [L, capacity, hidden]
            most = expert_out.shape[1] // h.world * h.topk  # max_tokens x topk, the same everywhere
        else:  # throughput: the packed rows
            most = h.most
        self.splits = scratch("splits", (2, h.world), torch.int64, device)
        self.send_splits, self.recv_splits = self.splits[0], self.splits[1]
        # the whole buffer: its rows size the weighted sum's allocation (the most tokens of the shape)
        self.received = empty("combine", (most, hidden), expert_out.dtype, device)
        self.entries = self.received[:h.tokens * h.topk]
        if expert_out.dim() == 3:
            self.back = scratch("back", (h.place.numel(), hidden), expert_out.dtype, device)
            self.send_back = bind(exchange, self.entries, self.back, self.send_splits, self.recv_splits)


def _combine_plan(exchange: Exchange, expert_out: torch.Tensor, h: Handle, empty: Empty, scratch: Scratch,
                  kernels: Callable[[], tuple] | None) -> CombinePlan:
    """The :class:`CombinePlan` of a combine whose ``expert_out`` is the dispatch's (a plan miss)."""
    if h.shape is not None and (tuple(expert_out.shape) != h.shape or expert_out.dtype != h.dtype):
        raise CollectiveError(f"moe.combine: expert_out must be the dispatch's expert rows, hidden size and dtype: "
                              f"{h.dtype} of shape {h.shape}, not {expert_out.dtype} of shape "
                              f"{tuple(expert_out.shape)}")
    return CombinePlan(exchange, expert_out, h, empty, scratch, kernels)


def combine_with(exchange: Exchange, expert_out: torch.Tensor, handle: Handle, empty: Empty = plain,
                 scratch: Scratch = plain, plans: Plans = unplanned,
                 kernels: Callable[[], tuple[WeightedSum | None, Gather | None, Callable | None]] | None = None
                 ) -> torch.Tensor:
    """:func:`combine` over ``exchange``, receiving rows into ``empty``'s buffer, the
    all-to-all's splits copied into ``scratch``'s buffer (:data:`Scratch`); both buffers and their
    views in the shape's :class:`CombinePlan` from ``plans`` (:data:`Plans`), made once
    ``expert_out`` passes its check against the handle's shape and dtype (both in the plan's key:
    a key seen before passed it); ``kernels()``: ``(weighted_sum, gather, regions)``, asked once
    per plan (:func:`combine`'s: the communicator's kernels), the weighted sum's
    (:data:`WeightedSum`; None: torch operations, ``3 * topk`` of them over the rows), the rows
    sent back's (:data:`Gather`; None: :func:`gather_rows`) and the two-kernel combine's
    (:func:`collectives.runtime.moe.regions_combine`, which replaces all three steps; None:
    they run); no ``kernels``: all None."""
    h = handle
    key = ("combine", expert_out.shape, expert_out.dtype, h.shape, h.dtype, h.tokens, h.topk, h.most, h.world,
           expert_out.device, kernels is None)
    p: CombinePlan = plans(key, lambda: _combine_plan(exchange, expert_out, h, empty, scratch, kernels))
    weighted_sum, gather, regions = p.kernels
    if regions is not None:  # (the handle's fields by address: no view made)
        place, kept, send_splits, recv_splits, slots, valid = h.ptrs("place", "kept", "send_splits", "recv_splits",
                                                                     "slots", "valid")
        if slots is None:
            h.slots = inverse(h.order)
            slots = h.slots.data_ptr()
        return regions(expert_out, place, kept, recv_splits, send_splits, slots, valid, h.weights, h.tokens)
    hidden = expert_out.shape[-1]
    back = p.back
    if back is None:  # throughput: rows for the call's receive buffer
        back = scratch("back", (h.place.numel(), hidden), expert_out.dtype, expert_out.device)
    if gather is None:
        gather_rows(expert_out.reshape(-1, hidden), h.place, h.kept, h.send_splits, h.recv_splits, p.splits, back)
    else:  # (the handle's fields by address: no view made)
        place, kept, send_splits, recv_splits, slots, valid = h.ptrs("place", "kept", "send_splits", "recv_splits",
                                                                     "slots", "valid")
        gather(expert_out, place, kept, send_splits, recv_splits, p.splits, back)
    entries = p.entries
    if weighted_sum is None:  # the torch steps read every entry: the unsent ones as zeros
        entries.zero_()
    if p.send_back is None:  # in the dispatch's sorted order
        exchange(entries, back, p.send_splits, p.recv_splits)
    else:
        p.send_back()
    if weighted_sum is not None:  # (it takes an unsent entry's weight as 0)
        if gather is None:
            slots, valid = h.ptrs("slots", "valid")
        if slots is None:
            h.slots = inverse(h.order)
            slots = h.slots.data_ptr()
        # the whole buffer: its rows size the output's allocation (the most tokens of the shape)
        return weighted_sum(p.received, slots, valid, h.weights, h.tokens, h.topk)
    weights = torch.where(h.valid.view(h.tokens, h.topk), h.weights, 0).float()
    y = torch.empty_like(entries).index_copy_(0, h.order, entries).view(h.tokens, h.topk, hidden)
    total = y[:, 0].float() * weights[:, 0, None]
    for k in range(1, h.topk):
        total = total + y[:, k].float() * weights[:, k, None]
    return total.to(expert_out.dtype)


def dispatch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
             mode: str = "low_latency", max_tokens: int | None = None, validate: bool = False,
             fp8: bool = False, group: Group = None) -> tuple[torch.Tensor, torch.Tensor, Handle]:
    """Tested on GPUs bit for bit, eager and in CUDA graphs replayed with new routings (one-GPU
    worlds of 2 to 8 ranks, 2 x H100; the wrong combine outputs of an early world run's graph
    replays, 2 runs of 5, have not recurred in any run since).  Send each token of ``x``
    ([tokens, hidden]) to its ``topk_ids`` experts' ranks (see the module).  ``mode``:
    ``"low_latency"`` or ``"throughput"`` (see the module).  ``max_tokens`` (low latency): the
    most tokens any rank dispatches (default: this rank's count; the same on every rank).
    ``fp8``: the rows travel and arrive as float8_e4m3fn with a scale per token
    (:func:`quantize`; ``handle.scales``; not inside torch.compile).  One kernel routes the
    entries, one makes the rows sent, one places the received rows
    (:mod:`collectives.runtime.moe`; torch steps with ``COLLECTIVES_MOE_FUSED=0``).
    Returns ``(expert_x, counts, handle)``."""
    max_tokens = x.shape[0] if max_tokens is None else max_tokens
    if torch.compiler.is_compiling():  # the custom operator (collectives.runtime.moe), on the default communicator
        comms.traceable(group, "moe.dispatch")
        if validate or fp8 or mode != "low_latency":
            raise CollectiveError("moe.dispatch inside torch.compile: mode must be 'low_latency' (throughput mode "
                                  "reads sizes back to the host), without validate (it reads the ids back) and "
                                  "without fp8")
        expert_x, counts, handle = runtime_moe.traced_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens,
                                                               _world())
        return expert_x, counts, handle_from(handle, topk_weights)
    return _dispatch(group, x, topk_ids, topk_weights, num_experts, max_tokens, mode, validate, fp8)


def _dispatch(group: Group, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
              max_tokens: int, mode: str = "low_latency", validate: bool = False, fp8: bool = False,
              apart: bool = False) -> tuple[torch.Tensor, torch.Tensor, Handle]:
    """The eager :func:`dispatch` on ``group``'s layer (``apart``: see :func:`dispatch_with`)."""
    comm = comms.communicator(group)
    layer = _layer(comm, group)
    return dispatch_with(layer.exchange, comm.world, x, topk_ids, topk_weights, num_experts, max_tokens, mode,
                         validate, layer.empty, fp8, layer.placement_for, layer.pack_for, layer.scratch,
                         layer.route_for, layer.plan, apart)


def combine(expert_out: torch.Tensor, handle: Handle, *, group: Group = None) -> torch.Tensor:
    """Each dispatched token's weighted sum of its experts' rows of ``expert_out`` ([L, W *
    max_tokens, hidden] in low-latency mode, the packed [sum(counts), hidden] in throughput
    mode; of the dispatch's ``x`` dtype: anything else raises :class:`CollectiveError` before
    any exchange), in its original order and dtype.  One kernel sums f32, f16 and bf16 rows of top-k up to
    16 (:mod:`collectives.runtime.moe`; torch steps with ``COLLECTIVES_MOE_FUSED=0`` and
    for other rows)."""
    if torch.compiler.is_compiling():
        comms.traceable(group, "moe.combine")
        return runtime_moe.traced_combine(expert_out, handle.weights, handle_tensors(handle, COMBINE_FIELDS))
    comm = comms.communicator(group)
    layer = _layer(comm, group)
    return combine_with(layer.exchange, expert_out, handle, layer.empty, layer.scratch, layer.plan,
                        lambda: (layer.launch(runtime_moe.weighted_sum, expert_out.dtype, expert_out.shape[-1],
                                              handle.topk),
                                 layer.launch(runtime_moe.gather, expert_out.shape[-1] * expert_out.element_size()),
                                 layer.regions_for(expert_out.dtype, expert_out.shape[-1], handle.topk,
                                                   expert_out.shape[1] // comm.world * handle.topk,
                                                   expert_out.device)
                                 if expert_out.dim() == 3 else None))


def handle_tensors(handle: Handle, fields: tuple[str, ...] = HANDLE_FIELDS) -> tuple[torch.Tensor, ...]:
    """The handle's tensors named by ``fields`` (the operators' arguments and results)."""
    return tuple(getattr(handle, f) for f in fields)


def handle_from(tensors: tuple[torch.Tensor, ...], topk_weights: torch.Tensor) -> Handle:
    """The handle of the operators' tensors (:data:`~collectives.runtime.moe.HANDLE_FIELDS`, or
    the combine's leading ones) and the dispatch's weights."""
    tokens, topk = topk_weights.shape
    return Handle(weights=topk_weights, tokens=tokens, topk=topk, **dict(zip(HANDLE_FIELDS, tensors)))


@torch_ops.implement("moe_dispatch")
def _dispatch_kernel(x, topk_ids, topk_weights, num_experts, max_tokens, world):
    # (each output its own allocation: a custom operator's outputs must not alias each other)
    expert_x, counts, handle = _dispatch(None, x, topk_ids, topk_weights, num_experts, max_tokens, apart=True)
    return (expert_x, counts) + handle_tensors(handle)


@torch_ops.implement("moe_combine")
def _combine_kernel(expert_out, topk_weights, *handle):
    return combine(expert_out, handle_from(handle, topk_weights))


def _world() -> int:
    """The default communicator's world size (a constant of a traced graph)."""
    from .runtime.communicator import communicator

    return communicator().world


#: The receive buffers' names; buffer ``i``'s growth is agreed as slot ``-(8 + i)``
#: (:meth:`~collectives.runtime.communicator.Communicator.agree_growth`; the Lamport buffers
#: take -1, -2, -4).
BUFFER_NAMES = ("dispatch", "combine", "regions")


def _symmetric(group: Group) -> Empty:
    """Receive buffers in ``group``'s symmetric memory (the all-to-all stores into them
    directly): its communicator's
    (:meth:`~collectives.runtime.communicator.Communicator.receive_buffer`), allocated once per
    name, shape and dtype (collective: every rank asks for the same) and reused: the next
    all-to-all into one waits for its receiver, which has finished with it by then (stream
    order).  A rank that has no buffer of the shape first agrees the allocation with every
    rank (bounded by the communicator's timeout): where the others have one cached (a shape
    that differs on this rank: ``max_tokens=None`` with fewer tokens here, another top-k or
    hidden size), it raises CollectiveError instead of entering the collective allocation
    alone."""
    from .runtime.communicator import communicator

    comm = communicator(group)
    return lambda name, shape, dtype, device: comm.receive_buffer(name, shape, dtype, -(8 + BUFFER_NAMES.index(name)))


class GroupExchange:
    """``group``'s all-to-all as an :data:`Exchange` (:func:`collectives.all_to_all`), whose
    ``bind`` keeps a call's plan for tensors used again (:class:`collectives.api.BoundAllToAll`)."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, out: torch.Tensor, inp: torch.Tensor, out_splits: torch.Tensor | None,
                 in_splits: torch.Tensor | None, bounded: bool = False) -> torch.Tensor:
        from . import api

        return api.all_to_all(out, inp, out_splits, in_splits, group=self.group, bounded=bounded)

    def bind(self, out: torch.Tensor, inp: torch.Tensor, out_splits: torch.Tensor | None,
             in_splits: torch.Tensor | None, bounded: bool = False) -> Callable[[], torch.Tensor]:
        """The all-to-all of these tensors, its plan kept (:class:`collectives.api.BoundAllToAll`)."""
        from . import api

        return api.BoundAllToAll(out, inp, out_splits, in_splits, group=self.group, bounded=bounded)


def _layer(comm: Communicator, group: Group) -> runtime_moe.Layer:
    """``comm``'s :class:`~collectives.runtime.moe.Layer` (made at its first call, on
    ``group``'s all-to-all and receive buffers), its call opened
    (:meth:`~collectives.runtime.moe.Layer.begin`)."""
    layer = comm.moe_layer or runtime_moe.layer(comm, lambda: (GroupExchange(group), _symmetric(group)))
    layer.begin()
    return layer


__all__ = ["BUFFER_NAMES", "E4M3_MAX", "MODES", "CombinePlan", "DispatchPlan", "Empty", "Exchange", "Gather",
           "GroupExchange", "Handle", "Pack", "PackFor", "Placement", "PlacementFor", "Plans", "Route", "RouteFor",
           "Scratch", "WeightedSum", "bind", "combine", "combine_with", "dispatch", "dispatch_with",
           "Wire", "gather_rows", "handle_from", "handle_tensors", "header_rows", "inverse", "message_size", "pack_rows",
           "place_rows",
           "plain", "quantize", "route_ids", "unplanned", "wire"]
