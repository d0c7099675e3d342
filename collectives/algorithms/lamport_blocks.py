"""The Lamport reduce-scatter and all-gather: the Lamport all-reduce's exchange
(:mod:`collectives.algorithms.lamport`) for the collectives where one tensor is one rank's block
of the other.  No barrier: the data (the reduce-scatter's, -0.0 marking an empty lane) or a tag
travelling with it (the all-gather's) is its own flag.

Both use the all-reduce's receive buffers and per-part call counts of their element width
(``receive_buffers``, ``lamport_step``), one slot per sender of at most
:data:`~collectives.config.LAMPORT_MAX_BYTES`, and the same fixed parts striding over the
slot's 16-byte vectors.  Every rank still sends to every rank in every call (an all-to-all of
blocks), and each vector of a slot belongs to the same part whatever the collective (and
whatever it carries: a block's bytes, or the all-gather's tagged words), so the rotation's
proof holds for any sequence of Lamport all-reduces, reduce-scatters and all-gathers: the slots
a rank empties in call ``s`` are written next in call ``s + 3``, by a rank that has received
this rank's data of ``s + 1`` and ``s + 2``, sent after the emptying.  Every receiver empties
what it delivered to the width's -0.0, whichever the format.

- Reduce-scatter: a rank sends block ``q`` of its input (canonical) into its slot on rank
  ``q`` (one relaxed ``st.sys`` per rank, every block's load in flight first; no multicast:
  each rank gets other data), then waits for every slot of its own buffer and reduces them in
  rank order into its output, as the all-reduce does.
- All-gather, bit-exact (:class:`GatherKernel`): a rank sends its input into its slot on every
  rank as 8-byte words ``tag << 32 | data`` (the low-latency protocol of NCCL's LL: an aligned
  64-bit access is single-copy atomic, so a word whose tag is this call's holds this call's
  data), then waits for every slot's words and stores slot ``q``'s data into block ``q`` of
  its output.  Every bit arrives as sent (-0.0, NaN payloads included); half a slot's bytes
  (:data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`) per rank.

A size entry carries the collective's code above the element count
(:attr:`~collectives.algorithms.lamport.LamportKernel.code`): ranks calling different Lamport
collectives of the same count fail the call as a size mismatch, recorded at once and cleaned
up on the GPU as the all-reduce's.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32, Uint64

import ptxops

from ..config import LAMPORT_BLOCKS, LAMPORT_GATHER_MAX_BYTES, LAMPORT_MAX_BYTES, VECTOR_BYTES
from ..device import lamport, signals
from ..device.launch import launcher
from ..dtypes import dtype
from ..layouts import LAMPORT_EXCHANGE, TIMEOUT
from .base import Call
from .key import KernelKey
from .lamport import THREADS, Lamport, LamportKernel, receive_buffers
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
    """The Lamport all-gather kernel, bit-exact: each 4 data bytes of a rank's block travel in
    one 8-byte word ``tag << 32 | data`` (single-copy atomic: an aligned 64-bit access), so the
    tag, not the data, says a word has come, and every bit pattern arrives as sent (-0.0, NaN
    payloads, all ones).  Word ``k`` of a slot carries bytes ``4k .. 4k + 3`` of the block
    whatever the sender's alignment; the parts stride over the slot's 16-byte vectors (two
    words) as every Lamport kernel does, so each vector of a slot belongs to the same part
    whatever the collective, and the buffers, counts and clean-up of the element width are the
    others' (the rotation's proof unchanged).

    The tag is :func:`~collectives.layouts.lamport_tag` of the call with its low bit set: never
    an empty word's half (-0.0 in every lane of 8, 16 or 32 bits: low bit 0) nor 0.  A receiver
    empties each word it delivered (the width's -0.0, what the other Lamport kernels expect), and
    a buffer a size mismatch left dirty is emptied whole before reuse, as for every Lamport
    kernel: a word a receiver polls holds -0.0 or this call's data, never a tag of another call
    (so neither a stale tag nor the wrap of the count can pass for this call's).  A block of at
    most :data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES` (half a slot)."""

    code = CODES["all_gather"]

    def __init__(self, key: KernelKey) -> None:
        super().__init__(key)
        self.bytes = key.element_bytes

    def vectors(self, n):
        """The slot's 16-byte vectors that ``n`` elements take: 8 data bytes each."""
        return (n * self.bytes + 7) // 8

    def tag(self, entry):
        """The high half of this call's words: the tag of our size ``entry``, low bit set."""
        return (entry | Uint64(1 << 32)) & Uint64(0xFFFFFFFF00000000)

    @cute.jit
    def gather_word(self, src, n, k) -> Uint32:
        """Data word ``k`` of the ``n`` elements at ``src`` (bytes ``4k .. 4k + 3``, 0 past the
        last), loaded element by element (data not 16-byte aligned)."""
        word = Uint32(0)
        per = 4 // self.bytes
        for i in cutlass.range_constexpr(per):
            j = k * per + i
            if j < n:
                element = cute.make_rmem_tensor(1, self.tail_carrier)
                lamport.load_words(element, src + j * self.bytes, None, signals.LOCAL)
                word = word | (Uint32(element[0]) << (8 * self.bytes * i))
        return word

    @cute.jit
    def scatter_word(self, word, out, n, k):
        """Store data word ``k`` at ``out`` element by element (those of the ``n``)."""
        per = 4 // self.bytes
        for i in cutlass.range_constexpr(per):
            j = k * per + i
            if j < n:
                ptr = signals.gmem(self.tail_carrier, out + j * self.bytes, self.bytes, signals.LOCAL,
                                   "collectives.algorithms.lamport_blocks.GatherKernel.scatter_word")
                ptxops.st(ptr, self.tail_carrier(word >> Uint32(8 * self.bytes * i)))

    @cute.jit
    def send(self, addrs, data_mc, region, src, n, first, step, entry):
        """Send this thread's vectors (``v = first, first + step, ...``: data bytes ``8v ..
        8v + 7``) as tagged words into our slot on every rank: one ``st.relaxed.sys.v2.b64``
        per rank, a lone ``.b64`` for a last word alone (16-byte aligned data loads 8 bytes at
        once, other data element by element).  No multicast: ``multimem.st`` moves 32-bit lanes."""
        tag = self.tag(entry)
        nbytes = n * self.bytes
        v = first
        while v < self.vectors(n):
            at = region + v * VECTOR_BYTES
            words = cute.make_rmem_tensor(2, Uint64)
            if cutlass.const_expr(self.vectored):  # whole 16-byte aligned vectors: 8 bytes each
                data = cute.make_rmem_tensor(2, Uint32)
                lamport.load_words(data, src + v * 8, None, signals.LOCAL)
                words[0] = tag | Uint64(data[0])
                words[1] = tag | Uint64(data[1])
                lamport.send(words, [a + at for a in addrs], data_mc, False)
            else:
                words[0] = tag | Uint64(self.gather_word(src, n, 2 * v))
                if v * 8 + 4 < nbytes:
                    words[1] = tag | Uint64(self.gather_word(src, n, 2 * v + 1))
                    lamport.send(words, [a + at for a in addrs], data_mc, False)
                else:
                    last = cute.make_rmem_tensor(1, Uint64)
                    last[0] = words[0]
                    lamport.send(last, [a + at for a in addrs], data_mc, False)
            v += step

    @cute.jit
    def wait_words(self, slots, where, tag, both, deadline) -> Int32:
        """Poll the vectors at ``where`` (``ld.relaxed.sys.v2.b64``) into ``slots`` until the
        words that carry data (the first, and the second where ``both``) hold ``tag``, or
        ``%globaltimer`` passes ``deadline``: -1 when all came, else a rank whose did not."""
        missing = Int32(0)
        polling = Boolean(True)
        high = Uint64(0xFFFFFFFF00000000)
        while polling:
            for q in cutlass.range_constexpr(self.world):
                lamport.load_words(slots[q], where[q], "relaxed")
            missing = Int32(-1)
            for q in cutlass.range_constexpr(self.world):
                if (slots[q][0] & high) != tag or (both and (slots[q][1] & high) != tag):
                    missing = Int32(q)
            polling = missing >= 0 and cute.arch.globaltimer() < deadline
        return missing

    @cute.jit
    def receive(self, own, out, n, deadline, err, rank, block, first, step, entry):
        """Wait for every rank's tagged words of this thread's vectors in our buffer at ``own``,
        store rank ``q``'s data in block ``q`` of ``out`` and empty the vectors (-0.0 of the
        width); False (and an error record) on a timeout."""
        tag = self.tag(entry)
        nbytes = n * self.bytes
        ok = Boolean(True)
        v = first
        while v < self.vectors(n) and ok:
            where = [own + Int64(q) * self.slot + v * VECTOR_BYTES for q in range(self.world)]
            slots = [cute.make_rmem_tensor(2, Uint64) for _ in range(self.world)]
            missing = self.wait_words(slots, where, tag, v * 8 + 4 < nbytes, deadline)
            ok = missing < 0
            if ok:
                for q in cutlass.range_constexpr(self.world):
                    block_out = out + Int64(q) * nbytes
                    if cutlass.const_expr(self.vectored):
                        data = cute.make_rmem_tensor(2, Uint32)
                        data[0] = Uint32(slots[q][0])
                        data[1] = Uint32(slots[q][1])
                        ptr = signals.gmem(Uint32, block_out + v * 8, 8, signals.LOCAL,
                                           "collectives.algorithms.lamport_blocks.GatherKernel.receive")
                        ptxops.st(ptr, data.load())
                    else:
                        self.scatter_word(Uint32(slots[q][0]), block_out, n, 2 * v)
                        self.scatter_word(Uint32(slots[q][1]), block_out, n, 2 * v + 1)
                for q in cutlass.range_constexpr(self.world):
                    lamport.clear(slots[q], where[q], self.bits)
            else:
                signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), missing, block, rank)
            v += step
        return ok


KERNELS = {"reduce_scatter": ScatterKernel, "all_gather": GatherKernel}


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the Lamport reduce-scatter or all-gather for ``key``."""
    return launcher(KERNELS[key.collective](key).kernel, key.threads,
                    emulate=key.backend == "multicast_emulated" and key.world, pdl=key.pdl)


class LamportBlocks(Lamport):
    """Reduce-scatter and all-gather without barriers (lowest latency, a block of at most
    :data:`~collectives.config.LAMPORT_MAX_BYTES` per rank, the all-gather's
    :data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`): the all-reduce's buffers, parts
    and grid.  Input and output are read and written where they lie."""

    collectives = ("reduce_scatter", "all_gather")

    def refusal(self, call: Call) -> str | None:
        block = call.n * dtype(call.dtype).bytes
        most = LAMPORT_GATHER_MAX_BYTES if call.collective == "all_gather" else LAMPORT_MAX_BYTES
        if block > most:
            return (f"lamport {call.collective} carries a block of at most {most} bytes per rank, "
                    f"not {block}; use algorithm='auto' or 'one_shot'")
        return None

    def plan(self, comm: Runtime, call: Call) -> Any:
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, threads=THREADS)
        data = comm.buffer(receive_buffers(comm, call.inp.element_size()))
        return self.launch(comm, call, key, data, call.inp.data_ptr())

    def blocks(self, comm: Runtime, key: KernelKey, work: int, limit: int | None = None) -> int:
        """The all-reduce's grid (:meth:`Lamport.blocks`), at most ``limit`` (the call's
        ``max_blocks``): any grid runs every part."""
        return min(super().blocks(comm, key, work), limit or LAMPORT_BLOCKS)

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["CODES", "KERNELS", "GatherKernel", "LamportBlocks", "ScatterKernel", "build"]
