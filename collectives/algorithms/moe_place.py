"""The MoE dispatch's placement of received rows (:func:`collectives.moe.dispatch`), one
kernel on one GPU.

After a dispatch's all-to-all of rows, ``received`` holds (throughput, ``exact``: in arrival
order; low latency: each source's in its region of ``rows / W`` rows, after the rows of its
message, which the same exchange brought: :func:`collectives.moe.header_rows`) the rows every
source sent this rank, a row per token and rank (:class:`collectives.moe.Wire`), each with a
header naming the entries it carries: slot ``k`` an index ``j`` among its source's entries (or
-1).  A source's entries are those of today's per-entry stream: source ``0``'s for local expert
``0``, then for expert ``1``, ..., then source ``1``'s, as each source's message says
(``counts[source * (L + 1) + l]``; its rows at ``counts[source * (L + 1) + L]``; low latency: the
words at the head of the source's region, its rows at most the region's).  Entry ``i`` (``j`` of source ``s``: ``i`` its source's first entry plus ``j``)
lies in segment ``s`` (the first whose running end passes ``i``; none past the last end: the
entry did not arrive), ``within`` entries into it; its slot in expert ``l = s % L`` is
``before[s] + within``, ``before[s]`` the entries earlier sources sent the same expert.  Its
place in ``expert_x``:

- low latency (``exact`` off): ``l * capacity + slot`` where ``slot < capacity`` (kept), else
  the trash row ``L * capacity`` (dropped and counted);
- throughput (``exact``): ``first[l] + slot``, ``first[l]`` the rows of the experts before
  ``l``: every arrived row is kept; the trash row is the total.

The kernel writes ``place[i]`` and ``kept[i]`` for every entry of ``room`` (what the combine
reads back), copies each arrived row to the places of the kept entries its header names (a
block a row: a thread per header slot finds its entry's place, -1 where it names none or the
entry is not kept, into shared memory, the slots ``threads`` at a time (one round at top-k <=
threads); the row's words loaded once, stored to each place; until issue 51 item 1 a row per
entry arrived and was copied once; until the fp8 pack of issue 51 every thread read each slot
and searched its place in turn, for each batch of words and again for the scale) (rows are
moved as words of ``word`` bytes: any dtype; fp8 rows, ``scales`` on, split on the way: their
first ``out_words`` words, the e4m3 values, to ``expert_x``, rows of that many words, and the
scale's 4 bytes after them to ``scales[place]``, so that neither needs a copy of its own), and, from block 0, each local
expert's count, the rows each source sent (the handle's ``recv_splits``) and the dispatch's
dropped count: the arrived rows it dropped and ``dropped_before``'s entries (ids out of range:
a torch addition less).  Every block first loads ``counts`` into shared memory
(all its threads), then computes the segments' starts there (prefix sums by doubling steps from
one buffer into another, one barrier each: ``log2(W x L)`` of them, ``W x L`` at most
:data:`MAX_SEGMENTS`), and ``before`` (and ``first``) with a thread per expert (``W`` steps each;
``first``: up to ``L``).  Then the grid's threads take a row of ``room`` each for ``place`` and
``kept`` (a binary search of the starts), and its blocks take the rows that arrived, a block a row,
its words spread over the threads, each loading :data:`LOADS` words before storing them (their
latencies overlapping), up to :data:`PLACE_BLOCKS` blocks (four of 256 threads on each of 132
SMs, all resident: until the fp8 pack of issue 51 :data:`MAX_BLOCKS`, of which the last third
waited for an SM and then ran the prologue above for no row) so that many rows are in flight
at once.  Until 2026-11-28 the grid was 264 blocks and each
block walked every row of ``room`` (arrived or not), one at a time, finding its place before its
copy (4 x H200, 1,024 rows of 14 KB: 19.1 us).  The
same arithmetic as the torch steps it replaces (``searchsorted``, prefix sums, ``index_copy_``)
in one launch instead of some twenty-five.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint16, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, gmem
from ..layouts import Arg, Layout
from .family import SNAPSHOT_WORLDS, Family, register

#: The most ``(source, local expert)`` segments (``W x L``) a kernel takes: its shared memory
#: (four int64 arrays of them at most, 32 KB, and a row's places, 2 KB at 256 threads: under the
#: 48 KB a kernel gets without asking).
MAX_SEGMENTS = 1024
#: SMs of an H100 or H200.
SMS = 132
#: Most thread blocks of a gather (each row is one block's; the grid strides past them): six
#: blocks of 256 threads on each SM, all resident (the gather takes 40 registers a thread: 6 x
#: 256 x 40 of the 64 Ki), a row each in flight.
MAX_BLOCKS = 6 * SMS
#: Most thread blocks of a placement: four of 256 threads on each SM, all resident (it takes
#: 56-60 registers a thread: 4 x 256 x 64 = 64 Ki; six would need 42 at most).
PLACE_BLOCKS = 4 * SMS
#: Words each thread of the placement and the combine's gather loads before it stores them
#: (16-byte words: a 7168-wide bf16 row is 896 of them, 3.5 a thread of 256).
LOADS = 4
#: Bytes per word a row moves in, and how: (element type, elements per access).
WORDS = {16: (Uint32, 4), 8: (Uint32, 2), 4: (Uint32, 1), 2: (Uint16, 1), 1: (Uint8, 1)}

MOE_PLACE = Layout("MoePlaceArgs", (
    Arg("counts", Int64, "int64[W * (L + 1)]: each source's message: the entries it sent each local expert, then "
                         "its rows (exact; low latency: the head of received, each source's message at the head "
                         "of its region)"),
    Arg("received", Int64, "the received rows (rows of row_words words: values, header): exact, in arrival order; "
                           "low latency, a region of rows / W rows per source: its message's rows "
                           "(collectives.moe.header_rows), then its rows"),
    Arg("expert_x", Int64, "the placed rows, out_words words each (their places, below; the trash row is never "
                           "written)"),
    Arg("scales", Int64, "f32[rows of expert_x], out (the key's scales): each placed row's scale, the 4 bytes "
                         "after its out_words words (unused otherwise)"),
    Arg("place", Int64, "int64[room], out: each entry's place in expert_x (the trash row: not kept)"),
    Arg("kept", Int64, "uint8[room], out: 1 where the entry arrived and was placed"),
    Arg("expert_counts", Int64, "int64[L], out: entries each local expert received"),
    Arg("lost", Int64, "int64[1], out: entries that arrived and were dropped (past an expert's capacity), plus "
                       "dropped_before's"),
    Arg("dropped_before", Int64, "int64[1]: entries the dispatch dropped before (ids out of range)"),
    Arg("recv_splits", Int64, "int64[W], out: entries each source sent (block 0)"),
    Arg("room", Int64, "entries place and kept have room for"),
    Arg("rows", Int64, "rows of the receive buffer"),
    Arg("capacity", Int64, "rows per local expert in expert_x (low latency; unused when exact)"),
    Arg("row_words", Int64, "words per received row"),
    Arg("out_words", Int64, "words per placed row (the values)"),
    Arg("topk", Int64, "a row's header slots: each an entry's index among its source's, or -1"),
    Arg("header", Int64, "the header's byte in a row (a multiple of 4)"),
))


@dataclass(frozen=True)
class MoePlaceKey:
    """The compile-time choices of one placement kernel: ``world`` and ``local`` (experts per
    rank: ``W x L`` segments, at most :data:`MAX_SEGMENTS`), ``exact`` (throughput mode's packed
    layout), ``word`` (bytes per access: 16, 8, 4, 2 or 1; a row's bytes are a multiple),
    ``scales`` (fp8 rows: each placed row's 4 bytes after its values go to ``scales``) and
    threads per block."""

    world: int
    local: int
    exact: bool = False
    word: int = 16
    threads: int = 256
    scales: bool = False

    def __post_init__(self) -> None:
        if self.world < 1 or self.local < 1 or self.world * self.local > MAX_SEGMENTS:
            raise ValueError(f"world x local experts must be 1..{MAX_SEGMENTS}, not {self.world} x {self.local}")
        if self.word not in WORDS:
            raise ValueError(f"word must be one of {tuple(WORDS)} bytes, not {self.word}")
        check_threads(self.threads)

    @staticmethod
    def word_for(row_bytes: int) -> int:
        """The widest word that divides a row of ``row_bytes`` (the buffers' rows then stay aligned to it)."""
        return next(w for w in WORDS if row_bytes % w == 0)

    def blocks(self, room: int) -> int:
        """Thread blocks of a launch for ``room`` rows (at least 1)."""
        return max(1, min(PLACE_BLOCKS, room))


def build(key: MoePlaceKey):
    """The ``@cute.jit`` launcher of the placement kernel for ``key`` (grid: a runtime argument)."""
    world, local, exact, threads = key.world, key.local, key.exact, key.threads
    segments = world * local
    element, per_word = WORDS[key.word]
    by = "collectives.algorithms.moe_place"

    @cute.jit
    def where(args: KernelArgs, i: Int64, starts, before, first, trash: Int64):
        """Row ``i``'s place in expert_x and whether it is kept (arrived, within its expert's capacity), from the
        shared ``starts``, ``before`` and ``first`` (see the kernel)."""
        lo, hi = Int64(0), Int64(segments)  # the first segment whose end passes row i
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid + 1] <= i:
                lo = mid + 1
            else:
                hi = mid
        place = trash
        kept = Int64(0)
        if lo < Int64(segments):  # the row arrived
            slot = before[lo] + (i - starts[lo])
            if cutlass.const_expr(exact):
                place = first[lo % local] + slot
                kept = Int64(1)
            elif slot < args.capacity:
                place = (lo % local) * args.capacity + slot
                kept = Int64(1)
        return place, kept

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int64(cute.arch.thread_idx()[0])
        block = Int64(cute.arch.block_idx()[0])
        smem = SmemAllocator()
        counts = smem.allocate_tensor(Int64, cute.make_layout(segments), byte_alignment=8)
        starts = smem.allocate_tensor(Int64, cute.make_layout(segments + 1), byte_alignment=8)  # + the total
        before = smem.allocate_tensor(Int64, cute.make_layout(segments), byte_alignment=8)
        first = smem.allocate_tensor(Int64, cute.make_layout(local), byte_alignment=8)
        row_starts = smem.allocate_tensor(Int64, cute.make_layout(world + 1), byte_alignment=8)  # sources' rows
        places = smem.allocate_tensor(Int64, cute.make_layout(threads), byte_alignment=8)  # a row's entries' places
        message = gmem(Int64, args.counts, 8, LOCAL, by)
        stride = Int64(local + 1)  # words from a source's message to the next's
        head, region = Int64(0), Int64(0)
        if cutlass.const_expr(not exact):  # a region per source: its message's rows, then its rows
            row_bytes = args.row_words * key.word
            head = (Int64(8 * (local + 1)) + row_bytes - 1) // row_bytes
            region = args.rows // world
            stride = region * row_bytes // 8
        j = tidx
        while j < Int64(segments):  # the counts into shared memory, every thread a share
            if cutlass.const_expr(exact):
                c = ptxops.ld(message + j + j // local, dtype=Int64)
            else:
                c = ptxops.ld(message + (j // local) * stride + j % local, dtype=Int64)
            counts[j] = c
            starts[j + 1] = c
            j += threads
        w = tidx
        while w <= Int64(world):  # the rows of the sources before w
            sent = Int64(0)
            for source in range(world):
                if Int64(source) < w:
                    if cutlass.const_expr(exact):
                        sent += ptxops.ld(message + source * (local + 1) + local, dtype=Int64)
                    else:  # (at most its region's rows)
                        sent += cutlass.min(cutlass.max(ptxops.ld(message + source * stride + local, dtype=Int64),
                                                        Int64(0)), region - head)
            row_starts[w] = sent
            w += threads
        if tidx == Int64(0):
            starts[0] = Int64(0)
        cute.arch.sync_threads()
        # the segments' starts (arrival order): inclusive prefix sums of starts[1:] by doubling steps, from
        # starts into before (a spare until the sums are done) and back, one barrier a step
        spare = [starts, before]
        for level in cutlass.range_constexpr(max(segments - 1, 1).bit_length()):
            ping, pong = spare[level % 2], spare[1 - level % 2]
            j = tidx
            while j < Int64(segments):
                v = ping[j + 1 - level % 2]  # (starts is one ahead)
                if j >= Int64(1 << level):
                    v += ping[j + 1 - level % 2 - (1 << level)]
                pong[j + level % 2] = v
                j += threads
            cute.arch.sync_threads()
        if cutlass.const_expr(max(segments - 1, 1).bit_length() % 2):  # the sums ended in before: into starts
            j = tidx
            while j < Int64(segments):
                starts[j + 1] = before[j]
                j += threads
            cute.arch.sync_threads()
        if block == Int64(0):
            w = tidx
            while w < Int64(world):  # each source's rows: the sum of its segments
                ptxops.st(gmem(Int64, args.recv_splits, 8, LOCAL, by) + w,
                          starts[(w + 1) * local] - starts[w * local])
                w += threads
        l = tidx
        while l < Int64(local):  # a thread per expert: the earlier sources' rows of it, its total, its drops
            acc = Int64(0)
            lost = Int64(0)
            for source in range(world):
                s = source * local + l
                c = counts[s]
                before[s] = acc
                if cutlass.const_expr(not exact):
                    room = cutlass.max(cutlass.min(args.capacity - acc, c), Int64(0))
                    lost += c - room
                acc += c
            if block == Int64(0):
                ptxops.st(gmem(Int64, args.expert_counts, 8, LOCAL, by) + l, acc)
            if cutlass.const_expr(exact):
                first[l] = acc  # (the totals, until their prefix sums below)
            else:
                first[l] = lost  # (the drops, summed below)
            l += threads
        cute.arch.sync_threads()
        if cutlass.const_expr(exact):  # first[l]: the rows of the experts before l (by way of counts[])
            l = tidx
            while l < Int64(local):
                experts = Int64(0)
                m = Int64(0)
                while m < l:
                    experts += first[m]
                    m += 1
                counts[l] = experts
                l += threads
            cute.arch.sync_threads()
            l = tidx
            while l < Int64(local):
                first[l] = counts[l]
                l += threads
            if block == Int64(0):
                if tidx == Int64(0):
                    ptxops.st(gmem(Int64, args.lost, 8, LOCAL, by),
                              ptxops.ld(gmem(Int64, args.dropped_before, 8, LOCAL, by), dtype=Int64))
        elif block == Int64(0):
            if tidx == Int64(0):
                lost = ptxops.ld(gmem(Int64, args.dropped_before, 8, LOCAL, by), dtype=Int64)
                m = Int64(0)
                while m < Int64(local):
                    lost += first[m]
                    m += 1
                ptxops.st(gmem(Int64, args.lost, 8, LOCAL, by), lost)
        cute.arch.sync_threads()
        total = starts[segments]
        trash = total if cutlass.const_expr(exact) else args.capacity * local
        grid = Int64(cute.arch.grid_dim()[0])

        i = block * threads + tidx
        while i < args.room:  # every row's place and kept flag: a thread a row, over the grid
            place, kept = where(args, i, starts, before, first, trash)
            ptxops.st(gmem(Int64, args.place, 8, LOCAL, by) + i, place)
            ptxops.st(gmem(Uint8, args.kept, 1, LOCAL, by) + i, Uint8(kept))
            i += grid * threads
        arrived = cutlass.min(row_starts[world], args.rows)  # (counts past the buffer's rows: its rows only)
        i = block
        while i < arrived:  # the rows that arrived, a block a row: each into its entries' places
            lo, hi = Int64(0), Int64(world)  # its source: the first whose rows end past row i
            while lo < hi:
                mid = (lo + hi) // 2
                if row_starts[mid + 1] <= i:
                    lo = mid + 1
                else:
                    hi = mid
            entries = starts[lo * local]  # the source's first entry
            row = i  # its row in the receive buffer: in arrival order, or in its source's region after the message
            if cutlass.const_expr(not exact):
                row = lo * region + head + i - row_starts[lo]
            header = gmem(Int32, args.received, 4, LOCAL, by) + (row * args.row_words * key.word + args.header) // 4
            src = gmem(element, args.received, key.word, LOCAL, by) + row * args.row_words * per_word
            base = Int64(0)
            while base < args.topk:  # the header's slots, a chunk of `threads` at a time (one at top-k <= threads)
                if base + tidx < args.topk:  # a thread per slot: its entry's place where it is kept, else -1
                    spot = Int64(-1)
                    named = Int64(ptxops.ld(header + base + tidx, dtype=Int32))
                    if named >= Int64(0):
                        if entries + named < args.room:
                            place, kept = where(args, entries + named, starts, before, first, trash)
                            if kept == Int64(1):
                                spot = place
                    places[tidx] = spot
                cute.arch.sync_threads()
                chunk = cutlass.min(args.topk - base, Int64(threads))
                w = tidx
                while w < args.out_words:  # LOADS words in flight, then their stores to each of the row's places
                    last = args.out_words - 1  # (a word past the row: its load repeats the last, not stored)
                    ats = [cute.assume(cutlass.min(w + u * threads, last) * per_word, divby=per_word)
                           for u in range(LOADS)]
                    words = [ptxops.ld(src + at, num_elements=per_word) for at in ats]
                    k = Int64(0)
                    while k < chunk:
                        place = places[k]
                        if place >= Int64(0):
                            at = place * args.out_words * per_word  # (its row of expert_x)
                            dst = gmem(element, args.expert_x, key.word, LOCAL, by) + at
                            for u in cutlass.range_constexpr(LOADS):
                                if w + u * threads <= last:
                                    ptxops.st(dst + ats[u], words[u])
                        k += 1
                    w += LOADS * threads
                if cutlass.const_expr(key.scales):
                    k = tidx  # a thread per slot: the scale (aligned to 4 only when the values' bytes are)
                    while k < chunk:
                        place = places[k]
                        if place >= Int64(0):
                            at = (row * args.row_words + args.out_words) * key.word
                            if cutlass.const_expr(key.word >= 4):  # one load, not four in a row
                                scale = ptxops.ld(gmem(Uint32, args.received, 4, LOCAL, by) + at // 4)
                                ptxops.st(gmem(Uint32, args.scales, 4, LOCAL, by) + place, scale)
                            else:
                                for b in cutlass.range_constexpr(4):
                                    byte = ptxops.ld(gmem(Uint8, args.received, 1, LOCAL, by) + at + b)
                                    ptxops.st(gmem(Uint8, args.scales, 1, LOCAL, by) + place * 4 + b, byte)
                        k += threads
                cute.arch.sync_threads()  # every thread is done with places[] before the next chunk's
                base += threads
            i += grid

    return launcher(kernel, threads, layout=MOE_PLACE)


def _to_text(key: MoePlaceKey) -> str:
    return f"moe_place/w{key.world}/l{key.local}/x{int(key.exact)}/b{key.word}/s{int(key.scales)}/t{key.threads}"


def _from_text(kid: str) -> MoePlaceKey:
    _, world, local, exact, word, scales, threads = kid.split("/")
    return MoePlaceKey(int(world[1:]), int(local[1:]), exact == "x1", int(word[1:]), int(threads[1:]), scales == "s1")


def _snapshot() -> list[str]:
    """World 2, 4 and 8 of 4 local experts, low latency and throughput, rows of 16-, 4- and 1-byte
    words, and fp8 rows split into values and scales."""
    return [_to_text(MoePlaceKey(world, 4, exact, word, scales=scales))
            for world in SNAPSHOT_WORLDS for exact in (False, True) for word, scales in
            ((16, False), (4, False), (1, False), (16, True), (4, True))]


def _facets(kid: str) -> tuple[tuple, ...]:
    key = _from_text(kid)
    return ("moe_place", key.world), ("moe_place", key.exact, key.word, key.scales)


FAMILY = register(Family("moe_place", MoePlaceKey, ("moe_place",), MOE_PLACE, build, _snapshot, _to_text, _from_text,
                         _facets))


__all__ = ["FAMILY", "LOADS", "MAX_BLOCKS", "MAX_SEGMENTS", "MOE_PLACE", "PLACE_BLOCKS", "SMS", "WORDS", "MoePlaceKey",
           "build"]
