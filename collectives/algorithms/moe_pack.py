"""The rows an MoE dispatch sends (:func:`collectives.moe.dispatch`), one kernel on one GPU:
each straight from its token, quantized to fp8 with ``fp8=True`` (``quantize``), else copied.

A token is sent once to each rank that has >= 1 of its entries: as row ``carriers[t * topk + k]``
(the routing's numbering, :mod:`collectives.algorithms.moe_route`), written by the token's first
entry to that rank (:func:`row_of`), laid out as :class:`collectives.moe.Wire` lays it out: its
values (fp8: its ``hidden`` e4m3 values and its f32 scale's 4 bytes), zeros to the header, the
header (``topk`` int32: slot ``k`` entry ``k``'s index in the per-entry stream to the row's rank,
``slots[t * topk + k]`` less the rank's first entry, or -1 where the row does not carry entry
``k``: a thread per (row, slot)), zeros to ``row_bytes``.  The scale is the token's largest
magnitude over 448 (1 where that is 0 or NaN) and each value ``x / scale`` converted as torch
converts (:mod:`collectives.device.rounding`: ``amax``, ``fp8_scale``, ``div_rn``, ``e4m3``), so
the bytes are :func:`collectives.moe.quantize`'s.  One block per token (the grid strides): with
fp8 each thread loads its first :data:`~collectives.algorithms.moe_place.LOADS` pieces of the
token (``vec`` values each, all in flight) into registers, where they stay until they are
quantized; pieces past those (hidden > ``LOADS`` x ``threads`` x ``vec``; 7168 bf16 at 256
threads fit) are read for the largest magnitude, ``LOADS`` in flight, and again (from the L1/L2
cache) to quantize.  The thread's largest magnitude becomes its warp's by butterfly shuffles and
the block's by one round in shared memory of the warps' (read after the barrier the rows need
anyway: two block barriers a token, as the copy).  A thread per entry finds the row it writes
(:func:`row_of`, -1: none) into shared memory (the entries ``threads`` at a time: one round at
top-k <= threads); each piece is quantized once and its bytes stored, ``vec`` at once, into each
of those rows.  Each pass loads ``LOADS`` pieces a thread before it uses them (their latencies
overlapping; until 2026-11-28 a piece at a time: 6.6 us for 128 bf16 tokens of 7168 to 8 rows
each on one H200).  It replaces some fifteen torch operations over the tokens
(:func:`collectives.moe.pack_rows`).  Without ``quantize`` a row is its token's values, copied
``vec`` at once.  Until 2026-11-28 a block made one row, so that each token was read, and with fp8
its largest magnitude found and its values quantized, ``topk`` times; until issue 51 item 1 a
token was sent as one row per entry (``topk`` rows, several to one rank); until the fp8 pack of
issue 51 each thread found the token's rows again (``topk`` x ``topk`` / 2 loads of ``carriers``,
behind the stores) for each batch of pieces, and with fp8 for each piece of it, and for the
scale, the zeros and every header slot (4 x H200, 128 tokens of 7168 to top-8 of 256 experts:
the fp8 pack 11.8 us, the copy's 5.2).  Until issue 51's register pack (2026-11-29) the fp8 pack
read every piece twice (the largest magnitude's pass, then the quantizing one) and reduced the
magnitudes by a tree in shared memory, a block barrier a level (9 barriers a token more than the
copy): 1 H200, world of 2 ranks, hidden 7168 bf16, top-8 of 256 experts, 1 / 128 / 512 tokens a rank:
the fp8 pack 5.33 / 6.35 / 14.28 us, the copy 2.83 / 3.97 / 8.76 us.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..device import rounding
from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, gmem
from ..dtypes import DTYPES
from ..layouts import Arg, Layout
from .family import Family, register
from .moe_place import LOADS

#: Token dtypes the kernel quantizes (widened to f32 exactly).
DTYPES_QUANTIZED = ("f32", "f16", "bf16")
#: Most thread blocks of a launch (each row is one block's; the grid strides past them).
MAX_BLOCKS = 264

MOE_PACK = Layout("MoePackArgs", (
    Arg("rows", Int64, "out: the sent rows, row_bytes each (16-byte aligned)"),
    Arg("x", Int64, "the tokens: tokens x hidden of the key's dtype"),
    Arg("carriers", Int64, "int64[tokens * topk]: the row that carries each entry (its token's to its rank), -1 "
                           "out of range"),
    Arg("slots", Int64, "int64[tokens * topk]: each entry's place in the entries' sort by expert"),
    Arg("send_splits", Int64, "int64[world]: entries per destination rank (each rank's first: their sums before)"),
    Arg("world", Int64, "ranks"),
    Arg("tokens", Int64, "tokens"),
    Arg("topk", Int64, "entries per token"),
    Arg("hidden", Int64, "values per token (a multiple of the key's vec, and of 4)"),
    Arg("header", Int64, "the header's byte in a row (a multiple of 4): topk int32 after the values (and scale)"),
    Arg("row_bytes", Int64, "bytes per sent row (a multiple of 16; collectives.moe.Wire)"),
))


@dataclass(frozen=True)
class MoePackKey:
    """The compile-time choices of one packing kernel: the tokens' dtype (any registered one;
    one of :data:`DTYPES_QUANTIZED` to ``quantize``), ``vec`` (values per access: 1, or a
    16-byte vector's), threads per block and ``quantize`` (fp8 rows, else copies)."""

    dtype: str
    vec: int = 1
    threads: int = 256
    quantize: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, not {self.dtype!r}")
        if self.quantize and self.dtype not in DTYPES_QUANTIZED:
            raise ValueError(f"the MoE fp8 packing kernel takes dtypes {DTYPES_QUANTIZED}, not {self.dtype!r}")
        if self.vec not in (1, DTYPES[self.dtype].elements(16)):
            raise ValueError(f"vec must be 1 or {DTYPES[self.dtype].elements(16)} for {self.dtype}, not {self.vec}")
        check_threads(self.threads)  # whole warps (128 to 1024): the shuffles take a full warp

    def blocks(self, tokens: int) -> int:
        """Thread blocks of a launch for ``tokens`` tokens (at least 1)."""
        return max(1, min(MAX_BLOCKS, tokens))


def build(key: MoePackKey):
    """The ``@cute.jit`` launcher of the packing kernel for ``key`` (grid: a runtime argument)."""
    dtype, vec, threads = DTYPES[key.dtype].cute, key.vec, key.threads
    align = vec * DTYPES[key.dtype].bytes
    words = max(vec // 4, 1)  # a piece's bytes as 32-bit words (vec 8 or 4), else one byte
    lanes = min(threads, cute.arch.WARP_SIZE)  # a warp's threads
    warps = threads // lanes
    by = "collectives.algorithms.moe_pack"

    @cute.jit
    def row_of(args: KernelArgs, token: Int64, k: Int64) -> Int64:
        """The row token ``token``'s entry ``k`` writes: its carrier where no earlier entry of the
        token has it (one writer a row), else -1."""
        carriers = gmem(Int64, args.carriers, 8, LOCAL, by) + token * args.topk
        row = ptxops.ld(carriers + k, dtype=Int64)
        earlier = Int64(0)
        while earlier < k:
            if ptxops.ld(carriers + earlier, dtype=Int64) == row:
                row = Int64(-1)
            earlier += 1
        return row

    @cute.jit
    def index_in_rank(args: KernelArgs, slot: Int64) -> Int64:
        """An entry's index in the per-entry stream to its rank: its place in the sort less the
        rank's first (the send splits' sum before the rank that holds it)."""
        first = Int64(0)
        found = Int64(0)
        w = Int64(0)
        while w < args.world:
            if found == Int64(0):
                count = ptxops.ld(gmem(Int64, args.send_splits, 8, LOCAL, by) + w, dtype=Int64)
                if slot < first + count:
                    found = Int64(1)
                else:
                    first += count
            w += 1
        return slot - first

    def largest(most: Float32, loaded: list) -> Float32:
        """``most`` and the magnitudes of ``loaded`` (pieces of ``vec`` values), the largest
        (NaN once any is NaN), in order: unrolled where traced."""
        for piece in loaded:
            for e in range(vec):
                most = rounding.amax(most, rounding.widen(piece[e] if vec > 1 else piece))
        return most

    @cute.jit
    def put(args: KernelArgs, owned: cute.Tensor, chunk: Int64, scale: Float32, value, piece: Int64):
        """Piece ``piece`` of the token (``value``: its ``vec`` values) quantized, its bytes stored
        into each of the chunk's rows (``owned``, -1: none)."""
        q = [rounding.e4m3(rounding.div_rn(rounding.widen(value[e] if cutlass.const_expr(vec > 1) else value), scale))
             for e in range(vec)]
        if cutlass.const_expr(vec >= 4):
            packed = cute.make_rmem_tensor(words, Uint32)
            for w in cutlass.range_constexpr(words):
                packed[w] = (Uint32(q[4 * w]) | (Uint32(q[4 * w + 1]) << Uint32(8))
                             | (Uint32(q[4 * w + 2]) << Uint32(16)) | (Uint32(q[4 * w + 3]) << Uint32(24)))
            at = cute.assume(piece * words, divby=words)
            word = packed.load()
            j = Int64(0)
            while j < chunk:  # the chunk's rows (fp8 vectors)
                i = owned[j]
                if i >= Int64(0):
                    ptxops.st(gmem(Uint32, args.rows + i * args.row_bytes, 4 * words, LOCAL, by) + at, word)
                j += 1
        else:
            j = Int64(0)
            while j < chunk:  # the chunk's rows (fp8 bytes)
                i = owned[j]
                if i >= Int64(0):
                    ptxops.st(gmem(Uint8, args.rows + i * args.row_bytes, 1, LOCAL, by) + piece, q[0])
                j += 1

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int64(cute.arch.thread_idx()[0])
        smem = SmemAllocator()
        owned = smem.allocate_tensor(Int64, cute.make_layout(threads), byte_alignment=8)  # a chunk's rows
        if cutlass.const_expr(key.quantize):  # each warp's largest magnitude
            most = smem.allocate_tensor(Float32, cute.make_layout(warps), byte_alignment=4)
        pieces = args.hidden // vec
        slots = gmem(Int64, args.slots, 8, LOCAL, by)
        carriers = gmem(Int64, args.carriers, 8, LOCAL, by)
        values = args.hidden * DTYPES[key.dtype].bytes  # the values' bytes, then (fp8) the scale's
        if cutlass.const_expr(key.quantize):
            values = args.hidden + 4
        step = Int64(LOADS * threads)
        token = Int64(cute.arch.block_idx()[0])
        while token < args.tokens:
            src = gmem(dtype, args.x, align, LOCAL, by) + cute.assume(token * args.hidden, divby=vec)
            last = pieces - 1  # (a piece past the token: its load repeats the last, unused)
            if cutlass.const_expr(key.quantize):
                # the thread's first LOADS pieces stay in registers from the largest magnitude to the stores
                held = [ptxops.ld(src + cute.assume(cutlass.min(tidx + u * threads, last) * vec, divby=vec),
                                  num_elements=vec) for u in range(LOADS)]
                m = largest(rounding.zero(), held)  # (a repeated piece changes no largest magnitude)
                a = tidx + step
                while a < pieces:  # pieces past the registers' (hidden > LOADS x threads x vec), LOADS in flight
                    seen = [ptxops.ld(src + cute.assume(cutlass.min(a + u * threads, last) * vec, divby=vec),
                                      num_elements=vec) for u in range(LOADS)]
                    m = largest(m, seen)
                    a += step
                for level in cutlass.range_constexpr(lanes.bit_length() - 1):  # the warp's, by butterfly shuffles
                    m = rounding.amax(m, cute.arch.shuffle_sync_bfly(m, offset=1 << level))
                if tidx % Int64(lanes) == Int64(0):
                    most[tidx // Int64(lanes)] = m
            base = Int64(0)
            while base < args.topk:  # the token's entries, a chunk of `threads` at a time (one at top-k <= threads)
                if base + tidx < args.topk:  # a thread per entry: the row it writes (-1: none)
                    owned[tidx] = row_of(args, token, base + tidx)
                cute.arch.sync_threads()  # the chunk's rows (and the warps' largest magnitudes) in
                if cutlass.const_expr(key.quantize):
                    most_of_all = most[0]
                    for w in cutlass.range_constexpr(1, warps):  # the block's
                        most_of_all = rounding.amax(most_of_all, most[w])
                    scale = rounding.fp8_scale(most_of_all)
                chunk = cutlass.min(args.topk - base, Int64(threads))
                if cutlass.const_expr(key.quantize):
                    for u in cutlass.range_constexpr(LOADS):  # the registers' pieces
                        if tidx + u * threads <= last:
                            put(args, owned, chunk, scale, held[u], tidx + u * threads)
                    p = tidx + step
                    while p < pieces:  # the others: LOADS in flight, then each quantized and stored to each row
                        batch = [ptxops.ld(src + cute.assume(cutlass.min(p + u * threads, last) * vec, divby=vec),
                                           num_elements=vec) for u in range(LOADS)]
                        for u in cutlass.range_constexpr(LOADS):
                            if p + u * threads <= last:
                                put(args, owned, chunk, scale, batch[u], p + u * threads)
                        p += step
                else:
                    p = tidx
                    while p < pieces:  # LOADS pieces in flight, then their stores to each row
                        ats = [cute.assume(cutlass.min(p + u * threads, last) * vec, divby=vec) for u in range(LOADS)]
                        batch = [ptxops.ld(src + at, num_elements=vec) for at in ats]
                        j = Int64(0)
                        while j < chunk:  # the chunk's rows
                            i = owned[j]
                            if i >= Int64(0):
                                row = gmem(dtype, args.rows + i * args.row_bytes, align, LOCAL, by)
                                for u in cutlass.range_constexpr(LOADS):
                                    if p + u * threads <= last:
                                        ptxops.st(row + ats[u], batch[u])
                            j += 1
                        p += LOADS * threads
                j = tidx
                while j < chunk:  # a thread per row: (fp8) its scale (4-byte aligned: hidden is a multiple of 4),
                    i = owned[j]  # and zeros around its header
                    if i >= Int64(0):
                        if cutlass.const_expr(key.quantize):
                            ptxops.st(gmem(Float32, args.rows + i * args.row_bytes + args.hidden, 4, LOCAL, by),
                                      rounding.narrow([scale], Float32))
                        row = gmem(Uint8, args.rows + i * args.row_bytes, 1, LOCAL, by)
                        b = values
                        while b < args.row_bytes:
                            if b == args.header:
                                b += 4 * args.topk
                            else:
                                ptxops.st(row + b, Uint8(0))
                                b += 1
                    j += threads
                pair = tidx
                while pair < chunk * args.topk:  # a thread per (row, slot): the header, slot k of row j's
                    j, k = pair // args.topk, pair % args.topk
                    i = owned[j]
                    if i >= Int64(0):
                        named = Int32(-1)  # entry k's index in the stream to the row's rank, where the row carries it
                        if ptxops.ld(carriers + token * args.topk + k, dtype=Int64) == i:
                            named = Int32(index_in_rank(args, ptxops.ld(slots + token * args.topk + k, dtype=Int64)))
                        ptxops.st(gmem(Int32, args.rows + i * args.row_bytes + args.header + 4 * k, 4, LOCAL, by),
                                  named)
                    pair += threads
                cute.arch.sync_threads()  # every thread is done with owned[] and most[] before the next chunk's
                base += threads
            token += Int64(cute.arch.grid_dim()[0])

    return launcher(kernel, threads, layout=MOE_PACK)


def _to_text(key: MoePackKey) -> str:
    return f"moe_pack/{key.dtype}/v{key.vec}/q{int(key.quantize)}/t{key.threads}"


def _from_text(kid: str) -> MoePackKey:
    _, dtype, vec, quantize, threads = kid.split("/")
    return MoePackKey(dtype, int(vec[1:]), int(threads[1:]), quantize == "q1")


def _snapshot() -> list[str]:
    """fp8 packing of every dtype it quantizes, copies of bf16, f16 and f32; by elements and
    by 16-byte vectors."""
    cases = [(dtype, True) for dtype in DTYPES_QUANTIZED] + [(dtype, False) for dtype in ("bf16", "f16", "f32")]
    return [_to_text(MoePackKey(dtype, vec, quantize=quantize))
            for dtype, quantize in cases for vec in (1, DTYPES[dtype].elements(16))]


def _facets(kid: str) -> tuple[tuple, ...]:
    key = _from_text(kid)
    return ("moe_pack", key.dtype, key.quantize), ("moe_pack", key.quantize, key.vec > 1)


FAMILY = register(Family("moe_pack", MoePackKey, ("moe_pack",), MOE_PACK, build, _snapshot, _to_text, _from_text,
                         _facets))


__all__ = ["DTYPES_QUANTIZED", "FAMILY", "MAX_BLOCKS", "MOE_PACK", "MoePackKey", "build"]
