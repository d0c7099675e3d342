"""Push reduce-scatter and all-reduce for inputs outside symmetric memory: no staging copy.

Each rank stores slice ``q`` of its input straight from the user's tensor into slot ``rank`` of
rank ``q``'s symmetric receive buffer (``world`` slots of ``m`` elements), and the owner
reduces its ``world`` slots from local memory into its output.  The all-reduce's slices split
``n`` in ``world`` (``m`` rounded up to whole vectors; the last slice may be shorter) and the
owner also hands its reduction to every rank through result buffers of their own (``world``
regions of ``m`` elements, region ``q`` owner ``q``'s; the kernel argument ``results`` holds their
table, :data:`~collectives.layouts.PUSH_ALL_REDUCE`): on the
peer backend it stores it into its region of every other rank's result buffer, and every rank
copies the other owners' regions out of its own result buffer into its output (local loads),
so that every byte crossing NVLink is a store; on the multicast backends it stores it into its
region of its own result buffer and every rank pulls each owner's region into its output
(plain loads from the peers).  The reduce-scatter's slices are its outputs
(``m = n``).  Every phase splits a slice alike (whole vectors in one grid stride, then the
elements past the last), so block ``b``'s signals order exactly the accesses that block ``b``
of another rank makes to the same elements.  The pushes are plain stores on every backend (a
reduction of local slots has nothing to multicast), so the kernel holds no ``multimem`` but
the multicast barrier's.

On the peer backend the kernel is a software pipeline.  Each block cuts its share of every
slot in rounds (:func:`collectives.algorithms.push.push_rounds`: chunks of whole grid strides, at most
:data:`~collectives.config.PUSH_MAX_ROUNDS`) and announces events with
:func:`~collectives.device.signals.signal_peers`: event ``j`` of the call at count ``C`` is
epoch ``C + 1 + j``; every rank's block emits the same events in the same order, so one
monotone word per block and rank (of the call's slot) says how far it got::

    push chunk 0;   signal event 0;   wait for every rank's event 0
    for k in 0 .. R-1:
        push chunk k+1 (if any)                    # remote stores in flight ...
        k > 0: wait for every rank's event k       # ... while we wait, reduce and copy
        reduce chunk k of our slots -> out
            all-reduce: and -> our region of every other rank's result buffer (remote stores)
        all-reduce: copy chunk k-1 of every other owner's region of our result buffer -> out
        signal event k+1 (unless it is the reduce-scatter's last round, eagerly)
    all-reduce, or an end barrier: wait for every rank's event R
    all-reduce: copy chunk R-1

Event ``k + 1`` says "chunk ``k + 1`` pushed, chunk ``k`` reduced (and its result stored on
every rank, and chunk ``k - 1`` copied out)": a rank reduces chunk ``k`` only after every rank
pushed it, and copies chunk ``k - 1`` of owner ``q`` only after ``q``'s event ``k``, which
``q`` emits after storing that chunk's result into every rank's result buffer.  The release of
a signal waits for the block's stores before it, remote ones included (after a ``bar.sync``),
so signalling after the local copy lets the pushes of chunk ``k + 1`` and the result stores of
chunk ``k`` drain while chunk ``k - 1`` is copied.

Sizes: every call takes the same range of epochs (:data:`~collectives.config.CALL_EPOCHS`,
see :mod:`~collectives.device.signals`), whatever its rounds (which depend on its size), so
every rank's epochs stay equal after a call whose sizes differed.  Every rank signals event 0
before its first wait, and a rank's words of a call stay in place until every rank has
entered the next call, so each wait compares the size of every rank's word of this call.  No
rank passes the first wait of a call whose sizes differ, and it pushes nothing but chunk 0
(which its event 0 releases) before it and stores no result: so every store of a failed call
into another rank is ordered before the next call's (or it could land on them, in a layout of
another size).

Buffer reuse across calls: a push writes into another rank's buffer before any wait, so the
buffer must be free there.  A rank finishes a call only after its blocks saw the event every
rank's block emits last (the data of other blocks is ordered by the end of the kernel), and it
emits any event of a call only after its previous kernel completed.  With a final wait (the
all-reduce; the reduce-scatter under graph capture) one receive buffer is enough: a rank
pushes the next call only after every owner's event ``R``, by which time every owner has
reduced all its slots.  Eagerly the reduce-scatter has no final wait and the caller
alternates two buffers (as the staged one-shot does): a rank pushes into a buffer again only
after a wait of the call in between, which every rank's block passed the event of only after
finishing the call that read it.  The all-reduce's result buffers are buffers of their own
(``results`` holds their table), with a region per owner so that owners never store over each
other.  Owner ``q`` stores a result of the next call into rank ``p``'s buffer only after a
wait for every rank's event 0 (or a later one) of that call, which ``p``'s block emits only
after its kernel of this call completed: after all of ``p``'s blocks copied every region out,
whatever the sizes, and so the regions, rounds and blocks' shares, of the two calls.  Results
within the slots' buffer would not do: a rank pushes the next call's chunk 0 before any wait,
while a slower rank may still copy its last chunk out (after its final wait), and a call of
another size lays its slots over the regions that followed the last call's.

The multicast backends run the same phases as one round between two multicast barriers:
push, barrier, reduce (into the owner's own result region), barrier, pull.  A rank's pushes of
the next call follow its previous kernel, which ended after every rank's blocks reached the
second barrier, so after every rank reduced its slots; an owner stores the next call's result
only after its first barrier, which every rank's block reaches only after its previous kernel,
so after every rank pulled.  Under emulation ``results`` is the result buffer's translation
table (the emulated barrier needs its pad window), whose window 0 lists the result buffers.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

from ptxops.ops import emulation

from ..config import PUSH_MAX_ROUNDS, PUSH_ROUND_STRIDES, Slot
from ..device import reduce, signals
from ..device.kernel_args import KernelArgs
from ..layouts import COLLECTIVE, PUSH_ALL_REDUCE, PUSH_ROUND, Layout
from ..device.launch import launcher
from . import design, tuning
from .base import Algorithm, Call, ceil_div
from .key import KernelKey
from .protocol import Runtime


def push_slice_elements(n, world: int, vec: int):
    """Elements of each slice of a push all-reduce of ``n``: ``n / world`` rounded up to whole
    vectors of ``vec`` (so every slice starts 16-byte aligned when the tensor does)."""
    return ceil_div(ceil_div(n, world), vec) * vec


def push_round_strides(strides):
    """Grid strides per round of a pipelined push whose slots take ``strides`` grid strides
    (``ceil(ceil(m / vec) / (blocks * threads))`` for slots of ``m`` elements, at least 1):
    :data:`~collectives.config.PUSH_ROUND_STRIDES`, or the least multiple of it that makes at most
    :data:`~collectives.config.PUSH_MAX_ROUNDS` rounds."""
    return PUSH_ROUND_STRIDES * ceil_div(ceil_div(strides, PUSH_MAX_ROUNDS), PUSH_ROUND_STRIDES)


def push_rounds(strides):
    """Rounds of a pipelined push whose slots take ``strides`` grid strides (1 to
    :data:`~collectives.config.PUSH_MAX_ROUNDS`; the last may be shorter)."""
    return ceil_div(strides, push_round_strides(strides))


def push_events(rounds, final: bool):
    """Signals each block of a pipelined push emits in a call of ``rounds`` rounds: event 0
    once the first round's chunk is pushed, event ``k + 1`` once chunk ``k + 1`` is pushed and
    chunk ``k`` reduced (in an all-reduce: its result stored on every rank, and chunk ``k - 1``
    of the others' results copied out), the last (after the last round) only when a ``final``
    wait reads it (the all-reduce's last copy, an end barrier)."""
    return rounds + int(final)


def layout(key: KernelKey) -> Layout:
    """The all-reduce's kernels take the result buffers' table where others take a multicast
    address (:data:`~collectives.layouts.PUSH_ALL_REDUCE`)."""
    return PUSH_ALL_REDUCE if key.collective == "all_reduce" else COLLECTIVE


def results_table(results: Int64) -> Int64:
    """The table of every rank's result buffer: ``results``, or, traced under a multicast
    emulation, the bases of window 0 of the translation table that ``results`` was."""
    active = emulation.active()
    return results if active is None else active.bases(0)


class Pipeline:
    """The pipelined push's schedule for one thread block (the module docstring), shared by the
    push kernels of this module and the push all-gather
    (:mod:`collectives.algorithms.push_gather`).  A subclass sets ``world``, ``threads``, ``vec``
    and ``final`` (a last wait for every rank's last event) and writes the rounds' work:
    :meth:`slot_elements` (the elements of a slot, which the rounds cut), :meth:`send` (chunk
    ``k``'s pushes, before any wait of that round), :meth:`work` (what round ``k`` does once every
    rank's event ``k`` came) and :meth:`finish` (after the final wait)."""

    @cute.jit
    def slot_elements(self, n):
        return n

    @cute.jit
    def send(self, args: KernelArgs, k, chunk, first, step):
        raise NotImplementedError

    @cute.jit
    def work(self, args: KernelArgs, k, chunk, first, step):
        raise NotImplementedError

    @cute.jit
    def finish(self, args: KernelArgs, rounds, chunk, first, step):
        pass

    @cute.jit
    def wait(self, flag, pad_table, pad, rank, block, calls, j, deadline, err, which, size):
        """Wait for every rank's event ``j`` (True in every thread of the block if it came,
        with our size)."""
        return signals.block_all(flag, signals.wait_peers(
            pad_table, pad, rank, block, calls, calls + Uint32(j + 1), deadline, err, which, size, self.world))

    @cute.jit
    def pipeline_kernel(self, args: KernelArgs):
        n = args.n
        pad_table, pad, err, rank, timeout_ns = args.pad_table, args.pad, args.err, args.rank, args.timeout_ns
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        flag = SmemAllocator().allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        calls, last = signals.enter_call(pad, self.world)  # this call's events are calls + 1 ...
        deadline = cute.arch.globaltimer() + timeout_ns
        size = signals.size_word(n, args.kinds)
        first = Int64(block) * self.threads + tidx
        step = Int64(cute.arch.grid_dim()[0]) * self.threads
        strides = ceil_div(ceil_div(self.slot_elements(n), self.vec), step)
        chunk = push_round_strides(strides) * step * self.vec
        rounds = push_rounds(strides)
        events = push_events(rounds, self.final)

        self.send(args, Int64(0), chunk, first, step)
        signals.signal_peers(pad_table, rank, block, calls, calls + Uint32(1), size, self.world)
        # Every rank's size before any other push: a failed call's pushes are all signalled.
        ok = self.wait(flag, pad_table, pad, rank, block, calls, Int64(0), deadline, err, Int32(0), size)
        if not ok:
            signals.lamport_missed_start(pad_table, rank, calls, self.world)  # (a rank that ran Lamport here?)
        k = Int64(0)
        while ok and k < rounds:
            if k + 1 < rounds:
                self.send(args, k + 1, chunk, first, step)
            if k > 0:
                ok = self.wait(flag, pad_table, pad, rank, block, calls, k, deadline, err, Int32(PUSH_ROUND), size)
            if ok:
                self.work(args, k, chunk, first, step)
                if k + 1 < events:
                    signals.signal_peers(pad_table, rank, block, calls, calls + Uint32(k + 2), size, self.world)
            k += 1
        if cutlass.const_expr(self.final):
            if ok:
                ok = self.wait(flag, pad_table, pad, rank, block, calls, rounds, deadline, err, Int32(1), size)
                if ok:
                    self.finish(args, rounds, chunk, first, step)
        signals.leave_call(pad, calls, last, self.world)


class PushKernel(Pipeline):
    """The push kernel of one key: its compile-time choices as attributes, one ``@cute.jit``
    method per phase (the module docstring gives the schedule): the pipeline on the peer
    backend, one round between two multicast barriers on the others; the reduce-scatter and
    the all-reduce differ only in how ``n`` is sliced."""

    def __init__(self, key: KernelKey) -> None:
        self.key = key
        self.b = design.Blocks(key)
        self.vec, self.world, self.threads = self.b.vec, self.b.world, self.b.threads
        self.dtype, self.acc, self.op = self.b.dtype, self.b.acc, self.b.op
        self.element_bytes = self.dtype.width // 8
        self.all_reduce = key.collective == "all_reduce"
        self.pipelined = key.backend == "peer"
        # The pipeline's last wait: the all-reduce's last copy, or an end barrier.
        self.final = self.all_reduce or key.end_barrier

    def launcher(self):
        """The ``@cute.jit`` launcher: the pipeline on the peer backend, else the design's
        kernel (push, barrier, reduce, barrier, pull)."""
        key = self.key
        if self.pipelined:
            return launcher(self.pipeline_kernel, self.threads, pdl=key.pdl, layout=layout(key))
        return design.kernel(key, self.b, stage=None, move=self.reduce_all, push=self.push_all,
                             pull=self.pull_all if self.all_reduce else None, layout=layout(key))

    @cute.jit
    def slot_elements(self, n):
        """Elements of each slot: a whole-vector share of ``n`` (all-reduce) or ``n``."""
        if cutlass.const_expr(self.all_reduce):
            return push_slice_elements(n, self.world, self.vec)
        else:
            return n

    @cute.jit
    def bounds(self, n, q):
        """(first input element, length, slot size) of slice ``q``: reduce-scatter slices are
        the ``n`` elements of an output; all-reduce slices split ``n`` in ``self.world``
        (:func:`collectives.algorithms.push.push_slice_elements`, the last may be shorter)."""
        m = self.slot_elements(n)
        if cutlass.const_expr(self.all_reduce):
            begin = cutlass.min(Int64(q) * m, n)
            return begin, cutlass.min(begin + m, n) - begin, m
        else:
            return Int64(q) * n, n, m

    @cute.jit
    def region(self, results, holder, q, m):
        """Owner ``q``'s region of rank ``holder``'s result buffer (``results``: the table)."""
        return signals.peer_address(results, holder) + Int64(q) * m * self.element_bytes

    @cute.jit
    def window(self, length, k, chunk):
        """Elements [lo, hi) of round ``k`` (rounds of ``chunk`` elements, whole grid strides)
        of a slice of ``length``: the elements past its last vector fall in the last one."""
        return cutlass.min(k * chunk, length), cutlass.min((k + 1) * chunk, length)

    @cute.jit
    def push(self, table, src, n, rank, k, chunk, first, step):
        """Chunk ``k`` of slot ``rank`` of rank ``q``'s buffer = chunk ``k`` of slice ``q`` of
        our input, for every ``q`` (``q = rank + i``: each rank writes to a different owner at a
        time; ``table`` the receive buffers', read where used).  The owners are a loop, not
        unrolled, as in ``collect``: unrolled, each owner's bounds were hoisted out of the
        pipeline's rounds into registers of their own, which spilled at 8 ranks
        (``tests/collectives/algorithms/test_kernel_registers.py``)."""
        for i in cutlass.range(self.world, unroll=1):
            q = (rank + i) % self.world
            begin, length, m = self.bounds(n, q)
            lo, hi = self.window(length, k, chunk)
            slot = signals.peer_address(table, q) + Int64(rank) * m * self.element_bytes
            self.b.copy_local(src + begin * self.element_bytes, slot, lo, hi, first, step)

    @cute.jit
    def reduce_chunk(self, table, results, out, n, rank, k, chunk, first, step):
        """Chunk ``k`` of the reduction of our ``self.world`` slots (local loads) into out (the
        all-reduce: into our slice of out and into our region of the result buffers, ``results``
        their table: in the pipeline every other rank's (peer stores), else our own)."""
        begin, length, m = self.bounds(n, rank)
        lo, hi = self.window(length, k, chunk)
        own = signals.peer_address(table, rank)
        slots = [own + Int64(s) * m * self.element_bytes for s in range(self.world)]
        dests = [out]
        if cutlass.const_expr(self.all_reduce):
            dests = [out + begin * self.element_bytes]
            if cutlass.const_expr(self.pipelined):
                dests += [self.region(results, (rank + i) % self.world, rank, m) for i in range(1, self.world)]
            else:
                dests += [self.region(results, rank, rank, m)]

        def reduce_here(vs):
            offsets = tuple(Int64(v) * self.vec for v in vs)
            reduced = reduce.load_reduce_peer(slots, offsets, self.dtype, self.acc, self.vec, self.op)
            for o, values in zip(offsets, reduced):
                for d in dests:
                    self.b.store_local(d, o, values, self.vec)

        self.b.each_vector(lo // self.vec, hi // self.vec, first, step, reduce_here)
        j = cutlass.max(Int64(hi // self.vec * self.vec), lo) + first
        while j < hi:
            value = reduce.load_reduce_peer(slots, (j,), self.dtype, self.acc, 1, self.op)[0]
            for d in dests:
                self.b.store_local(d, j, value, 1)
            j += step

    @cute.jit
    def pull(self, results, out, n, rank, k, chunk, first, step):
        """Chunk ``k`` of slice ``q`` of out = chunk ``k`` of owner ``q``'s region of its own
        result buffer, for every other ``q`` (``q = rank + i``: each rank reads from a
        different owner at a time; the multicast backends)."""
        for i in cutlass.range_constexpr(1, self.world):
            q = (rank + i) % self.world
            begin, length, m = self.bounds(n, q)
            lo, hi = self.window(length, k, chunk)
            self.b.copy_local(self.region(results, q, q, m), out + begin * self.element_bytes, lo, hi, first, step)

    @cute.jit
    def collect(self, results, out, n, rank, k, chunk, first, step):
        """Chunk ``k`` of slice ``q`` of out = chunk ``k`` of region ``q`` of our own result
        buffer (owner ``q`` stored it there), for every other ``q``: local loads and stores
        (the pipeline; ``results`` the result buffers' table)."""
        for i in cutlass.range(1, self.world, unroll=1):
            q = (rank + i) % self.world
            begin, length, m = self.bounds(n, q)
            lo, hi = self.window(length, k, chunk)
            self.b.copy_local(self.region(results, rank, q, m), out + begin * self.element_bytes, lo, hi, first, step)

    @cute.jit
    def push_all(self, table, src, n, rank, first, step):
        self.push(table, src, n, rank, Int64(0), self.slot_elements(n), first, step)

    @cute.jit
    def reduce_all(self, table, results, out, src, n, rank, first, step, buffers, deadline, err):
        self.reduce_chunk(table, results_table(results), out, n, rank, Int64(0), self.slot_elements(n), first, step)

    @cute.jit
    def pull_all(self, table, results, out, n, rank, first, step):
        self.pull(results_table(results), out, n, rank, Int64(0), self.slot_elements(n), first, step)

    @cute.jit
    def send(self, args: KernelArgs, k, chunk, first, step):
        self.push(args.data_table, args.src, args.n, args.rank, k, chunk, first, step)

    @cute.jit
    def work(self, args: KernelArgs, k, chunk, first, step):
        """Chunk ``k`` reduced; the all-reduce's chunk ``k - 1`` of the other owners' results
        copied out."""
        results = args.results if cutlass.const_expr(self.all_reduce) else None  # read where it is used
        self.reduce_chunk(args.data_table, results, args.out, args.n, args.rank, k, chunk, first, step)
        if cutlass.const_expr(self.all_reduce):
            if k > 0:
                self.collect(results, args.out, args.n, args.rank, k - 1, chunk, first, step)

    @cute.jit
    def finish(self, args: KernelArgs, rounds, chunk, first, step):
        """The all-reduce's last chunk of the other owners' results copied out."""
        if cutlass.const_expr(self.all_reduce):
            self.collect(args.results, args.out, args.n, args.rank, rounds - 1, chunk, first, step)


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the push reduce-scatter or all-reduce for ``key``."""
    return PushKernel(key).launcher()


class Push(Algorithm):
    """Each rank stores its slices straight from the caller's tensor into their owners'
    receive buffers (no staging copy: ``auto``'s choice for an input outside symmetric memory),
    and each owner reduces its slots locally.  The all-reduce's receive slots and result
    regions are :attr:`~collectives.config.Slot.PUSH_ALL_REDUCE` and ``PUSH_RESULTS``; eagerly the
    reduce-scatter alternates two buffers and drops its final wait."""

    collectives = ("all_reduce", "reduce_scatter")
    name = "push"
    stages_in = "always"
    drops_end_barrier = ("reduce_scatter",)
    phases = {PUSH_ROUND: "push round"}

    def check(self, key: KernelKey) -> None:
        if not key.stage_in:
            raise ValueError("push sends a non-symmetric input (stage_in=True) straight to its owners")
        super().check(key)

    def plan(self, comm: Runtime, call: Call) -> Any:
        if call.collective == "reduce_scatter":
            alternate = not call.capturing
            key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                            vector=call.vector, stage_in=True, end_barrier=not alternate)
            data = self.staging(comm, call, key, Slot.PUSH_REDUCE_SCATTER)
            plan = self.launch(comm, call, key, data, call.inp.data_ptr())
            plan.capture = call.capturing  # (its staging alternates eagerly only)
            return plan
        unroll = tuning.push_unroll(call.world, call.nbytes, call.backend)
        key = KernelKey(call.collective, self.name, call.backend, call.dtype, call.world, op=call.op,
                        vector=call.vector, stage_in=True, unroll=unroll)
        m = push_slice_elements(call.n, call.world, key.elements_per_access)
        nbytes = call.world * m * call.inp.element_size()
        data = comm.buffer(comm.staging(nbytes, Slot.PUSH_ALL_REDUCE))
        results = comm.buffer(comm.staging(nbytes, Slot.PUSH_RESULTS))
        return self.launch(comm, call, key, data, call.inp.data_ptr(), work=ceil_div(m, key.elements_per_access),
                           layout=PUSH_ALL_REDUCE, results=results)

    def build(self, key: KernelKey):
        return build(key)


__all__ = ["Pipeline", "Push", "PushKernel", "build", "layout", "push_events", "push_round_strides", "push_rounds",
           "push_slice_elements", "results_table"]
