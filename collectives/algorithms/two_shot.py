"""Two-shot all-reduce: rank ``r`` reduces slice ``r`` of the data and stores the result to every
rank (multimem ``ld_reduce`` + ``st`` on the multicast backend, peer loads and stores on the
peer backend); after the end barrier every rank holds the whole result, which ``gather_out``
copies to a separate output."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from typing import Any

from ..config import Slot
from . import design
from .base import Algorithm, Call, ceil_div
from .key import KernelKey
from .protocol import Runtime


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the two-shot all-reduce for ``key``."""
    b = design.Blocks(key)
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


class TwoShot(Algorithm):
    """Reduce-scatter then all-gather inside one kernel: least traffic.  A symmetric tensor
    reduced in place is used where it lies; anything else is staged in-kernel into
    :attr:`~collectives.config.Slot.STAGED` and the result copied out (``gather_out``)."""

    collectives = ("all_reduce",)
    name = "two_shot"
    gathers_out = ("all_reduce",)

    def plan(self, comm: Runtime, call: Call) -> Any:
        return sliced_plan(self, comm, call)

    def build(self, key: KernelKey):
        return build(key)


def sliced_plan(algorithm: Algorithm, comm: Runtime, call: Call) -> Any:
    """The plan of an all-reduce whose ranks each reduce one slice and store it to every rank
    (two-shot, TMA): in place on a symmetric tensor without ``out``, else staged with its
    result copied out."""
    zero_copy = call.in_place and call.symmetric
    key = KernelKey("all_reduce", algorithm.name, call.backend, call.dtype, call.world, op=call.op,
                    vector=call.vector, gather_out=not zero_copy, stage_in=not zero_copy)
    data = comm.buffer(call.inp) if zero_copy else algorithm.staging(comm, call, key, Slot.STAGED)
    work = ceil_div(ceil_div(call.n, key.elements_per_access), call.world)  # a slice's vectors
    return algorithm.launch(comm, call, key, data, 0 if zero_copy else call.inp.data_ptr(), work=work)


__all__ = ["TwoShot", "build", "sliced_plan"]
