"""The uneven all-to-all: every rank sends chunk ``r`` of its input (``in_splits[r]`` elements,
in rank order) to rank ``r``, which receives it as chunk ``s`` of its output
(``out_splits[s]`` elements from rank ``s``, in rank order).

Push, over the send/receive slots of :mod:`collectives.layouts` (device side
:mod:`collectives.device.all_to_all`): no barrier.  The grid is ``world x parts`` blocks; block
``(d, j)`` (``d = block % world``, ``j = block // world``) moves part ``j`` of two chunks: the
one this rank sends to rank ``rank + d`` and the one it receives from rank ``rank - d``
(``d = 0``: its own chunk, copied locally).  Per pair of ranks:

1. the receiver's block ``(d, 0)`` posts ``ready`` into the sender's region: where the chunk
   goes (the allocation's number and a byte offset in it: ranks may receive at different
   places of their allocations) and the size it expects;
2. the sender's blocks ``(d, j)`` wait for it, store their part of the chunk straight into the
   receiver's buffer over NVLink (when the sizes agree and the allocation is the one the
   sender's own call receives into, so its table addresses it, and of its element type:
   :func:`collectives.layouts.receiving`), and each posts its
   ``arrived`` (after a ``bar.sync``; :data:`~collectives.layouts.REFUSED` when it sent
   nothing);
3. the receiver's blocks ``(d, j)`` wait for their part's ``arrived`` and, when the receive
   buffer is a staging buffer, copy the part out to the output (``direct``: the output is the
   receive buffer, symmetric, and holds the data already).  A block whose wait timed out
   overwrites its ``ready`` in the sender's region with the epoch just past the call
   (:func:`~collectives.device.signals.gave_up`): a sender that comes after the receiver's
   host raised then times out too instead of storing into a buffer its owner has left.

Every block posts before it waits and waits only for posts that blocks of the same ``d`` make
before any wait of theirs, so no block waits on one that is itself waiting (all blocks are
resident: at most :data:`MAX_BLOCKS`).  Splits are device arrays (int64[W]) read by the
kernel: splits on the device cost no host synchronisation, and a size mismatch between a
sender's ``in_splits`` and a receiver's ``out_splits`` is caught on the device by both ends of
the pair (a recoverable error; pairs that agree complete).  Each copy moves 16-byte vectors
where the source and destination addresses agree modulo 16 (the elements before the first
whole vector and after the last one singly), else single elements.

Bounded (:attr:`AllToAllKey.bounded`, ``collectives.all_to_all(..., bounded=True)``): receivers
need not know what each source sends.  Receiver ``r``'s output is cut in ``world`` slots of
whole rows (:func:`collectives.layouts.slot`), sender ``s``'s chunk landing at slot ``s``; its
``ready`` announces the slot as the most it takes, the sender's wait passes a slot at least its
chunk, its ``arrived`` carries the size it sent, the receiver's wait passes a size at most its
slot (:func:`collectives.layouts.judge_within`) and writes the rows into ``out_splits`` (0 where
its wait failed).  A chunk past its slot is a size mismatch on both ends, nothing stored.  The
MoE dispatch sends its counts this way, at the head of its rows (:mod:`collectives.moe`).

The transport sits behind :class:`Transport`'s methods (the part's copy, the peer's buffer
address, the sender's part with its ``arrived``, the receiver's ``ready``), chosen by the key's
``transport``: ``nvlink`` (ptxops loads and stores through the peers' mapped addresses, the
default) or ``nvshmem`` (:class:`NvshmemTransport`: NVSHMEM put-with-signal,
:mod:`collectives.algorithms.nvshmem_exchange`), with the same protocol, words and waits.
The multicast backends have nothing to multicast here: an all-to-all is point to point, so
every backend runs this (peer) kernel.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cutlass
import cutlass.cute as cute
from cutlass import Int8, Int16, Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from .. import config
from ..config import MAX_WORLD, VECTOR_BYTES
from ..device import all_to_all as exchange, signals
from ..device.signals import LOCAL, PEER
from ..dtypes import DTYPES, dtype as registered
from ..layouts import (
    ARRIVED_WAIT,
    MAX_CHUNK,
    PHASES,
    PLACE_MISMATCH,
    READY_WAIT,
    REFUSED,
    SIZE_MISMATCH,
    TIMEOUT,
    Arg,
    ExchangeLayout,
    Layout,
)
from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from .base import Algorithm
from .family import SNAPSHOT_WORLDS, Family, register
from .protocol import Runtime
from .residency import CoResidencyError, Residency, share

#: Most thread blocks of an all-to-all kernel (``world x parts``): all resident at once on an
#: H100 (132 SMs), which the handshake needs.
MAX_BLOCKS = 128

#: Vectors each thread loads before it stores them (loads in flight at once).
UNROLL = 4
#: The same for a staged receive's copy out of the staging buffer (a local copy, once the
#: sender's part has arrived), which runs on the kernel's few blocks (``world x parts``, 32) after
#: their sends: at 4 loads in flight a plain output's all-to-all took 30 us more than a symmetric
#: one at 7.3 MB on 4 x H200 (114.6 vs 84.4, 512 tokens of the MoE bench), a copy at ~190 GB/s.
#: Measured in one-GPU worlds (1 x H200, ``collectives.tools.bench --world W``, all-to-all rows,
#: 2026-11-29, two alternated runs, us, staged at 56 MB per rank): W = 4: 471 / 474 at 4, 444 / 445
#: at 8, 401 / 395 at 16 (direct: 253-258 throughout); W = 2: 190 / 191, 181 / 180, 159 / 159;
#: no change past noise at 1.8 and 7.3 MB.  90 registers a thread at 16 (60 at 4): two blocks of
#: 256 still fit an SM.
COPY_OUT_UNROLL = 16
#: Thread blocks of an all-to-all kernel the runtime launches (:func:`default_parts`).
DEFAULT_BLOCKS = 32
#: How a chunk reaches its receiver (:class:`Transport`): ``nvlink``, this GPU's stores through
#: the peer's mapped address (the default); ``nvshmem``, NVSHMEM put-with-signal
#: (:class:`NvshmemTransport`: nvshmem4py installed, the communicator's heap NVSHMEM's).
TRANSPORTS = ("nvlink", "nvshmem")


def default_parts(world: int) -> int:
    """Thread blocks per pair of ranks the runtime uses: :data:`DEFAULT_BLOCKS` in all."""
    return max(1, DEFAULT_BLOCKS // world)


def grid(world: int, residency: Residency | None) -> tuple[int, bool]:
    """``(parts, pdl)`` of the all-to-all kernels a communicator launches: :func:`default_parts`
    with programmatic dependent launch as :data:`collectives.config.PDL` says, where the rank
    has its GPU alone.  Where ranks share it (``residency``), the grid is capped at the rank's
    share (:func:`~collectives.algorithms.residency.share`), which needs ``world`` blocks at
    least (one per pair): PDL is dropped where its successors' room would leave fewer (8
    ranks on an H100: 7 blocks each with it, 14 without), and the parts per pair shrink to fit.

    Raises:
        CoResidencyError: not even one block per pair of ranks fits each rank's share.
    """
    parts, pdl = default_parts(world), config.PDL
    if residency is None:
        return parts, pdl
    if pdl and share(residency.limits, residency.ranks, pdl=True) < world:
        pdl = False
    blocks = share(residency.limits, residency.ranks, pdl)
    if blocks < world:
        raise CoResidencyError(
            f"the all-to-all needs one block per pair of ranks ({world} per rank), but {residency.ranks} ranks on "
            f"one GPU of {residency.limits.sms} SMs have {blocks} each (collectives.algorithms.residency); use fewer "
            "ranks")
    return min(parts, blocks // world), pdl


ALL_TO_ALL = Layout("AllToAllArgs", (
    Arg("recv_table", Int64, "device table of every rank's address of the symmetric allocation this rank "
                             "receives into (int64[W])"),
    Arg("recv_id", Int64, "that allocation's number and this rank's element type (collectives.layouts.receiving: "
                          "the same on every rank)"),
    Arg("recv", Int64, "where this rank receives: its output (direct: symmetric, anywhere in that allocation) "
                       "or a staging buffer of at least out_n elements"),
    Arg("out", Int64, "this rank's output"),
    Arg("src", Int64, "this rank's input"),
    Arg("in_splits", Int64, "device int64[W]: rows this rank sends to each rank, in rank order"),
    Arg("out_splits", Int64, "device int64[W]: rows this rank receives from each rank, in rank order"),
    Arg("row", Int64, "elements per row (the splits count rows of dimension 0; 0 where rows are empty)"),
    Arg("in_n", Int64, "elements of the input (the in_splits must sum to at most this)"),
    Arg("out_n", Int64, "elements of the output and the receive buffer (the out_splits must sum to at most this)"),
    Arg("slot_table", Int64, "device table of every rank's slot region (collectives.layouts.ExchangeLayout)"),
    Arg("slots", Int64, "this rank's slot region (its entry of slot_table; its words hold the count of all-to-all "
                        "calls)"),
    Arg("err", Int64, "the error records (host-mapped int32[2][5], collectives.layouts.ERROR_FIELDS)"),
    Arg("rank", Int32, "this rank"),
    Arg("timeout_ns", Int64, "the bound of every wait, in nanoseconds of %globaltimer"),
))


@dataclass(frozen=True)
class AllToAllKey:
    """The compile-time choices of one all-to-all kernel: element type, world, ``parts`` (thread
    blocks per pair of ranks), threads per block (256 by default: a block of 256 needs at most
    128 registers a thread for two to fit an SM, so a one-GPU world of 8 ranks' 32 blocks each
    stays resident), ``direct`` (the output is the receive buffer), ``pdl`` (as
    :attr:`collectives.algorithms.KernelKey.pdl`), ``transport`` (:data:`TRANSPORTS`) and
    ``bounded``.

    ``bounded`` (off by default): the receiver does not know what each source sends.  Its
    output is cut in ``world`` equal slots of whole rows (:func:`collectives.layouts.slot`),
    source ``s``'s chunk landing at slot ``s``; its ``ready`` announces the slot as the most it
    takes, each sender's ``arrived`` the size it sent, and the kernel writes the rows each
    source sent into ``out_splits`` (an output here: never read).  A chunk above the slot is a
    size mismatch on both ends of its pair (:func:`collectives.layouts.judge_within`), nothing
    stored and 0 rows written, never an overrun."""

    dtype: str
    world: int
    parts: int = 4
    threads: int = 256
    direct: bool = False
    pdl: bool = field(default_factory=lambda: config.PDL)
    transport: str = "nvlink"
    bounded: bool = False

    def __post_init__(self) -> None:
        registered(self.dtype)  # ValueError naming the registered dtypes
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {self.transport!r}")
        if self.bounded and self.transport != "nvlink":
            raise ValueError("a bounded all-to-all moves its chunks over the nvlink transport only")
        if not 2 <= self.world <= MAX_WORLD:
            raise ValueError(f"world size must be 2..{MAX_WORLD}, not {self.world}")
        if not 1 <= self.parts or self.world * self.parts > MAX_BLOCKS:
            raise ValueError(f"parts must be 1..{MAX_BLOCKS // self.world} for world {self.world} (world x parts "
                             f"<= {MAX_BLOCKS} blocks, all resident), not {self.parts}")
        check_threads(self.threads)

    @property
    def blocks(self) -> int:
        return self.world * self.parts

    @property
    def vector(self) -> int:
        """Elements per 16-byte vector."""
        return DTYPES[self.dtype].elements(VECTOR_BYTES)


class Transport:
    """How a chunk's part reaches its destination, specialised on a key: ``copy_part`` moves
    part ``j`` of a chunk of ``m`` elements from one address to another (this GPU's or a
    peer's, through its NVLink address), each with its reach (:func:`ptxops.reach`:
    :data:`~collectives.device.signals.LOCAL` or :data:`~collectives.device.signals.PEER`;
    the copies are weak, so the reach checks no scope, but every pointer has one).  The part's
    elements are :func:`collectives.layouts.part`'s (vector-aligned parts of the chunk, the
    same for the sender's and the receiver's block ``j``); within it, 16-byte vectors where
    both addresses agree modulo 16, else single elements; every thread of the block takes its
    share.  ``send_part`` moves the sender's part and posts its ``arrived``, ``post_ready`` posts
    a receiver's ``ready`` (and its place) into the sender's region: this transport with NVLink
    stores and ``st.release.sys``, the handshake of :mod:`collectives.device.all_to_all`."""

    name = "nvlink"

    def __init__(self, key: AllToAllKey) -> None:
        self.dtype = DTYPES[key.dtype].cute
        self.bytes = DTYPES[key.dtype].bytes
        self.vec = key.vector
        self.parts = key.parts
        self.threads = key.threads

    @cute.jit
    def peer_buffer(self, table: Int64, rank: Int32) -> Int64:
        return signals.peer_address(table, rank)

    @cute.jit
    def post_ready(self, slot_table: Int64, slots: Int64, rank: Int32, sender: Int32, offset: Int64, size: Uint32,
                   epoch: Uint32, world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
        """As receiver ``rank``: ``ready`` (``size``, ``epoch``) and the place ``offset`` into
        ``sender``'s slot region (``slot_table``: every rank's region; ``slots``: ours)."""
        exchange.post_ready(slot_table, rank, sender, offset, size, epoch, world, parts)

    @cute.jit
    def send_part(self, shared: cute.Tensor, args: KernelArgs, send_at: Int64, send_n: Int64, send_size: Uint32,
                  j: Int32, tidx: Int32, rank: Int32, receiver: Int32, epoch: Uint32, world: cutlass.Constexpr,
                  parts: cutlass.Constexpr) -> None:
        """As sender ``rank``, after thread 0's wait for ``receiver``'s ready (its status in
        ``shared[0]``, the place's offset in ``shared[1]``): part ``j`` of our chunk (``send_n``
        elements from element ``send_at`` of the input) into the receiver's buffer, then its
        ``arrived``: ``send_size`` when the wait passed, :data:`~collectives.layouts.REFUSED`
        (nothing sent) on a size mismatch, nothing after a timeout."""
        element = self.bytes
        cute.arch.sync_threads()
        status = Int32(shared[0])
        if status == 0:
            to = self.peer_buffer(args.recv_table, receiver) + shared[1]
            self.copy_part(args.src + send_at * element, to, send_n, j, LOCAL, PEER)
        cute.arch.sync_threads()  # the part's stores before the release
        if status != Int32(TIMEOUT) and tidx == 0:  # nothing sent is announced too (REFUSED): no wait hangs
            sent = send_size
            if status != 0:
                sent = Uint32(REFUSED)
            exchange.post_arrived(args.slot_table, rank, receiver, j, sent, epoch, world, parts)

    @cute.jit
    def part(self, m: Int64, j: Int32) -> tuple:
        """(first element of part ``j`` of a chunk of ``m``, elements of a whole part): part
        ``j`` is ``[begin, min((j + 1) * size, m))`` (:func:`collectives.layouts.part` with the
        vector's alignment)."""
        size = ((m + self.parts - 1) // self.parts + self.vec - 1) // self.vec * self.vec
        return cutlass.min(Int64(j) * size, m), size

    @cute.jit
    def copy_part(self, src: Int64, dst: Int64, m: Int64, j: Int32, src_reach: cutlass.Constexpr,
                  dst_reach: cutlass.Constexpr, unroll: cutlass.Constexpr = UNROLL) -> None:
        begin, size = self.part(m, j)
        self.copy(src + begin * self.bytes, dst + begin * self.bytes, cutlass.min(Int64(j + 1) * size, m) - begin,
                  src_reach, dst_reach, unroll)

    @cute.jit
    def copy(self, src: Int64, dst: Int64, m: Int64, src_reach: cutlass.Constexpr,
             dst_reach: cutlass.Constexpr, unroll: cutlass.Constexpr = UNROLL) -> None:
        """dst[0:m] = src[0:m] by the block's threads (``src_reach``, ``dst_reach``: the
        addresses' reaches), ``unroll`` vectors loaded at a time by each."""
        by = "collectives.algorithms.all_to_all.Transport.copy"
        tidx = Int64(cute.arch.thread_idx()[0])
        head = m  # elements before the first 16-byte boundary: all of them unless both addresses agree
        vectors = Int64(0)
        if ((src ^ dst) & Int64(VECTOR_BYTES - 1)) == Int64(0):
            head = cutlass.min(((Int64(VECTOR_BYTES) - (src & Int64(VECTOR_BYTES - 1)))
                                & Int64(VECTOR_BYTES - 1)) // self.bytes, m)
            vectors = (m - head) // self.vec
        src_v, dst_v = src + head * self.bytes, dst + head * self.bytes  # 16-byte aligned
        v = tidx
        while v + (unroll - 1) * self.threads < vectors:  # unroll loads in flight, then their stores
            ats = [cute.assume((v + u * self.threads) * self.vec, divby=self.vec) for u in range(unroll)]
            loaded = [ptxops.ld(signals.gmem(self.dtype, src_v, VECTOR_BYTES, src_reach, by) + at,
                                num_elements=self.vec)
                      for at in ats]
            for at, values in zip(ats, loaded):
                ptxops.st(signals.gmem(self.dtype, dst_v, VECTOR_BYTES, dst_reach, by) + at, values)
            v += unroll * self.threads
        while v < vectors:
            at = cute.assume(v * self.vec, divby=self.vec)
            values = ptxops.ld(signals.gmem(self.dtype, src_v, VECTOR_BYTES, src_reach, by) + at, num_elements=self.vec)
            ptxops.st(signals.gmem(self.dtype, dst_v, VECTOR_BYTES, dst_reach, by) + at, values)
            v += self.threads
        e = tidx  # the head, then the tail after the vectors
        while e < m - vectors * self.vec:
            i = e
            if e >= head:
                i = e + vectors * self.vec
            value = ptxops.ld(signals.gmem(self.dtype, src, self.bytes, src_reach, by) + i)
            ptxops.st(signals.gmem(self.dtype, dst, self.bytes, dst_reach, by) + i, value)
            e += self.threads


@cute.jit
def chunk_of(splits: Int64, peer: Int32, n: Int64, row: Int64, world: cutlass.Constexpr) -> tuple:
    """(element offset of ``peer``'s chunk, its elements, the size to announce for it): the
    prefix sum of the splits array (rows of ``row`` elements); the size is
    :data:`~collectives.layouts.REFUSED` when any split is below 0 or its chunk above
    :data:`~collectives.layouts.MAX_CHUNK` elements (compared as rows, before the product
    that could wrap), or the chunks sum past ``n`` elements."""
    at, count, total = Int64(0), Int64(0), Int64(0)
    most = Int64(MAX_CHUNK) // cutlass.max(row, Int64(1))  # rows per chunk at most
    valid = True
    for r in cutlass.range_constexpr(world):
        s = ptxops.ld(signals.gmem(Int64, splits, 8, LOCAL, "collectives.algorithms.all_to_all.chunk_of") + r,
                      dtype=Int64)
        valid = valid and s >= Int64(0) and s <= most
        if peer == r:
            at, count = total, s * row
        total += s * row
    size = Uint32(REFUSED)
    if valid and total <= n:
        size = Uint32(count)
    return at, count, size


@cute.jit
def slot_of(peer: Int32, n: Int64, row: Int64, world: cutlass.Constexpr) -> tuple:
    """:func:`chunk_of` of a bounded all-to-all's receiver: (element offset of ``peer``'s slot,
    its elements, the size announced for it: the most ``peer`` may send), as
    :func:`collectives.layouts.slot` cuts an output of ``n`` elements."""
    rows = Int64(0)
    if row > Int64(0):
        rows = cutlass.min(n // row // Int64(world), Int64(MAX_CHUNK) // row)
    size = rows * row
    return Int64(peer) * size, size, Uint32(size)


@cute.jit
def record_rows(splits: Int64, peer: Int32, rows: Int64) -> None:
    """A bounded all-to-all's receiver: ``splits[peer] = rows`` (the rows ``peer`` sent)."""
    ptxops.st(signals.gmem(Int64, splits, 8, LOCAL, "collectives.algorithms.all_to_all.record_rows") + peer, rows)


class NvshmemTransport(Transport):
    """The chunks and handshake words over NVSHMEM put-with-signal and signal updates
    (:mod:`collectives.algorithms.nvshmem_exchange`: what each call orders); the protocol, the waits
    and the local copies (a rank's own chunk, a staged receive) are :class:`Transport`'s.
    Making one imports :mod:`ptxops.nvshmem` (:class:`~ptxops.errors.NvshmemMissing` without
    nvshmem4py)."""

    name = "nvshmem"

    #: The integer of each element width that the parts move as (a copy keeps the bits; NVSHMEM
    #: binds no fp8 type; CuTeDSL pointers are signless: :data:`ptxops.spec.nvshmem.SIGNLESS`).
    WORDS: ClassVar[dict[int, type]] = {1: Int8, 2: Int16, 4: Int32, 8: Int64}

    def __init__(self, key: AllToAllKey) -> None:
        super().__init__(key)
        from . import nvshmem_exchange

        self.device = nvshmem_exchange
        self.word = self.WORDS[self.bytes]

    @cute.jit
    def post_ready(self, slot_table: Int64, slots: Int64, rank: Int32, sender: Int32, offset: Int64, size: Uint32,
                   epoch: Uint32, world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
        self.device.post_ready(slots, rank, sender, offset, size, epoch, world, parts)

    @cute.jit
    def send_part(self, shared: cute.Tensor, args: KernelArgs, send_at: Int64, send_n: Int64, send_size: Uint32,
                  j: Int32, tidx: Int32, rank: Int32, receiver: Int32, epoch: Uint32, world: cutlass.Constexpr,
                  parts: cutlass.Constexpr) -> None:
        """As :meth:`Transport.send_part`: one block-scope put-with-signal of the part that sets
        its ``arrived`` in the receiver's region, or the word alone where nothing moves.  The
        receive allocation is named by our address of it (NVSHMEM's symmetric address)."""
        cute.arch.sync_threads()
        status = Int32(shared[0])
        if status == 0:
            begin, size = self.part(send_n, j)
            n = cutlass.min(Int64(j + 1) * size, send_n) - begin
            if n > Int64(0):
                at = begin * self.bytes
                self.device.put_part(self.word, self.bytes, args.src + send_at * self.bytes + at,
                                     self.peer_buffer(args.recv_table, rank) + shared[1] + at, n, args.slots, rank,
                                     receiver, j, send_size, epoch, world, parts)
            elif tidx == 0:
                self.device.post_arrived(args.slots, rank, receiver, j, send_size, epoch, world, parts)
        elif status != Int32(TIMEOUT) and tidx == 0:  # nothing sent is announced too (REFUSED): no wait hangs
            self.device.post_arrived(args.slots, rank, receiver, j, Uint32(REFUSED), epoch, world, parts)


def transport_of(key: AllToAllKey) -> Transport:
    """The :class:`Transport` of ``key.transport``."""
    return NvshmemTransport(key) if key.transport == "nvshmem" else Transport(key)


def build(key: AllToAllKey):
    """The ``@cute.jit`` launcher of the all-to-all kernel for ``key`` (grid ``key.blocks``)."""
    world, parts = key.world, key.parts
    transport = transport_of(key)
    element = DTYPES[key.dtype].bytes
    # The input and a staged output are this GPU's (LOCAL); peers store into the receive buffer
    # (PEER), which is the output itself when ``direct``.
    output = PEER if key.direct else LOCAL

    @cute.jit
    def kernel(args: KernelArgs):
        rank, slots, err = args.rank, args.slots, args.err
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        d, j = block % world, block // world
        receiver, sender = (rank + d) % world, (rank + world - d) % world
        smem = SmemAllocator()
        shared = smem.allocate_tensor(Int64, cute.make_layout(4 if key.bounded else 3), byte_alignment=8)
        counter = ExchangeLayout(world, parts).counter
        calls, last = signals.enter_call(slots, world, counter=counter)
        deadline = cute.arch.globaltimer() + args.timeout_ns
        epoch = calls + Uint32(1)
        send_at, send_n, send_size = chunk_of(args.in_splits, receiver, args.in_n, args.row, world)
        if cutlass.const_expr(key.bounded):  # our slot of each sender's, the most it may send
            recv_at, recv_n, recv_size = slot_of(sender, args.out_n, args.row, world)
        else:
            recv_at, recv_n, recv_size = chunk_of(args.out_splits, sender, args.out_n, args.row, world)
        if d == 0:  # our own chunk
            if cutlass.const_expr(key.bounded):
                fits = send_size <= recv_size  # (REFUSED is above every slot)
                if fits:
                    transport.copy_part(args.src + send_at * element, args.out + recv_at * element, send_n, j,
                                        LOCAL, output)
                if j == 0 and tidx == 0:
                    rows = Int64(0)
                    if fits:
                        rows = send_n // cutlass.max(args.row, Int64(1))
                    else:
                        signals.record_error(err, Int32(SIZE_MISMATCH), Int32(READY_WAIT), rank, block, rank)
                    record_rows(args.out_splits, rank, rows)
            elif send_size == recv_size and send_size != Uint32(REFUSED):
                transport.copy_part(args.src + send_at * element, args.out + recv_at * element, send_n, j, LOCAL,
                                    output)
            elif j == 0 and tidx == 0:
                signals.record_error(err, Int32(SIZE_MISMATCH), Int32(READY_WAIT), rank, block, rank)
        else:
            if j == 0 and tidx == 0:
                offset = args.recv - transport.peer_buffer(args.recv_table, rank) + recv_at * element
                transport.post_ready(args.slot_table, slots, rank, sender, exchange.place(args.recv_id, offset),
                                     recv_size, epoch, world, parts)
            if tidx == 0:  # the sender's side: wait for the receiver's ready
                if cutlass.const_expr(key.bounded):  # its slot must take our chunk
                    status, _ = exchange.wait_within(exchange.ready_word(slots, receiver, world, parts), calls,
                                                     send_size, Uint32(MAX_CHUNK), deadline)
                else:
                    status = exchange.wait_word(exchange.ready_word(slots, receiver, world, parts), calls,
                                                send_size, deadline)
                allocation, offset = exchange.place_of(exchange.ready_offset(slots, receiver, world, parts))
                if status != 0:
                    signals.record_error(err, status, Int32(READY_WAIT), receiver, block, rank)
                elif allocation != args.recv_id:
                    status = Int32(SIZE_MISMATCH)
                    signals.record_error(err, status, Int32(PLACE_MISMATCH), receiver, block, rank)
                shared[0] = Int64(status)
                shared[1] = offset
            transport.send_part(shared, args, send_at, send_n, send_size, j, tidx, rank, receiver, epoch, world,
                                parts)
            if tidx == 0:  # the receiver's side: wait for our part of the sender's chunk
                if cutlass.const_expr(key.bounded):  # what it sent, at most our slot
                    status, sent = exchange.wait_within(exchange.arrived_word(slots, sender, j, world, parts), calls,
                                                        Uint32(0), recv_size, deadline)
                    got = Int64(0)
                    if status == 0:
                        got = Int64(sent)
                    shared[3] = got
                    rows = got // cutlass.max(args.row, Int64(1))
                    if j == 0:
                        record_rows(args.out_splits, sender, rows)
                else:
                    status = exchange.wait_word(exchange.arrived_word(slots, sender, j, world, parts), calls,
                                                recv_size, deadline)
                shared[2] = Int64(status)
                if status != 0:
                    signals.record_error(err, status, Int32(ARRIVED_WAIT), sender, block, rank)
                if status == Int32(TIMEOUT):  # we leave: a late sender's ready wait then times out, no store
                    transport.post_ready(args.slot_table, slots, rank, sender, Int64(0), Uint32(REFUSED),
                                         signals.gave_up(calls), world, parts)
            cute.arch.sync_threads()
            if cutlass.const_expr(not key.direct):
                if cutlass.const_expr(key.bounded):  # the size the sender sent
                    recv_n = shared[3]
                if shared[2] == Int64(0):
                    transport.copy_part(args.recv + recv_at * element, args.out + recv_at * element, recv_n, j,
                                        PEER, LOCAL, COPY_OUT_UNROLL)
        signals.leave_call(slots, calls, last, world, counter=counter)

    return launcher(kernel, key.threads, key.blocks, pdl=key.pdl, layout=ALL_TO_ALL)


@dataclass(frozen=True)
class AllToAllCall:
    """One all-to-all call as the API received it (its plan checks it): ``inp``'s rows to
    ``out`` as the splits say, over ``transport`` (:data:`TRANSPORTS`), ``bounded`` or exact
    (:attr:`AllToAllKey.bounded`; :func:`collectives.all_to_all`)."""

    out: Any
    inp: Any
    out_splits: Any
    in_splits: Any
    transport: str = "nvlink"
    bounded: bool = False
    collective: ClassVar[str] = "all_to_all"


class PushAllToAll(Algorithm):
    """The all-to-all as an algorithm of the one call path (``api._replan``): its plan is
    made by the communicator's exchange part
    (:meth:`~collectives.algorithms.protocol.Runtime.exchange`: the slot region, the staging
    buffer, the split tensors), a :class:`~collectives.algorithms.plan.Plan` that follows the
    communicator's stream order like every collective's."""

    collectives = ("all_to_all",)
    name = "push"
    stages_in = "never"
    barriered = False
    phases = PHASES

    def plan(self, comm: Runtime, call: AllToAllCall) -> Any:
        return comm.exchange().plan(call)

    def build(self, key: AllToAllKey) -> Any:
        return build(key)


def _to_text(key: AllToAllKey) -> str:
    """The key's id (a bounded key's ends in ``/bounded``, an NVSHMEM transport's then in
    ``/nvshmem``; the default ones have no suffix)."""
    text = f"all_to_all/push/peer/{key.dtype}/w{key.world}/p{key.parts}/t{key.threads}/d{int(key.direct)}"
    suffixes = ["bounded"] * key.bounded + [key.transport] * (key.transport != "nvlink")
    return "/".join([text, *suffixes])


def _from_text(kid: str) -> AllToAllKey:
    _, _, _, dtype, world, parts, threads, direct, *rest = kid.split("/")
    bounded = rest[:1] == ["bounded"]
    transport = rest[bounded:]
    return AllToAllKey(dtype, int(world[1:]), parts=int(parts[1:]), threads=int(threads[1:]), direct=direct == "d1",
                       transport=transport[0] if transport else "nvlink", bounded=bounded)


def _snapshot() -> list[str]:
    """The all-to-all's kernels: dtype x world x staged or direct, exact or bounded, as the
    runtime launches them."""
    return [_to_text(AllToAllKey(dtype, world, default_parts(world), direct=direct, bounded=bounded))
            for dtype, world, direct, bounded in itertools.product(DTYPES, SNAPSHOT_WORLDS, (False, True),
                                                                   (False, True))]


def _facets(kid: str) -> tuple[tuple, ...]:
    key = _from_text(kid)
    return ("all_to_all", key.dtype), ("all_to_all", key.world, key.direct), ("all_to_all", "bounded", key.bounded)


FAMILY = register(Family("all_to_all", AllToAllKey, ("all_to_all",), ALL_TO_ALL, build, _snapshot, _to_text,
                         _from_text, _facets))


__all__ = ["ALL_TO_ALL", "FAMILY", "AllToAllCall", "PushAllToAll", "DEFAULT_BLOCKS", "MAX_BLOCKS", "UNROLL", "AllToAllKey",
           "NvshmemTransport", "TRANSPORTS", "Transport", "build", "chunk_of", "default_parts", "grid", "transport_of"]
