"""The design every barrier algorithm shares: ``start barrier -> move data -> end barrier`` for
one thread block, paired with the same block index on every rank (the data partition is the
same on every rank, so a per-block barrier orders exactly the accesses that conflict).

:class:`Blocks` holds the ``@cute.jit`` building blocks of one
:class:`~collectives.algorithms.KernelKey` (the backend chosen at compile time by
``key.backend``: multimem for ``multicast`` and, traced under :func:`ptxops.emulate_multicast`
by :func:`~collectives.device.launch.launcher`, for ``multicast_emulated``; NVLink loads and stores
for ``peer``); :func:`kernel` wraps an algorithm's data phase in the barriers, epochs and
deadline.  Data moves in 16-byte vectors through registers; the elements past the
last whole vector (and all of them when the data is not 16-byte aligned, ``vector=1``) take
the peer path one at a time.

Runtime arguments are plain 64-bit addresses and counts (:data:`collectives.layouts.COLLECTIVE`
names each and says what it holds), so one compile serves every tensor of a key.
"""

from __future__ import annotations

from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..config import MULTICAST_PATHS, VECTOR_BYTES
from ..device import reduce, signals
from ..device.kernel_args import KernelArgs
from ..layouts import COLLECTIVE, DATA_PHASE, TIMEOUT, Layout
from ..device.launch import launcher
from ..dtypes import DTYPES
from .key import KernelKey

#: The reach of the data buffers a kernel moves between with weak copies (store_local,
#: copy_local): any rank's, so the widest a GPU's memory has (an ordered access would need .sys).
DATA = signals.PEER


class Blocks:
    """The building blocks specialised on ``key`` (dtype, vector width, world, backend, op):
    ``@cute.jit`` methods whose compile-time choices are the attributes set here."""

    def __init__(self, key: KernelKey) -> None:
        self.world = key.world
        self.threads = key.threads
        self.dtype = DTYPES[key.dtype].cute
        self.acc = DTYPES[key.dtype].accumulator.cute
        self.vec = key.elements_per_access
        self.multicast = key.backend in MULTICAST_PATHS
        self.op = key.op
        self.unroll = key.unroll if self.vec > 1 else 1
        self.copy_unroll = max(1, self.unroll // 2)
        self.tile_vectors = key.tile_bytes // VECTOR_BYTES
        # The barrier collective's block made no accesses before its barrier: no bar.sync first.
        self.sync = key.collective != "barrier"

    @cute.jit
    def barrier(self, pad_table, pad_mc, pad, rank, block, calls, epoch, deadline, err, which, size):
        if cutlass.const_expr(self.multicast):
            return signals.barrier_multicast(pad_mc, pad, rank, block, calls, epoch, deadline, err, which, size,
                                             self.world, self.sync)
        else:
            return signals.barrier_peer(pad_table, pad, rank, block, calls, epoch, deadline, err, which, size,
                                        self.world, self.sync)

    @cute.jit
    def load_reduce(self, addrs, mc, offsets, n: cutlass.Constexpr):
        """The reduced values at each of ``offsets`` (a tuple: all loads in flight at once)."""
        if cutlass.const_expr(self.multicast and n > 1):
            return [reduce.load_reduce_multicast(mc, o, self.dtype, self.acc, n, self.op) for o in offsets]
        else:
            return reduce.load_reduce_peer(addrs, offsets, self.dtype, self.acc, n, self.op)

    @cute.jit
    def store_all(self, addrs, mc, offset, values, n: cutlass.Constexpr):
        if cutlass.const_expr(self.multicast and n > 1):
            reduce.store_multicast(mc, offset, values, self.dtype, n)
        else:
            reduce.store_peers(addrs, offset, values, self.dtype, n)

    @cute.jit
    def store_local(self, address, offset, values, n: cutlass.Constexpr):
        align = cutlass.const_expr(n * self.dtype.width // 8)
        dst = signals.gmem(self.dtype, address, align, DATA, "collectives.algorithms.design.Blocks.store_local")
        ptxops.st(dst + cute.assume(offset, divby=n), values)

    @cute.jit
    def copy_vector(self, src, dst, off):
        """dst[off:off + vec] = src[off:off + vec]: one vector (``off`` a multiple of ``vec``)."""
        align = cutlass.const_expr(self.vec * self.dtype.width // 8)
        at = signals.gmem(self.dtype, src, align, DATA, "collectives.algorithms.design.Blocks.copy_vector")
        at = at + cute.assume(off, divby=self.vec)
        values = ptxops.ld(at, num_elements=self.vec)
        self.store_local(dst, off, values, self.vec)

    @cute.jit
    def copy_vectors(self, src, dst, vs):
        """dst = src at the vectors ``vs`` (indices, in vectors): every load before any store."""
        align = cutlass.const_expr(self.vec * self.dtype.width // 8)
        at = signals.gmem(self.dtype, src, align, DATA, "collectives.algorithms.design.Blocks.copy_vectors")
        offsets = [Int64(v) * self.vec for v in vs]
        values = [ptxops.ld(at + cute.assume(o, divby=self.vec), num_elements=self.vec) for o in offsets]
        for o, value in zip(offsets, values):
            self.store_local(dst, o, value, self.vec)

    @cute.jit
    def copy_local(self, src, dst, begin, end, first, step):
        """dst[i] = src[i] for i in [begin, end): the whole vectors from ``begin`` (a vector
        boundary) split as the data phase splits them, then the elements past the last one;
        ``copy_unroll`` vectors loaded at a time."""
        if cutlass.const_expr(self.copy_unroll == 1):
            v = begin // self.vec + first
            while v < end // self.vec:
                self.copy_vector(src, dst, Int64(v) * self.vec)
                v += step
        else:
            def copy_here(vs):
                self.copy_vectors(src, dst, vs)

            self.each_vector(begin // self.vec, end // self.vec, first, step, copy_here, self.copy_unroll)
        j = cutlass.max(Int64(end // self.vec * self.vec), begin) + first
        while j < end:
            at = signals.gmem(self.dtype, src, self.dtype.width // 8, DATA, "collectives.algorithms.design.Blocks.copy_local")
            self.store_local(dst, j, ptxops.ld(at + j), 1)
            j += step

    @cute.jit
    def copy_tiles(self, src, dst, begin, end):
        """dst[v] = src[v] for the whole vectors v in [begin, end) of the TMA tiles this block
        moves (tile ``t`` of the range, of ``key.tile_bytes``, goes to block ``t % blocks``:
        the split of :func:`collectives.device.tiles.reduce_tiles`)."""
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        blocks = cute.arch.grid_dim()[0]
        t = Int64(block)
        while t * self.tile_vectors < end - begin:
            v = begin + t * self.tile_vectors + tidx
            while v < cutlass.min(begin + (t + 1) * self.tile_vectors, end):
                self.copy_vector(src, dst, v * self.vec)
                v += self.threads
            t += blocks

    @cute.jit
    def copy_slices(self, src, dst, n, first, step, copy_slice):
        """dst = src for all ``n`` elements, each block taking exactly the vectors that block of
        every rank reads or writes in the data phase (``copy_slice(src, dst, begin, end)`` the
        vectors [begin, end) of each rank's slice), then the elements past the last vector."""
        vectors = n // self.vec
        chunk = (vectors + self.world - 1) // self.world
        for q in cutlass.range_constexpr(self.world):
            begin = Int64(q) * chunk
            end = cutlass.min(begin + chunk, vectors)
            copy_slice(src, dst, begin, end)
        self.copy_local(src, dst, Int64(vectors * self.vec), n, first, step)

    @cute.jit
    def each_vector(self, begin, end, first, step, body, unroll: cutlass.Constexpr = 0):
        """``body((v, ...))`` for this thread's vectors in [begin, end): ``unroll`` (default
        ``self.unroll``) at a time while they last, then one by one (the same vectors per block
        as a plain stride loop)."""
        width = cutlass.const_expr(unroll or self.unroll)
        v = begin + first
        while v + (width - 1) * step < end:
            body(tuple(v + u * step for u in range(width)))
            v += width * step
        while v < end:
            body((v,))
            v += step

    @cute.jit
    def own_slice(self, n, rank):
        """The vectors [begin, end) of rank ``rank``'s slice (a two-shot's share of the data)."""
        vectors = n // self.vec
        chunk = (vectors + self.world - 1) // self.world
        begin = Int64(rank) * chunk
        return begin, cutlass.min(begin + chunk, vectors)

    @cute.jit
    def reduce_tail(self, addrs, data_mc, n, rank, first, step):
        """The last rank reduces the elements past the last whole vector and stores them to all."""
        if rank == self.world - 1:
            j = Int64(n // self.vec * self.vec) + first
            while j < n:
                self.store_all(addrs, data_mc, j, self.load_reduce(addrs, data_mc, (j,), 1)[0], 1)
                j += step

    @cute.jit
    def stage_whole(self, src, own, n, first, step):
        """Copy all ``n`` elements of this rank's input into its symmetric buffer."""
        self.copy_local(src, own, Int64(0), n, first, step)


@cute.jit
def tile_timeout(landed, err, rank):
    """Record a TMA stage that never landed (as a timeout of this rank, in the data phase)."""
    if not landed and cute.arch.thread_idx()[0] == 0:
        signals.record_error(err, Int32(TIMEOUT), Int32(DATA_PHASE), rank, cute.arch.block_idx()[0], rank)


@cute.jit
def pick(addrs: list, q: Int32) -> Int64:
    """``addrs[q]`` for a runtime rank ``q`` (a select per rank: the list is of registers)."""
    chosen = addrs[0]
    for r in cutlass.range_constexpr(1, len(addrs)):
        if q == r:
            chosen = addrs[r]
    return chosen


def kernel(key: KernelKey, b: Blocks, stage: Callable | None, move: Callable | None = None,
           gather: Callable | None = None, buffers: Callable | None = None, push: Callable | None = None,
           pull: Callable | None = None, layout: Layout = COLLECTIVE):
    """The ``@cute.jit`` launcher of ``key``'s kernel: ``stage(src, own, n, first, step)`` (for
    ``stage_in``; or, given ``push``, ``push(data_table, src, n, rank, first, step)`` storing the
    input into other ranks' buffers instead; ``push``, ``move`` and ``pull`` then get
    ``data_table`` as ``addrs``, not a list), the start barrier, ``move(addrs, data_mc, out,
    src, n, rank, first, step, buffers, deadline, err)`` (the data phase; none for a bare
    barrier), the end barrier (unless ``end_barrier=False``) and ``gather(src, out, n, first,
    step)`` (for ``gather_out``, where given) or ``pull(addrs, data_mc, out, n, rank, first,
    step)`` (reading the ranks' buffers after the end barrier).
    ``buffers(smem)`` allocates the shared memory ``move`` takes.  ``layout``: the kernel's
    arguments (:mod:`collectives.layouts`); its ``emulated`` argument is what ``move`` and
    ``pull`` get as ``data_mc``."""
    world, threads = key.world, key.threads
    single = key.collective == "barrier"  # launched as one block (Communicator.barrier)

    @cute.jit
    def kernel(args: KernelArgs):
        data_table, data_mc, out, src, n = args.data_table, getattr(args, layout.emulated), args.out, args.src, args.n
        pad_table, pad_mc, pad, err, rank, timeout_ns = (args.pad_table, args.pad_mc, args.pad, args.err, args.rank,
                                                         args.timeout_ns)
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        blocks = cute.arch.grid_dim()[0]
        smem = SmemAllocator()
        flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        shared = None
        if cutlass.const_expr(buffers is not None):
            shared = buffers(smem)
        calls, last = signals.enter_call(pad, world, single)
        deadline = cute.arch.globaltimer() + timeout_ns
        size = signals.size_word(n, args.kinds)
        first = Int64(block) * threads + tidx
        step = Int64(blocks) * threads
        addrs = None
        if cutlass.const_expr(push is not None):
            addrs = data_table  # a push reads each address from the table where it uses it
            push(addrs, src, n, rank, first, step)
        elif cutlass.const_expr(key.stage_in):
            stage(src, signals.peer_address(data_table, rank), n, first, step)
        counts = None
        if cutlass.const_expr(move is None):
            # A bare barrier has no block_all: a barrier of its threads puts every thread's read
            # of C (enter_call) before thread 0 advances it (nothing else orders them in the
            # memory model; thread 0 may pass first, on its own word), and every thread's read of
            # our Lamport counts before any thread moves them on (an empty rank's barrier meeting
            # a rank that runs a Lamport kernel, lamport_missed).  One warp: bar.warp.sync.
            counts = signals.lamport_counts(pad, world)
            if cutlass.const_expr(threads <= cute.arch.WARP_SIZE):
                cute.arch.sync_warp()
            else:
                cute.arch.sync_threads()
        ok = b.barrier(pad_table, pad_mc, pad, rank, block, calls, calls + Uint32(1), deadline, err, Int32(0), size)
        if cutlass.const_expr(move is None):
            if not ok:
                signals.lamport_missed(pad, calls, counts, world)
        if cutlass.const_expr(move is not None):  # a bare barrier has nothing to guard
            ok = signals.block_all(flag, ok)
            if cutlass.const_expr(push is None):
                addrs = [signals.peer_address(data_table, Int32(r)) for r in range(world)]
            if ok:
                move(addrs, data_mc, out, src, n, rank, first, step, shared, deadline, err)
                if cutlass.const_expr(key.barriers == 2):
                    ok2 = b.barrier(pad_table, pad_mc, pad, rank, block, calls, calls + Uint32(2), deadline, err, Int32(1),
                                    size)
                    ok2 = signals.block_all(flag, ok2)
                    if cutlass.const_expr(key.gather_out and gather is not None):
                        if ok2:
                            gather(signals.peer_address(data_table, rank), out, n, first, step)
                    if cutlass.const_expr(pull is not None):
                        if ok2:
                            pull(addrs, data_mc, out, n, rank, first, step)
            else:  # a failed start: only here, so no value of it is live across the data phase
                signals.lamport_missed_start(pad_table, rank, calls, world)  # (a rank that ran Lamport here?)
        signals.leave_call(pad, calls, last, world, single)

    return launcher(kernel, threads, emulate=key.backend == "multicast_emulated" and world, pdl=key.pdl,
                    layout=layout)


__all__ = ["Blocks", "kernel", "pick", "tile_timeout"]
