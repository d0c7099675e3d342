"""The design every barrier algorithm shares: ``start barrier -> move data -> end barrier`` for
one thread block, paired with the same block index on every rank (the data partition is the
same on every rank, so a per-block barrier orders exactly the accesses that conflict).

:func:`blocks` gives the ``@cute.jit`` building blocks of one :class:`~collectives.config.KernelKey`
(the backend chosen at compile time by ``key.backend``: multimem for ``multicast`` and, traced
under :func:`ptxops.emulate_multicast` by :func:`~collectives.launch.launcher`, for
``multicast_emulated``; NVLink loads and stores for ``peer``); :func:`kernel` wraps an algorithm's data phase in the barriers,
epochs and deadline.  Data moves in 16-byte vectors through registers; the elements past the
last whole vector (and all of them when the data is not 16-byte aligned, ``vector=1``) take
the peer path one at a time.

Runtime arguments are plain 64-bit addresses and counts, so one compile serves every tensor of
a key:

``data_table``  device table of every rank's data buffer address (int64[W])
``data_mc``     the data buffer's multicast address (multicast; emulated: a translation table; push all-reduce: the result buffers', see :mod:`~collectives.algorithms.push`)
``out``         this rank's output (all-reduce one-shot, reduce-scatter, gathered two-shot, all-gather)
``src``         this rank's input (``stage_in``: copied in-kernel; push and all-gather: pushed)
``n``           elements per rank (all-reduce, all-gather's input) or per output (reduce-scatter)
``pad_table``   device table of every rank's signal pad; ``pad_mc`` its multicast address;
``pad``         this rank's signal pad (its entry of ``pad_table``, saving the kernel a load)
``err``         the error record (host-mapped int32[5])
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..config import DATA_PHASE, MULTICAST_PATHS, TIMEOUT, VECTOR_BYTES, KernelKey
from ..device import reduce, signals
from ..dtypes import DTYPES
from ..launch import launcher


def blocks(key: KernelKey) -> SimpleNamespace:
    """The building blocks specialised on ``key`` (dtype, vector width, world, backend, op)."""
    world = key.world
    threads = key.threads
    dtype = DTYPES[key.dtype].cute
    acc = DTYPES[key.dtype].accumulator.cute
    vec = key.elements_per_access
    multicast = key.backend in MULTICAST_PATHS
    op = key.op
    unroll = 2 if vec > 1 else 1
    tile_vectors = key.tile_bytes // VECTOR_BYTES

    # The barrier collective's block made no accesses before its barrier: no bar.sync first.
    sync = key.collective != "barrier"

    @cute.jit
    def barrier(pad_table, pad_mc, pad, rank, block, calls, epoch, deadline, err, which, size):
        if cutlass.const_expr(multicast):
            return signals.barrier_multicast(pad_mc, pad, rank, block, calls, epoch, deadline, err, which, size, world,
                                             sync)
        else:
            return signals.barrier_peer(pad_table, pad, rank, block, calls, epoch, deadline, err, which, size, world,
                                        sync)

    @cute.jit
    def load_reduce(addrs, mc, offsets, n: cutlass.Constexpr):
        """The reduced values at each of ``offsets`` (a tuple: all loads in flight at once)."""
        if cutlass.const_expr(multicast and n > 1):
            return [reduce.load_reduce_multicast(mc, o, dtype, acc, n, op) for o in offsets]
        else:
            return reduce.load_reduce_peer(addrs, offsets, dtype, acc, n, op)

    @cute.jit
    def store_all(addrs, mc, offset, values, n: cutlass.Constexpr):
        if cutlass.const_expr(multicast and n > 1):
            reduce.store_multicast(mc, offset, values, dtype, n)
        else:
            reduce.store_peers(addrs, offset, values, dtype, n)

    @cute.jit
    def store_local(address, offset, values, n: cutlass.Constexpr):
        align = cutlass.const_expr(n * dtype.width // 8)
        ptxops.st(signals.gmem(dtype, address, align) + cute.assume(offset, divby=n), values)

    @cute.jit
    def copy_vector(src, dst, off):
        """dst[off:off + vec] = src[off:off + vec]: one vector (``off`` a multiple of ``vec``)."""
        align = cutlass.const_expr(vec * dtype.width // 8)
        values = ptxops.ld(signals.gmem(dtype, src, align) + cute.assume(off, divby=vec), num_elements=vec)
        store_local(dst, off, values, vec)

    @cute.jit
    def copy_local(src, dst, begin, end, first, step):
        """dst[i] = src[i] for i in [begin, end): the whole vectors from ``begin`` (a vector
        boundary) split as the data phase splits them, then the elements past the last one."""
        v = begin // vec + first
        while v < end // vec:
            copy_vector(src, dst, Int64(v) * vec)
            v += step
        j = cutlass.max(Int64(end // vec * vec), begin) + first
        while j < end:
            store_local(dst, j, ptxops.ld(signals.gmem(dtype, src, dtype.width // 8) + j), 1)
            j += step

    @cute.jit
    def copy_tiles(src, dst, begin, end):
        """dst[v] = src[v] for the whole vectors v in [begin, end) of the TMA tiles this block
        moves (tile ``t`` of the range, of ``key.tile_bytes``, goes to block ``t % blocks``:
        the split of :func:`collectives.device.tiles.reduce_tiles`)."""
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        blocks = cute.arch.grid_dim()[0]
        t = Int64(block)
        while t * tile_vectors < end - begin:
            v = begin + t * tile_vectors + tidx
            while v < cutlass.min(begin + (t + 1) * tile_vectors, end):
                copy_vector(src, dst, v * vec)
                v += threads
            t += blocks

    @cute.jit
    def copy_slices(src, dst, n, first, step, copy_slice):
        """dst = src for all ``n`` elements, each block taking exactly the vectors that block of
        every rank reads or writes in the data phase (``copy_slice(src, dst, begin, end)`` the
        vectors [begin, end) of each rank's slice), then the elements past the last vector."""
        vectors = n // vec
        chunk = (vectors + world - 1) // world
        for q in cutlass.range_constexpr(world):
            begin = Int64(q) * chunk
            end = cutlass.min(begin + chunk, vectors)
            copy_slice(src, dst, begin, end)
        copy_local(src, dst, Int64(vectors * vec), n, first, step)

    @cute.jit
    def each_vector(begin, end, first, step, body):
        """``body((v, ...))`` for this thread's vectors in [begin, end): ``unroll`` at a time
        while they last, then one by one (the same vectors per block as a plain stride loop)."""
        v = begin + first
        while v + (unroll - 1) * step < end:
            body(tuple(v + u * step for u in range(unroll)))
            v += unroll * step
        while v < end:
            body((v,))
            v += step

    @cute.jit
    def own_slice(n, rank):
        """The vectors [begin, end) of rank ``rank``'s slice (a two-shot's share of the data)."""
        vectors = n // vec
        chunk = (vectors + world - 1) // world
        begin = Int64(rank) * chunk
        return begin, cutlass.min(begin + chunk, vectors)

    @cute.jit
    def reduce_tail(addrs, data_mc, n, rank, first, step):
        """The last rank reduces the elements past the last whole vector and stores them to all."""
        if rank == world - 1:
            j = Int64(n // vec * vec) + first
            while j < n:
                store_all(addrs, data_mc, j, load_reduce(addrs, data_mc, (j,), 1)[0], 1)
                j += step

    @cute.jit
    def stage_whole(src, own, n, first, step):
        """Copy all ``n`` elements of this rank's input into its symmetric buffer."""
        copy_local(src, own, Int64(0), n, first, step)

    return SimpleNamespace(
        world=world, threads=threads, dtype=dtype, acc=acc, vec=vec, multicast=multicast, op=op,
        barrier=barrier, load_reduce=load_reduce, store_all=store_all, store_local=store_local,
        copy_vector=copy_vector, copy_local=copy_local, copy_tiles=copy_tiles, copy_slices=copy_slices,
        each_vector=each_vector, own_slice=own_slice, reduce_tail=reduce_tail, stage_whole=stage_whole,
    )


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


def kernel(key: KernelKey, b: SimpleNamespace, stage: Callable | None, move: Callable | None = None,
           gather: Callable | None = None, buffers: Callable | None = None, push: Callable | None = None,
           pull: Callable | None = None):
    """The ``@cute.jit`` launcher of ``key``'s kernel: ``stage(src, own, n, first, step)`` (for
    ``stage_in``; or, given ``push``, ``push(data_table, src, n, rank, first, step)`` storing the
    input into other ranks' buffers instead; ``push``, ``move`` and ``pull`` then get
    ``data_table`` as ``addrs``, not a list), the start barrier, ``move(addrs, data_mc, out,
    src, n, rank, first, step, buffers, deadline, err)`` (the data phase; none for a bare
    barrier), the end barrier (unless ``end_barrier=False``) and ``gather(src, out, n, first,
    step)`` (for ``gather_out``, where given) or ``pull(addrs, data_mc, out, n, rank, first,
    step)`` (reading the ranks' buffers after the end barrier).
    ``buffers(smem)`` allocates the shared memory ``move`` takes."""
    world, threads = key.world, key.threads
    single = key.collective == "barrier"  # launched as one block (Communicator.barrier)

    @cute.jit
    def kernel(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
    ):
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
        size = Uint32(n)
        first = Int64(block) * threads + tidx
        step = Int64(blocks) * threads
        addrs = None
        if cutlass.const_expr(push is not None):
            addrs = data_table  # a push reads each address from the table where it uses it
            push(addrs, src, n, rank, first, step)
        elif cutlass.const_expr(key.stage_in):
            stage(src, signals.peer_address(data_table, rank), n, first, step)
        ok = b.barrier(pad_table, pad_mc, pad, rank, block, calls, calls + Uint32(1), deadline, err, Int32(0), size)
        if cutlass.const_expr(move is not None):  # a bare barrier has nothing to guard
            ok = signals.block_all(flag, ok)
            if cutlass.const_expr(push is None):
                addrs = [signals.peer_address(data_table, Int32(r)) for r in range(world)]
            if cutlass.const_expr(not key.end_barrier):
                if ok:
                    move(addrs, data_mc, out, src, n, rank, first, step, shared, deadline, err)
            if cutlass.const_expr(key.barriers == 2):
                if ok:
                    move(addrs, data_mc, out, src, n, rank, first, step, shared, deadline, err)
                    ok2 = b.barrier(pad_table, pad_mc, pad, rank, block, calls, calls + Uint32(2), deadline, err, Int32(1),
                                    size)
                    ok2 = signals.block_all(flag, ok2)
                    if cutlass.const_expr(key.gather_out and gather is not None):
                        if ok2:
                            gather(signals.peer_address(data_table, rank), out, n, first, step)
                    if cutlass.const_expr(pull is not None):
                        if ok2:
                            pull(addrs, data_mc, out, n, rank, first, step)
        signals.leave_call(pad, calls, last, world, single)

    return launcher(kernel, threads, emulate=key.backend == "multicast_emulated" and world, pdl=key.pdl)


__all__ = ["blocks", "kernel", "pick", "tile_timeout"]
