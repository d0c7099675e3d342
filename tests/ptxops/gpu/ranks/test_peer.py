"""Cross-GPU tests of ptxops' sys-scope ordering and atomics through nvshmem4py peer memory.

Run: ``torchrun --nproc-per-node 2 -m pytest -q tests/ptxops/gpu/ranks/test_peer.py`` (skipped unless
launched by torchrun with WORLD_SIZE >= 2 on GPUs; never creates or touches multicast).

* Message passing in a ring, both directions at once for 2 ranks: rank r stores a payload
  (plain weak ``st``) into rank r+1's symmetric inbox, then ``st_release(flag, epoch,
  scope="sys")`` on rank r+1's flag; rank r+1 polls its own flag with
  ``ld_acquire(scope="sys")`` (bounded), checks every word, and acks into rank r's memory the
  same way.  Many rounds and channels in one launch; zero mismatches, zero timeouts.
* ``red(sem="release", scope="sys")`` from every thread of every rank into every rank's
  counters (Int32 and 64-bit): exact finals.
* ``atom_add(scope="sys")`` (absent, acq_rel and release sems) from every rank on rank 0's
  counters: exact finals and every old value seen exactly once across all ranks.

The kernels take plain Int64 device addresses (``ctx.peer_pointers``), built into pointers
in-kernel with ``cute.make_ptr``; tests/ptxops/test_gpu_kernels_compile.py compiles them on CPU.
Host barriers (``ctx.host_barrier()``) only separate phases.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

import cuda.bindings.driver as cuda  # noqa: E402
from cutlass import Int32, Int64  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402
from tests.support.gpu_support import THREADS, compile_for_device, current_stream, peer_context, spin_until  # noqa: E402
from tests.support.world_support import WORLD  # noqa: E402

import ptxops  # noqa: E402
from collectives.symmetric.capability import force_multicast_off  # noqa: E402

pytestmark = pytest.mark.multigpu

if "WORLD_SIZE" in os.environ:
    # NVLink multicast must stay off wherever this runs (shared GPU hosts); set before
    # nvshmem / NCCL start.  Forced (not setdefault): a stray NVSHMEM_DISABLE_NVLS=0 must not
    # let nvshmem create multicast objects.
    force_multicast_off()

CHANNELS = 8  # sender CTAs (and as many receiver CTAs) per rank
WORDS = 4096  # payload words per channel per round (32 per thread)
FLAG_STRIDE = 32  # Int32s between flags
ROUNDS = 200
BUDGET_NS = 10_000_000_000  # a launch gives up waiting after 10 s
PEER_BLOCKS = 128  # CTAs per rank for the sys-scope atomics (fixed: every rank knows N)
ATOM_SEMS = (None, "acq_rel", "release")


def _gptr(dtype, addr: Int64, align: int = 16) -> cute.Pointer:
    return cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=align)


def peer_value(sender: Int32, channel: Int32, epoch: Int32, idx: Int32) -> Int32:
    """Payload word ``idx`` of round ``epoch`` that ``sender`` sends on ``channel``."""
    return epoch * 65599 + channel * 31 + sender * 7919 + idx


def make_mp_launcher() -> Callable:
    """``launch(inbox, flags, next_inbox, next_flags, prev_flags, results, prev_rank, rounds,
    budget_ns, stream)``: Int64 addresses (own inbox/flags, the next rank's inbox/flags, the
    previous rank's flags, own Int32 results) and scalars; grid 2 x CHANNELS CTAs.

    flags layout (symmetric): [c * FLAG_STRIDE] = "round e of channel c is in my inbox"
    (written by the previous rank), [(CHANNELS + c) * FLAG_STRIDE] = "the next rank has read
    round e of channel c" (written by the next rank).  results: [0] mismatched words, [1]
    timed-out waits, [2] rounds received, [3] rounds acked."""

    @cute.kernel
    def peer_mp_kernel(inbox: Int64, flags: Int64, next_inbox: Int64, next_flags: Int64,
                       prev_flags: Int64, results: Int64, rank: Int32, prev_rank: Int32,
                       rounds: Int32, budget_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        deadline = cute.arch.globaltimer() + budget_ns
        mismatches = Int32(0)
        timeouts = Int32(0)
        seen = Int32(0)
        own_flags = _gptr(Int32, flags)
        res = _gptr(Int32, results)
        if bidx < CHANNELS:  # sender of channel c to the next rank
            c = bidx
            out = _gptr(Int32, next_inbox) + c * WORDS
            ack = own_flags + (CHANNELS + c) * FLAG_STRIDE
            ready = _gptr(Int32, next_flags) + c * FLAG_STRIDE
            for r in range(rounds):
                e = r + 1
                if tidx == 0:  # the receiver has read round e-1
                    late = spin_until(ack, e - 1, deadline, True, "sys")
                    timeouts += late
                    seen += 1 - late
                cute.arch.sync_threads()
                for j in cutlass.range_constexpr(WORDS // THREADS):
                    idx = j * THREADS + tidx
                    ptxops.st(out + idx, peer_value(rank, c, e, idx))
                cute.arch.sync_threads()
                if tidx == 0:
                    ptxops.st_release(ready, e, scope="sys")
            if tidx == 0:
                ptxops.red(res + 3, seen)
        else:  # receiver of channel c from the previous rank
            c = bidx - CHANNELS
            box = _gptr(Int32, inbox) + c * WORDS
            ready = own_flags + c * FLAG_STRIDE
            ack = _gptr(Int32, prev_flags) + (CHANNELS + c) * FLAG_STRIDE
            for r in range(rounds):
                e = r + 1
                if tidx == 0:
                    late = spin_until(ready, e, deadline, True, "sys")
                    timeouts += late
                    seen += 1 - late
                cute.arch.sync_threads()
                for j in cutlass.range_constexpr(WORDS // THREADS):
                    idx = WORDS - 1 - (j * THREADS + tidx)  # written by another sender thread
                    if ptxops.ld(box + idx) != peer_value(prev_rank, c, e, idx):
                        mismatches += 1
                cute.arch.sync_threads()
                if tidx == 0:
                    ptxops.st_release(ack, e, scope="sys")
            if tidx == 0:
                ptxops.red(res + 2, seen)
        ptxops.red(res + 0, mismatches)
        if tidx == 0:
            ptxops.red(res + 1, timeouts)

    @cute.jit
    def launch(inbox: Int64, flags: Int64, next_inbox: Int64, next_flags: Int64, prev_flags: Int64,
               results: Int64, rank: Int32, prev_rank: Int32, rounds: Int32, budget_ns: Int64,
               stream: cuda.CUstream):
        peer_mp_kernel(inbox, flags, next_inbox, next_flags, prev_flags, results, rank, prev_rank,
                       rounds, budget_ns).launch(grid=[2 * CHANNELS, 1, 1], block=[THREADS, 1, 1],
                                                 stream=stream)

    return launch


def red_values(rank: Any, g: Any, wide: Callable = int) -> tuple[Any, Any]:
    """What thread g of ``rank`` adds to every rank's (Int32, Int64) counters (the kernel, with
    ``wide=Int64``, and the host evaluate the same expression)."""
    return rank * 1000 + g % 7 + 1, (wide(g) + 1) * 4294967296 + wide(rank)


def make_red_launcher() -> Callable:
    """``launch(table, nranks, rank, stream)``: table is the address of nranks Int64 device
    addresses of every rank's counters (an Int32 at +0, an Int64 at +8); PEER_BLOCKS CTAs."""

    @cute.kernel
    def peer_red_kernel(table: Int64, nranks: Int32, rank: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = bidx * THREADS + tidx
        v32, v64 = red_values(rank, g, Int64)
        addrs = _gptr(Int64, table, 8)
        for k in range(nranks):
            addr = ptxops.ld(addrs + k)
            ptxops.red(_gptr(Int32, addr), Int32(v32), sem="release", scope="sys")
            ptxops.red(_gptr(Int64, addr + 8, 8), Int64(v64), sem="release", scope="sys")

    @cute.jit
    def launch(table: Int64, nranks: Int32, rank: Int32, stream: cuda.CUstream):
        peer_red_kernel(table, nranks, rank).launch(grid=[PEER_BLOCKS, 1, 1], block=[THREADS, 1, 1],
                                                    stream=stream)

    return launch


def make_atom_launcher() -> Callable:
    """``launch(target, olds, stream)``: every thread does atom.add 1 at sys scope on each of
    len(ATOM_SEMS) Int32 counters at ``target`` (rank 0's, through a peer mapping) and stores
    the old values in its row of ``olds`` (a local Int32 (threads, len(ATOM_SEMS)) array)."""

    @cute.kernel
    def peer_atom_kernel(target: Int64, olds: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = bidx * THREADS + tidx
        row = _gptr(Int32, olds, 4) + g * len(ATOM_SEMS)
        for s, sem in enumerate(ATOM_SEMS):
            old = ptxops.atom_add(_gptr(Int32, target) + s, Int32(1), sem=sem, scope="sys")
            ptxops.st(row + s, old)

    @cute.jit
    def launch(target: Int64, olds: Int64, stream: cuda.CUstream):
        peer_atom_kernel(target, olds).launch(grid=[PEER_BLOCKS, 1, 1], block=[THREADS, 1, 1],
                                              stream=stream)

    return launch


def builders() -> dict[str, Callable[[], Callable]]:
    return {"mp": make_mp_launcher, "red": make_red_launcher, "atom": make_atom_launcher}


def fake_args(name: str) -> tuple:
    """Arguments to compile kernel ``name`` without a GPU (addresses are never dereferenced)."""
    a = Int64(0)
    return {
        "mp": (a, a, a, a, a, a, Int32(0), Int32(1), Int32(ROUNDS), Int64(BUDGET_NS), make_fake_stream()),
        "red": (a, Int32(2), Int32(0), make_fake_stream()),
        "atom": (a, a, make_fake_stream()),
    }[name]


# --------------------------------------------------------------------------------------
# Host side: torchrun, torch.distributed, collectives (nvshmem4py)
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctx() -> Iterator[Any]:
    with peer_context() as c:
        yield c


@pytest.fixture(scope="module")
def kernels(ctx: Any) -> dict[str, Any]:
    """Every kernel compiled once for this GPU (before any phase starts, so no rank waits on
    another's compile inside a timed phase)."""
    import torch

    stream = current_stream()
    compiled = {name: compile_for_device(build(), *fake_args(name)[:-1], stream)
                for name, build in builders().items()}
    if not WORLD:  # (in a one-GPU world the tests' own host barriers separate the phases)
        torch.cuda.synchronize()
        ctx.host_barrier()
    return compiled


def test_message_passing_ring_sys_scope(ctx: Any, kernels: dict[str, Any]) -> None:
    import torch

    rank, world = ctx.rank, ctx.world_size
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    inbox = ctx.empty(CHANNELS * WORDS, torch.int32)
    inbox.zero_()
    flags = ctx.signal_pad(2 * CHANNELS * FLAG_STRIDE * 4)  # zeroed on every rank, then a barrier
    results = torch.zeros(4, dtype=torch.int32, device="cuda")
    boxes, flag_ptrs = ctx.peer_pointers(inbox), ctx.peer_pointers(flags)
    ctx.host_barrier()  # every inbox is zero before anyone writes into it

    kernels["mp"](Int64(boxes[rank]), Int64(flag_ptrs[rank]), Int64(boxes[nxt]), Int64(flag_ptrs[nxt]),
                  Int64(flag_ptrs[prv]), Int64(results.data_ptr()), Int32(rank), Int32(prv),
                  Int32(ROUNDS), Int64(BUDGET_NS), current_stream())
    ctx.host_barrier()

    mismatches, timeouts, received, acked = results.tolist()
    assert (mismatches, timeouts) == (0, 0), (
        f"rank {rank}: {mismatches} stale/wrong words from rank {prv}, {timeouts} timed-out waits")
    assert received == acked == CHANNELS * ROUNDS, (received, acked)
    # the last round is still in the inbox
    idx = torch.arange(WORDS, dtype=torch.int64)
    for c in range(CHANNELS):
        want = (ROUNDS * 65599 + c * 31 + prv * 7919 + idx).to(torch.int32)
        assert torch.equal(inbox[c * WORDS:(c + 1) * WORDS].cpu(), want), f"channel {c}"
    assert flags[:CHANNELS * FLAG_STRIDE:FLAG_STRIDE].cpu().tolist() == [ROUNDS] * CHANNELS
    ctx.host_barrier()
    ctx.free(flags)
    ctx.free(inbox)


def test_red_release_sys_from_every_rank(ctx: Any, kernels: dict[str, Any]) -> None:
    import torch

    world = ctx.world_size
    counters = ctx.empty(4, torch.int64)
    counters.zero_()
    table = torch.tensor(ctx.peer_pointers(counters), dtype=torch.int64, device="cuda")
    ctx.host_barrier()
    kernels["red"](Int64(table.data_ptr()), Int32(world), Int32(ctx.rank), current_stream())
    ctx.host_barrier()

    g = list(range(PEER_BLOCKS * THREADS))
    want32 = sum(red_values(r, x)[0] for r in range(world) for x in g)
    want64 = sum(red_values(r, x)[1] for r in range(world) for x in g)
    got = counters.cpu()
    got32 = int(got.view(torch.int32)[0])
    assert got32 == (want32 + 2**31) % 2**32 - 2**31, (got32, want32)
    assert int(got[1]) == (want64 + 2**63) % 2**64 - 2**63, (int(got[1]), want64)
    ctx.host_barrier()
    ctx.free(counters)


def test_atom_add_sys_on_one_rank_from_all(ctx: Any, kernels: dict[str, Any]) -> None:
    import torch

    world, n = ctx.world_size, PEER_BLOCKS * THREADS
    counters = ctx.empty(4, torch.int32)
    counters.zero_()
    olds = ctx.empty((n, len(ATOM_SEMS)), torch.int32)
    olds.fill_(-1)
    target = ctx.peer_pointers(counters)[0]
    ctx.host_barrier()
    kernels["atom"](Int64(target), Int64(olds.data_ptr()), current_stream())
    ctx.host_barrier()

    finals = ctx.peer_tensors(counters)[0].clone().cpu()  # rank 0's counters, read from here
    every = torch.cat([p.clone().cpu() for p in ctx.peer_tensors(olds)])  # all ranks' olds
    for s, sem in enumerate(ATOM_SEMS):
        assert int(finals[s]) == world * n, (sem, int(finals[s]))
        seen = torch.sort(every[:, s]).values
        assert torch.equal(seen, torch.arange(world * n, dtype=torch.int32)), (
            f"sem={sem}: old values are not 0..{world * n - 1} each once: {seen[:8].tolist()}")
    ctx.host_barrier()
    ctx.free(olds)
    ctx.free(counters)
