"""The two-kernel MoE combine's receiving kernel: each source's rows waited for in this rank's
receive regions (:class:`collectives.layouts.RegionLayout`), then every token's weighted sum
(:func:`collectives.algorithms.moe_combine.weighted_sum`, bit for bit the one-GPU kernel's).

Threads ``0 .. W - 1`` of every block wait, bounded, for source ``s``'s ``arrived`` of the call
(:func:`collectives.device.regions.wait_rows`, ``ld.acquire.sys``), expecting the rows this rank
sent ``s`` in the dispatch (``send_splits[s]``, which come back in the order they went) and its
own ``facts``; a ``bar.sync`` carries the acquires to the block.  Entry row ``q`` (the dispatch's
sorted order, rows by source in rank order) is source ``s``'s row ``j = q - (send_splits[0] + ... +
send_splits[s - 1])``, at ``j x row bytes`` into ``s``'s region of the call's half.  Where any
wait failed the block records it and writes nothing (the host raises the record); the call's
count moves on either way (:func:`~collectives.device.signals.enter_call` and ``leave_call`` on
the exchange's own count), so the ranks stay in step.  Designed for the two-kernel combine of
``docs/guide-moe.md``; no runtime path launches it yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.memory import SmemAllocator

import ptxops

from ..config import MAX_WORLD
from ..device import regions, signals
from ..device.kernel_args import KernelArgs
from ..device.launch import launcher
from ..device.signals import LOCAL, PEER, gmem
from ..dtypes import DTYPES
from ..layouts import REGION_WAIT, Arg, Layout, RegionLayout, call_parity
from .family import Family, register
from .moe_combine import MoeCombineKey, weighted_sum
from .moe_send_back import source_of

MOE_SUM_BACK = Layout("MoeSumBackArgs", (
    Arg("out", Int64, "the output: tokens x hidden of the key's dtype"),
    Arg("slots", Int64, "int64[tokens * topk]: the row that entry (t, k) came back as (rows by source, in rank order)"),
    Arg("valid", Int64, "uint8[tokens * topk]: 1 where entry (t, k) was sent (and came back)"),
    Arg("weights", Int64, "f32[tokens * topk]: entry (t, k)'s weight (taken as 0 where not valid)"),
    Arg("tokens", Int64, "tokens"),
    Arg("hidden", Int64, "elements per row (a multiple of the key's vec)"),
    Arg("regions", Int64, "this rank's receive allocation (collectives.layouts.RegionLayout)"),
    Arg("region_bytes", Int64, "bytes of a region (a source's in a half)"),
    Arg("send_splits", Int64, "int64[world]: rows this rank sent each rank in the dispatch (what comes back)"),
    Arg("words", Int64, "this rank's word region (the sources' words, its count and tickets)"),
    Arg("facts", Int64, "what this rank's rows are (collectives.layouts.region_facts): each source's must match"),
    Arg("err", Int64, "the error records (host-mapped int32[2][5], collectives.layouts.ERROR_FIELDS)"),
    Arg("rank", Int32, "this rank"),
    Arg("timeout_ns", Int64, "the bound of every wait, in nanoseconds of %globaltimer"),
))


@dataclass(frozen=True)
class MoeSumBackKey:
    """The compile-time choices of one receiving kernel: ``world`` (2..8) and the weighted
    sum's (:class:`~collectives.algorithms.moe_combine.MoeCombineKey`: dtype, top-k, vec,
    threads, at least ``world``)."""

    world: int
    dtype: str
    topk: int
    vec: int = 1
    threads: int = 256

    def __post_init__(self) -> None:
        if not 2 <= self.world <= MAX_WORLD:
            raise ValueError(f"world size must be 2..{MAX_WORLD}, not {self.world}")
        MoeCombineKey(self.dtype, self.topk, self.vec, self.threads)  # (its checks)

    def blocks(self, tokens: int, hidden: int) -> int:
        """Thread blocks of a launch (the weighted sum's)."""
        return MoeCombineKey(self.dtype, self.topk, self.vec, self.threads).blocks(tokens, hidden)


@cute.jit
def region_row(args: KernelArgs, q: Int64, half: Int64, row_bytes: Int64, world: cutlass.Constexpr) -> Int64:
    """The address of entry row ``q``: its source's row in that source's region of ``half``."""
    source, j = source_of(args.send_splits, q, world)
    return args.regions + (half * world + Int64(source)) * args.region_bytes + j * row_bytes


def build(key: MoeSumBackKey):
    """The ``@cute.jit`` launcher of the receiving kernel for ``key`` (grid: a runtime argument)."""
    world, threads = key.world, key.threads
    dtype, element = DTYPES[key.dtype].cute, DTYPES[key.dtype].bytes
    counter = RegionLayout(world, 16).counter
    by = "collectives.algorithms.moe_sum_back"

    @cute.jit
    def kernel(args: KernelArgs):
        tidx = Int32(cute.arch.thread_idx()[0])
        block = Int32(cute.arch.block_idx()[0])
        calls, last = signals.enter_call(args.words, world, counter=counter)
        deadline = cute.arch.globaltimer() + args.timeout_ns
        smem = SmemAllocator()
        failed = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        if tidx == 0:
            failed[0] = Int32(0)
        cute.arch.sync_threads()
        row_bytes = args.hidden * element
        if tidx < world:
            expected = ptxops.ld(gmem(Int64, args.send_splits, 8, LOCAL, by) + tidx, dtype=Int64)
            status, _ = regions.wait_rows(args.words, tidx, calls, args.facts,
                                          args.region_bytes // cutlass.max(row_bytes, Int64(1)), expected, deadline,
                                          world)
            if status != Int32(0):  # (blocks may judge apart: each failing one records, the first claims)
                failed[0] = Int32(1)  # (any thread's: a plain store of the same value)
                signals.record_error(args.err, status, Int32(REGION_WAIT), tidx, block, args.rank)
        cute.arch.sync_threads()  # the waits' acquires (and their verdict) to the block
        if failed[0] == Int32(0):
            half = Int64(call_parity(calls))
            weighted_sum(args, lambda q: region_row(args, q, half, row_bytes, world), dtype, key.vec * element,
                         key.topk, key.vec, threads, PEER, by)
        signals.leave_call(args.words, calls, last, world, counter=counter)

    return launcher(kernel, threads, layout=MOE_SUM_BACK)


def _to_text(key: MoeSumBackKey) -> str:
    return f"moe_sum_back/w{key.world}/{key.dtype}/k{key.topk}/v{key.vec}/t{key.threads}"


def _from_text(kid: str) -> MoeSumBackKey:
    _, world, dtype, topk, vec, threads = kid.split("/")
    return MoeSumBackKey(int(world[1:]), dtype, int(topk[1:]), int(vec[1:]), int(threads[1:]))


def _snapshot() -> list[str]:
    """2, 4 and 8 ranks, bf16 top-8 by 16-byte vectors; 4 ranks f32 top-2 by elements."""
    return [_to_text(MoeSumBackKey(world, "bf16", 8, 8)) for world in (2, 4, 8)] + [
        _to_text(MoeSumBackKey(4, "f32", 2, 1))]


FAMILY = register(Family("moe_sum_back", MoeSumBackKey, ("moe_sum_back",), MOE_SUM_BACK, build, _snapshot,
                         _to_text, _from_text, lambda kid: (("moe_sum_back", kid),)))


__all__ = ["FAMILY", "MOE_SUM_BACK", "MoeSumBackKey", "build"]
