"""Send/receive slots with epochs between every ordered pair of ranks: the device side of
:mod:`collectives.layouts` (the words, the handshake and its judging are described there).

A receiver :func:`post_ready` s into each sender's region (its free buffer's offset and the
size it expects); a sender :func:`wait_word` s for it, stores its chunk into the receiver's
buffer, and :func:`post_arrived` s (after a ``bar.sync`` that carries its block's stores into
the release); the receiver :func:`wait_word` s for that.  Every wait is bounded by a deadline
on ``%globaltimer``; its status is the host model's :func:`collectives.layouts.judge`.

Sizes travel in the high half of a 64-bit word.  The halves are taken apart as unsigned
32-bit values (``word & 0xFFFFFFFF``, and a shift by a ``Uint64`` count truncated at once to
``Uint32``: ``shr.u64``; a 64-bit result of a shift by a Python int may be arithmetic,
``shr.s64``) and compared unsigned, so sizes at and above 2^31 compare as the host model's.

Every slot word has the reach :data:`~collectives.device.signals.PEER` (:func:`ptxops.reach`):
other GPUs write our region's words and we write theirs.  The region's call count is this
GPU's alone (:data:`~collectives.device.signals.LOCAL`, tagged by
:func:`~collectives.device.signals.enter_call`).

These are ``@cute.jit`` functions: call them from your own ``@cute.kernel``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64

import ptxops

from ..layouts import PLACE_BITS, REFUSED, SIZE_MISMATCH, TIMEOUT, ExchangeLayout
from .signals import PEER, gmem, in_call, peer_address, reached


@cute.jit
def size_of(word: Uint64) -> Uint32:
    """The size (high half) of a slot word, unsigned."""
    return Uint32(word >> Uint64(32))


@cute.jit
def epoch_of(word: Uint64) -> Uint32:
    """The epoch (low half) of a slot word."""
    return Uint32(word & Uint64(0xFFFFFFFF))


@cute.jit
def pack(size: Uint32, epoch: Uint32) -> Uint64:
    """``size << 32 | epoch``."""
    return (Uint64(size) << Uint64(32)) | Uint64(epoch)


@cute.jit
def place(allocation: Int64, offset: Int64) -> Int64:
    """:func:`collectives.layouts.place`: ``allocation << PLACE_BITS | offset``."""
    return (allocation << Int64(PLACE_BITS)) | offset


@cute.jit
def place_of(word: Int64) -> tuple:
    """(allocation, byte offset) of a place (:func:`collectives.layouts.unplace`; the
    allocation's bits shifted as unsigned)."""
    return Int64(Uint64(word) >> Uint64(PLACE_BITS)), word & Int64((1 << PLACE_BITS) - 1)


@cute.jit
def post_ready(slot_table: Int64, rank: Int32, sender: Int32, offset: Int64, size: Uint32, epoch: Uint32,
               world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
    """As receiver ``rank``: tell ``sender`` (in its region) that our buffer takes ``size``
    elements from it at ``offset`` (a :func:`place`): the place with a relaxed store, then
    ``ready`` with ``st.release.sys`` (which orders the place before it, and our call's entry:
    our previous call's reads of the buffer ended with the previous kernel)."""
    layout = ExchangeLayout(world, parts)
    region = peer_address(slot_table, sender)
    by = "collectives.device.all_to_all.post_ready (the sender's slot region)"
    ptxops.st(gmem(Int64, region, 8, PEER, by) + layout.offset(0) // 2 + rank, offset, sem="relaxed", scope="sys")
    ptxops.st_release(gmem(Uint64, region, 8, PEER, by) + layout.ready(0) // 2 + rank, pack(size, epoch),
                      scope="sys")


@cute.jit
def ready_offset(slots: Int64, receiver: Int32, world: cutlass.Constexpr, parts: cutlass.Constexpr) -> Int64:
    """The place ``receiver`` posted with its ``ready`` in our region (read after the wait's
    acquire)."""
    layout = ExchangeLayout(world, parts)
    words = gmem(Int64, slots, 8, PEER, "collectives.device.all_to_all.ready_offset (our region, receivers write it)")
    return ptxops.ld(words + layout.offset(0) // 2 + receiver, dtype=Int64)


@cute.jit
def ready_word(slots: Int64, receiver: Int32, world: cutlass.Constexpr, parts: cutlass.Constexpr) -> cute.Pointer:
    """The ``ready`` word ``receiver`` writes in our region."""
    words = gmem(Uint64, slots, 8, PEER, "collectives.device.all_to_all.ready_word (our region, receivers write it)")
    return words + ExchangeLayout(world, parts).ready(0) // 2 + receiver


@cute.jit
def arrived_word(region: Int64, sender: Int32, part: Int32, world: cutlass.Constexpr,
                 parts: cutlass.Constexpr) -> cute.Pointer:
    """The ``arrived`` word of ``sender``'s part ``part`` in the region at ``region`` (a
    receiver's, or ours: the sender writes it)."""
    words = gmem(Uint64, region, 8, PEER, "collectives.device.all_to_all.arrived_word")
    return words + ExchangeLayout(world, parts).arrived(0, 0) // 2 + sender * parts + part


@cute.jit
def post_arrived(slot_table: Int64, rank: Int32, receiver: Int32, part: Int32, size: Uint32, epoch: Uint32,
                 world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
    """As sender ``rank``: announce part ``part`` of our chunk (``size`` elements in all) to
    ``receiver`` with one ``st.release.sys`` into its region (call it after the ``bar.sync``
    that follows the block's stores of the part)."""
    word = arrived_word(peer_address(slot_table, receiver), rank, part, world, parts)
    ptxops.st_release(word, pack(size, epoch), scope="sys")


@cute.jit
def poll_epoch(word: cute.Pointer, want: Uint32, deadline: Int64) -> Uint64:
    """The slot word ``word`` read with ``ld.acquire.sys`` until its epoch reaches ``want``
    (wrap-safe) or ``%globaltimer`` passes ``deadline``: the last value read."""
    seen = ptxops.ld_acquire(word, scope="sys", dtype=Uint64)
    while not reached(epoch_of(seen), want) and cute.arch.globaltimer() < deadline:
        seen = ptxops.ld_acquire(word, scope="sys", dtype=Uint64)
    return seen


@cute.jit
def wait_word(word: cute.Pointer, calls: Uint32, expected: Uint32, deadline: Int64) -> Int32:
    """Poll a slot word with ``ld.acquire.sys`` until its epoch reaches ``calls + 1`` (wrap-safe)
    or ``%globaltimer`` passes ``deadline``; then judge it as
    :func:`collectives.layouts.judge`: 0, ``TIMEOUT`` (not this call's epoch) or
    ``SIZE_MISMATCH`` (a size other than ``expected``, or :data:`~collectives.layouts.REFUSED`).
    The caller's ``bar.sync`` after it carries the acquire to the block."""
    want = calls + Uint32(1)
    seen = poll_epoch(word, want, deadline)
    epoch, size = epoch_of(seen), size_of(seen)
    status = Int32(0)
    if not reached(epoch, want) or not in_call(epoch, calls):
        status = Int32(TIMEOUT)
    elif size != expected or size == Uint32(REFUSED):
        status = Int32(SIZE_MISMATCH)
    return status


@cute.jit
def wait_within(word: cute.Pointer, calls: Uint32, low: Uint32, high: Uint32, deadline: Int64) -> tuple:
    """:func:`wait_word` of a bounded all-to-all
    (:attr:`~collectives.algorithms.all_to_all.AllToAllKey.bounded`), judged as
    :func:`collectives.layouts.judge_within`: ``(status, size)``, the status ``SIZE_MISMATCH``
    where the size posted lies outside ``[low, high]`` (or is :data:`~collectives.layouts.REFUSED`)
    instead of differing from one expected size (the same poll)."""
    want = calls + Uint32(1)
    seen = poll_epoch(word, want, deadline)
    epoch, size = epoch_of(seen), size_of(seen)
    status = Int32(0)
    if not (reached(epoch, want) and in_call(epoch, calls)):
        status = Int32(TIMEOUT)
    elif size < low or size > high or size == Uint32(REFUSED):
        status = Int32(SIZE_MISMATCH)
    return status, size


__all__ = ["arrived_word", "epoch_of", "pack", "place", "place_of", "poll_epoch", "post_arrived", "post_ready",
           "ready_offset", "ready_word", "size_of", "wait_within", "wait_word"]
