"""Cross-GPU signals and barriers over a symmetric signal pad, built from ptxops.

Every rank owns a pad of uint32 words (see :class:`collectives.config.PadLayout`); the pad is
zeroed once and never reset.  A barrier passes monotonically growing epochs: rank ``src``
announces epoch ``e`` by writing ``size << 32 | e`` into the 64-bit ``arrival(block, src)`` of
every peer's pad (peer flavour) or by adding 1 to ``counter(block)`` through the multicast
address (multicast flavour, ``W * m`` after ``m`` multicast barriers, so the flavours mix); a
waiter compares wrap-safely (``int32(seen - want) >= 0``), so a
fast rank that is already at ``e + 1`` never confuses a slow one and nothing is ever reset.

Every wait is bounded by a deadline on ``%globaltimer``; a wait that times out writes an error
record (status, barrier, missing rank, block, rank) that the host turns into
:class:`collectives.CollectiveTimeout`, and reports failure so the kernel can exit.

The peer barrier is a :func:`signal_peers` and a :func:`wait_peers` of one epoch; a kernel may
use them apart, as a sequence of epochs that every rank's block announces in the same order
(a pipeline: wait for the peers' epoch ``e`` while its own later work is in flight).

These are ``@cute.jit`` functions: call them from your own ``@cute.kernel``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32, Uint64

import ptxops

from ..config import SIZE_MISMATCH, TIMEOUT, PadLayout


@cute.jit
def gmem(dtype: cutlass.Constexpr, address: Int64, align: cutlass.Constexpr = 16) -> cute.Pointer:
    """A global-memory pointer of ``dtype`` at a 64-bit device address."""
    return cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)


@cute.jit
def peer_address(table: Int64, rank: Int32) -> Int64:
    """Entry ``rank`` of a device table of 64-bit addresses (one per rank)."""
    return ptxops.ld(gmem(Int64, table, 8) + rank, dtype=Int64)


@cute.jit
def reached(seen: Uint32, want: Uint32) -> Boolean:
    """Wrap-safe ``seen >= want`` for monotonic 32-bit epochs."""
    return Int32(seen - want) >= 0


@cute.jit
def wait_until(flag: cute.Pointer, want: Uint32, deadline: Int64, scope: cutlass.Constexpr = "sys") -> Boolean:
    """Poll ``flag`` with acquire loads at ``scope`` (``sys`` when the writer is another GPU)
    until it reaches ``want`` (wrap-safe) or ``%globaltimer`` passes ``deadline``; True if it
    was reached."""
    seen = ptxops.ld_acquire(flag, scope=scope, dtype=Uint32)
    while not reached(seen, want) and cute.arch.globaltimer() < deadline:
        seen = ptxops.ld_acquire(flag, scope=scope, dtype=Uint32)
    return reached(seen, want)


@cute.jit
def signal(pad: Int64, offset: Int32, value: Uint32) -> None:
    """Publish ``value`` at word ``offset`` of the pad at ``pad`` (a peer's or our own): a
    release store at sys scope, so everything this thread saw before is visible to a waiter
    whose acquire reads it."""
    ptxops.st_release(gmem(Uint32, pad, 4) + offset, value, scope="sys")


@cute.jit
def record_error(err: Int64, status: Int32, barrier: Int32, peer: Int32, block: Int32, rank: Int32) -> None:
    """Write the error record once (the first failure wins the compare-and-swap)."""
    record = gmem(Int32, err, 4)
    if ptxops.atom_cas(record, Int32(0), status, sem="relaxed", scope="sys") == 0:
        ptxops.st(record + 1, barrier, sem="relaxed", scope="sys")
        ptxops.st(record + 2, peer, sem="relaxed", scope="sys")
        ptxops.st(record + 3, block, sem="relaxed", scope="sys")
        ptxops.st(record + 4, rank, sem="relaxed", scope="sys")


@cute.jit
def read_epoch(pad: Int64, block: Int32, world: cutlass.Constexpr) -> Uint32:
    """This rank's count of barriers passed by ``block`` (read before the kernel's first
    barrier; :func:`advance_epoch` stores the new count)."""
    layout = PadLayout(world=world)
    return ptxops.ld(gmem(Uint32, pad, 4) + layout.epoch(block), dtype=Uint32)


@cute.jit
def advance_epoch(pad: Int64, block: Int32, epoch: Uint32, world: cutlass.Constexpr) -> None:
    layout = PadLayout(world=world)
    ptxops.st(gmem(Uint32, pad, 4) + layout.epoch(block), epoch)


@cute.jit
def signal_peers(
    pad_table: Int64,
    rank: Int32,
    block: Int32,
    epoch: Uint32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> None:
    """Announce ``epoch`` of thread block ``block`` to every rank: threads ``t < world`` each
    load rank ``t``'s pad address and give it one 64-bit ``st.release.sys`` of ``size << 32 |
    epoch`` at ``arrival(block, rank)`` (arrival and size in one store).  With ``sync`` a
    ``bar.sync`` first carries the block's earlier accesses into the release (drop it only
    where the block made none in this kernel)."""
    layout = PadLayout(world=world)
    tidx = cute.arch.thread_idx()[0]
    if cutlass.const_expr(sync):
        cute.arch.sync_threads()
    if tidx < world:
        word = (Uint64(size) << 32) | Uint64(epoch)
        peer = gmem(Uint64, peer_address(pad_table, tidx), 8)
        ptxops.st_release(peer + layout.arrival(block, rank) // 2, word, scope="sys")


@cute.jit
def wait_peers(
    pad: Int64,
    rank: Int32,
    block: Int32,
    want: Uint32,
    last: Uint32,
    past: Boolean,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
) -> Boolean:
    """Wait until every rank's block ``block`` has announced ``want``: threads ``t < world``
    poll their own pad (``pad``, no table load) for rank ``t``'s word with ``ld.acquire.sys``
    until its epoch reaches ``want`` (wrap-safe) or ``%globaltimer`` passes ``deadline``.

    ``last`` ends the epochs of the waiter's call: a word in ``[want, last]`` was stored by
    rank ``t`` in this call and carries its size, compared with ours; a word past ``last``
    means rank ``t`` already left this call.  With ``past`` (the call's last wait) that is
    how a call ends: rank ``t`` left after its own waits compared our size with its own
    (which, then, a later call may have replaced).  Without, rank ``t`` left a call that still
    needed it, as only a failed call does (its waits saw another size): recorded as a size
    mismatch.  The caller's sync after the wait carries the acquire to the other threads.
    Returns (in threads ``t < world``) whether rank ``t`` arrived before the deadline with
    the same size; a failure is written to the error record (``which``: the barrier or phase
    it names)."""
    layout = PadLayout(world=world)
    tidx = cute.arch.thread_idx()[0]
    ok = Boolean(True)
    if tidx < world:
        own = gmem(Uint64, pad, 8) + layout.arrival(block, tidx) // 2
        seen = ptxops.ld_acquire(own, scope="sys", dtype=Uint64)
        while not reached(Uint32(seen & Uint64(0xFFFFFFFF)), want) and cute.arch.globaltimer() < deadline:
            seen = ptxops.ld_acquire(own, scope="sys", dtype=Uint64)
        seen_epoch = Uint32(seen & Uint64(0xFFFFFFFF))
        mine = reached(last, seen_epoch)  # a word of this call, with rank t's size
        if not reached(seen_epoch, want):
            ok = Boolean(False)
            record_error(err, Int32(TIMEOUT), which, tidx, block, rank)
        elif mine and Uint32(seen >> 32) != size or not mine and not past:
            ok = Boolean(False)
            record_error(err, Int32(SIZE_MISMATCH), which, tidx, block, rank)
    return ok


@cute.jit
def barrier_peer(
    pad_table: Int64,
    pad: Int64,
    rank: Int32,
    block: Int32,
    epoch: Uint32,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> Boolean:
    """Peer-flavour barrier of thread block ``block`` with block ``block`` of every rank:
    :func:`signal_peers` of ``epoch``, then :func:`wait_peers` for it, the barrier being its
    own range of epochs (a word past ``epoch`` means rank ``t`` already passed this barrier,
    which it does only after comparing our size with its own).  Returns (in threads ``t <
    world``) whether rank ``t`` arrived before the deadline with the same size.
    """
    signal_peers(pad_table, rank, block, epoch, size, world, sync)
    return wait_peers(pad, rank, block, epoch, epoch, Boolean(True), deadline, err, which, size, world)


@cute.jit
def barrier_multicast(
    mc_pad: Int64,
    pad: Int64,
    rank: Int32,
    block: Int32,
    epoch: Uint32,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> Boolean:
    """Multicast-flavour barrier: thread 0 stores our ``size`` on every rank and adds 1 to the
    block's counter on every rank (``multimem.st`` then ``multimem.red.release.sys``), waits
    until its own counter has every rank's arrival and compares every rank's size with ours
    (``sync`` as for :func:`barrier_peer`).

    The counter, not ``epoch``, says how many multicast barriers the block has passed: before
    our arrival at the m-th it holds ``world * m`` plus the ranks already arrived (< world; none
    can be at the next one before we arrive), so the target is ``world * (m + 1)`` whatever
    peer-flavour barriers (which advance the epoch, not the counter) ran in between."""
    layout = PadLayout(world=world)
    tidx = cute.arch.thread_idx()[0]
    ok = Boolean(True)
    if cutlass.const_expr(sync):
        cute.arch.sync_threads()
    if tidx == 0:
        mc = gmem(Uint32, mc_pad, 4)
        own = gmem(Uint32, pad, 4)
        passed = ptxops.ld(own + layout.counter(block), sem="relaxed", scope="sys", dtype=Uint32) // Uint32(world)
        ptxops.multimem_st(mc + layout.size(block, rank), size, sem="relaxed", scope="sys")
        ptxops.multimem_red(mc + layout.counter(block), Uint32(1), sem="release", scope="sys")
        ok = wait_until(own + layout.counter(block), (passed + Uint32(1)) * Uint32(world), deadline)
        if not ok:
            record_error(err, Int32(TIMEOUT), which, Int32(-1), block, rank)
        else:
            for r in cutlass.range_constexpr(world):
                if ptxops.ld(own + layout.size(block, r), dtype=Uint32) != size:
                    ok = Boolean(False)
                    record_error(err, Int32(SIZE_MISMATCH), which, Int32(r), block, rank)
    return ok


@cute.jit
def block_all(flag: cute.Tensor, ok: Boolean) -> Boolean:
    """True in every thread of the block iff ``ok`` held in every thread (one shared word)."""
    tidx = cute.arch.thread_idx()[0]
    if tidx == 0:
        flag[0] = Int32(1)
    cute.arch.sync_threads()
    if not ok:
        flag[0] = Int32(0)
    cute.arch.sync_threads()
    result = flag[0] != 0
    cute.arch.sync_threads()
    return result
