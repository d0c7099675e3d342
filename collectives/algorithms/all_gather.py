"""All-gather, one-shot and TMA: between the start and end barriers each rank pushes its input
into block ``rank`` of every rank's symmetric buffer; after the end barrier every rank's buffer
holds every block, and ``gather_out`` copies it to a separate output (a symmetric ``out`` is the
buffer itself).  The one-shot kernel stores its own block into a separate output while it
pushes it (local stores overlapping the NVLink ones), so only the other ranks' blocks are
copied after the end barrier.

Push rather than pull: the input is read where it lies (no staging copy, symmetric or not), and
the traffic that crosses NVLink is stores, which need no round trip; on the multicast backend
each vector is one ``multimem.st`` (TMA: one bulk store of each tile to the multicast address)
instead of one store per rank.  The start barrier keeps a rank from writing into a peer's buffer
before that peer's previous collective has finished with it; the end barrier of block ``b``
with block ``b`` of every rank makes exactly the vectors block ``b`` of each rank pushed
visible, so the copy-out takes, in each rank's block, the vectors that block pushed.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int64

import ptxops

from ..config import TMA_STAGES, VECTOR_BYTES, Slot
from ..device import signals, tiles
from ..layouts import DATA_PHASE
from . import design
from .base import Algorithm, Call
from .key import KernelKey
from .protocol import Runtime
from .tma import bulk_blocks


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the all-gather kernel for ``key`` (one-shot or TMA)."""
    b = design.Blocks(key)
    world, vec, dtype = b.world, b.vec, b.dtype
    tma = key.algorithm == "tma"
    tile = key.tile_bytes
    own_to_out = key.gather_out and not tma

    @cute.jit
    def push(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """This rank's ``n`` elements at ``src`` into block ``rank`` of every rank's buffer."""
        vectors = n // vec
        base = Int64(rank) * n
        if cutlass.const_expr(tma):  # n fills whole vectors (a TMA all-gather needs it)
            # One input per tile: the pipeline's "reduction" of a single tile in its own dtype
            # is a copy, bit for bit.
            landed = tiles.reduce_tiles([src], Int64(0), vectors * VECTOR_BYTES, addrs, base * (dtype.width // 8),
                                        data_mc, buffers, dtype, dtype, "sum", tile, TMA_STAGES, b.multicast, deadline)
            design.tile_timeout(landed, err, rank)
        else:
            def send(vs):
                align = cutlass.const_expr(vec * dtype.width // 8)
                offsets = tuple(Int64(v) * vec for v in vs)
                own = signals.gmem(dtype, src, align, signals.LOCAL, "collectives.algorithms.all_gather.push")
                loaded = [ptxops.ld(own + cute.assume(o, divby=vec), num_elements=vec)
                          for o in offsets]  # all loads in flight before the stores
                for o, values in zip(offsets, loaded):
                    b.store_all(addrs, data_mc, base + o, values, vec)
                    if cutlass.const_expr(own_to_out):
                        b.store_local(out, base + o, values, vec)

            b.each_vector(Int64(0), vectors, first, step, send)
            j = Int64(vectors * vec) + first
            while j < n:
                own = signals.gmem(dtype, src, dtype.width // 8, signals.LOCAL, "collectives.algorithms.all_gather.push")
                value = ptxops.ld(own + j)
                b.store_all(addrs, data_mc, base + j, value, 1)
                if cutlass.const_expr(own_to_out):
                    b.store_local(out, base + j, value, 1)
                j += step

    @cute.jit
    def copy_out(src, dst, n, first, step):
        """dst = src (TMA), each block taking in each rank's block exactly the tiles that
        block of that rank pushed."""
        for q in cutlass.range_constexpr(world):
            b.copy_tiles(src, dst, Int64(q) * (n // vec), Int64(q + 1) * (n // vec))

    @cute.jit
    def copy_others(addrs, data_mc, out, n, rank, first, step):
        """out = this rank's buffer in every other rank's block (its own block went to out
        during the push), each block taking the vectors that block of that rank pushed."""
        own = design.pick(addrs, rank)
        for q in cutlass.range_constexpr(world):
            if q != rank:
                b.copy_local(own, out, Int64(q) * n, Int64(q + 1) * n, first, step)

    def buffers(smem):
        return tiles.shared_buffers(smem, dtype, 1, tile, TMA_STAGES)

    if tma:
        return design.kernel(key, b, stage=None, move=push, gather=copy_out, buffers=buffers)
    return design.kernel(key, b, stage=None, move=push, pull=copy_others if own_to_out else None)


class OneShotGather(Algorithm):
    """Each rank pushes its input into block ``rank`` of every rank's symmetric buffer: a
    symmetric ``out`` is that buffer, any other is copied out of
    :attr:`~collectives.config.Slot.STAGED` (``gather_out``)."""

    collectives = ("all_gather",)
    name = "one_shot"
    gathers_out = ("all_gather",)
    stages_in = "never"

    def plan(self, comm: Runtime, call: Call) -> Any:
        zero_copy = call.symmetric
        data = comm.buffer(call.out if zero_copy else comm.staging(call.nbytes, Slot.STAGED))
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, vector=call.vector,
                        gather_out=not zero_copy)
        return self.launch(comm, call, key, data, call.inp.data_ptr())

    def build(self, key: KernelKey):
        return build(key)


class TmaGather(OneShotGather):
    """The one-shot all-gather moving tiles by bulk copies on at most a quarter of the SMs
    (16-byte aligned tensors and block size)."""

    name = "tma"
    whole_vectors_only = True
    phases = {DATA_PHASE: "TMA bulk copies"}
    blocks = staticmethod(bulk_blocks)


__all__ = ["OneShotGather", "TmaGather", "build"]
