"""The MoE dispatch's routing (:func:`collectives.moe.dispatch`), one kernel of one block on one
GPU: the ``(token, k)`` entries sorted by expert and counted, the steps before the dispatch's
first all-to-all.

Entry ``i``'s expert is ``ids[i]``, or ``E`` (a bin past the last expert's) where that is out
of ``0..E-1``.  The kernel writes ``valid[i]`` (its id is in range), ``bins`` (the entries of
each expert, then the out-of-range ones), ``send_splits`` (the entries of each destination
rank's ``L`` experts), ``order``: the entries sorted by expert, stably (by ``i`` within an
expert), and its inverse ``slots`` (``order[slots[i]] = i``: each entry's sent row, which the
rows' packing and the combine read), entry ``i`` being at ``start[e] + rank`` (``start``: the exclusive prefix sum of
``bins``; ``rank``: the entries of ``e`` before ``i``).  It is a counting sort: the block's threads are groups of
``lanes`` (a warp), group ``g`` owning a contiguous span of the entries; a round reads ``lanes``
entries of each span, one a thread, through shared memory, each thread finding its entry's rank
among its group's round by comparing it with the round's ``lanes`` entries (no atomics: the result
is the stable sort's whatever the scheduling), the round's last entry of an expert moving the
group's count of that expert on.  One pass counts; then each expert's count is the sum of its
groups', a scan (Hillis-Steele in shared memory) makes the experts' starts and each group's start
within an expert is its expert's start plus the earlier groups' counts (entries of a lower group
come first: stable); a second pass places.  Each thread compares ``lanes x n / threads`` entries
per pass, whatever the entries: the kernel routes every size of the low-latency and throughput
modes.  It replaces torch's id mapping, mask, stable sort (a radix sort: 28 us of GPU time at
1,024 entries), count and sum of the splits: seven launches.
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
    :data:`ID_DTYPES`), threads per block (one block; a power of two) and lanes per group (a
    power of two from 4 that divides the threads, keys compared in fours).  Each thread compares
    ``2 lanes n / threads`` keys; the shared memory holds a group's count of each expert (int32,
    ``threads / lanes x (MAX_EXPERTS + 1)``) besides the scan's (int32: entries below 2^31):
    256 threads of 8 groups fit 48 KiB at :data:`MAX_EXPERTS`."""

    ids: str = "i64"
    threads: int = 256
    lanes: int = 32

    def __post_init__(self) -> None:
        if self.ids not in ID_DTYPES:
            raise ValueError(f"ids must be one of {tuple(ID_DTYPES)}, not {self.ids!r}")
        check_threads(self.threads)
        if self.lanes < 4 or self.lanes & (self.lanes - 1) or self.threads % self.lanes:
            raise ValueError(f"lanes must be a power of two from 4 (keys are compared in fours) dividing the "
                             f"threads {self.threads}, not {self.lanes}")


def build(key: MoeRouteKey):
    """The ``@cute.jit`` launcher of the routing kernel for ``key`` (one block)."""
    threads, lanes, (ids, size) = key.threads, key.lanes, ID_DTYPES[key.ids]
    groups = threads // lanes
    by = "collectives.algorithms.moe_route"

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int64(cute.arch.thread_idx()[0])
        group, lane = tidx // lanes, tidx % lanes
        smem = SmemAllocator()
        keys = smem.allocate_tensor(Int64, cute.make_layout(threads), byte_alignment=8)  # a round's experts
        # table[g * bins + e]: group g's count of expert e, then (placing) where its next one goes
        table = smem.allocate_tensor(Int32, cute.make_layout(groups * (MAX_EXPERTS + 1)), byte_alignment=8)
        count = smem.allocate_tensor(Int32, cute.make_layout(MAX_EXPERTS + 1), byte_alignment=8)
        spare = smem.allocate_tensor(Int32, cute.make_layout(MAX_EXPERTS + 1), byte_alignment=8)
        bins = args.experts + 1
        j = tidx
        while j < groups * bins:
            table[j] = Int32(0)
            j += threads
        cute.arch.sync_threads()
        # group g's entries: [g * span, (g + 1) * span), span a multiple of lanes (every group the same rounds)
        span = ((args.n + groups - 1) // groups + lanes - 1) // lanes * lanes
        for placing in cutlass.range_constexpr(2):  # count, then place
            step = Int64(0)
            while step < span:  # a round: lanes entries of each group, one a thread
                i = group * span + step + lane
                e = Int64(-1)
                if i < args.n:
                    raw = Int64(ptxops.ld(gmem(ids, args.ids, size, LOCAL, by) + i))
                    e = args.experts
                    if raw >= Int64(0):
                        if raw < args.experts:
                            e = raw
                keys[tidx] = e
                cute.arch.sync_threads()
                before, after = Int64(0), Int64(0)  # the group's entries of this expert before and after it
                first = group * lanes
                for j4 in cutlass.range_constexpr(lanes // 4):  # (in fours, their loads' latencies overlapping)
                    four = [keys[first + j4 * 4 + u] for u in range(4)]
                    for u in cutlass.range_constexpr(4):
                        if four[u] == e:
                            if j4 * 4 + u < lane:
                                before += 1
                            if j4 * 4 + u > lane:
                                after += 1
                at = Int64(0)
                if i < args.n:
                    at = Int64(table[group * bins + e]) + before
                    if cutlass.const_expr(placing):
                        ptxops.st(gmem(Int64, args.order, 8, LOCAL, by) + at, i)
                        ptxops.st(gmem(Int64, args.slots, 8, LOCAL, by) + i, at)
                        valid = Uint8(0)
                        if e < args.experts:
                            valid = Uint8(1)
                        ptxops.st(gmem(Uint8, args.valid, 1, LOCAL, by) + i, valid)
                cute.arch.sync_threads()  # every thread has read table[] before the last ones move it on
                if i < args.n:
                    if after == Int64(0):
                        table[group * bins + e] = Int32(at + 1)
                cute.arch.sync_threads()  # and keys[] is free for the next round
                step += lanes
            if cutlass.const_expr(not placing):  # the counts out, then table[] becomes each group's starts
                j = tidx
                while j < bins:  # count[e]: e's entries; table[g, e]: those of the groups before g
                    total = Int64(0)
                    for g in cutlass.range_constexpr(groups):
                        c = Int64(table[g * bins + j])
                        table[g * bins + j] = Int32(total)
                        total += c
                    ptxops.st(gmem(Int64, args.bins, 8, LOCAL, by) + j, total)
                    count[j] = Int32(total)
                    spare[j] = Int32(total)
                    j += threads
                cute.arch.sync_threads()
                step = Int64(1)
                while step < bins:  # spare[]: the inclusive prefix sums, by doubling steps
                    j = tidx
                    while j < bins:
                        v = Int64(spare[j])
                        if j >= step:
                            v += Int64(spare[j - step])
                        count[j] = Int32(v)
                        j += threads
                    cute.arch.sync_threads()
                    j = tidx
                    while j < bins:
                        spare[j] = count[j]
                        j += threads
                    cute.arch.sync_threads()
                    step *= 2
                j = tidx
                while j < bins:  # table[g, e] += e's start (the exclusive prefix)
                    start = Int64(0)
                    if j > Int64(0):
                        start = Int64(spare[j - 1])
                    for g in cutlass.range_constexpr(groups):
                        table[g * bins + j] = Int32(Int64(table[g * bins + j]) + start)
                    j += threads
                w = tidx
                while w < args.experts // args.local:  # rank w: experts [wL, (w + 1)L)
                    first = Int64(0)
                    if w > Int64(0):
                        first = Int64(spare[w * args.local - 1])
                    ptxops.st(gmem(Int64, args.send_splits, 8, LOCAL, by) + w,
                              Int64(spare[(w + 1) * args.local - 1]) - first)
                    w += threads
                cute.arch.sync_threads()

    return launcher(kernel, threads, grid=1, layout=MOE_ROUTE)


def _to_text(key: MoeRouteKey) -> str:
    return f"moe_route/{key.ids}/t{key.threads}/l{key.lanes}"


def _from_text(kid: str) -> MoeRouteKey:
    _, ids, threads, lanes = kid.split("/")
    return MoeRouteKey(ids, int(threads[1:]), int(lanes[1:]))


FAMILY = register(Family("moe_route", MoeRouteKey, ("moe_route",), MOE_ROUTE, build,
                         lambda: [_to_text(MoeRouteKey(ids)) for ids in ID_DTYPES], _to_text, _from_text,
                         lambda kid: (("moe_route", kid),)))


__all__ = ["FAMILY", "ID_DTYPES", "MAX_EXPERTS", "MOE_ROUTE", "MoeRouteKey", "build"]
