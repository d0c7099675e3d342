"""Two-shot all-reduce: rank ``r`` reduces slice ``r`` of the data and stores the result to every
rank (multimem ``ld_reduce`` + ``st`` on the multicast backend, peer loads and stores on the
peer backend); after the end barrier every rank holds the whole result, which ``gather_out``
copies to a separate output."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from ..config import KernelKey
from . import design


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the two-shot all-reduce for ``key``."""
    b = design.blocks(key)
    vec = b.vec

    @cute.jit
    def copy(src, dst, n, first, step):
        """dst = src, each block taking exactly the vectors that block of every rank reduces."""

        def copy_slice(src, dst, begin, end):
            b.copy_local(src, dst, begin * vec, end * vec, first, step)

        b.copy_slices(src, dst, n, first, step, copy_slice)

    @cute.jit
    def move(addrs, data_mc, out, src, n, rank, first, step, buffers, deadline, err):
        """Reduce this rank's slice and store it to every rank."""
        begin, end = b.own_slice(n, rank)

        def reduce_and_share(vs):
            offsets = tuple(Int64(v) * vec for v in vs)
            for o, values in zip(offsets, b.load_reduce(addrs, data_mc, offsets, vec)):
                b.store_all(addrs, data_mc, o, values, vec)

        b.each_vector(begin, end, first, step, reduce_and_share)
        b.reduce_tail(addrs, data_mc, n, rank, first, step)

    return design.kernel(key, b, stage=copy, move=move, gather=copy)


__all__ = ["build"]
