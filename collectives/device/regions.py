"""The regions' exchange on the device: the words of :class:`collectives.layouts.RegionLayout`
as a sending and a receiving kernel use them (the protocol, its judging and its model are
described there and in ``tests/collectives/algorithms/test_region_model.py``).

A source waits, bounded, until its receiver's ``arrived`` of the call before has reached its
own words (:func:`wait_free`: the receiver then finished reading the call's half), stores its
rows into its region of the receiver's half, and after every block's stores the sending
kernel's last block :func:`post_rows` s the ``facts`` (relaxed) and the ``arrived`` word
(``st.release.sys``) into the receiver's words; a receiver :func:`wait_rows` for each source's
``arrived`` of the call with ``ld.acquire.sys`` and judges it as
:func:`collectives.layouts.judge_region`.  Every word has the reach
:data:`~collectives.device.signals.PEER` (peers write ours, we write theirs); the count and the
tickets are this GPU's (:func:`~collectives.device.signals.enter_call`'s ``counter``).

These are ``@cute.jit`` functions: call them from your own ``@cute.kernel``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64

import ptxops

from ..config import CALL_EPOCHS
from ..layouts import REFUSED, SIZE_MISMATCH, TIMEOUT, RegionLayout, call_parity
from .all_to_all import epoch_of, pack, poll_epoch, size_of
from .signals import PEER, gmem, peer_address, reached


@cute.jit
def region_arrived_at(words: Int64, half: Uint32, source: Int32, world: cutlass.Constexpr) -> Int64:
    """The address of the ``arrived`` word ``source`` releases for ``half`` into the word region
    at ``words`` (a receiver's, or ours); its ``facts`` word follows it (8 bytes on)."""
    entry = 4 * RegionLayout(world, 16).arrived(0, 1)  # bytes of a (half, source)'s words
    return words + (Int64(half) * world + Int64(source)) * entry


@cute.jit
def region_arrived_word(words: Int64, half: Uint32, source: Int32, world: cutlass.Constexpr) -> cute.Pointer:
    """That ``arrived`` word as a pointer."""
    return gmem(Uint64, region_arrived_at(words, half, source, world), 8, PEER,
                "collectives.device.regions.arrived_word (a word region: sources write it)")


@cute.jit
def region_facts_word(words: Int64, half: Uint32, source: Int32, world: cutlass.Constexpr) -> cute.Pointer:
    """The ``facts`` word beside it."""
    return gmem(Int64, region_arrived_at(words, half, source, world) + Int64(8), 8, PEER,
                "collectives.device.regions.facts_word (a word region: sources write it)")


@cute.jit
def wait_free(words: Int64, receiver: Int32, calls: Uint32, deadline: Int64,
              world: cutlass.Constexpr) -> cutlass.Boolean:
    """As a source at count ``calls``: poll our ``arrived`` word of ``receiver``'s call before
    (the other half) with ``ld.acquire.sys`` until it reaches that call's epoch, or
    ``%globaltimer`` passes ``deadline``; True where it did
    (:func:`collectives.layouts.may_store`)."""
    want = calls - Uint32(CALL_EPOCHS - 1)
    word = region_arrived_word(words, Uint32(call_parity(calls - Uint32(CALL_EPOCHS))), receiver, world)
    return reached(epoch_of(poll_epoch(word, want, deadline)), want)


@cute.jit
def post_rows(words_table: Int64, rank: Int32, receiver: Int32, calls: Uint32, rows: Uint32, facts: Int64,
              world: cutlass.Constexpr) -> None:
    """As source ``rank``: ``facts`` (a relaxed store) and ``arrived`` (``rows``, the call's
    epoch; ``st.release.sys``, which orders the facts and every store this thread has seen
    before it) into ``receiver``'s words of the call's half (``rows``
    :data:`~collectives.layouts.REFUSED`: nothing was stored)."""
    theirs, half = peer_address(words_table, receiver), Uint32(call_parity(calls))
    ptxops.st(region_facts_word(theirs, half, rank, world), facts, sem="relaxed", scope="sys")
    ptxops.st_release(region_arrived_word(theirs, half, rank, world), pack(rows, calls + Uint32(1)), scope="sys")


@cute.jit
def refuse_rows(words_table: Int64, rank: Int32, receiver: Int32, calls: Uint32, world: cutlass.Constexpr) -> None:
    """As source ``rank`` after a :func:`wait_free` timed out: ``arrived`` of
    :data:`~collectives.layouts.REFUSED` rows (nothing stored), which the receiver judges a
    timeout instead of waiting for rows that do not come."""
    word = region_arrived_word(peer_address(words_table, receiver), Uint32(call_parity(calls)), rank, world)
    ptxops.st_release(word, pack(Uint32(REFUSED), calls + Uint32(1)), scope="sys")


@cute.jit
def wait_rows(words: Int64, source: Int32, calls: Uint32, facts: Int64, capacity: Int64, expected: Int64,
              deadline: Int64, world: cutlass.Constexpr) -> tuple:
    """As a receiver at count ``calls``: poll ``source``'s ``arrived`` of the call with
    ``ld.acquire.sys`` until its epoch reaches the call's (or ``deadline`` passes), then judge
    it with the ``facts`` read after it (:func:`collectives.layouts.judge_region`, ``expected``
    the rows known to come, -1 where unknown): ``(status, rows)``, status 0, ``TIMEOUT`` or
    ``SIZE_MISMATCH``."""
    want, half = calls + Uint32(1), Uint32(call_parity(calls))
    seen = poll_epoch(region_arrived_word(words, half, source, world), want, deadline)
    rows, status = size_of(seen), Int32(0)
    if epoch_of(seen) != want or rows == Uint32(REFUSED):
        status = Int32(TIMEOUT)
    else:
        sent = ptxops.ld(region_facts_word(words, half, source, world), dtype=Int64)
        if sent != facts or Int64(rows) > capacity or (expected >= Int64(0) and Int64(rows) != expected):
            status = Int32(SIZE_MISMATCH)
    if status != Int32(0):
        rows = Uint32(0)
    return status, rows


__all__ = ["post_rows", "refuse_rows", "region_arrived_at", "region_arrived_word", "region_facts_word", "wait_free",
           "wait_rows"]
