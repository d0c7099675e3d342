"""TMA all-reduce and reduce-scatter: the data phase moves tiles through the bulk-copy reduce
pipeline of :mod:`collectives.device.tiles` (block ``b`` owning tiles ``b, b + B, ...`` of each
slice): all-reduce reduces this rank's slice and stores it to every rank (as two-shot does),
reduce-scatter reduces this rank's output.  Elements past the last whole vector take the peer
path one at a time."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from typing import Any

from .. import config
from ..config import TMA_STAGES, VECTOR_BYTES, Slot
from ..device import tiles
from ..layouts import DATA_PHASE
from . import design, tuning
from .base import Algorithm, Call, capped, ceil_div
from .key import KernelKey
from .protocol import Runtime
from .two_shot import sliced_plan


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the TMA kernel for ``key``."""
    b = design.Blocks(key)
    world, vec, dtype = b.world, b.vec, b.dtype
    tile = key.tile_bytes
    copy_tiles = b.copy_tiles

    @cute.jit
    def copy(src, dst, n, first, step):
        """dst = src, each block taking exactly its tiles of every rank's slice (all-reduce)."""
        b.copy_slices(src, dst, n, first, step, copy_tiles)

    @cute.jit
    def stage_scatter(src, own, n, first, step):
        """Copy this rank's ``world`` inputs into its symmetric buffer by the tiles that block
        reduces (``n`` fills whole vectors: a TMA reduce-scatter needs it)."""
        for q in cutlass.range_constexpr(world):
            copy_tiles(src, own, Int64(q) * (n // vec), Int64(q + 1) * (n // vec))

    @cute.jit
    def all_reduce(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """Reduce this rank's slice tile by tile and store it to every rank."""
        begin, end = b.own_slice(n, rank)
        at = begin * VECTOR_BYTES
        landed = tiles.reduce_tiles(addrs, at, cutlass.max(end - begin, Int64(0)) * VECTOR_BYTES, addrs, at,
                                    data_mc, buffers, dtype, b.acc, b.op, tile, TMA_STAGES, b.multicast, deadline)
        design.tile_timeout(landed, err, rank)
        b.reduce_tail(addrs, data_mc, n, rank, first, step)

    @cute.jit
    def reduce_scatter(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """Reduce this rank's output tile by tile (from every rank's buffer, by peer loads)."""
        vectors = n // vec
        landed = tiles.reduce_tiles(addrs, Int64(rank) * n * (dtype.width // 8), vectors * VECTOR_BYTES, [out],
                                    Int64(0), Int64(0), buffers, dtype, b.acc, b.op, tile, TMA_STAGES, False, deadline)
        design.tile_timeout(landed, err, rank)

    def buffers(smem):
        return tiles.shared_buffers(smem, dtype, world, tile, TMA_STAGES)

    if key.collective == "reduce_scatter":
        return design.kernel(key, b, stage=stage_scatter, move=reduce_scatter, buffers=buffers)
    return design.kernel(key, b, stage=copy, move=all_reduce, gather=copy, buffers=buffers)


def bulk_blocks(comm: Runtime, key: KernelKey, work: int, limit: int | None = None) -> int:
    """Blocks of a TMA kernel for ``work`` vectors per rank: one per tile, at most
    ``sms //`` :data:`~collectives.config.TMA_SM_DIVISOR` (a quarter: bulk copies need few), at most ``limit`` and this rank's co-residency share."""
    blocks = min(ceil_div(work * VECTOR_BYTES, key.tile_bytes), comm.sms // config.TMA_SM_DIVISOR)
    return capped(comm, key, max(1, min(blocks, limit or blocks)))


class Tma(Algorithm):
    """Tiles moved by bulk copies through shared memory on at most a quarter of the SMs
    (16-byte aligned tensors only).  The all-reduce plans as two-shot does; a reduce-scatter
    reads a large symmetric input in place and stages the rest, keeping both barriers."""

    collectives = ("all_reduce", "reduce_scatter")
    name = "tma"
    gathers_out = ("all_reduce",)
    whole_vectors_only = True
    phases = {DATA_PHASE: "TMA bulk copies"}

    def plan(self, comm: Runtime, call: Call) -> Any:
        if call.collective == "all_reduce":
            return sliced_plan(self, comm, call)
        zero_copy = call.symmetric and call.nbytes > tuning.STAGE_MAX_BYTES
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, stage_in=not zero_copy)
        data = comm.buffer(call.inp) if zero_copy else self.staging(comm, call, key, Slot.STAGED)
        return self.launch(comm, call, key, data, 0 if zero_copy else call.inp.data_ptr())

    def blocks(self, comm: Runtime, key: KernelKey, work: int, limit: int | None = None) -> int:
        return bulk_blocks(comm, key, work, limit)

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["Tma", "build", "bulk_blocks"]
