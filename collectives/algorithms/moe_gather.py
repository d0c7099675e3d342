"""The MoE combine's rows to send back (:func:`collectives.moe.combine`), one kernel on one GPU:
the dispatch's placement in reverse.

Row ``i`` of the output is what received row ``i`` of the dispatch became: row ``place[i]`` of
the experts' outputs where ``kept[i]``, else zeros (a row dropped past an expert's capacity
counts as nothing in its token's sum).  Only the rows that arrived are made (the first
``sum(splits)``, the rows the combine's all-to-all sends back; the receive buffer has room for
``W x max_tokens x min(topk, L)``, about ``W`` times what arrives on average): the rest of
``out`` is left unwritten (a low-latency combine at 128 tokens on 4 ranks, top-8: 1,024 of
4,096 rows, a quarter of the bytes written).  Rows move as words of ``word`` bytes, a row's words spread over a block's
threads (each loading :data:`~collectives.algorithms.moe_place.LOADS` words before storing
them), whole rows to a block (the grid strides).  It replaces a gather, a clamp of the places
and a pass that zeroed the rows not kept (that pass alone read and wrote every row once more).
Block 0 also copies both splits to ``copy``, where the combine's all-to-all reads them (a buffer
of the communicator's, whose place keeps that all-to-all's plan the same at every call: a torch
copy less).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int64, Uint8

import ptxops

from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, gmem
from ..layouts import Arg, Layout
from .family import Family, register
from .moe_place import LOADS, MAX_BLOCKS, WORDS

MOE_GATHER = Layout("MoeGatherArgs", (
    Arg("out", Int64, "out: room rows of row_words words, in the dispatch's arrival order"),
    Arg("rows", Int64, "the experts' output rows (the places index them)"),
    Arg("place", Int64, "int64[room]: each row's place in rows (read only where kept)"),
    Arg("kept", Int64, "uint8[room]: 1 where the row was placed"),
    Arg("room", Int64, "rows of out"),
    Arg("splits", Int64, "int64[world]: rows that arrived from each source (the rows of out made: their sum)"),
    Arg("world", Int64, "entries of splits"),
    Arg("send_splits", Int64, "int64[world]: rows the dispatch sent each rank (what comes back)"),
    Arg("copy", Int64, "int64[2 * world], out (block 0): send_splits, then splits: the combine's all-to-all's"),
    Arg("row_words", Int64, "words per row"),
))


@dataclass(frozen=True)
class MoeGatherKey:
    """The compile-time choices of one gather kernel: ``word`` (bytes per access: 16, 8, 4, 2
    or 1; a row's bytes are a multiple) and threads per block."""

    word: int = 16
    threads: int = 256

    def __post_init__(self) -> None:
        if self.word not in WORDS:
            raise ValueError(f"word must be one of {tuple(WORDS)} bytes, not {self.word}")
        check_threads(self.threads)

    def blocks(self, room: int) -> int:
        """Thread blocks of a launch for ``room`` rows (at least 1)."""
        return max(1, min(MAX_BLOCKS, room))


def build(key: MoeGatherKey):
    """The ``@cute.jit`` launcher of the gather kernel for ``key`` (grid: a runtime argument)."""
    threads = key.threads
    element, per_word = WORDS[key.word]
    by = "collectives.algorithms.moe_gather"

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int64(cute.arch.thread_idx()[0])
        arrived = Int64(0)
        j = Int64(0)
        while j < args.world:
            arrived += ptxops.ld(gmem(Int64, args.splits, 8, LOCAL, by) + j, dtype=Int64)
            j += Int64(1)
        end = cutlass.min(arrived, args.room)
        if Int64(cute.arch.block_idx()[0]) == Int64(0):
            j = tidx
            while j < args.world:  # the splits where the combine's all-to-all reads them
                ptxops.st(gmem(Int64, args.copy, 8, LOCAL, by) + j,
                          ptxops.ld(gmem(Int64, args.send_splits, 8, LOCAL, by) + j, dtype=Int64))
                ptxops.st(gmem(Int64, args.copy, 8, LOCAL, by) + args.world + j,
                          ptxops.ld(gmem(Int64, args.splits, 8, LOCAL, by) + j, dtype=Int64))
                j += threads
        i = Int64(cute.arch.block_idx()[0])
        while i < end:
            dst = gmem(element, args.out, key.word, LOCAL, by) + i * args.row_words * per_word
            row_back(args, i, dst, tidx, key.word, threads, by)
            i += Int64(cute.arch.grid_dim()[0])

    return launcher(kernel, threads, layout=MOE_GATHER)


@cute.jit
def row_back(args: KernelArgs, i: Int64, dst: cute.Pointer, tidx: Int64, word: cutlass.Constexpr,
             threads: cutlass.Constexpr, by: cutlass.Constexpr) -> None:
    """Row ``i`` of what goes back, stored at ``dst`` (this GPU's, or a peer's) by the block's
    threads (``args``: ``rows``, ``place``, ``kept``, ``row_words``): row ``place[i]`` of the
    experts' outputs where ``kept[i]``, each thread loading :data:`LOADS` words before it stores
    them, else zeros (a row dropped counts as nothing in its token's sum)."""
    element, per_word = WORDS[word]
    if ptxops.ld(gmem(Uint8, args.kept, 1, LOCAL, by) + i) != Uint8(0):
        place = ptxops.ld(gmem(Int64, args.place, 8, LOCAL, by) + i, dtype=Int64)
        src = gmem(element, args.rows, word, LOCAL, by) + place * args.row_words * per_word
        w = tidx
        while w < args.row_words:  # LOADS words in flight, then their stores
            last = args.row_words - 1  # (a word past the row: its load repeats the last, not stored)
            ats = [cute.assume(cutlass.min(w + u * threads, last) * per_word, divby=per_word) for u in range(LOADS)]
            words = [ptxops.ld(src + at, num_elements=per_word) for at in ats]
            for u in cutlass.range_constexpr(LOADS):
                if w + u * threads <= last:
                    ptxops.st(dst + ats[u], words[u])
            w += LOADS * threads
    else:
        zero = element(0)
        if cutlass.const_expr(per_word > 1):
            words = cute.make_rmem_tensor(per_word, element)
            for e in cutlass.range_constexpr(per_word):
                words[e] = element(0)
            zero = words.load()
        w = tidx
        while w < args.row_words:
            ptxops.st(dst + cute.assume(w * per_word, divby=per_word), zero)
            w += threads


def _to_text(key: MoeGatherKey) -> str:
    return f"moe_gather/b{key.word}/t{key.threads}"


def _from_text(kid: str) -> MoeGatherKey:
    _, word, threads = kid.split("/")
    return MoeGatherKey(int(word[1:]), int(threads[1:]))


FAMILY = register(Family("moe_gather", MoeGatherKey, ("moe_gather",), MOE_GATHER, build,
                         lambda: [_to_text(MoeGatherKey(word)) for word in WORDS], _to_text, _from_text,
                         lambda kid: (("moe_gather", kid),)))


__all__ = ["FAMILY", "MOE_GATHER", "MoeGatherKey", "build", "row_back"]
