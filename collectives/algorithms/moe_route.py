"""The MoE dispatch's routing (:func:`collectives.moe.dispatch`), one kernel of one block on one
GPU: the ``(token, k)`` entries sorted by expert and counted, the steps before the dispatch's
first all-to-all.

Entry ``i``'s expert is ``ids[i]``, or ``E`` (a bin past the last expert's) where that is out
of ``0..E-1``.  The kernel writes ``valid[i]`` (its id is in range), ``bins`` (the entries of
each expert, then the out-of-range ones), ``send_splits`` (the entries of each destination
rank's ``L`` experts), ``order``: the entries sorted by expert, stably (by ``i`` within an
expert), and its inverse ``slots`` (``order[slots[i]] = i``: each entry's sent row, which the
rows' packing and the combine read), entry ``i`` being at ``start[e] + rank`` (``start``: the exclusive prefix sum of
``bins``; ``rank``: the entries of ``e`` before ``i``).  It is a counting sort: the entries go
through shared memory a chunk of ``threads`` at a time, each thread finding its entry's rank
among the chunk's by comparing it with the chunk's earlier entries (no atomics: the result is
the stable sort's whatever the scheduling), the chunk's last entry of an expert moving that
expert's count on; one pass counts, a scan (Hillis-Steele in shared memory) makes the starts,
and a second pass places.  Each thread compares ``n`` entries per pass (four loads at once), so
the kernel is for decode sizes (:data:`MAX_ENTRIES`); it replaces torch's id mapping, mask, stable sort (a radix
sort: 28 us of GPU time at 1,024 entries), count and sum of the splits: seven launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8
from cutlass.memory import SmemAllocator

import ptxops

from ..device.kernel_args import KernelArgs
from ..layouts import Arg, Layout
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, gmem
from .family import Family, register

#: Most experts a routing kernel counts (its shared memory holds ``2 x (E + 1)`` int64 counts).
MAX_EXPERTS = 1024
#: Most entries (tokens x top-k) the dispatch routes with the kernel (each thread compares every
#: entry twice: its time grows with the square of the entries); torch's sort past it.  On 4 x H100
#: (hidden 7168, top-8 of 256, graphs) the kernel made the fused dispatch faster up to 64 tokens
#: per rank (512 entries: 110.7 -> 100.1 us) and slower past it (128 tokens: 146.8 -> 168.2 us;
#: 512 tokens: 368.6 -> 584.9 us).
MAX_ENTRIES = 512
#: Dtypes of the ids it reads: their CuTeDSL type and bytes.
ID_DTYPES = {"i32": (Int32, 4), "i64": (Int64, 8)}

MOE_ROUTE = Layout("MoeRouteArgs", (
    Arg("ids", Int64, "the entries' expert ids: n of the key's dtype (any value; out of 0..E-1: dropped)"),
    Arg("n", Int64, "entries (tokens x top-k)"),
    Arg("experts", Int64, "experts E (at most MAX_EXPERTS)"),
    Arg("local", Int64, "experts per rank L (a divisor of E)"),
    Arg("order", Int64, "int64[n], out: the entries sorted by expert, stably; out-of-range ones last"),
    Arg("valid", Int64, "uint8[n], out: 1 where the entry's id is in range"),
    Arg("bins", Int64, "int64[E + 1], out: entries per expert, then the out-of-range ones"),
    Arg("send_splits", Int64, "int64[E / L], out: entries per destination rank"),
    Arg("slots", Int64, "int64[n], out: each entry's place in order (order[slots[i]] = i)"),
))


@dataclass(frozen=True)
class MoeRouteKey:
    """The compile-time choices of one routing kernel: the ids' dtype (one of
    :data:`ID_DTYPES`) and threads per block (one block; a power of two from 4).  Each thread
    compares ``2 n`` keys whatever the threads, so more of them only add issue slots: 128
    (4 warps) keep a shared-memory load's latency the bound, four loads in flight."""

    ids: str = "i64"
    threads: int = 128

    def __post_init__(self) -> None:
        if self.ids not in ID_DTYPES:
            raise ValueError(f"ids must be one of {tuple(ID_DTYPES)}, not {self.ids!r}")
        check_threads(self.threads)
        if self.threads < 4:
            raise ValueError(f"threads must be at least 4 (keys are compared in fours), not {self.threads}")


def build(key: MoeRouteKey):
    """The ``@cute.jit`` launcher of the routing kernel for ``key`` (one block)."""
    threads, (ids, size) = key.threads, ID_DTYPES[key.ids]
    by = "collectives.algorithms.moe_route"

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int64(cute.arch.thread_idx()[0])
        smem = SmemAllocator()
        keys = smem.allocate_tensor(Int64, cute.make_layout(threads), byte_alignment=8)  # a chunk's experts
        count = smem.allocate_tensor(Int64, cute.make_layout(MAX_EXPERTS + 1), byte_alignment=8)
        spare = smem.allocate_tensor(Int64, cute.make_layout(MAX_EXPERTS + 1), byte_alignment=8)
        bins = args.experts + 1
        j = tidx
        while j < bins:
            count[j] = Int64(0)
            j += threads
        cute.arch.sync_threads()
        for placing in cutlass.range_constexpr(2):  # count, then place
            base = Int64(0)
            while base < args.n:  # a chunk of entries, one a thread
                i = base + tidx
                e = Int64(-1)
                if i < args.n:
                    raw = Int64(ptxops.ld(gmem(ids, args.ids, size, LOCAL, by) + i))
                    e = args.experts
                    if raw >= Int64(0):
                        if raw < args.experts:
                            e = raw
                keys[tidx] = e
                cute.arch.sync_threads()
                # (in fours, their loads' latencies overlapping: keys past the entries are -1, no expert)
                chunk = (cutlass.min(args.n - base, Int64(threads)) + 3) // 4 * 4
                before, after = Int64(0), Int64(0)  # the chunk's entries of this expert before and after it
                j = Int64(0)
                while j < chunk:
                    four = [keys[j + u] for u in range(4)]
                    for u in cutlass.range_constexpr(4):
                        if four[u] == e:
                            if j + u < tidx:
                                before += 1
                            if j + u > tidx:
                                after += 1
                    j += 4
                at = Int64(0)
                if i < args.n:
                    at = count[e] + before
                    if cutlass.const_expr(placing):  # count[e]: where e's next entry goes
                        ptxops.st(gmem(Int64, args.order, 8, LOCAL, by) + at, i)
                        ptxops.st(gmem(Int64, args.slots, 8, LOCAL, by) + i, at)
                        valid = Uint8(0)
                        if e < args.experts:
                            valid = Uint8(1)
                        ptxops.st(gmem(Uint8, args.valid, 1, LOCAL, by) + i, valid)
                cute.arch.sync_threads()  # every thread has read count[] before the last ones move it on
                if i < args.n:
                    if after == Int64(0):
                        count[e] = at + 1
                cute.arch.sync_threads()  # and keys[] is free for the next chunk
                base += threads
            if cutlass.const_expr(not placing):  # the counts out, then count[] becomes each expert's start
                j = tidx
                while j < bins:
                    ptxops.st(gmem(Int64, args.bins, 8, LOCAL, by) + j, count[j])
                    spare[j] = count[j]
                    j += threads
                cute.arch.sync_threads()
                step = Int64(1)
                while step < bins:  # spare[]: the inclusive prefix sums, by doubling steps
                    j = tidx
                    while j < bins:
                        v = spare[j]
                        if j >= step:
                            v += spare[j - step]
                        count[j] = v
                        j += threads
                    cute.arch.sync_threads()
                    j = tidx
                    while j < bins:
                        spare[j] = count[j]
                        j += threads
                    cute.arch.sync_threads()
                    step *= 2
                j = tidx
                while j < bins:  # count[]: the exclusive ones
                    start = Int64(0)
                    if j > Int64(0):
                        start = spare[j - 1]
                    count[j] = start
                    j += threads
                w = tidx
                while w < args.experts // args.local:  # rank w: experts [wL, (w + 1)L)
                    first = Int64(0)
                    if w > Int64(0):
                        first = spare[w * args.local - 1]
                    ptxops.st(gmem(Int64, args.send_splits, 8, LOCAL, by) + w,
                              spare[(w + 1) * args.local - 1] - first)
                    w += threads
                cute.arch.sync_threads()

    return launcher(kernel, threads, grid=1, layout=MOE_ROUTE)


def _to_text(key: MoeRouteKey) -> str:
    return f"moe_route/{key.ids}/t{key.threads}"


def _from_text(kid: str) -> MoeRouteKey:
    _, ids, threads = kid.split("/")
    return MoeRouteKey(ids, int(threads[1:]))


FAMILY = register(Family("moe_route", MoeRouteKey, ("moe_route",), MOE_ROUTE, build,
                         lambda: [_to_text(MoeRouteKey(ids)) for ids in ID_DTYPES], _to_text, _from_text,
                         lambda kid: (("moe_route", kid),)))


__all__ = ["FAMILY", "ID_DTYPES", "MAX_ENTRIES", "MAX_EXPERTS", "MOE_ROUTE", "MoeRouteKey", "build"]
