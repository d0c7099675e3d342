"""The two-kernel MoE combine's sending kernel: the rows sent back made and stored straight into
their sources' receive regions (:class:`collectives.layouts.RegionLayout`), the gather
(:mod:`~collectives.algorithms.moe_gather`) and the combine's all-to-all in one kernel.

Row ``i`` of what goes back is what received row ``i`` of the dispatch became: row ``place[i]``
of the experts' outputs where ``kept[i]``, else zeros.  The dispatch's rows arrived by source,
``splits[s]`` rows from source ``s`` in rank order, so row ``i`` goes back to the source ``s``
whose rows it lies in, as that source's row ``j = i - (splits[0] + ... + splits[s - 1])``: at
``j x row bytes`` into this rank's region of the call's half in ``s``'s receive allocation.  First
threads ``0 .. W - 1`` of every block wait, bounded, until each source may take the call's rows
(:func:`collectives.device.regions.wait_free`: normally at once; a block whose wait timed out
sets the pair's ``refused`` word, so that the pair is refused whatever the other blocks saw);
then the blocks stride over the rows, each made and stored by the gather's
:func:`~collectives.algorithms.moe_gather.row_back`; then the block whose ticket completes the grid (``atom.add.acq_rel.sys`` after a ``bar.sync``: every block's stores
before it) posts each source its ``facts`` and ``arrived`` (``splits[s]`` rows), or refuses a
source some block may not store to.  Rows past a source's region are not stored: the source's ``arrived``
announces them all, which its receiver judges a size mismatch, and this rank records one too.
No wait here depends on another block (each polls only its own words), so the grid need not be
resident at once.  Designed for the two-kernel combine of ``docs/guide-moe.md``; no runtime
path launches it yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..config import MAX_WORLD
from ..device import regions
from ..device import signals
from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, PEER, gmem
from ..layouts import MAX_CHUNK, REGION_STORE_WAIT, SIZE_MISMATCH, TIMEOUT, Arg, Layout, RegionLayout, call_parity
from .family import Family, register
from .moe_gather import row_back
from .moe_place import MAX_BLOCKS, WORDS

MOE_SEND_BACK = Layout("MoeSendBackArgs", (
    Arg("rows", Int64, "the experts' output rows (the places index them)"),
    Arg("place", Int64, "int64[room]: each received row's place in rows (read only where kept)"),
    Arg("kept", Int64, "uint8[room]: 1 where the row was placed"),
    Arg("splits", Int64, "int64[world]: rows that arrived from each source in the dispatch, in rank order (each "
                         "source's go back to it)"),
    Arg("row_words", Int64, "words per row"),
    Arg("regions_table", Int64, "device table of every rank's receive allocation (collectives.layouts.RegionLayout)"),
    Arg("region_bytes", Int64, "bytes of a region (a source's in a half)"),
    Arg("words_table", Int64, "device table of every rank's word region"),
    Arg("words", Int64, "this rank's word region (its entry of words_table: its count, its tickets)"),
    Arg("facts", Int64, "what this rank's rows are (collectives.layouts.region_facts), compared by each receiver"),
    Arg("err", Int64, "the error records (host-mapped int32[2][5], collectives.layouts.ERROR_FIELDS)"),
    Arg("rank", Int32, "this rank"),
    Arg("timeout_ns", Int64, "the bound of every wait, in nanoseconds of %globaltimer"),
))


@dataclass(frozen=True)
class MoeSendBackKey:
    """The compile-time choices of one sending kernel: ``world`` (2..8), ``word`` (bytes per
    access: 16, 8, 4, 2 or 1; a row's bytes are a multiple) and threads per block (at least
    ``world``)."""

    world: int
    word: int = 16
    threads: int = 256

    def __post_init__(self) -> None:
        if not 2 <= self.world <= MAX_WORLD:
            raise ValueError(f"world size must be 2..{MAX_WORLD}, not {self.world}")
        if self.word not in WORDS:
            raise ValueError(f"word must be one of {tuple(WORDS)} bytes, not {self.word}")
        check_threads(self.threads)

    def blocks(self, rows: int) -> int:
        """Thread blocks of a launch for ``rows`` rows sent back (at least 1)."""
        return max(1, min(MAX_BLOCKS, rows))


@cute.jit
def source_of(splits: Int64, i: Int64, world: cutlass.Constexpr) -> tuple:
    """(source, row within its rows) of received row ``i``: the rank whose rows, in rank order,
    ``i`` lies in (``world`` where past them all)."""
    by = "collectives.algorithms.moe_send_back.source_of"
    source, first = Int32(world), Int64(0)
    before = Int64(0)
    for s in cutlass.range_constexpr(world):
        n = ptxops.ld(gmem(Int64, splits, 8, LOCAL, by) + s, dtype=Int64)
        if source == Int32(world) and i < before + n:
            source, first = Int32(s), before
        before += n
    return source, i - first


def build(key: MoeSendBackKey):
    """The ``@cute.jit`` launcher of the sending kernel for ``key`` (grid: a runtime argument)."""
    threads, world = key.threads, key.world
    element = WORDS[key.word][0]
    layout = RegionLayout(world, 16)
    by = "collectives.algorithms.moe_send_back"

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int32(cute.arch.thread_idx()[0])
        block = Int32(cute.arch.block_idx()[0])
        words = gmem(Uint32, args.words, 4, LOCAL, by)
        calls = ptxops.ld(words + layout.counter[0], dtype=Uint32)  # (the receiving kernel moves it on)
        deadline = cute.arch.globaltimer() + args.timeout_ns
        smem = SmemAllocator()
        free = smem.allocate_tensor(Int32, cute.make_layout(world + 1), byte_alignment=4)  # (last: the last block)
        row_bytes = args.row_words * key.word
        capacity = args.region_bytes // cutlass.max(row_bytes, Int64(1))
        if tidx < world:
            ok = regions.wait_free(args.words, tidx, calls, deadline, world)
            free[tidx] = Int32(ok)
            if not ok:  # (blocks may judge apart: any one's timeout refuses the pair, below)
                ptxops.st(words + layout.refused(0) + tidx, Uint32(1))
                signals.record_error(args.err, Int32(TIMEOUT), Int32(REGION_STORE_WAIT), tidx, block, args.rank)
        cute.arch.sync_threads()
        half = Int64(call_parity(calls))
        total = Int64(0)
        for s in cutlass.range_constexpr(world):
            total += ptxops.ld(gmem(Int64, args.splits, 8, LOCAL, by) + s, dtype=Int64)
        i = Int64(block)
        while i < total:
            source, j = source_of(args.splits, i, world)
            if free[source] != Int32(0) and j < capacity:
                to = signals.peer_address(args.regions_table, source) + (
                    half * world + Int64(args.rank)) * args.region_bytes + j * row_bytes
                row_back(args, i, gmem(element, to, key.word, PEER, by), Int64(tidx), key.word, threads, by)
            i += Int64(cute.arch.grid_dim()[0])
        cute.arch.sync_threads()  # the block's stores (and refusals) before its ticket
        if tidx == 0:
            ticket = ptxops.atom_add(words + layout.send_tickets, Uint32(1), sem="acq_rel", scope="sys")
            free[world] = Int32(ticket == Uint32(cute.arch.grid_dim()[0] - 1))
        cute.arch.sync_threads()
        if free[world] != Int32(0):  # the last block: every block's stores are before this
            if tidx < world:
                refused = ptxops.ld(words + layout.refused(0) + tidx, dtype=Uint32)
                if free[tidx] != Int32(0) and refused == Uint32(0):
                    sent = ptxops.ld(gmem(Int64, args.splits, 8, LOCAL, by) + tidx, dtype=Int64)
                    if sent > capacity:
                        signals.record_error(args.err, Int32(SIZE_MISMATCH), Int32(REGION_STORE_WAIT), tidx, block,
                                             args.rank)
                    announced = Uint32(cutlass.min(sent, Int64(MAX_CHUNK)))
                    regions.post_rows(args.words_table, args.rank, tidx, calls, announced, args.facts, world)
                else:
                    regions.refuse_rows(args.words_table, args.rank, tidx, calls, world)
                if refused != Uint32(0):
                    ptxops.st(words + layout.refused(0) + tidx, Uint32(0))  # (the next kernel reads after this one)
            if tidx == 0:
                ptxops.st(words + layout.send_tickets, Uint32(0))

    return launcher(kernel, threads, layout=MOE_SEND_BACK)


def _to_text(key: MoeSendBackKey) -> str:
    return f"moe_send_back/w{key.world}/b{key.word}/t{key.threads}"


def _from_text(kid: str) -> MoeSendBackKey:
    _, world, word, threads = kid.split("/")
    return MoeSendBackKey(int(world[1:]), int(word[1:]), int(threads[1:]))


FAMILY = register(Family("moe_send_back", MoeSendBackKey, ("moe_send_back",), MOE_SEND_BACK, build,
                         lambda: [_to_text(MoeSendBackKey(world, word)) for world in (2, 4, 8) for word in (16, 2)],
                         _to_text, _from_text, lambda kid: (("moe_send_back", kid),)))


__all__ = ["FAMILY", "MOE_SEND_BACK", "MoeSendBackKey", "build", "source_of"]
