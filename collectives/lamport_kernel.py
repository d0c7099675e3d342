"""The Lamport one-shot all-reduce: no barrier, the data is its own flag.

Every rank owns three rotating receive buffers per element width (one symmetric allocation,
``3 x world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`); call ``s`` of a width
uses buffer ``s % 3``.  A rank sends its canonical input (:mod:`collectives.device.lamport`)
into its own slot of buffer ``s % 3`` on every rank, polls its own buffer until every slot of
its elements holds data, reduces in rank order (16-bit floats in f32, fp8 in f16), writes the
result and marks the slots empty again.  The slots it empties are written next in call
``s + 3``, by a rank that has by then received this rank's data of calls ``s + 1`` and
``s + 2``, which this rank sends only after emptying them: clearing never races with writing.

The call count lives on the device (``lamport_step`` in the signal pad, advanced by the last
thread block to finish), so CUDA-graph replays rotate the buffers just as eager calls do.
With its data each rank sends its element count; a receiver that reads another count
records a size mismatch, and a wait bounded by the deadline records a timeout.

The launch takes the same arguments as :mod:`collectives.kernels` (``data_table`` and
``data_mc`` are the receive buffers', ``src`` is the input, ``out`` the output).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cuda.bindings import driver
from cutlass import Boolean, Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from .config import (
    DTYPES,
    LAMPORT_EXCHANGE,
    LAMPORT_MAX_BYTES,
    SIZE_MISMATCH,
    TIMEOUT,
    VECTOR_BYTES,
    KernelKey,
    PadLayout,
)
from .device import lamport, reduce, signals
from .device.reduce import ACC, DTYPE

BUFFERS = 3


def width_index(element_bytes: int) -> int:
    """0, 1, 2 for 1-, 2-, 4-byte elements: which set of Lamport buffers a dtype uses."""
    return element_bytes.bit_length() - 1


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the Lamport all-reduce for ``key``."""
    world, threads, op = key.world, key.threads, key.op
    dtype = DTYPE[key.dtype]
    acc = ACC[DTYPES[key.dtype][1]]
    bits = dtype.width
    width = width_index(key.element_bytes)
    multicast = key.backend == "multicast"
    vectored = key.elements_per_access > 1
    per_vector = VECTOR_BYTES // key.element_bytes
    tail_carrier = lamport.CARRIER[bits]
    slot = LAMPORT_MAX_BYTES
    layout = PadLayout(world=world)

    def size_word(buffer, src):
        """Pad word of ``src``'s element count in ``buffer`` (a runtime value)."""
        return layout.lamport_size(width, 0, src) + buffer * world

    @cute.jit
    def reduce_slots(slots):
        """The ``world`` slots' values (register words) combined in rank order, as ``dtype``."""
        total = reduce.convert(cute.recast_tensor(slots[0], dtype).load(), acc)
        for q in cutlass.range_constexpr(1, world):
            total = reduce.combine(total, reduce.convert(cute.recast_tensor(slots[q], dtype).load(), acc), op)
        return reduce.convert(total, dtype)

    @cute.jit
    def send(addrs, data_mc, region, src, n, first, step):
        """Send this thread's elements, canonical, into our slot on every rank: whole vectors,
        then the elements past the last one."""
        vectors = n // per_vector if cutlass.const_expr(vectored) else Int64(0)
        v = first
        while v < vectors:
            words = cute.make_rmem_tensor(4, Uint32)
            lamport.load_words(words, src + v * VECTOR_BYTES)
            for i in cutlass.range_constexpr(4):
                words[i] = lamport.canonical(words[i], bits)
            at = region + v * VECTOR_BYTES
            lamport.send(words, [a + at for a in addrs], data_mc + at, multicast)
            v += step
        j = vectors * per_vector + first
        while j < n:
            word = cute.make_rmem_tensor(1, tail_carrier)
            lamport.load_words(word, src + j * (bits // 8))
            word[0] = lamport.canonical(word[0], bits)
            at = region + j * (bits // 8)
            lamport.send(word, [a + at for a in addrs], data_mc + at, multicast)
            j += step

    @cute.jit
    def receive(own, out, n, deadline, err, rank, block, first, step):
        """Wait for every rank's copy of this thread's elements in our buffer at ``own``,
        reduce them into ``out`` and empty their slots.  Returns False on a timeout."""
        ok = Boolean(True)
        vectors = n // per_vector if cutlass.const_expr(vectored) else Int64(0)
        v = first
        while v < vectors and ok:
            slots = [cute.make_rmem_tensor(4, Uint32) for _ in range(world)]
            where = [own + Int64(q) * slot + v * VECTOR_BYTES for q in range(world)]
            missing = lamport.wait_slots(slots, where, bits, deadline)
            if missing >= 0:
                signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), missing, block, rank)
                ok = Boolean(False)
            else:
                at = signals.gmem(dtype, out, VECTOR_BYTES) + cute.assume(v * per_vector, divby=per_vector)
                ptxops.st(at, reduce_slots(slots))
                for q in cutlass.range_constexpr(world):
                    lamport.clear(slots[q], where[q], bits)
            v += step
        j = vectors * per_vector + first
        while j < n and ok:
            slots = [cute.make_rmem_tensor(1, tail_carrier) for _ in range(world)]
            where = [own + Int64(q) * slot + j * (bits // 8) for q in range(world)]
            missing = lamport.wait_slots(slots, where, bits, deadline)
            if missing >= 0:
                signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), missing, block, rank)
                ok = Boolean(False)
            else:
                ptxops.st(signals.gmem(dtype, out, bits // 8) + j, reduce_slots(slots)[0])
                for q in cutlass.range_constexpr(world):
                    lamport.clear(slots[q], where[q], bits)
            j += step
        return ok

    @cute.jit
    def announce(pad_table, pad_mc, buffer, size, rank, block):
        """Block 0 sends our element count into every rank's size word of ``buffer``."""
        tidx = cute.arch.thread_idx()[0]
        if block == 0 and tidx < world:
            if cutlass.const_expr(multicast):
                if tidx == 0:
                    at = signals.gmem(Uint32, pad_mc, 4) + size_word(buffer, rank)
                    ptxops.multimem_st(at, size, sem="relaxed", scope="sys")
            else:
                peer = signals.gmem(Uint32, signals.peer_address(pad_table, tidx), 4)
                ptxops.st(peer + size_word(buffer, rank), size, sem="relaxed", scope="sys")

    @cute.jit
    def sizes_agree(pad, buffer, size, deadline, err, rank, block) -> Boolean:
        """Threads ``t < world`` wait for rank ``t``'s element count and compare it with ours
        (True in threads that found it equal, and in the others)."""
        tidx = cute.arch.thread_idx()[0]
        ok = Boolean(True)
        if tidx < world:
            own = signals.gmem(Uint32, pad, 4) + size_word(buffer, tidx)
            seen = ptxops.ld(own, sem="relaxed", scope="sys")
            while seen == Uint32(0) and cute.arch.globaltimer() < deadline:
                seen = ptxops.ld(own, sem="relaxed", scope="sys")
            if seen == Uint32(0):
                signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                ok = Boolean(False)
            elif seen != size:
                signals.record_error(err, Int32(SIZE_MISMATCH), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                ok = Boolean(False)
        return ok

    @cute.jit
    def finish(pad, buffer, step_now, blocks):
        """The last block to finish empties this call's size words and advances the step."""
        words = signals.gmem(Uint32, pad, 4)
        done = ptxops.atom_add(words + layout.lamport_done(width), Uint32(1), sem="acq_rel", scope="gpu")
        if done == Uint32(blocks - 1):
            ptxops.st(words + layout.lamport_done(width), Uint32(0))
            for q in cutlass.range_constexpr(world):
                ptxops.st(words + size_word(buffer, q), Uint32(0))
            ptxops.st(words + layout.lamport_step(width), step_now + Uint32(1))

    @cute.kernel
    def kernel(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
    ):
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        blocks = cute.arch.grid_dim()[0]
        smem = SmemAllocator()
        flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        step_now = ptxops.ld(signals.gmem(Uint32, pad, 4) + layout.lamport_step(width))
        buffer = Int32(step_now % Uint32(BUFFERS))
        deadline = cute.arch.globaltimer() + timeout_ns
        first = Int64(block) * threads + tidx
        step = Int64(blocks) * threads
        addrs = [signals.peer_address(data_table, Int32(r)) for r in range(world)]
        base = Int64(buffer) * (world * slot)
        region = base + Int64(rank) * slot
        size = Uint32(n)
        announce(pad_table, pad_mc, buffer, size, rank, block)
        send(addrs, data_mc, region, src, n, first, step)
        ok = sizes_agree(pad, buffer, size, deadline, err, rank, block)
        if signals.block_all(flag, ok):
            receive(signals.peer_address(data_table, rank) + base, out, n, deadline, err, rank, block, first, step)
        cute.arch.sync_threads()
        if tidx == 0:
            finish(pad, buffer, step_now, blocks)

    @cute.jit
    def launch(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
        blocks: Int32, stream: driver.CUstream,
    ):
        kernel(data_table, data_mc, out, src, n, pad_table, pad_mc, pad, err, rank, timeout_ns).launch(
            grid=[blocks, 1, 1], block=[threads, 1, 1], stream=stream
        )

    return launch


__all__ = ["BUFFERS", "build", "width_index"]
