"""Push reduce-scatter for inputs outside symmetric memory: no staging copy.

Each rank stores slice ``q`` of its input straight from the user's tensor into slot ``rank`` of
rank ``q``'s symmetric receive buffer (``world`` slots of ``n`` elements), passes one barrier,
and reduces its ``world`` slots from local memory into its output.  The push and the reduction
split the ``n`` elements alike (whole vectors in one stride, then the elements past the last),
so block ``b``'s barrier orders exactly the stores that block ``b`` of the owner reads.  The
pushes are plain stores on both backends (a reduction of local slots has nothing to
multicast), so the kernel holds no ``multimem``.

A push writes into another rank's buffer before the barrier, so the buffer must be free there:
eagerly the caller alternates between two buffers with no end barrier (as the staged one-shot
does: a rank pushes into a buffer again only after a barrier that every rank entered after
finishing the call that read it); under graph capture the kernel keeps its end barrier.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from ..config import KernelKey
from ..device import reduce
from . import design


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the push reduce-scatter for ``key``."""
    b = design.blocks(key)
    vec, world, dtype, acc, op = b.vec, b.world, b.dtype, b.acc, b.op
    element_bytes = dtype.width // 8

    @cute.jit
    def push(addrs, src, n, rank, first, step):
        """Slot ``rank`` of rank ``q``'s buffer = slice ``q`` of our input, for every ``q``."""
        for q in cutlass.range_constexpr(world):
            slot = addrs[q] + Int64(rank) * n * element_bytes
            b.copy_local(src + Int64(q) * n * element_bytes, slot, Int64(0), n, first, step)

    @cute.jit
    def move(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """out = the reduction of our ``world`` receive slots (local loads)."""
        own = addrs[0]
        for r in cutlass.range_constexpr(1, world):
            if rank == r:
                own = addrs[r]
        slots = [own + Int64(s) * n * element_bytes for s in range(world)]
        vectors = n // vec

        def reduce_here(vs):
            offsets = tuple(Int64(v) * vec for v in vs)
            for o, values in zip(offsets, reduce.load_reduce_peer(slots, offsets, dtype, acc, vec, op)):
                b.store_local(out, o, values, vec)

        b.each_vector(Int64(0), vectors, first, step, reduce_here)
        j = Int64(vectors * vec) + first
        while j < n:
            b.store_local(out, j, reduce.load_reduce_peer(slots, (j,), dtype, acc, 1, op)[0], 1)
            j += step

    return design.kernel(key, b, stage=None, move=move, push=push)


__all__ = ["build"]
