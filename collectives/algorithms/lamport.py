"""The Lamport one-shot all-reduce: no barrier, the data is its own flag.

Every rank owns three rotating receive buffers per element width (one symmetric allocation,
``3 x world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`); call ``s`` of a width
uses buffer ``s % 3`` (:func:`~collectives.layouts.lamport_buffer`; the count wraps at
:data:`~collectives.config.LAMPORT_CALLS`, a multiple of 3, so the rotation holds across the
wrap).  A rank sends its canonical input (:mod:`collectives.device.lamport`) into its own slot
of buffer ``s % 3`` on every rank, polls its own buffer until every slot of its elements holds
data, reduces in rank order (16-bit floats in f32, fp8 in f16), writes the
result and marks the slots empty again.  The slots it empties are written next in call
``s + 3``, by a rank that has by then received this rank's data of calls ``s + 1`` and
``s + 2``, which this rank sends only after emptying them: clearing never races with writing.

The work is split in a fixed number of parts (:data:`~collectives.config.LAMPORT_BLOCKS`,
striding over 16-byte vectors), so every vector of a slot always belongs to the same part, and
each part counts its own calls on the device (``lamport_step`` in the signal pad): the buffer
follows that count, in eager calls and CUDA-graph replays alike, with no inter-block
coordination.  A block runs one part, or several where the grid is smaller (ranks sharing a GPU,
:mod:`~collectives.algorithms.residency`): it sends all of its parts before it waits for any,
so any resident grid makes progress.
With its data each rank sends ``tag << 32 | elements`` (``tag = call + 1``,
:func:`~collectives.layouts.lamport_tag`); a receiver waits for the entry of this call (older
entries carry older calls, so nothing is ever cleared) and records a size mismatch if the count
differs.  Every wait is bounded by the deadline.

A size mismatch leaves the call's buffer dirty (the receivers skip it; data past the smaller
sizes is never cleared).  Every rank's part 0 sees the mismatch and writes, in its own pad,
the tag of the call two later (:func:`~collectives.layouts.lamport_cleanup_call`); that call's
part 0 empties the whole buffer before it announces its size
(:func:`~collectives.layouts.lamport_stale` says why then) and clears the mark: the count
comes back to the failed call's after the wrap, where a mark left standing would read as a
mismatch of that call (its parts other than 0 would deliver nothing, with no error).  Each rank decides from its own
earlier kernel, on the GPU, at the same call: no host step, no collective reset.

A rank may run another kernel where its peers run Lamport: a rank with nothing to move launches
the barrier of size 0 (:func:`collectives.api._launch`) where ``auto`` picks Lamport for the
others.  So a Lamport kernel's block 0 also counts the call among the rank's collective calls
(the barriers' count ``C``) and leaves an arrival word in the call's slot of every rank's pad
(epoch :func:`~collectives.layouts.lamport_epoch`, size ``n ^``
:data:`~collectives.algorithms.base.LAMPORT_SIGNATURE`): a barrier waiting there records a size
mismatch, moves its own Lamport count of that width on as the peer's kernel did and marks the
buffer the peer wrote into dirty (:func:`~collectives.device.signals.lamport_missed`); a Lamport
kernel whose size entry from a rank has not come watches that rank's arrival word (part 0) or
part 0's verdict (the other parts) and records the size mismatch too.  The counts stay equal on
every rank and the communicator goes on.  Where the entries are there at once this costs one
load and ``W`` stores in block 0 (as many as the size entries).  The same holds where ranks'
dtypes gave them Lamport kernels of different element widths: each part 0 that failed moves
our count of every other width some rank ran on
(:func:`~collectives.device.signals.lamport_missed_any`, on the failure path only).  And where
ranks' sizes made ``auto`` choose a barriered algorithm with data on some and Lamport on others:
the barriered kernel's start records the size mismatch, and on that failure path only thread 0
of its block 0 (which waited for every rank's block 0, where a Lamport kernel leaves its
arrival word) reads the ranks' arrival words of the call and moves our count of each width some
rank ran on, once (:func:`~collectives.device.signals.lamport_missed_start`; the design
kernels and the push pipeline).

The launch takes the same arguments as :mod:`collectives.algorithms.design` (``data_table`` and
``data_mc`` are the receive buffers', ``src`` is the input, ``out`` the output).
"""

from __future__ import annotations

import os
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32, Uint64
from cutlass.memory import SmemAllocator

import ptxops

from ..config import (
    CALL_EPOCHS,
    KIND_SHIFT,
    LAMPORT_BLOCKS,
    LAMPORT_BUFFERS,
    LAMPORT_CALLS,
    LAMPORT_MAX_BYTES,
    LAMPORT_WIDTHS,
    MULTICAST_PATHS,
    VECTOR_BYTES,
)
from ..device import lamport, reduce, signals
from ..device.kernel_args import KernelArgs
from ..device.launch import launcher
from ..dtypes import DTYPES
from ..errors import CollectiveError
from ..layouts import (
    LAMPORT_EXCHANGE,
    SIZE_MISMATCH,
    TIMEOUT,
    PadLayout,
    lamport_buffer,
    lamport_cleanup_call,
    lamport_epoch,
    lamport_next,
    lamport_stale,
    lamport_tag,
)
from .base import LAMPORT_SIGNATURE, Algorithm, Call, capped
from .key import KernelKey
from .protocol import Runtime


BUFFERS = LAMPORT_BUFFERS
#: Threads of every Lamport kernel's block (a part is this many 16-byte vectors per stride).
THREADS = 256
#: Test only: a communicator's first Lamport call, while this is set, starts every Lamport call
#: count there (below :data:`~collectives.config.LAMPORT_CALLS`; ``LAMPORT_CALLS - 2`` crosses
#: the wrap in a few calls).  Every rank must set the same value.
SEED_CALL_ENV = "COLLECTIVES_TEST_SEED_CALL"


def width_index(element_bytes: int) -> int:
    """0, 1, 2 for 1-, 2-, 4-byte elements: which set of Lamport buffers a dtype uses."""
    return element_bytes.bit_length() - 1


class LamportKernel:
    """The Lamport all-reduce kernel of one key: its compile-time choices as attributes, one
    ``@cute.jit`` method per step (the module docstring gives the protocol)."""

    #: The collective's code in bits ``KIND_SHIFT`` up of a size entry's element count (0: the
    #: all-reduce; :mod:`~collectives.algorithms.lamport_blocks` sets its own), so that ranks
    #: calling different Lamport collectives in one call fail it as a size mismatch.
    code = 0

    def __init__(self, key: KernelKey) -> None:
        self.key = key
        self.world, self.threads, self.op = key.world, key.threads, key.op
        self.dtype = DTYPES[key.dtype].cute
        self.acc = DTYPES[key.dtype].accumulator.cute
        self.bits = self.dtype.width
        self.width = width_index(key.element_bytes)
        self.multicast = key.backend in MULTICAST_PATHS
        self.vectored = key.elements_per_access > 1
        self.per_vector = VECTOR_BYTES // key.element_bytes
        self.tail_carrier = lamport.CARRIER[self.bits]
        self.slot = LAMPORT_MAX_BYTES
        self.layout = PadLayout(world=self.world)

    def entry(self, call, n):
        """Our size entry of call ``call``: ``tag << 32 | code << KIND_SHIFT | n``."""
        word = (Uint64(lamport_tag(call)) << 32) | Uint64(n)
        if self.code:
            word = word | Uint64(self.code << KIND_SHIFT)
        return word

    def size_word(self, buffer, src):
        """Pad word (the first of two) of ``src``'s size entry in ``buffer`` (a runtime value)."""
        return self.layout.lamport_size(self.width, 0, src) + 2 * buffer * self.world

    @cute.jit
    def reduce_slots(self, slots):
        """The ``self.world`` slots' values (register words) combined in rank order, as ``self.dtype``."""
        total = reduce.convert(cute.recast_tensor(slots[0], self.dtype).load(), self.acc)
        for q in cutlass.range_constexpr(1, self.world):
            value = reduce.convert(cute.recast_tensor(slots[q], self.dtype).load(), self.acc)
            total = reduce.combine(total, value, self.op)
        return reduce.convert(total, self.dtype)

    @cute.jit
    def send_one(self, words, src, addrs, data_mc, at, stride):
        """Load ``words`` from ``src``, make them canonical and send them to byte ``at`` of our
        self.slot on every rank (``stride``, the bytes of one rank's block of a reduce-scatter's
        input, is the subclass's)."""
        lamport.load_words(words, src, None, signals.LOCAL)
        for i in cutlass.range_constexpr(cute.size(words)):
            words[i] = lamport.canonical(words[i], self.bits)
        lamport.send(words, [a + at for a in addrs], data_mc + at, self.multicast)

    @cute.jit
    def deliver(self, slots, out, stride):
        """Store the arrived ``slots``' reduction at ``out`` (``stride``, the bytes of one
        rank's block of an all-gather's output, is the subclass's)."""
        values = self.reduce_slots(slots)
        n = cutlass.const_expr(cute.size(slots[0]) * slots[0].element_type.width // self.bits)
        ptr = signals.gmem(self.dtype, out, n * self.bits // 8, signals.LOCAL,
                           "collectives.algorithms.lamport.LamportKernel.deliver")
        ptxops.st(ptr, values if cutlass.const_expr(n > 1) else values[0])

    @cute.jit
    def receive_one(self, slots, where, out, stride, deadline, err, rank, block) -> Boolean:
        """Wait for every rank's ``slots`` at ``where``, deliver them at ``out`` and empty
        them; False (and an error record) on a timeout."""
        missing = lamport.wait_slots(slots, where, self.bits, deadline)
        ok = missing < 0
        if ok:
            self.deliver(slots, out, stride)
            for q in cutlass.range_constexpr(self.world):
                lamport.clear(slots[q], where[q], self.bits)
        else:
            signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), missing, block, rank)
        return ok

    def vectors(self, n):
        """The 16-byte vectors of a slot that ``n`` elements take (the parts stride over them)."""
        return (n + self.per_vector - 1) // self.per_vector

    @cute.jit
    def send(self, addrs, data_mc, region, src, n, first, step, entry):
        """Send this thread's 16-byte vectors of the self.slot (``v = first, first + step, ...``),
        canonical, into our self.slot on every rank; a vector that the data does not fill (or all
        of them, for data that is not 16-byte aligned) goes element by element (``entry``, our
        size entry of the call, carries its tag: the tagged all-gather's)."""
        full = n // self.per_vector if cutlass.const_expr(self.vectored) else Int64(0)
        stride = n * (self.bits // 8)
        v = first
        while v < self.vectors(n):
            at = v * VECTOR_BYTES
            if v < full:
                self.send_one(cute.make_rmem_tensor(4, Uint32), src + at, addrs, data_mc, region + at, stride)
            else:
                j = v * self.per_vector
                while j < cutlass.min(v * self.per_vector + self.per_vector, n):
                    e = j * (self.bits // 8)
                    self.send_one(cute.make_rmem_tensor(1, self.tail_carrier), src + e, addrs, data_mc, region + e,
                                  stride)
                    j += 1
            v += step

    @cute.jit
    def receive(self, own, out, n, deadline, err, rank, block, first, step, entry):
        """Wait for every rank's copy of this thread's vectors in our buffer at ``own``, reduce
        them into ``out`` and empty their slots (the vectors :func:`send` sent with ``entry``)."""
        ok = Boolean(True)
        full = n // self.per_vector if cutlass.const_expr(self.vectored) else Int64(0)
        stride = n * (self.bits // 8)
        v = first
        while v < self.vectors(n) and ok:
            at = v * VECTOR_BYTES
            if v < full:
                slots = [cute.make_rmem_tensor(4, Uint32) for _ in range(self.world)]
                ok = self.receive_one(slots, [own + Int64(q) * self.slot + at for q in range(self.world)], out + at,
                                      stride, deadline, err, rank, block)
            else:
                j = v * self.per_vector
                while j < cutlass.min(v * self.per_vector + self.per_vector, n) and ok:
                    e = j * (self.bits // 8)
                    slots = [cute.make_rmem_tensor(1, self.tail_carrier) for _ in range(self.world)]
                    ok = self.receive_one(slots, [own + Int64(q) * self.slot + e for q in range(self.world)], out + e,
                                          stride, deadline, err, rank, block)
                    j += 1
            v += step
        return ok

    @cute.jit
    def empty_buffer(self, own, tidx):
        """Block 0's self.threads mark every self.slot of the buffer at ``own`` empty (-0.0)."""
        v = Int64(tidx)
        while v < self.world * self.slot // VECTOR_BYTES:
            lamport.clear(cute.make_rmem_tensor(4, Uint32), own + v * VECTOR_BYTES, self.bits)
            v += self.threads

    def arrival(self, calls, n):
        """Our block 0's arrival word of the call at count ``calls`` (what barriered kernels
        signal, :mod:`collectives.device.signals`): size ``n ^``
        :data:`~collectives.algorithms.base.LAMPORT_SIGNATURE` and epoch
        :func:`~collectives.layouts.lamport_epoch`, so that a rank running a barriered kernel in
        this call (an empty rank's barrier) records a size mismatch instead of a timeout."""
        size = Uint32(n) ^ Uint32(LAMPORT_SIGNATURE)
        return (Uint64(size) << 32) | Uint64(Uint32(lamport_epoch(calls, self.width)))

    @cute.jit
    def announce(self, pad_table, pad_mc, buffer, entry, rank, block, calls, n):
        """Block 0 sends our size entry into every rank's size words of ``buffer`` and our
        :meth:`arrival` of the call at count ``calls`` into its arrival word of us."""
        tidx = cute.arch.thread_idx()[0]
        if block == 0 and tidx < self.world:
            by = "collectives.algorithms.lamport.LamportKernel.announce"
            if cutlass.const_expr(self.multicast):
                if tidx == 0:
                    at = signals.gmem(Uint64, pad_mc, 8, signals.MULTICAST, by)
                    at = at + self.size_word(buffer, rank) // 2
                    ptxops.multimem_st(at, entry, sem="relaxed", scope="sys")
                    ptxops.multimem_st(signals.arrival_word(pad_mc, calls, Int32(0), rank, self.world,
                                                            signals.MULTICAST),
                                       self.arrival(calls, n), sem="relaxed", scope="sys")
            else:
                peer = signals.peer_address(pad_table, tidx)
                at = signals.gmem(Uint64, peer, 8, signals.PEER, by)
                ptxops.st(at + self.size_word(buffer, rank) // 2, entry, sem="relaxed", scope="sys")
                ptxops.st(signals.arrival_word(peer, calls, Int32(0), rank, self.world), self.arrival(calls, n),
                          sem="relaxed", scope="sys")

    @cute.jit
    def sizes_agree(self, pad, buffer, entry, deadline, err, rank, block, calls, failed, call) -> Boolean:
        """Threads ``t < self.world`` wait for rank ``t``'s size entry of this call and compare its
        element count with ours (True in self.threads that found it equal, and in the others).

        While it has not come, part 0 (``block``; it knows ``calls``, our count of collective
        calls) also watches rank ``t``'s arrival word of this call: a rank that ran another
        kernel in it (an empty rank's barrier, a Lamport kernel of another width) sends no
        entry, and the wait ends in a size mismatch instead of the deadline (where that kernel
        was a Lamport one of another width, :meth:`receive_part` moves our count of that width
        on).  Another part
        watches our dirty word of ``buffer`` (``failed``): part 0 writes it, the tag of
        :func:`~collectives.layouts.lamport_cleanup_call` of ``call``, once its check failed (a
        failure already recorded).  Both with relaxed accesses at gpu scope: part 0 runs in
        another block, on another SM, and a weak load may be served from this SM's L1, which no
        other SM's store updates (L1s are not coherent: a part that polled it once would spin to
        the deadline, a fatal timeout, while its peers went on).  Where the entry is there at
        once, neither is read."""
        tidx = cute.arch.thread_idx()[0]
        ok = Boolean(True)
        if tidx < self.world:
            by = "collectives.algorithms.lamport.LamportKernel.sizes_agree"
            own = signals.gmem(Uint64, pad, 8, signals.PEER, by)
            own = own + self.size_word(buffer, tidx) // 2
            # dtype given: CuTeDSL's pointer arithmetic makes ``own`` an Int64 pointer, and a signed
            # load shifts arithmetically (tags >= 2^31 never matched)
            seen = ptxops.ld(own, sem="relaxed", scope="sys", dtype=Uint64)
            left = Int32(0)  # SIZE_MISMATCH: rank t ran another kernel in this call; -1: part 0 failed it
            while (seen >> 32) != (entry >> 32) and left == 0 and cute.arch.globaltimer() < deadline:
                if block == 0:
                    word = ptxops.ld(signals.arrival_word(pad, calls, Int32(0), tidx, self.world), sem="relaxed",
                                     scope="sys", dtype=Uint64)
                    epoch = Uint32(word & Uint64(0xFFFFFFFF))
                    if signals.in_call(epoch, calls) and epoch != Uint32(lamport_epoch(calls, self.width)):
                        left = Int32(SIZE_MISMATCH)
                elif ptxops.ld(failed, sem="relaxed", scope="gpu", dtype=Uint32) == Uint32(
                        lamport_tag(lamport_cleanup_call(call))):
                    left = Int32(-1)
                seen = ptxops.ld(own, sem="relaxed", scope="sys", dtype=Uint64)
            if (seen >> 32) != (entry >> 32):
                ok = Boolean(False)
                if left == 0:
                    signals.record_error(err, Int32(TIMEOUT), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                elif left > 0:
                    signals.record_error(err, Int32(SIZE_MISMATCH), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
            elif seen != entry:
                signals.record_error(err, Int32(SIZE_MISMATCH), Int32(LAMPORT_EXCHANGE), tidx, block, rank)
                ok = Boolean(False)
        return ok

    @cute.jit
    def send_part(self, args: KernelArgs, part: Int32, addrs, dirty, tidx, calls):
        """Part ``part`` (a fixed share of the vectors) of our data of this call into every rank's
        buffer; part 0 first empties a buffer a size mismatch left dirty (and clears its mark)
        and announces our size (and our arrival in the call at count ``calls``)."""
        data_table, n, rank = args.data_table, args.n, args.rank
        call = ptxops.ld(self.counter(args.pad, part), dtype=Uint32)  # unsigned: up to LAMPORT_CALLS > 2^31
        buffer = Int32(lamport_buffer(call))
        entry = self.entry(call, n)
        if part == 0:
            stale = Int32(lamport_stale(call))
            if ptxops.ld(dirty + stale, dtype=Uint32) == Uint32(lamport_tag(call)):
                own = signals.peer_address(data_table, rank)
                self.empty_buffer(own + Int64(stale) * (self.world * self.slot), tidx)
                cute.arch.sync_threads()
                if tidx == 0:  # the mark is spent: the count comes back to its call after the wrap
                    ptxops.st(dirty + stale, Uint32(0))
        self.announce(args.pad_table, args.pad_mc, buffer, entry, rank, part, calls, n)
        base = Int64(buffer) * (self.world * self.slot)
        self.send(addrs, args.data_mc, base + Int64(rank) * self.slot, args.src, n,
                  Int64(part) * self.threads + tidx, Int64(LAMPORT_BLOCKS * self.threads), entry)

    @cute.jit
    def receive_part(self, args: KernelArgs, part: Int32, flag, dirty, deadline, tidx, calls):
        """Wait for every rank's data of part ``part``, reduce it into the output and empty the
        slots (or, on a size mismatch, mark the buffer dirty from part 0); then count the call."""
        n, rank = args.n, args.rank
        counter = self.counter(args.pad, part)
        call = ptxops.ld(counter, dtype=Uint32)
        buffer = Int32(lamport_buffer(call))
        entry = self.entry(call, n)
        # A part with no vectors has nothing to wait for.
        if Int64(part) * self.threads < self.vectors(n):
            ok = self.sizes_agree(args.pad, buffer, entry, deadline, args.err, rank, part, calls, dirty + buffer,
                                  call)
            if signals.block_all(flag, ok):
                own = signals.peer_address(args.data_table, rank) + Int64(buffer) * (self.world * self.slot)
                self.receive(own, args.out, n, deadline, args.err, rank, part, Int64(part) * self.threads + tidx,
                             Int64(LAMPORT_BLOCKS * self.threads), entry)
            elif part == 0 and tidx == 0:  # every rank's part 0 gets here: mark the buffer dirty
                # (relaxed, gpu scope: the other parts' blocks poll it in sizes_agree)
                ptxops.st(dirty + buffer, Uint32(lamport_tag(lamport_cleanup_call(call))), sem="relaxed", scope="gpu")
                # a rank that ran a Lamport kernel of another width here: our count of it moves on
                signals.lamport_missed_any(args.pad, calls, self.world, own=self.width)
        cute.arch.sync_threads()
        if tidx == 0:
            ptxops.st(counter, Uint32(lamport_next(call)))

    def counter(self, pad: Int64, part: Int32):
        """Pad word counting part ``part``'s calls (its buffer follows it)."""
        words = signals.gmem(Uint32, pad, 4, signals.LOCAL, "collectives.algorithms.lamport.LamportKernel.counter")
        return words + (self.layout.lamport_step(self.width, 0) + part)

    @cute.jit
    def kernel(self, args: KernelArgs):
        """Block ``b`` of a grid of ``G`` blocks runs parts ``b, b + G, ...`` of the fixed
        :data:`~collectives.config.LAMPORT_BLOCKS`: it sends all of them, then receives them
        (a part's sender never waits before sending: any grid that is resident is deadlock-free).
        Block 0 (part 0's) also counts the call among the rank's collective calls
        (:func:`~collectives.device.signals.enter_call`'s count ``C``, one load at its start, one
        store at its end: the other blocks never read it), as a barriered kernel does, so that
        the counts stay equal where ranks ran different kernels in a call."""
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        grid = cute.arch.grid_dim()[0]
        smem = SmemAllocator()
        flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        dirty = signals.gmem(Uint32, args.pad, 4, signals.LOCAL, "collectives.algorithms.lamport.LamportKernel.kernel")
        dirty = dirty + self.layout.lamport_dirty(self.width, 0)
        deadline = cute.arch.globaltimer() + args.timeout_ns
        addrs = [signals.peer_address(args.data_table, Int32(r)) for r in range(self.world)]
        count = signals.gmem(Uint32, args.pad, 4, signals.LOCAL, "collectives.algorithms.lamport.LamportKernel.kernel")
        count = count + self.layout.calls
        calls = Uint32(0)
        if block == 0:
            calls = ptxops.ld(count, dtype=Uint32)
        part = Int32(block)
        while part < LAMPORT_BLOCKS:
            self.send_part(args, part, addrs, dirty, tidx, calls)
            part += grid
        part = Int32(block)
        while part < LAMPORT_BLOCKS:
            self.receive_part(args, part, flag, dirty, deadline, tidx, calls)
            part += grid
        if block == 0 and tidx == 0:  # after receive_part's bar.sync: every thread's last use of calls
            ptxops.st(count, calls + Uint32(CALL_EPOCHS))


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the Lamport all-reduce for ``key``."""
    return launcher(LamportKernel(key).kernel, key.threads,
                    emulate=key.backend == "multicast_emulated" and key.world, pdl=key.pdl)



class Lamport(Algorithm):
    """One-shot without barriers: the data is its own flag (lowest latency, at most
    :data:`~collectives.config.LAMPORT_MAX_BYTES` per rank).  It reads the input and writes the
    output where they lie; its symmetric memory is the three rotating receive buffers of the
    element width, and its work is split in a fixed number of parts
    (:data:`~collectives.config.LAMPORT_BLOCKS`), one per block or several."""

    collectives = ("all_reduce",)
    name = "lamport"
    stages_in = "never"
    barriered = False
    phases = {LAMPORT_EXCHANGE: "Lamport data exchange"}

    def refusal(self, call: Call) -> str | None:
        if call.nbytes > LAMPORT_MAX_BYTES:
            return (f"lamport all_reduce carries at most {LAMPORT_MAX_BYTES} bytes per rank, not {call.nbytes}; "
                    "use algorithm='auto', 'one_shot' or 'two_shot'")
        return None

    def plan(self, comm: Runtime, call: Call) -> Any:
        key = KernelKey("all_reduce", self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, threads=THREADS)
        data = comm.buffer(receive_buffers(comm, call.inp.element_size()))
        return self.launch(comm, call, key, data, call.inp.data_ptr())

    def blocks(self, comm: Runtime, key: KernelKey, work: int, limit: int | None = None) -> int:
        """One block per part (:data:`~collectives.config.LAMPORT_BLOCKS`), all resident at
        once (each waits for data other ranks' blocks send); where ranks share a GPU, at most
        the rank's share (``comm.block_cap``): each block then runs several parts."""
        return capped(comm, key, LAMPORT_BLOCKS)

    def build(self, key: KernelKey):
        return build(key)


def receive_buffers(comm: Runtime, element_bytes: int) -> Any:
    """``comm``'s three rotating receive buffers for elements of ``element_bytes`` bytes (``3 x
    world`` slots of :data:`~collectives.config.LAMPORT_MAX_BYTES`, symmetric), allocated on
    first use (collectively, agreed first) and filled with -0.0 of that width; a barrier after
    the fill keeps every rank from sending before every rank's fill is done.  The first use of
    any width first applies :data:`SEED_CALL_ENV`."""
    buffers = comm.lamport_buffers
    if element_bytes not in buffers:
        import torch

        from .plan import capturing  # torch: not at import (collectives.algorithms imports without it)

        if not buffers:
            seed_counts(comm, int(os.environ.get(SEED_CALL_ENV, "0")))
        nbytes = LAMPORT_BUFFERS * comm.world * LAMPORT_MAX_BYTES
        comm.agree_growth(-element_bytes, nbytes)
        buf = buffers[element_bytes] = comm.ctx.empty(nbytes, torch.uint8)
        widths = {1: (torch.uint8, 0x80), 2: (torch.int16, -(1 << 15)), 4: (torch.int32, -(1 << 31))}
        view, empty = widths[element_bytes]  # -0.0 of the width: an empty slot
        buf.view(view).fill_(empty)
        comm.barrier("auto", bool(capturing()))
    return buffers[element_bytes]


def seed_counts(comm: Runtime, call: int) -> None:
    """Start every Lamport call count of ``comm`` at ``call`` (test only, :data:`SEED_CALL_ENV`;
    0, the zeroed pad's, needs no write).  The counts are the kernels' words: the layout of this
    world size, not the pad's allocation layout (of the largest world).  Refused where a size
    mismatch's clean-up is pending: its mark names a count the move would skip."""
    if not 0 <= call < LAMPORT_CALLS:
        raise CollectiveError(f"{SEED_CALL_ENV}={call}: a Lamport call count is 0..{LAMPORT_CALLS - 1}")
    kernel_layout = PadLayout(world=comm.world)
    if comm.lamport_buffers:  # counts moved mid-life: no clean-up may be pending (its mark names a count)
        first, last = kernel_layout.lamport_dirty(0, 0), kernel_layout.lamport_dirty(2, LAMPORT_BUFFERS - 1)
        marks = comm.pad[first:last + 1].tolist()  # (synchronizes: the test hook runs between calls)
        if any(marks):
            raise CollectiveError(f"the Lamport counts can be moved only where no size mismatch's clean-up is pending "
                                  f"(its buffer is emptied two calls of its width later); marks {marks}")
    if call:
        as_int32 = call - (1 << 32) if call >= 1 << 31 else call  # the pad holds int32 words
        for width in range(LAMPORT_WIDTHS):
            start = kernel_layout.lamport_step(width, 0)
            comm.pad[start:start + LAMPORT_BLOCKS].fill_(as_int32)


__all__ = ["BUFFERS", "SEED_CALL_ENV", "THREADS", "Lamport", "build", "lamport_buffer", "lamport_cleanup_call", "lamport_next",
           "lamport_stale", "lamport_tag", "receive_buffers", "seed_counts", "width_index"]
