"""Push reduce-scatter and all-reduce for inputs outside symmetric memory: no staging copy.

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

The all-reduce is the same push of slices of ``m`` elements (``n`` split in ``world`` slices,
``m`` rounded up to whole vectors; the last slice may be shorter), then the owner reduces its
slice into its output and into a result region after its slots, passes a second barrier, and
every rank pulls each owner's result region into its output (plain loads from the peers).
Its second barrier makes one buffer enough, eagerly and in graphs: a rank pushes into a buffer
only after the second barrier of the previous call, by which time every owner has read its
slots, and an owner rewrites its result region only after the next call's first barrier, by
which time every rank has pulled it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from ..config import KernelKey
from ..device import reduce
from . import design


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the push reduce-scatter or all-reduce for ``key``: one
    push, one local reduction of the ``world`` receive slots and, for the all-reduce, the pull
    of the other owners' results; the two differ only in how ``n`` is sliced."""
    b = design.blocks(key)
    vec, world, dtype, acc, op = b.vec, b.world, b.dtype, b.acc, b.op
    element_bytes = dtype.width // 8
    all_reduce = key.collective == "all_reduce"

    @cute.jit
    def bounds(n, q):
        """(first input element, length, slot size) of slice ``q``: reduce-scatter slices are
        the ``n`` elements of an output; all-reduce slices split ``n`` in ``world``
        (:func:`collectives.config.push_slice_elements`, the last may be shorter)."""
        if cutlass.const_expr(all_reduce):
            m = (((n + world - 1) // world + vec - 1) // vec) * vec
            begin = cutlass.min(Int64(q) * m, n)
            return begin, cutlass.min(begin + m, n) - begin, m
        else:
            return Int64(q) * n, n, n

    @cute.jit
    def push(addrs, src, n, rank, first, step):
        """Slot ``rank`` of rank ``q``'s buffer = slice ``q`` of our input, for every ``q``
        (``q = rank + i``: each rank writes to a different owner at a time)."""
        for i in cutlass.range_constexpr(world):
            q = (rank + i) % world
            begin, length, m = bounds(n, q)
            slot = design.pick(addrs, q) + Int64(rank) * m * element_bytes
            b.copy_local(src + begin * element_bytes, slot, Int64(0), length, first, step)

    @cute.jit
    def move(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """The reduction of our ``world`` slots (local loads) into out (the all-reduce: into
        our slice of out and our result region)."""
        begin, length, m = bounds(n, rank)
        own = design.pick(addrs, rank)
        slots = [own + Int64(s) * m * element_bytes for s in range(world)]
        if cutlass.const_expr(all_reduce):
            dests = [out + begin * element_bytes, own + Int64(world) * m * element_bytes]
        else:
            dests = [out]
        vectors = length // vec

        def reduce_here(vs):
            offsets = tuple(Int64(v) * vec for v in vs)
            for o, values in zip(offsets, reduce.load_reduce_peer(slots, offsets, dtype, acc, vec, op)):
                for d in dests:
                    b.store_local(d, o, values, vec)

        b.each_vector(Int64(0), vectors, first, step, reduce_here)
        j = Int64(vectors * vec) + first
        while j < length:
            value = reduce.load_reduce_peer(slots, (j,), dtype, acc, 1, op)[0]
            for d in dests:
                b.store_local(d, j, value, 1)
            j += step

    @cute.jit
    def pull(addrs, out, n, rank, first, step):
        """Slice ``q`` of out = rank ``q``'s result region, for every other ``q`` (``q = rank +
        i``: each rank reads from a different owner at a time)."""
        for i in cutlass.range_constexpr(1, world):
            q = (rank + i) % world
            begin, length, m = bounds(n, q)
            result = design.pick(addrs, q) + Int64(world) * m * element_bytes
            b.copy_local(result, out + begin * element_bytes, Int64(0), length, first, step)

    return design.kernel(key, b, stage=None, move=move, push=push, pull=pull if all_reduce else None)


__all__ = ["build"]
