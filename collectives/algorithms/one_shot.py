"""One-shot all-reduce and reduce-scatter: after the start barrier every rank reduces the whole
result (its own slice, for reduce-scatter) from every rank's buffer into its output — one
multimem ``ld_reduce`` per vector on the multicast backend, ``world`` peer loads on the peer
backend."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

from typing import Any

from ..config import Slot
from . import design, tuning
from .base import Algorithm, Call
from .key import KernelKey
from .protocol import Runtime


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the one-shot kernel for ``key``."""
    b = design.Blocks(key)
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




class OneShot(Algorithm):
    """After the start barrier every rank reduces the whole result (its own slice, for
    reduce-scatter) from every rank's buffer.  The input is staged into an internal symmetric
    buffer in-kernel (a large symmetric reduce-scatter input is read in place); eagerly the
    staging alternates between two buffers and the end barrier is dropped."""

    collectives = ("all_reduce", "reduce_scatter")
    name = "one_shot"
    drops_end_barrier = ("all_reduce", "reduce_scatter")

    def plan(self, comm: Runtime, call: Call) -> Any:
        # A symmetric reduce-scatter input past STAGE_MAX_BYTES is read in place (two
        # barriers, no copy); the staged cases alternate two buffers and drop the end barrier,
        # except under graph capture (a replayed graph would reuse one buffer).
        zero_copy = (call.collective == "reduce_scatter" and call.symmetric
                     and call.nbytes > tuning.STAGE_MAX_BYTES)
        alternate = not zero_copy and not call.capturing
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, stage_in=not zero_copy, end_barrier=not alternate)
        if zero_copy:
            return self.launch(comm, call, key, comm.buffer(call.inp), 0)
        plan = self.launch(comm, call, key, self.staging(comm, call, key, Slot.STAGED), call.inp.data_ptr())
        plan.capture = call.capturing  # (its staging alternates eagerly only)
        return plan

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["OneShot", "build"]
