"""Every word host and device share bit for bit, laid out once (pure Python: no torch, no
CuTeDSL), read by the host's code and the kernels' alike:

- the signal pad: :class:`PadLayout`, and the call count's :func:`call_parity` and
  :func:`call_last`;
- the error records kernels write and the host reads (:data:`ERROR_FIELDS`, the two records,
  the status and phase codes);
- the all-to-all's send/receive slots: :class:`ExchangeLayout`, its words and how a waiter
  judges them (below; the kernels' side is :mod:`collectives.device.all_to_all`);
- the regions' exchange a two-kernel MoE layer is designed on: :class:`RegionLayout`,
  :func:`may_store`, :func:`judge_region` (its model: ``tests/collectives/algorithms/test_region_model.py``;
  no kernel uses it yet);
- kernel arguments: :class:`Arg` and :class:`Layout`, the collectives' :data:`COLLECTIVE`
  (and :data:`PUSH_ALL_REDUCE`), the stream flags' :data:`FLAGS`; every other kernel family
  declares its own with them next to its kernel (e.g. :data:`collectives.algorithms.all_to_all.ALL_TO_ALL`).
  The kernels' view of them is :class:`collectives.device.kernel_args.KernelArgs`.

The all-to-all's slots: every ordered pair of ranks (sender ``s``, receiver ``r``) has one slot, a handshake of two
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
word past the call (:func:`~collectives.layouts.call_last`) comes only from a rank that gave
up on a timeout, and is judged a timeout.  Epochs compare wrap-safely (``int32(seen - want)
>= 0``), sizes as unsigned 32-bit values.

A size a rank cannot send or receive (a split below 0 or above :data:`MAX_CHUNK`, splits
summing past the tensor) is announced as :data:`REFUSED`, which matches nothing, so both
ends of each of its pairs fail with a size mismatch and every wait still ends: a size
mismatch never costs a timeout.  Pairs whose sizes agree complete on both ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .config import (CALL_EPOCHS, LAMPORT_BLOCKS, LAMPORT_BUFFERS, LAMPORT_CALLS, LAMPORT_WIDTHS, MAX_WORLD,
                     PUSH_EPOCHS)
from .dtypes import DTYPES

# -- the signal pad -------------------------------------------------------------------------------


def call_parity(calls):
    """Which of the two arrival slots the call at count ``calls`` signals into (0 or 1):
    consecutive calls alternate, so a rank's words of a call stay readable until every rank
    has left it (a rank starts call ``C + 2 * CALL_EPOCHS`` only after every rank entered the
    call between).  Python or CuTeDSL (a uint32 count), like :func:`~collectives.algorithms.base.ceil_div`."""
    return calls // CALL_EPOCHS % 2


def call_last(calls):
    """The last epoch of the call at count ``calls`` (which every signal of the call reaches at
    most): ``calls + CALL_EPOCHS - 1``, to be taken modulo 2^32 (the kernel's uint32 wraps)."""
    return calls + (CALL_EPOCHS - 1)


# -- Lamport call counts (Python or CuTeDSL) ----------------------------------------------------


def _like(call, value):
    """``value`` in the type of ``call``: a CuTeDSL ``Uint32`` count keeps to ``Uint32``
    arithmetic (a Python constant is an ``Int32``, an ``Int64`` past its range as
    :data:`~collectives.config.LAMPORT_CALLS` is, and a mixed operation takes the wider type).  The signed hazard
    is elsewhere: a load through a pointer moved by ``+`` returns a signed integer unless given
    ``dtype=``, and its ``>>`` is then ``shr.s64`` (its ``%`` ``rem.s``): convert it first."""
    return type(call)(value)


def lamport_buffer(call):
    """The receive buffer of Lamport call ``call`` (a count below :data:`~collectives.config.LAMPORT_CALLS`;
    Python or CuTeDSL: the kernel evaluates these formulas)."""
    return call % _like(call, LAMPORT_BUFFERS)


def lamport_next(call):
    """The count after ``call``: it wraps at :data:`~collectives.config.LAMPORT_CALLS`."""
    return (call + _like(call, 1)) % _like(call, LAMPORT_CALLS)


def lamport_tag(call):
    """The tag of call ``call`` in its size entries (and in a buffer's clean-up word):
    1 .. :data:`~collectives.config.LAMPORT_CALLS`, never the 0 of a fresh pad, unique among any three calls in a row."""
    return call + _like(call, 1)


def lamport_stale(call):
    """The buffer call ``call`` empties first when a size mismatch left it dirty: that of the
    call two before (``call - 2``), which no rank writes again before ``call + 1`` (after
    receiving this rank's data of ``call``) and into which every rank's stores of ``call - 2``
    have landed (each rank sent its ``call - 1`` size entry, which this rank's ``call - 1``
    received, after them)."""
    return (call + _like(call, 1)) % _like(call, LAMPORT_BUFFERS)


def lamport_cleanup_call(call):
    """The call that empties the buffer of ``call``, should ``call`` fail with a size mismatch."""
    return lamport_next(lamport_next(call))


def lamport_epoch(calls, width: int):
    """The epoch a Lamport kernel of element width ``width`` (0, 1, 2: 1-, 2-, 4-byte) leaves in
    its block 0's arrival word of the call at count ``calls`` (with ``n ^``
    :data:`~collectives.algorithms.base.LAMPORT_SIGNATURE` as its size): ``call_last(calls) -
    width``, in the call, reached by every barriered kernel's wait and past every epoch one
    signals (:data:`~collectives.config.PUSH_EPOCHS`).  A barriered kernel meeting it records a size mismatch (the
    size differs) and a Lamport kernel meeting another one a rank that ran another kernel."""
    return calls + (CALL_EPOCHS - 1 - width)


assert CALL_EPOCHS - LAMPORT_WIDTHS > PUSH_EPOCHS


@dataclass(frozen=True)
class PadLayout:
    """Word offsets in each rank's signal pad (uint32, symmetric, zeroed once, never reset).

    ``arrival(parity, block, src)`` is the first word of the 64-bit slot that rank ``src``'s
    block ``block`` writes in calls of that :func:`call_parity` (``size << 32 | epoch`` in one
    store, through every peer's pad or the multicast address); ``calls`` is this rank's count
    of collective calls (:data:`CALL_EPOCHS` per call), ``tickets`` counts the blocks of the
    running call that have read it.  Epochs only grow; comparisons are wrap-safe.
    """

    max_blocks: int = 1024
    world: int = MAX_WORLD

    def arrival(self, parity: int, block: int, src: int) -> int:
        return 2 * ((parity * self.max_blocks + block) * self.world + src)

    @property
    def calls(self) -> int:
        return 4 * self.max_blocks * self.world

    @property
    def tickets(self) -> int:
        return self.calls + 1

    @property
    def lamport_base(self) -> int:
        """First word of the Lamport state (even: the size entries are 8-byte aligned)."""
        return self.calls + 2

    @property
    def _lamport_sizes(self) -> int:
        """Words of the size entries: 64 bits per width, buffer and source rank."""
        return 2 * LAMPORT_WIDTHS * LAMPORT_BUFFERS * self.world

    def lamport_size(self, width: int, buffer: int, src: int) -> int:
        return self.lamport_base + 2 * ((width * LAMPORT_BUFFERS + buffer) * self.world + src)

    def lamport_step(self, width: int, block: int) -> int:
        return self.lamport_base + self._lamport_sizes + width * LAMPORT_BLOCKS + block

    def lamport_dirty(self, width: int, buffer: int) -> int:
        """The tag of the call that must empty ``buffer`` (:func:`~collectives.layouts.lamport_stale`), written by a
        call whose sizes differed across ranks."""
        return self._lamport_marks + width * LAMPORT_BUFFERS + buffer

    @property
    def _lamport_marks(self) -> int:
        """First of the dirty marks, after the size entries and every width's call counts."""
        return self.lamport_base + self._lamport_sizes + LAMPORT_WIDTHS * LAMPORT_BLOCKS

    @property
    def words(self) -> int:
        return self._lamport_marks + LAMPORT_WIDTHS * LAMPORT_BUFFERS


# -- the error records ----------------------------------------------------------------------------

#: Fields of the error record a failed kernel writes (int32 words, host-mapped memory).
#: ``barrier`` is 0 (start), 1 (end), :data:`LAMPORT_EXCHANGE` (a Lamport data wait),
#: :data:`DATA_PHASE` (a TMA stage that never landed), :data:`FLAG_WAIT` (a stream flag
#: never posted; ``block`` is then its slot) or :data:`PUSH_ROUND` (a pipelined push's wait
#: for a round's chunk).
ERROR_FIELDS = ("status", "barrier", "peer", "block", "rank")
#: Each field's word in a record (the status first: a kernel publishes a record by its status).
ERROR_FIELD = {name: i for i, name in enumerate(ERROR_FIELDS)}
assert ERROR_FIELD["status"] == 0
LAMPORT_EXCHANGE, DATA_PHASE, FLAG_WAIT, PUSH_ROUND = 2, 3, 4, 5
#: The error records, each of :data:`ERROR_FIELDS`: the first for what leaves the communicator
#: unusable (a timeout of a collective), the second for what the host clears and raises while
#: the communicator stays usable (a size mismatch, a stream flag's timeout), so that clearing
#: one never erases the other.
FATAL_RECORD, RECOVERABLE_RECORD = 0, 1
ERROR_RECORDS = 2
#: Values of the record's status word (``CLAIMED``: a kernel is writing the other fields).
TIMEOUT, SIZE_MISMATCH, CLAIMED = 1, 2, -1


# -- the all-to-all's slots -----------------------------------------------------------------------



U32 = 1 << 32
#: The size word of a pair that cannot be sent (never equal to any size, itself included).
REFUSED = U32 - 1
#: The most elements one chunk (one pair's data in one call) may hold.
MAX_CHUNK = REFUSED - 1
#: Error-record phase codes: a wait for a receiver's ``ready``, for a sender's ``arrived``
#: (after :data:`~collectives.layouts.PUSH_ROUND`), and a ready whose place lies in another
#: allocation than the sender's.
READY_WAIT, ARRIVED_WAIT, PLACE_MISMATCH = 6, 7, 8
#: The regions' exchange's (:class:`RegionLayout`): a source's wait before it stores (its
#: receiver's ``arrived`` of the call before, :func:`may_store`) and a receiver's wait for a
#: source's rows (:func:`judge_region`).
REGION_STORE_WAIT, REGION_WAIT = 9, 10
PHASES = {READY_WAIT: "all-to-all ready wait", ARRIVED_WAIT: "all-to-all data wait",
          REGION_STORE_WAIT: "regions' exchange: wait for the receiver's previous call",
          REGION_WAIT: "regions' exchange: wait for a source's rows",
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


def judge_within(word: int, calls: int, low: int, high: int) -> int:
    """:func:`judge` in a bounded all-to-all: a size in ``[low, high]`` passes (never
    :data:`REFUSED`), any other is ``SIZE_MISMATCH``.  The sender judges the receiver's
    ``ready`` (its capacity) with ``low`` its own size, the receiver the sender's ``arrived``
    (the size sent) with ``high`` its capacity."""
    size, _ = unpack(word)
    status = judge(word, calls, size)
    if status == 0 and not low <= size <= high:
        return SIZE_MISMATCH
    return status


def slot(n: int, row: int, world: int) -> int:
    """Elements each source may send a rank in a bounded all-to-all whose output holds ``n``
    elements of rows of ``row``: a ``world``-th of its whole rows (at most :data:`MAX_CHUNK`
    elements); source ``s``'s chunk lands at element ``s * slot``.  0 where rows are empty."""
    rows = n // row // world if row > 0 else 0
    return min(rows, MAX_CHUNK // max(row, 1)) * row


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


# -- the regions' exchange (designed for the two-kernel MoE layer; no kernel uses it yet) ---------
#
# A sending kernel stores each peer's rows straight into the peer's symmetric receive
# allocation and a receiving kernel, launched after it, waits for them: no ``ready`` round
# trip and no staging.  The allocation is ``2 x world`` fixed regions of ``region_bytes``
# (:class:`RegionLayout`): half :func:`call_parity` ``(C)`` for the call at count ``C`` (a count of
# the exchange's own, advanced by :data:`~collectives.config.CALL_EPOCHS` a call as every count
# is, so that the signals' :func:`~collectives.device.signals.enter_call` and ``leave_call``
# keep it), region ``s`` in it for
# source ``s``'s rows, row ``i`` at ``i x row_bytes``.  The regions' bytes come from the
# allocation (the same on every rank: a symmetric allocation), not from a call's shape, so a
# sender whose shape disagrees with the receiver's still stores inside its own region of the
# call's half, which nothing else reads in that call.
#
# Each (half, source) has two 64-bit words in the receiver's word region, written by the
# source: ``facts`` (plain: what its rows are, :func:`region_facts`), then ``arrived``
# (``st.release.sys``: ``rows << 32 | epoch``, the epoch ``C + 1``, :func:`pack`), after all its
# stores.  Why the call's half is free when source ``s`` stores into it: receiver ``r`` last
# read it in the call before last, and before sending this call the source sees ``r``'s
# ``arrived`` of the call before in its own words (:func:`may_store`), which ``r`` released
# after its receive of the call before last (stream order).  Usually that has already passed
# (the source's own receive of the call before waited for that word); where that wait timed
# out, it is waited for again, bounded, and on a timeout the source refuses the pair
# (``arrived`` of :data:`REFUSED` rows, nothing stored).  So a source is at most one call ahead of a receiver's reads, each half's words hold
# the call before last's epoch or this call's, and a word past the call comes only from a
# source that refused a later call after a timeout: :func:`judge_region` judges it a timeout.


def region_facts(row_bytes: int, kind: int) -> int:
    """The ``facts`` word of a source's rows: ``kind << 32 | row_bytes`` (``kind``: what a row
    holds, e.g. the dtype's index and fp8; both ends compare it whole)."""
    if not 0 <= row_bytes < U32 or not 0 <= kind < U32:
        raise ValueError(f"row bytes and kind are unsigned 32-bit values, not ({row_bytes}, {kind})")
    return kind << 32 | row_bytes


@dataclass(frozen=True)
class RegionLayout:
    """One rank's receive allocation (bytes) and word region (uint32 units; every entry 64-bit)
    of a regions' exchange among ``world`` ranks, ``region_bytes`` a source (a multiple of 16).
    The words are zeroed or seeded (:meth:`seeded`) once and never reset."""

    world: int
    region_bytes: int

    def __post_init__(self) -> None:
        if not 1 <= self.world <= MAX_WORLD or self.region_bytes <= 0 or self.region_bytes % 16:
            raise ValueError(f"a regions' exchange has 1..{MAX_WORLD} ranks and regions of a positive multiple of "
                             f"16 bytes, not {self.world} and {self.region_bytes}")

    @property
    def bytes(self) -> int:
        """The receive allocation's bytes (two halves of ``world`` regions)."""
        return 2 * self.world * self.region_bytes

    def region(self, half: int, source: int) -> int:
        """The byte offset of ``source``'s region in half ``half``."""
        return (half * self.world + source) * self.region_bytes

    def capacity(self, row_bytes: int) -> int:
        """Rows of ``row_bytes`` a region holds."""
        return self.region_bytes // row_bytes if row_bytes > 0 else 0

    def arrived(self, half: int, source: int) -> int:
        """The ``arrived`` word ``source`` releases into this (receiver's) region."""
        return 4 * (half * self.world + source)

    def facts(self, half: int, source: int) -> int:
        """The ``facts`` word ``source`` stores before that release."""
        return self.arrived(half, source) + 2

    @property
    def counter(self) -> tuple[int, int]:
        """The words of this rank's count of the exchange's calls and of its receiving
        kernel's tickets (:func:`~collectives.device.signals.enter_call`'s ``counter``)."""
        return 8 * self.world, 8 * self.world + 1

    @property
    def send_tickets(self) -> int:
        """The word of the sending kernel's tickets (its last block posts every ``arrived``)."""
        return self.counter[1] + 1

    def refused(self, receiver: int) -> int:
        """The word a block of the sending kernel whose wait for ``receiver`` timed out sets
        (so that the last block refuses the pair, whatever its own wait saw; it clears it)."""
        return self.send_tickets + 1 + receiver

    @property
    def words(self) -> int:
        return self.refused(self.world)

    def seeded(self, calls: int) -> dict[int, int]:
        """The words (by offset) of a rank whose count starts at ``calls`` (a multiple of
        :data:`~collectives.config.CALL_EPOCHS`; the test hook starts counts near the 2^32
        wrap): the count, and ``arrived`` words as if every source had sent the two calls
        before (0 rows), so the first two calls find their halves free."""
        before = [(calls - back * CALL_EPOCHS) % U32 for back in (1, 2)]
        return {self.counter[0]: calls % U32, **{self.arrived(call_parity(c), s): pack(0, c + 1)
                                                 for c in before for s in range(self.world)}}

    def seeded_words(self, calls: int) -> dict[int, int]:
        """:meth:`seeded` as the uint32 words a host writes (by offset): a 64-bit word's low
        half at its offset, its high half after it; the count one word."""
        words = {}
        for offset, value in self.seeded(calls).items():
            words[offset] = value % U32
            if offset != self.counter[0]:
                words[offset + 1] = value >> 32
        return words


def may_store(word: int, calls: int) -> bool:
    """Whether a source at count ``calls`` may store into a receiver's half of the call,
    having read ``word``, the receiver's ``arrived`` of the other half in its own words: the
    receiver has sent the call before (its epoch, ``calls - CALL_EPOCHS + 1``, reached), so it
    has finished reading the call before last, the last one in this half."""
    return reached(unpack(word)[1], (calls - CALL_EPOCHS + 1) % U32)


def judge_region(word: int, facts: int, calls: int, expected_facts: int, capacity: int,
                 expected_rows: int | None = None) -> tuple[int, int]:
    """(status, rows) of a receiver's wait at count ``calls`` that ended on ``word``, with the
    ``facts`` word read after it: 0 with the rows sent; ``TIMEOUT`` where the epoch is not this
    call's (not reached by the deadline, or past the call) or the source refused after a
    timeout; ``SIZE_MISMATCH`` where the facts differ, the rows pass the region's
    ``capacity`` (the source stored none), or differ from ``expected_rows`` (where the receiver
    knows them: a combine's rows come back as the dispatch sent them)."""
    rows, epoch = unpack(word)
    if epoch != (calls + 1) % U32 or rows == REFUSED:
        return TIMEOUT, 0
    if facts != expected_facts or rows > capacity or expected_rows is not None and rows != expected_rows:
        return SIZE_MISMATCH, 0
    return 0, rows


# -- kernel arguments -----------------------------------------------------------------------------

#: The types a kernel argument may have (the names of their CuTeDSL types): the host passes a
#: Python int for each, the kernel reads a signed integer of as many bits.
ARG_TYPES = {"Int32": 32, "Int64": 64}


@dataclass(frozen=True)
class Arg:
    """One runtime argument: its name in kernels and on the host, its type (one of
    :data:`ARG_TYPES`: given as the CuTeDSL type or its name, kept as the name), what it holds."""

    name: str
    type: str
    meaning: str

    def __post_init__(self) -> None:
        name = getattr(self.type, "__name__", self.type)
        if name not in ARG_TYPES:
            raise TypeError(f"argument {self.name}: its type must be one of {', '.join(ARG_TYPES)}, not {self.type!r}")
        object.__setattr__(self, "type", name)


@dataclass(frozen=True)
class Layout:
    """The arguments of one kind of kernel, in launch order.  ``emulated``: the argument that
    carries a translation table under a multicast emulation (the launcher hands the body that
    table's first fake multicast base in its place)."""

    name: str
    args: tuple[Arg, ...]
    emulated: str = ""

    @cached_property
    def index(self) -> dict[str, int]:
        return {a.name: i for i, a in enumerate(self.args)}

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def pack(self, **values: int) -> tuple[int, ...]:
        """The host's launch arguments in order, given every one by name."""
        if values.keys() != self.index.keys():
            raise TypeError(f"{self.name}: missing {sorted(set(self.index) - set(values))}, "
                            f"unknown {sorted(set(values) - set(self.index))}")
        return tuple(map(values.__getitem__, self.names))

    def template(self, fixed: dict[str, int], *per_call: str) -> tuple[list[int], tuple[int, ...]]:
        """The launch arguments in order, ``fixed``'s given and the ``per_call`` ones 0, and the
        places of those (in that order): a launch prepared once copies the list and sets them at
        each call (the MoE kernels': no dictionary and no Python frame per call).  Every argument
        must be named once, else TypeError."""
        named = list(fixed) + list(per_call)
        if sorted(named) != sorted(self.names):
            raise TypeError(f"{self.name}: the fixed and per-call arguments must name each of {list(self.names)} "
                            f"once, not {named}")
        return [fixed.get(n, 0) for n in self.names], tuple(self.index[n] for n in per_call)

    def renamed(self, name: str, **replacements: Arg) -> Layout:
        """This layout with the arguments named in ``replacements`` replaced (same types)."""
        args = tuple(replacements.get(a.name, a) for a in self.args)
        assert [a.type for a in args] == [a.type for a in self.args]
        emulated = replacements[self.emulated].name if self.emulated in replacements else self.emulated
        return Layout(name, args, emulated)


COLLECTIVE = Layout("CollectiveArgs", (
    Arg("data_table", "Int64", "device table of every rank's data buffer address (int64[W])"),
    Arg("data_mc", "Int64", "the data buffer's multicast address (0 on the peer backend; emulated: its translation "
                            "table of two windows, the data buffer's and the signal pad's)"),
    Arg("out", "Int64", "this rank's output (one-shot all-reduce, reduce-scatter, gathered two-shot/TMA, all-gather)"),
    Arg("src", "Int64", "this rank's input (stage_in: copied in-kernel; push and all-gather: pushed; 0: in place)"),
    Arg("n", "Int64", "elements per rank (all-reduce, all-gather's input) or per output (reduce-scatter)"),
    Arg("kinds", "Int32", "the call's signature (collectives.algorithms.Call.signature: the kinds of the caller's "
                          "tensors, its collective, dtype and op), brought to the barriers with n in their size word"),
    Arg("pad_table", "Int64", "device table of every rank's signal pad"),
    Arg("pad_mc", "Int64", "the signal pad's multicast address (0 on the peer backend)"),
    Arg("pad", "Int64", "this rank's signal pad (its entry of pad_table, saving the kernel a load)"),
    Arg("err", "Int64", "the error records (host-mapped int32[2][5], collectives.layouts.ERROR_FIELDS)"),
    Arg("rank", "Int32", "this rank"),
    Arg("timeout_ns", "Int64", "the bound of every wait, in nanoseconds of %globaltimer"),
), emulated="data_mc")

#: The push all-reduce (:mod:`collectives.algorithms.push`): no multicast address of its
#: receive slots (its pushes are plain stores), but the table of every rank's result buffer.
PUSH_ALL_REDUCE = COLLECTIVE.renamed("PushAllReduceArgs", data_mc=Arg(
    "results", "Int64", "device table of every rank's result buffer (emulated: its translation table of two "
                        "windows, the result buffers' and the signal pad's)"))

#: The stream-flag kernels (:mod:`collectives.algorithms.flags`): one thread, one GPU.
FLAGS = Layout("FlagArgs", (
    Arg("flags", "Int64", "each slot's count of posts (int32[FLAG_SLOTS])"),
    Arg("consumed", "Int64", "each slot's count of posts its consumer took"),
    Arg("index", "Int32", "the slot"),
    Arg("err", "Int64", "the error records"),
    Arg("rank", "Int32", "this rank"),
    Arg("timeout_ns", "Int64", "the bound of a wait"),
))


__all__ = ["ARG_TYPES", "ARRIVED_WAIT", "Arg", "CLAIMED", "COLLECTIVE", "DATA_PHASE", "DTYPE_BITS", "ERROR_FIELD",
           "ERROR_FIELDS", "ERROR_RECORDS", "ExchangeLayout", "FATAL_RECORD", "FLAGS", "FLAG_WAIT",
           "LAMPORT_EXCHANGE", "Layout", "MAX_CHUNK", "PHASES", "PLACE_BITS", "PLACE_MISMATCH",
           "PUSH_ALL_REDUCE", "PUSH_ROUND", "PadLayout", "READY_WAIT", "RECOVERABLE_RECORD", "REFUSED",
           "REGION_STORE_WAIT", "REGION_WAIT", "RegionLayout", "SIZE_MISMATCH", "TIMEOUT", "U32", "announced",
           "call_last", "call_parity", "chunk", "judge", "judge_region", "judge_within", "may_store", "pack", "part",
           "place", "reached", "receiving", "region_facts", "slot", "unpack", "unplace"]
