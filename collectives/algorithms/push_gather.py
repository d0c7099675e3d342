"""Push all-gather: the one-shot all-gather's pushes as a software pipeline, whose copies out of
the receive buffer overlap the remote stores (issue 49: an output outside symmetric memory).

The one-shot all-gather into an output outside symmetric memory pushes every rank's input into
every rank's buffer, passes its end barrier and only then copies the other ranks' blocks out
(4 x H200, 256 MB of output: 674 us against 590 into a symmetric output, which it does not copy).
Here each rank stores chunk ``k`` of its input into slot ``rank`` of every other rank's receive
buffer (``world`` slots of ``n`` elements, :attr:`~collectives.config.Slot.PUSH_ALL_GATHER`) and
into block ``rank`` of its own output, each vector loaded once, and copies chunk ``k`` of every
other slot of its own buffer into its output as soon as every rank has signalled that chunk, while
its stores of chunk ``k + 1`` cross NVLink::

    push chunk 0;   signal event 0;   wait for every rank's event 0 (the sizes agree)
    for k in 0 .. R-1:
        push chunk k+1 (if any)                    # remote stores in flight ...
        k > 0: wait for every rank's event k       # ... while we wait and copy
        copy chunk k of every other slot -> out
        signal event k+1
    wait for every rank's event R

Event ``k + 1`` says "chunk ``k + 1`` pushed, chunk ``k`` copied out" (its release waits for the
block's stores, remote ones included, after a ``bar.sync``: signalling after the copy lets the
pushes drain meanwhile); the last, ``R``, that the rank has copied everything out, so that after
the final wait no rank reads its buffer any more and the next call's first pushes (before any
wait) land safely: one receive buffer of its own slot, which no other collective shares. Rounds,
events, sizes and the failure paths are the push all-reduce's
(:mod:`collectives.algorithms.push`: chunks of whole grid strides, at most
:data:`~collectives.config.PUSH_MAX_ROUNDS`; block ``b`` of every rank moves the same elements,
so its signals order exactly what block ``b`` of another rank reads; a call whose sizes differ
pushes chunk 0 only, which its event 0 releases, and fails every rank's first wait).  Peer
backend only: the pipeline signals through the peers' pads.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int64

import ptxops

from ..config import Slot
from ..device import reduce, signals
from ..device.kernel_args import KernelArgs
from ..device.launch import launcher
from ..layouts import PUSH_ROUND
from . import design
from .base import Algorithm, Call
from .key import KernelKey
from .protocol import Runtime
from .push import Pipeline


class PushGatherKernel(Pipeline):
    """The push all-gather kernel of one key: the push pipeline's schedule
    (:class:`~collectives.algorithms.push.Pipeline`, the module docstring) over slots of ``n``
    elements, whose rounds push our chunk (:meth:`push`) and copy the others' out
    (:meth:`collect`), with a final wait."""

    final = True

    def __init__(self, key: KernelKey) -> None:
        self.key = key
        self.b = design.Blocks(key)
        self.vec, self.world, self.threads, self.dtype = self.b.vec, self.b.world, self.b.threads, self.b.dtype
        self.element_bytes = self.dtype.width // 8

    @cute.jit
    def push(self, table, out, src, n, rank, k, chunk, first, step):
        """Chunk ``k`` of our input into slot ``rank`` of every other rank's buffer (``table``:
        the buffers') and into block ``rank`` of ``out``: each vector loaded once, then stored to
        every destination (the other ranks from ``rank + 1`` on: each rank's first stores go to a
        different peer)."""
        by = "collectives.algorithms.push_gather.PushGatherKernel.push"
        lo, hi = cutlass.min(k * chunk, n), cutlass.min((k + 1) * chunk, n)
        base = Int64(rank) * n * self.element_bytes
        dests = [out + base] + [signals.peer_address(table, (rank + i) % self.world) + base
                                for i in range(1, self.world)]
        align = cutlass.const_expr(self.vec * self.element_bytes)

        def send(vs):
            offsets = tuple(Int64(v) * self.vec for v in vs)
            own = signals.gmem(self.dtype, src, align, signals.LOCAL, by)
            loaded = [ptxops.ld(own + cute.assume(o, divby=self.vec), num_elements=self.vec)
                      for o in offsets]  # all loads in flight before the stores
            for o, values in zip(offsets, loaded):
                reduce.store_peers(dests, o, values, self.dtype, self.vec)

        self.b.each_vector(lo // self.vec, hi // self.vec, first, step, send)
        j = cutlass.max(Int64(hi // self.vec * self.vec), lo) + first  # past the last vector (the last chunk)
        while j < hi:
            value = ptxops.ld(signals.gmem(self.dtype, src, self.element_bytes, signals.LOCAL, by) + j)
            reduce.store_peers(dests, j, value, self.dtype, 1)
            j += step

    @cute.jit
    def collect(self, table, out, n, rank, k, chunk, first, step):
        """Chunk ``k`` of block ``q`` of ``out`` = chunk ``k`` of slot ``q`` of our own buffer, for
        every other rank ``q`` (local loads and stores)."""
        lo, hi = cutlass.min(k * chunk, n), cutlass.min((k + 1) * chunk, n)
        own = signals.peer_address(table, rank)
        for i in cutlass.range(1, self.world, unroll=1):
            q = (rank + i) % self.world
            at = Int64(q) * n * self.element_bytes
            self.b.copy_local(own + at, out + at, lo, hi, first, step)

    @cute.jit
    def send(self, args: KernelArgs, k, chunk, first, step):
        self.push(args.data_table, args.out, args.src, args.n, args.rank, k, chunk, first, step)

    @cute.jit
    def work(self, args: KernelArgs, k, chunk, first, step):
        self.collect(args.data_table, args.out, args.n, args.rank, k, chunk, first, step)


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the push all-gather for ``key``."""
    return launcher(PushGatherKernel(key).pipeline_kernel, key.threads, pdl=key.pdl)


class PushGather(Algorithm):
    """Each rank pushes its input chunk by chunk into slot ``rank`` of every rank's receive
    buffer and copies the other slots out of its own as each chunk arrives (the module): an
    all-gather into any output, peer backend only.  ``stage_in`` as the push family has it:
    the input goes out straight from where it lies."""

    collectives = ("all_gather",)
    name = "push"
    stages_in = "always"
    backends = ("peer",)  # (its pipeline signals through the peers' pads)
    phases = {PUSH_ROUND: "push round"}

    def check(self, key: KernelKey) -> None:
        super().check(key)
        if not key.stage_in:
            raise ValueError("push sends its input straight from where it lies (stage_in=True)")

    def plan(self, comm: Runtime, call: Call) -> Any:
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, vector=call.vector,
                        stage_in=True)
        data = comm.buffer(comm.staging(call.nbytes, Slot.PUSH_ALL_GATHER))
        return self.launch(comm, call, key, data, call.inp.data_ptr())

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["PushGather", "PushGatherKernel", "build"]
