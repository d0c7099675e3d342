"""A TMA tile pipeline: bulk-load every rank's tile, reduce it in shared memory, bulk-store it.

A range of bytes (the same on every rank) is cut into tiles; thread block ``b`` of ``B``
takes tiles ``b, b + B, ...``.  Thread 0 keeps ``stages`` tiles in flight: for each, one
``cp.async.bulk`` per rank into that stage's input buffers, all completing on the stage's
mbarrier (whose expected transaction count the arrive raised by their bytes).  When a stage
lands, the block reduces its ``world`` inputs (16-bit floats in f32, fp8 in f16) into one of two
output buffers, and thread 0 bulk-stores it to each destination (or once to a multicast
address), then refills the stage with the tile ``stages`` ahead.  An output buffer is rewritten
only after the bulk store that read it two tiles earlier has read it (``wait_group.read 1``).

:func:`shared_buffers` allocates the buffers (call it in the kernel); :func:`reduce_tiles`
runs the pipeline.  Generic-proxy writes (the other ranks', released by a barrier) become
visible to the bulk loads through ``fence.proxy.async.global``; the bulk stores have completed
and are visible to the generic proxy when :func:`reduce_tiles` returns.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64
from cutlass.memory import SmemAllocator

import ptxops

from ..config import TMA_DRAIN_NS, VECTOR_BYTES
from .reduce import combine, convert
from .signals import MULTICAST, PEER, gmem, spin


def smem_bytes(world: int, tile: int, stages: int) -> int:
    """Shared memory :func:`shared_buffers` takes (plus alignment padding)."""
    return (stages * world + 2) * tile + 8 * stages + 256


@cute.jit
def shared_buffers(smem: SmemAllocator, dtype: cutlass.Constexpr, world: cutlass.Constexpr,
                   tile: cutlass.Constexpr, stages: cutlass.Constexpr):
    """(inputs, outputs, mbarriers, flag): pointers to ``stages * world`` input tiles, two
    output tiles of ``tile`` bytes, ``stages`` mbarriers and one Int32 word."""
    elements = tile * 8 // dtype.width
    inputs = smem.allocate_tensor(dtype, cute.make_layout(stages * world * elements), byte_alignment=128)
    outputs = smem.allocate_tensor(dtype, cute.make_layout(2 * elements), byte_alignment=128)
    mbars = smem.allocate_tensor(Int64, cute.make_layout(stages), byte_alignment=8)
    flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
    by = "collectives.device.tiles.shared_buffers"
    return (ptxops.reach(inputs.iterator, "cta", by=by), ptxops.reach(outputs.iterator, "cta", by=by),
            ptxops.reach(mbars.iterator, "cta", by=by), flag)


@cute.jit
def _tile_at(k: Int64, tile: cutlass.Constexpr) -> Int64:
    """Byte offset of this block's ``k``-th tile (tile ``block + k * blocks`` of the range)."""
    return (Int64(cute.arch.block_idx()[0]) + k * cute.arch.grid_dim()[0]) * tile


@cute.jit
def _tile_bytes(k: Int64, nbytes: Int64, tile: cutlass.Constexpr) -> Int64:
    """Bytes of this block's ``k``-th tile (the last tile of the range may be short)."""
    return cutlass.min(Int64(tile), nbytes - _tile_at(k, tile))


@cute.jit
def _issue(k: Int64, srcs, src_offset: Int64, nbytes: Int64, inputs, mbars, dtype: cutlass.Constexpr,
           tile: cutlass.Constexpr, stages: cutlass.Constexpr) -> None:
    """Bulk-load this block's ``k``-th tile of every rank into stage ``k % stages`` (one thread)."""
    world = cutlass.const_expr(len(srcs))
    per_tile = cutlass.const_expr(tile * 8 // dtype.width)
    s = Int32(k % stages)
    at = _tile_at(k, tile)
    size = Int32(_tile_bytes(k, nbytes, tile))
    ptxops.mbarrier_arrive(mbars + s, size * world)
    for q in cutlass.range_constexpr(world):
        dst = inputs + cute.assume((s * world + q) * per_tile, divby=per_tile)
        src = gmem(dtype, srcs[q] + src_offset + at, VECTOR_BYTES, PEER, "collectives.device.tiles.reduce_tiles")
        ptxops.cp_async_bulk(dst, src, size, mbar=mbars + s)


@cute.jit
def reduce_tiles(
    srcs,
    src_offset: Int64,
    nbytes: Int64,
    dsts,
    dst_offset: Int64,
    mc: Int64,
    buffers,
    dtype: cutlass.Constexpr,
    acc: cutlass.Constexpr,
    op: cutlass.Constexpr,
    tile: cutlass.Constexpr,
    stages: cutlass.Constexpr,
    multicast: cutlass.Constexpr,
    deadline: Int64,
) -> Boolean:
    """For this block's tiles of bytes ``[0, nbytes)`` (a multiple of 16): reduce the tile at
    ``src_offset`` of every address in ``srcs`` (rank order) and store the result at
    ``dst_offset`` of every address in ``dsts``, or of ``mc`` with ``multicast``.  Returns
    False (in every thread) if a stage had not landed by ``%globaltimer`` ``deadline``: the
    block then stores nothing more and exits once the loads still in flight have landed."""
    inputs, outputs, mbars, flag = buffers
    tidx = cute.arch.thread_idx()[0]
    block = cute.arch.block_idx()[0]
    blocks = cute.arch.grid_dim()[0]
    count = (nbytes + tile - 1) // tile
    mine = (count - block + blocks - 1) // blocks

    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            ptxops.mbarrier_init(mbars + s, 1)
        ptxops.fence(op_restrict="mbarrier_init", sem="release", scope="cluster")
        ptxops.fence(proxy="async.global")
        k = Int64(0)
        while k < cutlass.min(Int64(stages), mine):
            _issue(k, srcs, src_offset, nbytes, inputs, mbars, dtype, tile, stages)
            k += 1
    cute.arch.sync_threads()

    landed = Boolean(True)
    k = Int64(0)
    while k < mine and landed:
        s = Int32(k % stages)
        parity = Int32((k // stages) % 2)
        # Every thread waits (acquiring the bulk loads' writes); thread 0's outcome decides for
        # the whole block, so that a deadline passing mid-block cannot split it.
        landed = spin(lambda: ptxops.mbarrier_try_wait(mbars + s, phase=parity), lambda x: x, deadline)
        if tidx == 0:
            flag[0] = Int32(landed)
        cute.arch.sync_threads()
        landed = flag[0] != 0
        if landed:
            _reduce_and_store(k, mine, nbytes, inputs, outputs, mbars, srcs, src_offset, dsts, dst_offset, mc, dtype, acc, op,
                              tile, stages, multicast)
            k += 1
    if tidx == 0:
        if not landed:
            _drain(k, mine, mbars, stages)
        ptxops.cp_async_bulk_wait_group(0)
        ptxops.fence(proxy="async.global")
    cute.arch.sync_threads()
    return landed


@cute.jit
def _drain(k: Int64, mine: Int64, mbars, stages: cutlass.Constexpr) -> None:
    """After stage ``k`` missed the deadline: wait for it and the stages issued after it, so
    that no bulk load still writes into shared memory once the block has exited (bounded by
    :data:`~collectives.config.TMA_DRAIN_NS`; one thread)."""
    drained = cute.arch.globaltimer() + TMA_DRAIN_NS
    j = k
    while j < cutlass.min(k + stages, mine):
        s = Int32(j % stages)
        parity = Int32((j // stages) % 2)
        spin(lambda: ptxops.mbarrier_try_wait(mbars + s, phase=parity), lambda x: x, drained)
        j += 1


@cute.jit
def _reduce_and_store(k: Int64, mine: Int64, nbytes: Int64, inputs, outputs, mbars, srcs, src_offset: Int64, dsts,
                      dst_offset: Int64, mc: Int64, dtype: cutlass.Constexpr, acc: cutlass.Constexpr,
                      op: cutlass.Constexpr, tile: cutlass.Constexpr, stages: cutlass.Constexpr,
                      multicast: cutlass.Constexpr) -> None:
    """Reduce this block's landed ``k``-th tile (of ``mine``) into an output buffer, bulk-store
    it, and refill its stage with the tile ``stages`` ahead."""
    world = cutlass.const_expr(len(srcs))
    tidx = cute.arch.thread_idx()[0]
    threads = cute.arch.block_dim()[0]
    per_tile = cutlass.const_expr(tile * 8 // dtype.width)
    vec = cutlass.const_expr(VECTOR_BYTES * 8 // dtype.width)
    s = Int32(k % stages)
    size = _tile_bytes(k, nbytes, tile)
    out = outputs + cute.assume(Int32(k % 2) * per_tile, divby=per_tile)
    v = Int64(tidx)
    while v < size // VECTOR_BYTES:
        total = convert(ptxops.ld(inputs + cute.assume((s * world) * per_tile + Int32(v) * vec, divby=vec),
                                  num_elements=vec), acc)
        for q in cutlass.range_constexpr(1, world):
            at = inputs + cute.assume((s * world + q) * per_tile + Int32(v) * vec, divby=vec)
            total = combine(total, convert(ptxops.ld(at, num_elements=vec), acc), op)
        ptxops.st(out + cute.assume(Int32(v) * vec, divby=vec), convert(total, dtype))
        v += threads
    ptxops.fence(proxy="async.shared::cta")
    cute.arch.sync_threads()
    if tidx == 0:
        at = _tile_at(k, tile)
        if cutlass.const_expr(multicast):
            dst = gmem(dtype, mc + dst_offset + at, VECTOR_BYTES, MULTICAST, "collectives.device.tiles.reduce_tiles")
            ptxops.cp_async_bulk(dst, out, Int32(size))
        else:
            for d in cutlass.range_constexpr(len(dsts)):
                dst = gmem(dtype, dsts[d] + dst_offset + at, VECTOR_BYTES, PEER, "collectives.device.tiles.reduce_tiles")
                ptxops.cp_async_bulk(dst, out, Int32(size))
        ptxops.cp_async_bulk_commit_group()
        if k + stages < mine:
            _issue(k + stages, srcs, src_offset, nbytes, inputs, mbars, dtype, tile, stages)
        ptxops.cp_async_bulk_wait_group(1, read=True)
    cute.arch.sync_threads()


__all__ = ["reduce_tiles", "shared_buffers", "smem_bytes"]
