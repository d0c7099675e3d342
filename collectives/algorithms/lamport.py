"""The Lamport one-shot all-reduce: no barrier, the data is its own flag.

Every rank owns three rotating receive buffers per element width (one symmetric allocation,
``3 x world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`); call ``s`` of a width
uses buffer ``s % 3`` (:func:`~collectives.config.lamport_buffer`; the count wraps at
:data:`~collectives.config.LAMPORT_CALLS`, a multiple of 3, so the rotation holds across the
wrap).  A rank sends its canonical input (:mod:`collectives.device.lamport`) into its own slot
of buffer ``s % 3`` on every rank, polls its own buffer until every slot of its elements holds
data, reduces in rank order (16-bit floats in f32, fp8 in f16), writes the
result and marks the slots empty again.  The slots it empties are written next in call
``s + 3``, by a rank that has by then received this rank's data of calls ``s + 1`` and
``s + 2``, which this rank sends only after emptying them: clearing never races with writing.

The grid is fixed (:data:`~collectives.config.LAMPORT_BLOCKS` blocks striding over 16-byte
vectors), so every vector of a slot always belongs to the same thread block, and each block
counts its own calls on the device (``lamport_step`` in the signal pad): the buffer follows
that count, in eager calls and CUDA-graph replays alike, with no inter-block coordination.
With its data each rank sends ``tag << 32 | elements`` (``tag = call + 1``,
:func:`~collectives.config.lamport_tag`); a receiver waits for the entry of this call (older
entries carry older calls, so nothing is ever cleared) and records a size mismatch if the count
differs.  Every wait is bounded by the deadline.

A size mismatch leaves the call's buffer dirty (the receivers skip it; data past the smaller
sizes is never cleared).  Every rank's block 0 sees the mismatch and writes, in its own pad,
the tag of the call two later (:func:`~collectives.config.lamport_cleanup_call`); that call's
block 0 empties the whole buffer before it announces its size
(:func:`~collectives.config.lamport_stale` says why then).  Each rank decides from its own
earlier kernel, on the GPU, at the same call: no host step, no collective reset.

The launch takes the same arguments as :mod:`collectives.algorithms.design` (``data_table`` and
``data_mc`` are the receive buffers', ``src`` is the input, ``out`` the output).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32, Uint64
from cutlass.memory import SmemAllocator

import ptxops

from ..config import (
    LAMPORT_BLOCKS,
    LAMPORT_BUFFERS,
    LAMPORT_EXCHANGE,
    LAMPORT_MAX_BYTES,
    MULTICAST_PATHS,
    SIZE_MISMATCH,
    TIMEOUT,
    VECTOR_BYTES,
    KernelKey,
    PadLayout,
    lamport_buffer,
    lamport_cleanup_call,
    lamport_next,
    lamport_stale,
    lamport_tag,
)
from ..device import lamport, reduce, signals
from ..dtypes import DTYPES
from ..launch import launcher

BUFFERS = LAMPORT_BUFFERS


def width_index(element_bytes: int) -> int:
    """0, 1, 2 for 1-, 2-, 4-byte elements: which set of Lamport buffers a dtype uses."""
    return element_bytes.bit_length() - 1


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the Lamport all-reduce for ``key``."""
    world, threads, op = key.world, key.threads, key.op
    dtype = DTYPES[key.dtype].cute
    acc = DTYPES[key.dtype].accumulator.cute
    bits = dtype.width
    width = width_index(key.element_bytes)
    multicast = key.backend in MULTICAST_PATHS
    vectored = key.elements_per_access > 1
    per_vector = VECTOR_BYTES // key.element_bytes
    tail_carrier = lamport.CARRIER[bits]
    slot = LAMPORT_MAX_BYTES
    layout = PadLayout(world=world)

    def size_word(buffer, src):
        """Pad word (the first of two) of ``src``'s size entry in ``buffer`` (a runtime value)."""
        return layout.lamport_size(width, 0, src) + 2 * buffer * world

    @cute.jit
    def reduce_slots(slots):
        """The ``world`` slots' values (register words) combined in rank order, as ``dtype``."""
        total = reduce.convert(cute.recast_tensor(slots[0], dtype).load(), acc)
        for q in cutlass.range_constexpr(1, world):
            total = reduce.combine(total, reduce.convert(cute.recast_tensor(slots[q], dtype).load(), acc), op)
        return reduce.convert(total, dtype)

    @cute.jit
    def send_one(words, src, addrs, data_mc, at):
        """Load ``words`` from ``src``, make them canonical and send them to byte ``at`` of our
        slot on every rank."""
        lamport.load_words(words, src)
        for i in cutlass.range_constexpr(cute.size(words)):
            words[i] = lamport.canonical(words[i], bits)
        lamport.send(words, [a + at for a in addrs], data_mc + at, multicast)

    @cute.jit
    def receive_one(slots, where, out, deadline, err, rank, block) -> Boolean:
        """Wait for every rank's ``slots`` at ``where``, store their reduction at ``out`` and
        empty them; False (and an error record) on a timeout."""
        missing = lamport.wait_slots(slots, where, bits, deadline)
        ok = missing < 0
        if ok:
            values = reduce_slots(slots)
            n = cutlass.const_expr(cute.size(slots[0]) * slots[0].element_type.width // bits)
            ptr = signals.gmem(dtype, out, n * bits // 8)
            ptxops.st(ptr, values if cutlass.const_expr(n > 1) else values[0])
            for q in cutlass.range_constexpr(world):
                lamport.clear(slots[q], where[q], bits)
        else:
            signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), missing, block, rank)
        return ok

    @cute.jit
    def send(addrs, data_mc, region, src, n, first, step):
        """Send this thread's 16-byte vectors of the slot (``v = first, first + step, ...``),
        canonical, into our slot on every rank; a vector that the data does not fill (or all
        of them, for data that is not 16-byte aligned) goes element by element."""
        full = n // per_vector if cutlass.const_expr(vectored) else Int64(0)
        v = first
        while v < (n + per_vector - 1) // per_vector:
            at = v * VECTOR_BYTES
            if v < full:
                send_one(cute.make_rmem_tensor(4, Uint32), src + at, addrs, data_mc, region + at)
            else:
                j = v * per_vector
                while j < cutlass.min(v * per_vector + per_vector, n):
                    e = j * (bits // 8)
                    send_one(cute.make_rmem_tensor(1, tail_carrier), src + e, addrs, data_mc, region + e)
                    j += 1
            v += step

    @cute.jit
    def receive(own, out, n, deadline, err, rank, block, first, step):
        """Wait for every rank's copy of this thread's vectors in our buffer at ``own``, reduce
        them into ``out`` and empty their slots (the vectors :func:`send` sent)."""
        ok = Boolean(True)
        full = n // per_vector if cutlass.const_expr(vectored) else Int64(0)
        v = first
        while v < (n + per_vector - 1) // per_vector and ok:
            at = v * VECTOR_BYTES
            if v < full:
                slots = [cute.make_rmem_tensor(4, Uint32) for _ in range(world)]
                ok = receive_one(slots, [own + Int64(q) * slot + at for q in range(world)], out + at,
                                 deadline, err, rank, block)
            else:
                j = v * per_vector
                while j < cutlass.min(v * per_vector + per_vector, n) and ok:
                    e = j * (bits // 8)
                    slots = [cute.make_rmem_tensor(1, tail_carrier) for _ in range(world)]
                    ok = receive_one(slots, [own + Int64(q) * slot + e for q in range(world)], out + e,
                                     deadline, err, rank, block)
                    j += 1
            v += step
        return ok

    @cute.jit
    def empty_buffer(own, tidx):
        """Block 0's threads mark every slot of the buffer at ``own`` empty (-0.0)."""
        v = Int64(tidx)
        while v < world * slot // VECTOR_BYTES:
            lamport.clear(cute.make_rmem_tensor(4, Uint32), own + v * VECTOR_BYTES, bits)
            v += threads

    @cute.jit
    def announce(pad_table, pad_mc, buffer, entry, rank, block):
        """Block 0 sends our size entry into every rank's size words of ``buffer``."""
        tidx = cute.arch.thread_idx()[0]
        if block == 0 and tidx < world:
            if cutlass.const_expr(multicast):
                if tidx == 0:
                    at = signals.gmem(Uint64, pad_mc, 8) + size_word(buffer, rank) // 2
                    ptxops.multimem_st(at, entry, sem="relaxed", scope="sys")
            else:
                peer = signals.gmem(Uint64, signals.peer_address(pad_table, tidx), 8)
                ptxops.st(peer + size_word(buffer, rank) // 2, entry, sem="relaxed", scope="sys")

    @cute.jit
    def sizes_agree(pad, buffer, entry, deadline, err, rank, block) -> Boolean:
        """Threads ``t < world`` wait for rank ``t``'s size entry of this call and compare its
        element count with ours (True in threads that found it equal, and in the others)."""
        tidx = cute.arch.thread_idx()[0]
        ok = Boolean(True)
        if tidx < world:
            own = signals.gmem(Uint64, pad, 8) + size_word(buffer, tidx) // 2
            seen = ptxops.ld(own, sem="relaxed", scope="sys")
            while (seen >> 32) != (entry >> 32) and cute.arch.globaltimer() < deadline:
                seen = ptxops.ld(own, sem="relaxed", scope="sys")
            if (seen >> 32) != (entry >> 32):
                signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                ok = Boolean(False)
            elif seen != entry:
                signals.record_error(err, Int32(SIZE_MISMATCH), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                ok = Boolean(False)
        return ok

    @cute.jit
    def kernel(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
    ):
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        smem = SmemAllocator()
        flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        counter = signals.gmem(Uint32, pad, 4) + (layout.lamport_step(width, 0) + block)
        call = Uint32(ptxops.ld(counter))  # unsigned: the count runs up to LAMPORT_CALLS > 2^31
        buffer = Int32(lamport_buffer(call))
        dirty = signals.gmem(Uint32, pad, 4) + layout.lamport_dirty(width, 0)
        deadline = cute.arch.globaltimer() + timeout_ns
        first = Int64(block) * threads + tidx
        step = Int64(LAMPORT_BLOCKS * threads)
        addrs = [signals.peer_address(data_table, Int32(r)) for r in range(world)]
        base = Int64(buffer) * (world * slot)
        entry = (Uint64(lamport_tag(call)) << 32) | Uint64(n)
        if block == 0:
            stale = Int32(lamport_stale(call))
            if ptxops.ld(dirty + stale) == Uint32(lamport_tag(call)):
                empty_buffer(signals.peer_address(data_table, rank) + Int64(stale) * (world * slot), tidx)
                cute.arch.sync_threads()
        announce(pad_table, pad_mc, buffer, entry, rank, block)
        send(addrs, data_mc, base + Int64(rank) * slot, src, n, first, step)
        # A block with no vectors has nothing to wait for.
        if Int64(block) * threads < (n + per_vector - 1) // per_vector:
            ok = sizes_agree(pad, buffer, entry, deadline, err, rank, block)
            if signals.block_all(flag, ok):
                receive(signals.peer_address(data_table, rank) + base, out, n, deadline, err, rank, block, first, step)
            elif block == 0 and tidx == 0:  # every rank's block 0 gets here: mark the buffer dirty
                ptxops.st(dirty + buffer, Uint32(lamport_tag(lamport_cleanup_call(call))))
        cute.arch.sync_threads()
        if tidx == 0:
            ptxops.st(counter, Uint32(lamport_next(call)))

    return launcher(kernel, threads, grid=LAMPORT_BLOCKS, emulate=key.backend == "multicast_emulated" and world,
                    pdl=key.pdl)


__all__ = ["BUFFERS", "build", "width_index"]
