"""The collective kernels: one design, two backends chosen at compile time.

Every kernel is ``start barrier -> move data -> end barrier`` for one thread block, paired with
the same block index on every rank (the data partition is the same on every rank, so a
per-block barrier orders exactly the accesses that conflict).  Data moves in 16-byte vectors
through registers, or, for ``algorithm="tma"``, in tiles through the bulk-copy pipeline of
:mod:`collectives.device.tiles` (block ``b`` owning tiles ``b, b + B, ...`` of each slice);
the elements past the last whole vector (and all of them when the data is not 16-byte
aligned, ``vector=1``) take the peer path one at a time.  The Lamport all-reduce, which has
no barrier, is built by :mod:`collectives.lamport_kernel` with the same launch arguments.

Runtime arguments are plain 64-bit addresses and counts, so one compile serves every tensor of
a :class:`~collectives.config.KernelKey`:

``data_table``  device table of every rank's data buffer address (int64[W])
``data_mc``     the data buffer's multicast address (multicast backend; 0 otherwise)
``out``         this rank's output (all-reduce one-shot, reduce-scatter, gathered two-shot)
``src``         this rank's input when it is not symmetric (``stage_in``: copied in-kernel)
``n``           elements per rank (all-reduce) or per output (reduce-scatter)
``pad_table``   device table of every rank's signal pad; ``pad_mc`` its multicast address;
``pad``         this rank's signal pad (its entry of ``pad_table``, saving the kernel a load)
``err``         the error record (host-mapped int32[5])
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from . import lamport_kernel
from .config import DATA_PHASE, DTYPES, TIMEOUT, TMA_STAGES, VECTOR_BYTES, KernelKey
from .device import reduce, signals, tiles
from .device.reduce import ACC, DTYPE
from .launch import example_arguments, launcher


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the kernel for ``key`` (compile it with ``cute.compile``)."""
    if key.algorithm == "lamport":
        return lamport_kernel.build(key)
    world = key.world
    threads = key.threads
    dtype = DTYPE[key.dtype]
    acc = ACC[DTYPES[key.dtype][1]]
    vec = key.elements_per_access
    multicast = key.backend == "multicast"
    op = key.op
    unroll = 2 if vec > 1 else 1
    tma = key.algorithm == "tma"
    tile = key.tile_bytes
    tile_vectors = tile // VECTOR_BYTES

    @cute.jit
    def barrier(pad_table, pad_mc, pad, rank, block, epoch, deadline, err, which, size):
        if cutlass.const_expr(multicast):
            return signals.barrier_multicast(pad_mc, pad, rank, block, epoch, deadline, err, which, size, world)
        else:
            return signals.barrier_peer(pad_table, rank, block, epoch, deadline, err, which, size, world)

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
        moves (tile ``t`` of the range goes to block ``t % blocks``)."""
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
    def copy_slices(src, dst, n, first, step):
        """dst = src for all ``n`` elements, each block taking exactly the vectors that block of
        every rank reads or writes in the data phase (two-shot: this block's share of each
        rank's slice; TMA: this block's tiles of each slice), then the elements past the last
        vector."""
        vectors = n // vec
        chunk = (vectors + world - 1) // world
        for q in cutlass.range_constexpr(world):
            begin = Int64(q) * chunk
            end = cutlass.min(begin + chunk, vectors)
            if cutlass.const_expr(tma):
                copy_tiles(src, dst, begin, end)
            else:
                copy_local(src, dst, begin * vec, end * vec, first, step)
        copy_local(src, dst, Int64(vectors * vec), n, first, step)

    @cute.jit
    def gather(src, dst, n, first, step):
        """Two-shot: copy the whole result from the symmetric buffer to ``out``, each block
        taking exactly the vectors that block of the slice's owner wrote (its end barrier
        with that block is what makes them visible)."""
        copy_slices(src, dst, n, first, step)

    @cute.jit
    def stage(src, own, n, first, step):
        """Copy this rank's input into its symmetric buffer, each block taking exactly the
        elements that block of every reader will read after the start barrier."""
        if cutlass.const_expr(key.collective == "all_reduce" and key.algorithm != "one_shot"):
            copy_slices(src, own, n, first, step)
        elif cutlass.const_expr(key.collective == "reduce_scatter"):
            for q in cutlass.range_constexpr(world):
                if cutlass.const_expr(tma):  # n fills whole vectors (a TMA reduce-scatter needs it)
                    copy_tiles(src, own, Int64(q) * (n // vec), Int64(q + 1) * (n // vec))
                else:
                    copy_local(src, own, Int64(q) * n, Int64(q + 1) * n, first, step)
        else:
            copy_local(src, own, Int64(0), n, first, step)

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
    def tile_timeout(landed, err, rank):
        """Record a TMA stage that never landed (as a timeout of this rank, in the data phase)."""
        if not landed and cute.arch.thread_idx()[0] == 0:
            signals.record_error(err, Int32(TIMEOUT), Int32(DATA_PHASE), rank, cute.arch.block_idx()[0], rank)

    @cute.jit
    def move(addrs, data_mc, out, n, rank, first, step, buffers, deadline, err):
        """The data phase between the barriers."""
        vectors = n // vec
        if cutlass.const_expr(tma and key.collective == "reduce_scatter"):
            landed = tiles.reduce_tiles(addrs, Int64(rank) * n * (dtype.width // 8), vectors * VECTOR_BYTES, [out],
                                        Int64(0), Int64(0), buffers, dtype, acc, op, tile, TMA_STAGES, False, deadline)
            tile_timeout(landed, err, rank)
        elif cutlass.const_expr(key.collective == "all_reduce" and key.algorithm != "one_shot"):
            chunk = (vectors + world - 1) // world
            begin = Int64(rank) * chunk
            end = cutlass.min(begin + chunk, vectors)

            def reduce_and_share(vs):
                offsets = tuple(Int64(v) * vec for v in vs)
                for o, values in zip(offsets, load_reduce(addrs, data_mc, offsets, vec)):
                    store_all(addrs, data_mc, o, values, vec)

            if cutlass.const_expr(tma):
                at = begin * VECTOR_BYTES
                landed = tiles.reduce_tiles(addrs, at, cutlass.max(end - begin, Int64(0)) * VECTOR_BYTES, addrs, at,
                                            data_mc, buffers, dtype, acc, op, tile, TMA_STAGES, multicast, deadline)
                tile_timeout(landed, err, rank)
            else:
                each_vector(begin, end, first, step, reduce_and_share)
            if rank == world - 1:
                j = Int64(vectors * vec) + first
                while j < n:
                    store_all(addrs, data_mc, j, load_reduce(addrs, data_mc, (j,), 1)[0], 1)
                    j += step
        else:
            base = Int64(rank) * n if cutlass.const_expr(key.collective == "reduce_scatter") else Int64(0)

            def reduce_here(vs):
                offsets = tuple(Int64(v) * vec for v in vs)
                for o, values in zip(offsets, load_reduce(addrs, data_mc, tuple(base + o for o in offsets), vec)):
                    store_local(out, o, values, vec)

            each_vector(Int64(0), vectors, first, step, reduce_here)
            j = Int64(vectors * vec) + first
            while j < n:
                store_local(out, j, load_reduce(addrs, data_mc, (base + j,), 1)[0], 1)
                j += step

    @cute.kernel
    def kernel(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
    ):
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        blocks = cute.arch.grid_dim()[0]
        smem = SmemAllocator()
        flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        buffers = None
        if cutlass.const_expr(tma):
            buffers = tiles.shared_buffers(smem, dtype, world, tile, TMA_STAGES)
        epoch = signals.read_epoch(pad, block, world)
        deadline = cute.arch.globaltimer() + timeout_ns
        size = Uint32(n)
        first = Int64(block) * threads + tidx
        step = Int64(blocks) * threads
        if cutlass.const_expr(key.stage_in):
            stage(src, signals.peer_address(data_table, rank), n, first, step)
        ok = barrier(pad_table, pad_mc, pad, rank, block, epoch + Uint32(1), deadline, err, Int32(0), size)
        ok = signals.block_all(flag, ok)
        addrs = [signals.peer_address(data_table, Int32(r)) for r in range(world)]
        if cutlass.const_expr(key.collective != "barrier" and not key.end_barrier):
            if ok:
                move(addrs, data_mc, out, n, rank, first, step, buffers, deadline, err)
        if cutlass.const_expr(key.barriers == 2):
            if ok:
                move(addrs, data_mc, out, n, rank, first, step, buffers, deadline, err)
                ok2 = barrier(pad_table, pad_mc, pad, rank, block, epoch + Uint32(2), deadline, err, Int32(1), size)
                ok2 = signals.block_all(flag, ok2)
                if cutlass.const_expr(key.gather_out):
                    if ok2:
                        gather(signals.peer_address(data_table, rank), out, n, first, step)
        if tidx == 0:
            signals.advance_epoch(pad, block, epoch + Uint32(key.barriers), world)

    return launcher(kernel, threads)


__all__ = ["ACC", "DTYPE", "build", "example_arguments"]
