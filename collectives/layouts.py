"""The words of an all-to-all's send/receive slots, and how a waiter judges them (pure Python:
no torch, no CuTeDSL; the kernels' side is :mod:`collectives.device.all_to_all`).

Every ordered pair of ranks (sender ``s``, receiver ``r``) has one slot, a handshake of two
64-bit words of ``size << 32 | epoch`` per call, each written with one ``st.release.sys`` and
polled with ``ld.acquire.sys``:

- ``ready``, in the sender's region, written by the receiver at the start of its call: its
  receive buffer is free and expects ``size`` elements from ``s`` (its ``out_splits[s]``) at
  the :func:`place` in the word ``offset`` (a plain 64-bit word stored before the release:
  the release carries it): which symmetric allocation (its number, the same on every rank)
  and the element type it receives (:func:`receiving`), and the byte offset in it;
- ``arrived``, one per part (a chunk moves in :func:`part` ranges, one thread block each), in
  the receiver's region, written by the sender after its part's stores: ``size`` is what it
  sent (its ``in_splits[r]``), or :data:`REFUSED` where it sent nothing (the ready's size
  differed, or the place lies in an allocation other than the one the sender addresses: it
  can only address the allocation its own call names; or the receiver's elements are of
  another type: sizes count elements, and equal counts of another width are other bytes).

The epoch of both is ``C + 1``, ``C`` the rank's count of all-to-all calls, kept in its
region (:attr:`ExchangeLayout.counter`, advanced by
:data:`~collectives.config.CALL_EPOCHS` per call as the signal pad's count of collective
calls is, :func:`collectives.device.signals.enter_call`; every rank's ``C`` is equal at a
call).  A count of its own, not the pad's: every all-to-all call rewrites every word, so a
word is never more than one call behind its waiter, however many other collectives ran
between (a pad count would let 2^31 epochs of other calls pass, and a stale word look new).  A
word holds an older call's epoch until its writer enters this call, and no newer one: the
receiver rewrites ``ready`` only in a later call, which it enters after reading ``arrived``
of this one, which the sender writes after reading ``ready``; the sender rewrites ``arrived``
only after the receiver's next ``ready``.  So the slots need no reset and no alternation; a
word past the call (:func:`~collectives.config.call_last`) comes only from a rank that gave
up on a timeout, and is judged a timeout.  Epochs compare wrap-safely (``int32(seen - want)
>= 0``), sizes as unsigned 32-bit values.

A size a rank cannot send or receive (a split below 0 or above :data:`MAX_CHUNK`, splits
summing past the tensor) is announced as :data:`REFUSED`, which matches nothing, so both
ends of each of its pairs fail with a size mismatch and every wait still ends: a size
mismatch never costs a timeout.  Pairs whose sizes agree complete on both ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import SIZE_MISMATCH, TIMEOUT, call_last
from .dtypes import DTYPES

U32 = 1 << 32
#: The size word of a pair that cannot be sent (never equal to any size, itself included).
REFUSED = U32 - 1
#: The most elements one chunk (one pair's data in one call) may hold.
MAX_CHUNK = REFUSED - 1
#: Error-record phase codes: a wait for a receiver's ``ready``, for a sender's ``arrived``
#: (after :data:`~collectives.config.PUSH_ROUND`), and a ready whose place lies in another
#: allocation than the sender's.
READY_WAIT, ARRIVED_WAIT, PLACE_MISMATCH = 6, 7, 8
PHASES = {READY_WAIT: "all-to-all ready wait", ARRIVED_WAIT: "all-to-all data wait",
          PLACE_MISMATCH: "all-to-all receive buffers (ranks received elements of different dtypes, or into "
                          "different allocations: "
                          "a symmetric out on some ranks, a plain one on others)"}
#: Bits of a place's byte offset (above them: what the receiver receives, :func:`receiving`).
PLACE_BITS = 40
#: Bits of :func:`receiving` that name the element type (above them: the allocation's number).
DTYPE_BITS = (len(DTYPES) - 1).bit_length()


@dataclass(frozen=True)
class ExchangeLayout:
    """Word offsets (uint32 units; every entry 64-bit, so even) in one rank's slot region for
    ``world`` ranks whose chunks move in ``parts`` parts.  The region is symmetric, zeroed (or
    seeded with the pad's starting count) once and never reset."""

    world: int
    parts: int

    def ready(self, receiver: int) -> int:
        """The ``ready`` word receiver ``receiver`` writes in this (sender's) region."""
        return 2 * receiver

    def offset(self, receiver: int) -> int:
        """Where ``receiver`` takes this rank's chunk (a :func:`place`)."""
        return 2 * (self.world + receiver)

    def arrived(self, sender: int, part: int) -> int:
        """The ``arrived`` word of ``sender``'s part ``part`` in this (receiver's) region."""
        return 2 * (2 * self.world + sender * self.parts + part)

    @property
    def counter(self) -> tuple[int, int]:
        """The words of the count of all-to-all calls and of the call's tickets."""
        end = 2 * (2 + self.parts) * self.world
        return end, end + 1

    @property
    def words(self) -> int:
        return self.counter[1] + 1


def pack(size: int, epoch: int) -> int:
    """The 64-bit word ``size << 32 | epoch``."""
    return (size % U32) << 32 | epoch % U32


def unpack(word: int) -> tuple[int, int]:
    """(size, epoch) of a 64-bit word, both unsigned 32-bit."""
    return word >> 32 & (U32 - 1), word & (U32 - 1)


def place(allocation: int, offset: int) -> int:
    """The ``offset`` word: ``allocation << PLACE_BITS | offset`` (bytes)."""
    if not 0 <= offset < 1 << PLACE_BITS or not 0 <= allocation < 1 << (63 - PLACE_BITS):
        raise ValueError(f"a place is an allocation below 2^{63 - PLACE_BITS} and an offset below 2^{PLACE_BITS}, "
                         f"not ({allocation}, {offset})")
    return allocation << PLACE_BITS | offset


def receiving(allocation: int, dtype: str) -> int:
    """What a receiver names in its place and a sender compares with its own: the symmetric
    allocation's number and the element type (its index in :data:`~collectives.dtypes.DTYPES`),
    ``allocation << DTYPE_BITS | index``.  A sender of f32 into a receiver of bf16 then refuses
    the pair (both ends record a size mismatch) instead of storing twice the bytes the
    receiver's buffer takes."""
    return allocation << DTYPE_BITS | list(DTYPES).index(dtype)


def unplace(word: int) -> tuple[int, int]:
    """(allocation, byte offset) of an ``offset`` word."""
    return word >> PLACE_BITS, word & ((1 << PLACE_BITS) - 1)


def announced(split: int, valid: bool = True) -> int:
    """The size a rank announces for a split: the split, or :data:`REFUSED` for one outside
    ``0..MAX_CHUNK`` or when its splits are not ``valid`` (they sum past the tensor)."""
    return split if valid and 0 <= split <= MAX_CHUNK else REFUSED


def reached(seen: int, want: int) -> bool:
    """The kernels' wrap-safe ``int32(seen - want) >= 0`` on uint32 epochs."""
    return (seen - want) % U32 < 1 << 31


def judge(word: int, calls: int, expected: int) -> int:
    """The status of a wait of the call at count ``calls`` that ended on ``word`` (its last
    load), expecting size ``expected``: 0 (passed), ``TIMEOUT`` (the epoch is not this call's:
    not reached by the deadline, or past the call) or ``SIZE_MISMATCH``."""
    size, epoch = unpack(word)
    want = (calls + 1) % U32
    if not reached(epoch, want) or reached(calls % U32, epoch) or not reached(call_last(calls) % U32, epoch):
        return TIMEOUT
    if size != expected or size == REFUSED:
        return SIZE_MISMATCH
    return 0


def part(count: int, parts: int, j: int, align: int = 1) -> tuple[int, int]:
    """Elements ``[begin, end)`` of part ``j`` of a chunk of ``count``: parts of
    ``ceil(count / parts)`` rounded up to a multiple of ``align`` (the last ones shorter or
    empty).  It depends on the chunk's size only, so the sender's block ``j`` and the
    receiver's block ``j`` take the same elements, whatever their addresses."""
    size = -(-(-(-count // parts)) // align) * align
    return min(j * size, count), min((j + 1) * size, count)


def chunk(splits: list[int], peer: int, n: int, row: int = 1) -> tuple[int, int, int]:
    """(element offset of ``peer``'s chunk, its elements, the size announced for it) of a rank
    whose splits are ``splits`` rows of ``row`` elements over a tensor of ``n`` elements: the
    prefix sum, and :data:`REFUSED` when a split is below 0, a chunk above :data:`MAX_CHUNK`
    elements (judged in rows, ``split <= MAX_CHUNK // row``, before the kernel's 64-bit
    product could wrap), or the chunks sum past ``n``."""
    most = MAX_CHUNK // max(row, 1)
    total = 0
    for s in splits:  # in 64 bits, as the kernel sums (a product past them wraps)
        total = _int64(total + _int64(s * row))
    valid = all(0 <= s <= most for s in splits) and total <= n
    return sum(splits[:peer]) * row, splits[peer] * row, announced(splits[peer] * row, valid)


def _int64(x: int) -> int:
    """``x`` wrapped to a signed 64-bit integer."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


__all__ = ["ARRIVED_WAIT", "DTYPE_BITS", "MAX_CHUNK", "PHASES", "PLACE_BITS", "PLACE_MISMATCH", "READY_WAIT",
           "REFUSED", "ExchangeLayout", "announced", "chunk", "judge", "pack", "part", "place", "reached", "receiving",
           "unpack", "unplace"]
