"""One-shot all-reduce and reduce-scatter: after the start barrier every rank reduces the whole
result (its own slice, for reduce-scatter) from every rank's buffer into its output — one
multimem ``ld_reduce`` per vector on the multicast backend, ``world`` peer loads on the peer
backend."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from ..config import KernelKey
from . import design


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the one-shot kernel for ``key``."""
    b = design.blocks(key)
    vec, world = b.vec, b.world
    scatter = key.collective == "reduce_scatter"

    @cute.jit
    def stage(src, own, n, first, step):
        """Copy this rank's input into its symmetric buffer (reduce-scatter: ``world`` outputs'
        worth, split per output as the readers split them)."""
        if cutlass.const_expr(scatter):
            for q in cutlass.range_constexpr(world):
                b.copy_local(src, own, Int64(q) * n, Int64(q + 1) * n, first, step)
        else:
            b.stage_whole(src, own, n, first, step)

    @cute.jit
    def move(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """out = the reduction over ranks of (this rank's slice of) the data."""
        vectors = n // vec
        base = Int64(rank) * n if cutlass.const_expr(scatter) else Int64(0)

        def reduce_here(vs):
            offsets = tuple(Int64(v) * vec for v in vs)
            for o, values in zip(offsets, b.load_reduce(addrs, data_mc, tuple(base + o for o in offsets), vec)):
                b.store_local(out, o, values, vec)

        b.each_vector(Int64(0), vectors, first, step, reduce_here)
        j = Int64(vectors * vec) + first
        while j < n:
            b.store_local(out, j, b.load_reduce(addrs, data_mc, (base + j,), 1)[0], 1)
            j += step

    return design.kernel(key, b, stage, move)


__all__ = ["build"]
