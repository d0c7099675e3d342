"""The MoE dispatch's routing (:func:`collectives.moe.dispatch`), one kernel of one block on one
GPU: the ``(token, k)`` entries sorted by expert and counted, the steps before the dispatch's
first all-to-all.

Entry ``i``'s expert is ``ids[i]`` (token ``i / topk``'s id ``i % topk``, its row of ids read at its
``stride``: a router's ids sliced from a wider tensor are read where they lie, not copied first), or
``E`` (a bin past the last expert's) where that is out of ``0..E-1``. The kernel writes ``valid[i]``
(its id is in range), ``bins`` (the entries of each expert, then the out-of-range ones),
``send_splits`` (the entries of each destination rank's ``L`` experts), ``order``: the entries
sorted by expert, stably (by ``i`` within an expert), and its inverse ``slots`` (``order[slots[i]] =
i``: each entry's sent row, which the rows' packing and the combine read), entry ``i`` being at
``start[e] + rank`` (``start``: the exclusive prefix sum of ``bins``; ``rank``: the entries of ``e``
before ``i``). It is a counting sort: the block's threads are groups of ``lanes`` (at most a warp),
group ``g`` owning a contiguous span of the entries; a round takes ``lanes`` entries of each span,
one a thread, each thread finding its entry's rank among its group's round by one ``match.any.sync``
of its warp (the lanes of its expert and group) and a ``popc`` (no atomics: the result is the stable
sort's whatever the scheduling), the round's last entry of an expert moving the group's count of that
expert on. A group's rounds touch only its own counts, so they sync as a warp (two ``bar.warp.sync``
a round, no block barrier), and each round's id is loaded during the round before (the first of
each pass while the block zeroes its table, or sums the counts), nothing reading it (its range
check) before its round: one load in flight a thread. One pass counts; then each expert's
count is the sum of its groups' (``BATCH`` groups' counts loaded at once), the experts' starts are one
scan (each warp shuffles up its chunk of 32 experts; one barrier; each expert adds the chunks' sums
before its own) and each group's start within an expert is its expert's start plus the earlier
groups' counts (entries of a lower group come first: stable); a second pass places. Four block
barriers in all. The block has as many threads as the groups' counts fit in shared memory
(:meth:`MoeRouteKey.for_experts`: 1024, 32 groups, up to 256 experts; 256 at :data:`MAX_EXPERTS`):
1,024 entries are one round a group. The same rounds number the rows sent (a row per token and
destination rank with >= 1 of its entries: :class:`collectives.moe.Wire`): an in-range entry *owns*
its token's row to its rank where no earlier entry of the token goes there: none of the group's
lanes before it in the round of its token and rank (one more ``match.any.sync``, keyed by the token
mod 32: a round's lanes are consecutive entries), nor of its token's entries before the group's
round, which are loaded again (only a token across rounds or groups: none where ``topk`` divides
``lanes``, 8 of 32), and each rank's rows are counted as a bin past the experts' (``E + 1 + r``), by its
owners only: a round matches the group's lanes of its rank (a second ``match.any.sync``) and ballots
their owners, an entry's row being its bin's start plus the owners before it, less one where it is
not one itself (its owner came earlier in its group, or in an earlier group: the same row). The scan
over all the bins places the rows after the ``n`` entries, so that rank ``r``'s rows are numbered
from the rows before ``r``, by token. The kernel writes each entry's row (``rows``; -1 out of range)
and the counts' message (``bins``: each rank's ``L`` experts' entries, then its rows; then the
out-of-range entries). With ``head_rows`` (a low-latency dispatch's one exchange), each rank's
rows come ``head_rows`` later per rank up to its own (rank ``r``'s: ``(r + 1) head_rows``), and
after the scan the kernel writes each rank's message (its ``L + 1`` words) into the head of its
chunk of the sent rows and the chunk's rows (``row_splits``): the exchange's in_splits. It replaces torch's id mapping, mask, stable sort (a radix sort: 28 us of GPU time at 1,024 entries), count and sum of the splits: seven launches. Until
2026-11-28 every round took three block barriers and waited for its own entries' loads (4 x H200,
1,024 entries: 13.6 us; one token: 6.5 us); then (2 x H200, 1,024 entries: 7.5 us) each thread still
compared its entry with its group's round's through shared memory, each expert summed its groups'
counts one load after another and the scan took a block barrier for each of its nine doubling steps
(13 barriers); then (1 x H200, a world of 2 ranks, top-8 of 256 experts; 1, 128 and 512 tokens:
5.1, 9.6 and 27.4 us, ~5 us a round) each entry's owner check loaded its token's earlier ids again,
up to topk - 1 loads one after another, twice (both passes), and each round's range check of the id
loaded for the next waited for that load at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..device.kernel_args import KernelArgs
from ..layouts import Arg, Layout
from ..device.launch import BLOCK_THREADS, check_threads, launcher
from ..device.signals import LOCAL, gmem
from .family import Family, register

#: Most experts a routing kernel counts (its shared memory holds ``2 x (E + 1)`` int64 counts).
MAX_EXPERTS = 1024
#: Dtypes of the ids it reads: their CuTeDSL type and bytes.
ID_DTYPES = {"i32": (Int32, 4), "i64": (Int64, 8)}

MOE_ROUTE = Layout("MoeRouteArgs", (
    Arg("ids", Int64, "the entries' expert ids: tokens rows of topk of the key's dtype, stride apart (any value; "
                      "out of 0..E-1: dropped)"),
    Arg("topk", Int64, "entries per token (a row of ids)"),
    Arg("stride", Int64, "elements from a token's ids to the next token's (topk where contiguous)"),
    Arg("n", Int64, "entries (tokens x top-k)"),
    Arg("experts", Int64, "experts E (at most MAX_EXPERTS)"),
    Arg("local", Int64, "experts per rank L (a divisor of E)"),
    Arg("order", Int64, "int64[n], out: the entries sorted by expert, stably; out-of-range ones last"),
    Arg("valid", Int64, "uint8[n], out: 1 where the entry's id is in range"),
    Arg("bins", Int64, "int64[E + W + 1], out: the counts' message: for each rank its L experts' entries, then "
                       "the rows sent to it; then the out-of-range entries"),
    Arg("send_splits", Int64, "int64[E / L], out: entries per destination rank"),
    Arg("slots", Int64, "int64[n], out: each entry's place in order (order[slots[i]] = i)"),
    Arg("rows", Int64, "int64[n], out: the row that carries each entry (its token's to its rank; by rank, then "
                       "token, each rank's after head_rows), -1 out of range"),
    Arg("head_rows", Int64, "rows heading each rank's chunk with its message (0: none; low latency: "
                            "collectives.moe.header_rows)"),
    Arg("sent", Int64, "with head_rows: the rows sent (row_bytes each), out: each rank's message into its head"),
    Arg("row_bytes", Int64, "with head_rows: bytes per sent row"),
    Arg("row_splits", Int64, "with head_rows: int64[W], out: the rows of each rank's chunk (head_rows + its rows)"),
))


#: Lanes of a warp: the most of a group, the experts a warp's shuffles scan at once.
WARP = 32
FULL_WARP = -1  # match.sync's member mask: every lane of the warp
#: Groups' counts of an expert loaded at once (their latencies overlapping) before they are stored.
BATCH = 8

#: Shared memory a kernel may take without asking for more (its counts, table and scan).
SMEM_BYTES = 48 * 1024


@dataclass(frozen=True)
class MoeRouteKey:
    """The compile-time choices of one routing kernel: the ids' dtype (one of
    :data:`ID_DTYPES`), threads per block (one block; a power of two), lanes per group (a power
    of two up to 32 that divides the threads: a group is lanes of one warp) and ``experts``, the
    most experts it counts (a power of two up to :data:`MAX_EXPERTS`), and ``ranks``, the most
    ranks whose rows it counts (a power of two up to ``experts``).  Each thread takes ``2 n /
    threads`` entries; the shared memory holds a group's count of each expert and each rank's rows
    (int32, ``threads / lanes x (experts + 1 + ranks)``) besides the scan's (int32: entries below 2^31), within
    :data:`SMEM_BYTES`: 1024 threads of 32 groups at
    256 experts, 256 threads at :data:`MAX_EXPERTS` (:meth:`for_experts` picks the most threads)."""

    ids: str = "i64"
    threads: int = 256
    lanes: int = 32
    experts: int = MAX_EXPERTS
    ranks: int = 8

    def __post_init__(self) -> None:
        if self.ids not in ID_DTYPES:
            raise ValueError(f"ids must be one of {tuple(ID_DTYPES)}, not {self.ids!r}")
        check_threads(self.threads)
        if not 1 <= self.lanes <= WARP or self.lanes & (self.lanes - 1) or self.threads % self.lanes:
            raise ValueError(f"lanes must be a power of two up to {WARP} (a group syncs as a warp) dividing the "
                             f"threads {self.threads}, not {self.lanes}")
        if not 1 <= self.experts <= MAX_EXPERTS or self.experts & (self.experts - 1):
            raise ValueError(f"experts must be a power of two up to {MAX_EXPERTS}, not {self.experts}")
        if not 1 <= self.ranks <= self.experts or self.ranks & (self.ranks - 1):
            raise ValueError(f"ranks must be a power of two up to experts ({self.experts}), not {self.ranks}")
        if self.smem_bytes() > SMEM_BYTES:
            raise ValueError(f"{self.threads} threads in groups of {self.lanes} counting {self.experts} experts take "
                             f"{self.smem_bytes()} bytes of shared memory, past {SMEM_BYTES}")

    def smem_bytes(self) -> int:
        """Shared memory the kernel takes."""
        return smem_bytes(self.threads, self.lanes, self.experts, self.ranks)

    @classmethod
    def for_experts(cls, ids: str, experts: int, world: int) -> MoeRouteKey:
        """The key for ``experts`` experts (1 to :data:`MAX_EXPERTS`) on ``world`` ranks: counting
        the next power of two of each, with the most threads (groups of 32) whose counts fit
        :data:`SMEM_BYTES`."""
        bound, ranks = (1 << max(v - 1, 0).bit_length() for v in (experts, world))
        return cls(ids, max(t for t in BLOCK_THREADS if smem_bytes(t, 32, bound, ranks) <= SMEM_BYTES),
                   experts=bound, ranks=ranks)


def smem_bytes(threads: int, lanes: int, experts: int, ranks: int) -> int:
    """Shared memory of a routing kernel of ``threads`` in groups of ``lanes`` counting ``experts``
    and ``ranks``' rows: the groups' counts, the bins' starts, the scan's chunks' sums (int32 each;
    16 bytes of alignment each)."""
    bins = experts + 1 + ranks
    return 4 * (threads // lanes * bins + bins + -(-bins // min(threads, WARP))) + 3 * 16


def build(key: MoeRouteKey):
    """The ``@cute.jit`` launcher of the routing kernel for ``key`` (one block)."""
    threads, lanes, (ids, size) = key.threads, key.lanes, ID_DTYPES[key.ids]
    groups = threads // lanes
    most, ranks = key.experts, key.ranks  # the bins the shared memory holds (and the out-of-range one)
    chunk = min(threads, WARP)  # the bins a warp's shuffles scan at once
    chunks = (most + 1 + ranks + chunk - 1) // chunk
    by = "collectives.algorithms.moe_route"

    @cute.jit
    def bin_of(args: KernelArgs, raw: Int64) -> Int32:
        """The bin of id ``raw``: itself where in ``0..E-1``, else ``E``."""
        e = Int32(args.experts)
        if raw >= Int64(0):
            if raw < args.experts:
                e = Int32(raw)
        return e

    @cute.jit
    def id_at(args: KernelArgs, token: Int32, k: Int32) -> Int64:
        """Token ``token``'s ``k``-th id, as loaded."""
        return Int64(ptxops.ld(gmem(ids, args.ids, size, LOCAL, by) + Int64(token) * args.stride + Int64(k)))

    @cute.jit
    def load_of(args: KernelArgs, i: Int32):
        """Entry ``i``'s id as loaded (token ``i / topk``'s id ``i % topk``; nothing reads it before
        the next round: its load in flight meanwhile) and 1, or 0 and 0 past the entries."""
        raw, inside = Int64(0), Int32(0)
        if i < Int32(args.n):
            token = i // Int32(args.topk)
            raw = id_at(args, token, i - token * Int32(args.topk))
            inside = Int32(1)
        return raw, inside

    @cute.jit
    def expert_of(args: KernelArgs, raw: Int64, inside: Int32):
        """An entry's bin (of its loaded id ``raw``; -1 past the entries) and its rank where in
        range, else -1."""
        e, rank = Int32(-1), Int32(-1)
        if inside == Int32(1):
            e = bin_of(args, raw)
            if e < Int32(args.experts):
                rank = e // Int32(args.local)
        return e, rank

    @cute.jit
    def owns(args: KernelArgs, i: Int32, rank: Int32, base: Int32, wl: Int32) -> Int32:
        """1 where in-range entry ``i`` (of rank ``rank``, in its group's round from entry ``base``)
        owns its token's row to its rank: no earlier entry of the token goes there; else 0.  Its
        token's entries in the round are the group's lanes of its token (one ``match.any.sync``:
        a round's ``lanes`` entries are of distinct tokens mod 32) and of its rank; only those
        before ``base`` (a token across rounds or groups: none where ``topk`` divides ``lanes``)
        are loaded again.  Every lane of the warp calls it (the match)."""
        token = Int32(-1)
        if i < Int32(args.n):
            token = i // Int32(args.topk)
        mates = cute.arch.match_sync(FULL_WARP, ((rank + 1) * WARP + token % WARP) * (WARP // lanes) + wl // lanes)
        owner = Int32(0)
        if rank >= Int32(0):
            if cute.arch.popc(mates & ((Uint32(1) << Uint32(wl)) - Uint32(1))) == 0:
                owner = Int32(1)
                first = token * Int32(args.topk)
                local = Int32(args.local)
                earlier = Int32(0)
                while earlier < base - first:  # (out of range: E // L = W, no rank)
                    if bin_of(args, id_at(args, token, earlier)) // local == rank:
                        owner = Int32(0)
                    earlier += 1
        return owner

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int32(cute.arch.thread_idx()[0])
        group, lane = tidx // lanes, tidx % lanes
        wl = tidx % WARP  # the thread's lane in its warp
        n, experts = Int32(args.n), Int32(args.experts)
        world = experts // Int32(args.local)
        smem = SmemAllocator()
        # table[g * bins + e]: group g's count of expert e, then (placing) where its next one goes
        # (bins E + 1 + r: rank r's rows, counting their owners, placed after the n entries)
        table = smem.allocate_tensor(Int32, cute.make_layout(groups * (most + 1 + ranks)), byte_alignment=8)
        starts = smem.allocate_tensor(Int32, cute.make_layout(most + 1 + ranks), byte_alignment=8)  # e's first place
        chunk_sums = smem.allocate_tensor(Int32, cute.make_layout(chunks), byte_alignment=8)  # a chunk's entries
        bins = experts + 1 + world
        j = tidx
        while j < groups * bins:
            table[j] = Int32(0)
            j += threads
        # group g's entries: [g * span, (g + 1) * span), span a multiple of lanes (every group the same rounds)
        span = ((n + groups - 1) // groups + lanes - 1) // lanes * lanes
        raw, inside = load_of(args, group * span + lane)  # the first round's id (loaded meanwhile)
        cute.arch.sync_threads()
        for placing in cutlass.range_constexpr(2):  # count, then place
            step = Int32(0)
            while step < span:  # a round: lanes entries of each group, one a thread (a group: lanes of one warp)
                i = group * span + step + lane
                e, rank = expert_of(args, raw, inside)  # (loaded during the round before)
                raw, inside = Int64(0), Int32(0)  # the next round's id: in flight during this round
                if step + lanes < span:
                    raw, inside = load_of(args, i + lanes)
                owner = owns(args, i, rank, group * span + step, wl)
                # the group's lanes of this expert (the key names the group within its warp: a match
                # of the warp's lanes is one of the group's); the group's table moved on by the last round
                peers = cute.arch.match_sync(FULL_WARP, e * (WARP // lanes) + wl // lanes)
                before = Int32(cute.arch.popc(peers & ((Uint32(1) << Uint32(wl)) - Uint32(1))))  # the entries before it
                after = Int32(cute.arch.popc(peers >> Uint32(wl) >> Uint32(1)))  # and after it
                # its row's: the group's lanes of its rank, their owners (one a token), those before it
                row_peers = cute.arch.match_sync(FULL_WARP, (rank + 1) * (WARP // lanes) + wl // lanes)
                owners = Uint32(cute.arch.vote_ballot_sync(owner == Int32(1))) & row_peers
                owners_before = Int32(cute.arch.popc(owners & ((Uint32(1) << Uint32(wl)) - Uint32(1))))
                row_after = Int32(cute.arch.popc(row_peers >> Uint32(wl) >> Uint32(1)))
                cute.arch.sync_warp()
                at = Int32(0)
                if e >= Int32(0):
                    at = table[group * bins + e] + before
                    if cutlass.const_expr(placing):
                        ptxops.st(gmem(Int64, args.order, 8, LOCAL, by) + at, Int64(i))
                        ptxops.st(gmem(Int64, args.slots, 8, LOCAL, by) + i, Int64(at))
                        valid = Uint8(0)
                        if e < experts:
                            valid = Uint8(1)
                        ptxops.st(gmem(Uint8, args.valid, 1, LOCAL, by) + i, valid)
                row_at = Int32(0)
                if rank >= Int32(0):  # its row: its owner's (this entry, or one counted before it)
                    row_at = table[group * bins + experts + 1 + rank]
                    if cutlass.const_expr(placing):  # (after the heads of the ranks up to its own)
                        ptxops.st(gmem(Int64, args.rows, 8, LOCAL, by) + i,
                                  Int64(row_at + owners_before + owner - 1 - n) + Int64(rank + 1) * args.head_rows)
                elif cutlass.const_expr(placing):
                    if e >= Int32(0):
                        ptxops.st(gmem(Int64, args.rows, 8, LOCAL, by) + i, Int64(-1))
                # the group's lanes have read table[] before the last ones move it on; the next round
                # reads it after its first sync
                cute.arch.sync_warp()
                if e >= Int32(0):
                    if after == Int32(0):
                        table[group * bins + e] = at + 1
                if rank >= Int32(0):
                    if row_after == Int32(0):  # the round's last lane of the rank moves its rows on
                        table[group * bins + experts + 1 + rank] = row_at + Int32(cute.arch.popc(owners))
                step += lanes
            if cutlass.const_expr(not placing):  # the counts out, then table[] becomes each group's starts
                raw, inside = load_of(args, group * span + lane)  # the placing pass's first, loaded meanwhile
                cute.arch.sync_threads()
                j = tidx
                while j - wl < bins:  # a warp's chunk of W bins a step, every lane in (its shuffles)
                    total = Int32(0)  # e's entries; table[g, e] becomes those of the groups before g
                    if j < bins:
                        for g8 in cutlass.range_constexpr(0, groups, BATCH):  # BATCH loads, then their stores
                            counts = [table[g * bins + j] for g in range(g8, min(g8 + BATCH, groups))]
                            for u in cutlass.range_constexpr(len(counts)):
                                table[(g8 + u) * bins + j] = total
                                total += counts[u]
                        word = j + j // Int32(args.local)  # the message: expert j and the out-of-range bin
                        if j > experts:  # rank j - E - 1's rows, after its experts'
                            word = (j - experts) * (Int32(args.local) + 1) - 1
                        ptxops.st(gmem(Int64, args.bins, 8, LOCAL, by) + word, Int64(total))
                    within = total  # the chunk's inclusive prefix sums, by shuffles up the warp
                    for level in cutlass.range_constexpr(chunk.bit_length() - 1):
                        up = cute.arch.shuffle_sync_up(within, 1 << level)
                        if wl >= (1 << level):
                            within += up
                    if j < bins:
                        starts[j] = within - total  # (exclusive)
                    if wl == chunk - 1:
                        chunk_sums[j // chunk] = within
                    j += threads
                cute.arch.sync_threads()
                j = tidx
                while j < bins:  # e's start: the chunks' before its own, then table[g, e] += it
                    earlier = [chunk_sums[c] for c in range(chunks)]  # (all loaded, those before e's added)
                    start = starts[j]
                    for c in cutlass.range_constexpr(chunks):
                        if c < j // chunk:
                            start += earlier[c]
                    starts[j] = start
                    for g8 in cutlass.range_constexpr(0, groups, BATCH):
                        counts = [table[g * bins + j] for g in range(g8, min(g8 + BATCH, groups))]
                        for u in cutlass.range_constexpr(len(counts)):
                            table[(g8 + u) * bins + j] = counts[u] + start
                    j += threads
                cute.arch.sync_threads()
                local = Int32(args.local)
                w = tidx
                while w < experts // local:  # rank w: experts [wL, (w + 1)L) (starts[] read by the placing pass never)
                    ptxops.st(gmem(Int64, args.send_splits, 8, LOCAL, by) + w,
                              Int64(starts[(w + 1) * local] - starts[w * local]))
                    w += threads
                if args.head_rows > Int64(0):  # each rank's message at the head of its chunk, and the chunk's rows
                    words = gmem(Int64, args.bins, 8, LOCAL, by)  # (stored above, before two block barriers)
                    w = tidx  # (32-bit index arithmetic: no 64-bit division)
                    while w < world * (local + 1):
                        r = w // (local + 1)
                        head = Int64(starts[experts + 1 + r] - n) + Int64(r) * args.head_rows
                        ptxops.st(gmem(Int64, args.sent, 8, LOCAL, by)
                                  + (head * (args.row_bytes >> 3) + Int64(w - r * (local + 1))),
                                  ptxops.ld(words + w, dtype=Int64))
                        if w - r * (local + 1) == local:  # its rows' word
                            ptxops.st(gmem(Int64, args.row_splits, 8, LOCAL, by) + r,
                                      ptxops.ld(words + w, dtype=Int64) + args.head_rows)
                        w += threads

    return launcher(kernel, threads, grid=1, layout=MOE_ROUTE)


def _to_text(key: MoeRouteKey) -> str:
    return f"moe_route/{key.ids}/e{key.experts}/r{key.ranks}/t{key.threads}/l{key.lanes}"


def _from_text(kid: str) -> MoeRouteKey:
    _, ids, experts, ranks, threads, lanes = kid.split("/")
    return MoeRouteKey(ids, int(threads[1:]), int(lanes[1:]), int(experts[1:]), int(ranks[1:]))


def _snapshot() -> list[str]:
    """Both id dtypes at 256 experts on 8 ranks (1024 threads), and at :data:`MAX_EXPERTS` (256 threads)."""
    return [_to_text(MoeRouteKey.for_experts(ids, experts, 8)) for ids in ID_DTYPES for experts in (256, MAX_EXPERTS)]


FAMILY = register(Family("moe_route", MoeRouteKey, ("moe_route",), MOE_ROUTE, build, _snapshot, _to_text,
                         _from_text, lambda kid: (("moe_route", kid),)))


__all__ = ["BATCH", "FAMILY", "ID_DTYPES", "MAX_EXPERTS", "MOE_ROUTE", "SMEM_BYTES", "MoeRouteKey", "build", "smem_bytes"]
