"""The Lamport reduce-scatter and all-gather: the Lamport all-reduce's exchange
(:mod:`collectives.algorithms.lamport`) for the collectives where one tensor is one rank's block
of the other.  No barrier: the data is its own flag (-0.0 marks an empty lane).

Both use the all-reduce's receive buffers and per-part call counts of their element width
(``receive_buffers``, ``lamport_step``), one slot per sender of at most
:data:`~collectives.config.LAMPORT_MAX_BYTES`, holding one block (``n`` elements), and the same
fixed parts striding over the block's 16-byte vectors.  Every rank still sends to every rank in
every call (an all-to-all of blocks), and each vector of a slot belongs to the same part
whatever the collective, so the rotation's proof holds for any sequence of Lamport
all-reduces, reduce-scatters and all-gathers: the slots a rank empties in call ``s`` are
written next in call ``s + 3``, by a rank that has received this rank's data of ``s + 1`` and
``s + 2``, sent after the emptying.

- Reduce-scatter: a rank sends block ``q`` of its input (canonical) into its slot on rank
  ``q`` (one relaxed ``st.sys`` per rank, every block's load in flight first; no multicast:
  each rank gets other data), then waits for every slot of its own buffer and reduces them in
  rank order into its output, as the all-reduce does.
- All-gather: a rank sends its input into its slot on every rank (the all-reduce's send, one
  ``multimem.st`` with the multicast backend), then waits for every slot and stores slot ``q``
  into block ``q`` of its output.  The lanes arrive bit for bit, except that a -0.0 arrives as
  +0.0 (equal as floats): the sender's :func:`~collectives.device.lamport.canonical`.

A size entry carries the collective's code above the element count
(:attr:`~collectives.algorithms.lamport.LamportKernel.code`): ranks calling different Lamport
collectives of the same count fail the call as a size mismatch, recorded at once and cleaned
up on the GPU as the all-reduce's.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int64

import ptxops

from ..config import LAMPORT_BLOCKS, LAMPORT_MAX_BYTES
from ..device import lamport, signals
from ..device.launch import launcher
from ..dtypes import dtype
from .base import Call
from .key import KernelKey
from .lamport import Lamport, LamportKernel, receive_buffers
from .protocol import Runtime

#: Each collective's code in its size entries (the all-reduce's is 0).
CODES = {"reduce_scatter": 1, "all_gather": 2}


class ScatterKernel(LamportKernel):
    """The Lamport reduce-scatter kernel: block ``q`` of the input goes to rank ``q``."""

    code = CODES["reduce_scatter"]

    @cute.jit
    def send_one(self, words, src, addrs, data_mc, at, stride):
        """Load block ``q`` of our input (``src + q * stride``) for every ``q``, make it canonical
        and send it to byte ``at`` of our slot on rank ``q``."""
        count = cutlass.const_expr(cute.size(words))
        blocks = [words] + [cute.make_rmem_tensor(count, words.element_type) for _ in range(1, self.world)]
        for q in cutlass.range_constexpr(self.world):
            lamport.load_words(blocks[q], src + Int64(q) * stride, None, signals.LOCAL)
        for q in cutlass.range_constexpr(self.world):
            for i in cutlass.range_constexpr(count):
                blocks[q][i] = lamport.canonical(blocks[q][i], self.bits)
            lamport.send(blocks[q], [addrs[q] + at], data_mc, False)


class GatherKernel(LamportKernel):
    """The Lamport all-gather kernel: slot ``q`` goes to block ``q`` of the output."""

    code = CODES["all_gather"]

    @cute.jit
    def deliver(self, slots, out, stride):
        """Store slot ``q``'s words at ``out + q * stride`` (block ``q`` of the output)."""
        count = cutlass.const_expr(cute.size(slots[0]))
        carrier = slots[0].element_type
        for q in cutlass.range_constexpr(self.world):
            ptr = signals.gmem(carrier, out + Int64(q) * stride, count * carrier.width // 8, signals.LOCAL,
                               "collectives.algorithms.lamport_blocks.GatherKernel.deliver")
            ptxops.st(ptr, slots[q].load() if cutlass.const_expr(count > 1) else slots[q][0])


KERNELS = {"reduce_scatter": ScatterKernel, "all_gather": GatherKernel}


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the Lamport reduce-scatter or all-gather for ``key``."""
    return launcher(KERNELS[key.collective](key).kernel, key.threads,
                    emulate=key.backend == "multicast_emulated" and key.world, pdl=key.pdl)


class LamportBlocks(Lamport):
    """Reduce-scatter and all-gather without barriers (lowest latency, a block of at most
    :data:`~collectives.config.LAMPORT_MAX_BYTES` per rank): the all-reduce's buffers, parts
    and grid.  Input and output are read and written where they lie."""

    collectives = ("reduce_scatter", "all_gather")

    def refusal(self, call: Call) -> str | None:
        block = call.n * dtype(call.dtype).bytes
        if block > LAMPORT_MAX_BYTES:
            return (f"lamport {call.collective} carries a block of at most {LAMPORT_MAX_BYTES} bytes per rank, "
                    f"not {block}; use algorithm='auto' or 'one_shot'")
        return None

    def plan(self, comm: Runtime, call: Call) -> Any:
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, threads=256)
        data = comm.buffer(receive_buffers(comm, call.inp.element_size()))
        return self.launch(comm, call, key, data, call.inp.data_ptr())

    def blocks(self, comm: Runtime, key: KernelKey, work: int, limit: int | None = None) -> int:
        """The all-reduce's grid (:meth:`Lamport.blocks`), at most ``limit`` (the call's
        ``max_blocks``): any grid runs every part."""
        return min(super().blocks(comm, key, work), limit or LAMPORT_BLOCKS)

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["CODES", "KERNELS", "GatherKernel", "LamportBlocks", "ScatterKernel", "build"]
