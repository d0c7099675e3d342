"""Cross-GPU signals and barriers over a symmetric signal pad, built from ptxops.

Every rank owns a pad of uint32 words (see :class:`collectives.layouts.PadLayout`); the pad is
zeroed once and never reset.  A rank counts its collective calls in the pad (``C``, a multiple
of :data:`~collectives.config.CALL_EPOCHS`, read at a kernel's start by :func:`enter_call` and
advanced once per call by :func:`leave_call`, whatever the call's grid), and the blocks of a
call signal epochs ``C + 1 .. call_last(C)``: rank ``src``'s block ``b`` announces epoch ``e``
by writing ``size << 32 | e`` into its 64-bit arrival word of block ``b`` in every rank's pad
(peer flavour: one ``st.release.sys`` per peer; multicast flavour: one
``multimem.st.release.sys``), and a waiter polls its own pad and compares wrap-safely
(``int32(seen - want) >= 0``), so nothing is ever reset.

Why a count of calls and not a count per block: a call whose sizes differ across ranks may
launch grids of different sizes (one-shot f32 of 2048 elements: one block; of 2056: two); a
count per block would then advance on some ranks only, and a later call's wait would pass on
a stale word.  Every call advances ``C`` by the same step on every rank, whatever ran.  Its
cost is one ``atom.add.acq_rel.gpu`` per block of a kernel of several blocks, issued at the
start (its result is used at the end, so its latency hides behind the kernel's work); a
one-block kernel (the barrier, the smallest collectives) takes no ticket and costs what the
count per block did: one load at the start, one store at the end.  A grid that never depends
on the size would cost every small collective hundreds of blocks' barriers, and repairing the
counts after a mismatch would need a collective step on the host.

Why two arrival slots, alternating by call (:func:`~collectives.layouts.call_parity`): a rank's
words of call ``C`` stay there until it starts the call after next, which it can do only
after every rank has entered the next call (each call's first wait waits for every rank's
first signal, whatever its size).  So a waiter always finds every rank's word of its own call,
with that rank's size, and never mistakes a rank that already left the call (perhaps failing
it) for one that passed.

Every wait is bounded by a deadline on ``%globaltimer``; a wait that times out writes an error
record (status, barrier, missing rank, block, rank) that the host turns into
:class:`collectives.CollectiveTimeout`, and reports failure so the kernel can exit.

A barrier is a :func:`signal_peers` (or :func:`signal_multicast`) and a :func:`wait_peers` of
one epoch; a kernel may use them apart, as a sequence of epochs that every rank's block
announces in the same order (a pipeline: wait for the peers' epoch ``e`` while its own later
work is in flight).

A buffer's multicast address and its unicast addresses are virtual aliases, which the PTX
memory model treats as different proxies: the multicast flavour's wait ends with
``fence.proxy.alias`` in every polling thread, so that every path from an access through one
address before a rank's signal to an access through the other after our wait crosses an alias
proxy fence (docs/guide-memory-ordering.md, "Multicast and unicast addresses of one buffer").

These are ``@cute.jit`` functions: call them from your own ``@cute.kernel``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32, Uint64

import ptxops

from ..config import CALL_EPOCHS, LAMPORT_WIDTHS
from ..layouts import (
    CLAIMED,
    ERROR_FIELD,
    ERROR_FIELDS,
    FATAL_RECORD,
    FLAG_WAIT,
    LAMPORT_BLOCKS,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
    PadLayout,
    call_last,
    call_parity,
    lamport_buffer,
    lamport_cleanup_call,
    lamport_epoch,
    lamport_next,
    lamport_tag,
)


#: The reaches (:func:`ptxops.reach`) of the memory collectives' kernels address: a buffer or
#: signal-pad word another GPU reads or writes (a peer's, or ours that peers write), a multicast
#: address, this GPU's own words (tables, call counts, stream flags, outputs) and the
#: host-mapped error record.  Every ordered access to them is checked against its reach.
PEER, MULTICAST, LOCAL, HOST = "peer", "multicast", "gpu", "host"


@cute.jit
def gmem(dtype: cutlass.Constexpr, address: Int64, align: cutlass.Constexpr = 16,
         reach: cutlass.Constexpr = None, by: cutlass.Constexpr = None) -> cute.Pointer:
    """A global-memory pointer of ``dtype`` at a 64-bit device address; with ``reach``
    (:data:`PEER`, :data:`MULTICAST`, :data:`LOCAL`, :data:`HOST`) tagged with it
    (:func:`ptxops.reach`, ``by`` naming the function that knows what the address is).  Moved
    by ``+``, it loads signed integers (``Int64`` for ``Uint64``) unless ``ptxops.ld`` is given
    ``dtype=``: a ``>>`` of such a value is arithmetic (``shr.s64``)."""
    ptr = cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)
    if cutlass.const_expr(reach is not None):
        ptr = ptxops.reach(ptr, reach, by=by)
    return ptr


@cute.jit
def peer_address(table: Int64, rank: Int32) -> Int64:
    """Entry ``rank`` of a device table of 64-bit addresses (one per rank)."""
    return ptxops.ld(gmem(Int64, table, 8, LOCAL, "collectives.device.signals.peer_address") + rank, dtype=Int64)


@cute.jit
def size_word(n: Int64, kinds: Int32) -> Uint32:
    """The size a rank brings to a call's barriers: its element count ``n`` (below 2^29, the
    host's :data:`~collectives.config.MAX_ELEMENTS`) XOR its call's signature ``kinds``
    (:func:`collectives.algorithms.base.signature`: the kinds of its tensors in the top bits,
    the collective, dtype and op below them): ranks whose tensors differ in kind may have
    planned different kernels, ranks of different dtypes would move different bytes, and
    either fails the call as a size mismatch."""
    return Uint32(n) ^ Uint32(kinds)


@cute.jit
def reached(seen: Uint32, want: Uint32) -> Boolean:
    """Wrap-safe ``seen >= want`` for monotonic 32-bit epochs."""
    return Int32(seen - want) >= 0


@cute.jit
def spin(probe, done, deadline: Int64):
    """The bounded spin-wait: ``x = probe()`` again until ``done(x)`` or ``%globaltimer`` passes
    ``deadline``; the last ``x``.  ``probe`` (an acquiring load, an ``mbarrier.try_wait``) and
    ``done`` are traced inline, at each place of the loop."""
    x = probe()
    while not done(x) and cute.arch.globaltimer() < deadline:
        x = probe()
    return x


@cute.jit
def wait_until(flag: cute.Pointer, want: Uint32, deadline: Int64, scope: cutlass.Constexpr = "sys") -> Boolean:
    """Poll ``flag`` with acquire loads at ``scope`` (``sys`` when the writer is another GPU)
    until it reaches ``want`` (wrap-safe) or ``%globaltimer`` passes ``deadline``; True if it
    was reached."""
    seen = spin(lambda: ptxops.ld_acquire(flag, scope=scope, dtype=Uint32), lambda x: reached(x, want), deadline)
    return reached(seen, want)


@cute.jit
def signal(pad: Int64, offset: Int32, value: Uint32) -> None:
    """Publish ``value`` at word ``offset`` of the pad at ``pad`` (a peer's or our own): a
    release store at sys scope, so everything this thread saw before is visible to a waiter
    whose acquire reads it."""
    ptxops.st_release(gmem(Uint32, pad, 4, PEER, "collectives.device.signals.signal") + offset, value, scope="sys")


@cute.jit
def record_error(err: Int64, status: Int32, barrier: Int32, peer: Int32, block: Int32, rank: Int32) -> None:
    """Write an error record once: the fatal record for a collective's timeout, the
    recoverable one for a size mismatch or a stream flag's timeout (``barrier``
    :data:`~collectives.layouts.FLAG_WAIT`), so that the host's clearing of the second never
    erases the first.  The first failure claims the record (compare-and-swap of its status to
    :data:`~collectives.layouts.CLAIMED`), stores the fields, then publishes the status with a
    sys-scope release: a host that reads the status reads the fields of the same failure."""
    index = Int32(RECOVERABLE_RECORD)
    if status == Int32(TIMEOUT) and barrier != Int32(FLAG_WAIT):
        index = Int32(FATAL_RECORD)
    record = gmem(Int32, err, 4, HOST, "collectives.device.signals.record_error") + index * len(ERROR_FIELDS)
    if ptxops.atom_cas(record, Int32(0), Int32(CLAIMED), sem="relaxed", scope="sys") == 0:
        ptxops.st(record + ERROR_FIELD["barrier"], barrier, sem="relaxed", scope="sys")
        ptxops.st(record + ERROR_FIELD["peer"], peer, sem="relaxed", scope="sys")
        ptxops.st(record + ERROR_FIELD["block"], block, sem="relaxed", scope="sys")
        ptxops.st(record + ERROR_FIELD["rank"], rank, sem="relaxed", scope="sys")
        ptxops.st_release(record, status, scope="sys")  # (the status: the record's first word)


@cute.jit
def enter_call(pad: Int64, world: cutlass.Constexpr, single: cutlass.Constexpr = False,
               counter: cutlass.Constexpr = None) -> tuple:
    """(``C``, whether this block is the last of the call to have read it): every thread
    reads the rank's call count ``C``; in a kernel of several blocks thread 0 then takes a
    ticket (``atom.add.acq_rel.gpu``, after a ``bar.sync`` that puts the block's reads before
    it), and the block whose ticket completes the grid advances ``C`` in :func:`leave_call`
    (its acquire orders that store after every block's read).  ``single``: the kernel always
    runs one block (no ticket code at all).  ``counter``: the word offsets (count, tickets)
    of a count of its own at ``pad`` (default: the signal pad's, :class:`PadLayout`)."""
    layout = PadLayout(world=world)
    count, tickets = counter if cutlass.const_expr(counter is not None) else (layout.calls, layout.tickets)
    words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.enter_call")
    calls = ptxops.ld(words + count, dtype=Uint32)
    blocks = cute.arch.grid_dim()[0]
    last = Boolean(True)
    if cutlass.const_expr(not single) and blocks > 1:
        cute.arch.sync_threads()
        if cute.arch.thread_idx()[0] == 0:
            ticket = ptxops.atom_add(words + tickets, Uint32(1), sem="acq_rel", scope="gpu")
            last = ticket == Uint32(blocks - 1)
    return calls, last


@cute.jit
def leave_call(pad: Int64, calls: Uint32, last: Boolean, world: cutlass.Constexpr,
               single: cutlass.Constexpr = False, counter: cutlass.Constexpr = None) -> None:
    """In thread 0 of the call's last block: the tickets back to 0 and ``C`` on by
    :data:`~collectives.config.CALL_EPOCHS` (plain stores: the next kernel reads them after
    this one ends; ``single`` and ``counter`` as for :func:`enter_call`)."""
    layout = PadLayout(world=world)
    count, tickets = counter if cutlass.const_expr(counter is not None) else (layout.calls, layout.tickets)
    words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.leave_call")
    if cute.arch.thread_idx()[0] == 0 and last:
        if cutlass.const_expr(not single) and cute.arch.grid_dim()[0] > 1:
            ptxops.st(words + tickets, Uint32(0))
        ptxops.st(words + count, calls + Uint32(CALL_EPOCHS))


@cute.jit
def arrival_word(pad: Int64, calls: Uint32, block: Int32, src: Int32, world: cutlass.Constexpr,
                 reach: cutlass.Constexpr = PEER) -> cute.Pointer:
    """Rank ``src``'s 64-bit arrival word of block ``block`` in the pad at ``pad``, in the slot
    of the call at count ``calls``: a word other GPUs write or read (``reach``
    :data:`MULTICAST` for the pad's multicast address)."""
    layout = PadLayout(world=world)
    word = gmem(Uint64, pad, 8, reach, "collectives.device.signals.arrival_word")
    return word + layout.arrival(Int32(call_parity(calls)), block, src) // 2


@cute.jit
def in_call(epoch: Uint32, calls: Uint32) -> Boolean:
    """Whether ``epoch`` is one of the call at count ``calls`` (in ``calls + 1 ..
    call_last(calls)``, wrap-safe)."""
    return not reached(calls, epoch) and reached(Uint32(call_last(calls)), epoch)


@cute.jit
def gave_up(calls: Uint32) -> Uint32:
    """The epoch a rank that gave up on the call at count ``calls`` leaves in its arrival word:
    ``call_last(calls) + 1``, reached by every wait of the call and in none of its epochs."""
    return Uint32(call_last(calls)) + Uint32(1)


@cute.jit
def signal_peers(
    pad_table: Int64,
    rank: Int32,
    block: Int32,
    calls: Uint32,
    epoch: Uint32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> None:
    """Announce ``epoch`` of thread block ``block`` to every rank: threads ``t < world`` each
    load rank ``t``'s pad address and give it one 64-bit ``st.release.sys`` of ``size << 32 |
    epoch`` at our arrival word (arrival and size in one store).  With ``sync`` a ``bar.sync``
    first carries the block's earlier accesses into the release (drop it only where the block
    made none in this kernel)."""
    tidx = cute.arch.thread_idx()[0]
    if cutlass.const_expr(sync):
        cute.arch.sync_threads()
    if tidx < world:
        word = (Uint64(size) << 32) | Uint64(epoch)
        ptxops.st_release(arrival_word(peer_address(pad_table, tidx), calls, block, rank, world), word, scope="sys")


@cute.jit
def signal_multicast(
    mc_pad: Int64,
    rank: Int32,
    block: Int32,
    calls: Uint32,
    epoch: Uint32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> None:
    """:func:`signal_peers` through the pad's multicast address: thread 0 gives our arrival
    word on every rank one ``multimem.st.release.sys`` of ``size << 32 | epoch``, then a
    ``fence.proxy.alias``: our own word is polled next through the unicast address."""
    if cutlass.const_expr(sync):
        cute.arch.sync_threads()
    if cute.arch.thread_idx()[0] == 0:
        word = (Uint64(size) << 32) | Uint64(epoch)
        ptxops.multimem_st(arrival_word(mc_pad, calls, block, rank, world, MULTICAST), word, sem="release", scope="sys")
        ptxops.fence(proxy="alias")


@cute.jit
def wait_peers(
    peers: Int64,
    pad: Int64,
    rank: Int32,
    block: Int32,
    calls: Uint32,
    want: Uint32,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
    alias: cutlass.Constexpr = False,
) -> Boolean:
    """Wait until every rank's block ``block`` has announced ``want`` in the call at count
    ``calls``: threads ``t < world`` poll their own pad (no table load) for rank ``t``'s word
    with ``ld.acquire.sys`` until its epoch reaches ``want`` (wrap-safe) or ``%globaltimer``
    passes ``deadline``.

    The word is rank ``t``'s of this call (the slots alternate by call, see the module), so
    the size it carries is rank ``t``'s for this call: compared with ours.  An epoch past
    :func:`~collectives.layouts.call_last` would be a rank two calls ahead, which only a rank
    that gave up on a timeout can be: recorded as a timeout.  A block other than 0 also
    watches rank ``t``'s block 0 while it waits (block 0 runs on every rank): once that has
    signalled this call with another size, rank ``t``'s grid may lack this block, and the wait
    ends with a size mismatch instead of the deadline.  A thread that gives up on rank ``t``
    (a timeout) then tells it: it overwrites our arrival word with the epoch just past the call
    (:func:`gave_up`) in rank ``t``'s pad (``peers``: the pad table) or, in the multicast
    flavour (``alias``; ``peers``: the pad's multicast address, whose words arrive through it),
    in every rank's with one ``multimem.st``.  A wait of this call takes that epoch for a rank
    that left it, a timeout, at once: a rank that arrives after its peers gave up fails too
    instead of passing on their signals (as NCCL's abort reaches every rank).  ``alias``:
    ``fence.proxy.alias`` after the wait.  The
    caller's sync after the wait carries the acquire (and the fence) to the other threads.
    Returns (in threads ``t < world``) whether rank ``t`` arrived before the deadline with the
    same size; a failure is written to the error record (``which``: the barrier or phase it
    names)."""
    tidx = cute.arch.thread_idx()[0]
    ok = Boolean(True)
    if tidx < world:
        own = arrival_word(pad, calls, block, tidx, world)
        head = arrival_word(pad, calls, Int32(0), tidx, world)
        seen = ptxops.ld_acquire(own, scope="sys", dtype=Uint64)
        other = Boolean(False)  # rank t's block 0 signalled this call with another size
        while not reached(Uint32(seen & Uint64(0xFFFFFFFF)), want) and not other and cute.arch.globaltimer() < deadline:
            if block > 0:
                first = ptxops.ld(head, sem="relaxed", scope="sys", dtype=Uint64)
                other = in_call(Uint32(first & Uint64(0xFFFFFFFF)), calls) and Uint32(first >> 32) != size
            seen = ptxops.ld_acquire(own, scope="sys", dtype=Uint64)
        epoch = Uint32(seen & Uint64(0xFFFFFFFF))
        if cutlass.const_expr(alias):
            ptxops.fence(proxy="alias")
        status = Int32(0)
        if not reached(epoch, want) and other:
            status = Int32(SIZE_MISMATCH)
        elif not reached(epoch, want) or not in_call(epoch, calls):
            status = Int32(TIMEOUT)
        elif Uint32(seen >> 32) != size:
            status = Int32(SIZE_MISMATCH)
        if status != 0:
            ok = Boolean(False)
            record_error(err, status, which, tidx, block, rank)
        if status == Int32(TIMEOUT):
            word = (Uint64(size) << 32) | Uint64(gave_up(calls))
            if cutlass.const_expr(alias):
                ptxops.multimem_st(arrival_word(peers, calls, block, rank, world, MULTICAST), word, sem="release",
                                   scope="sys")
            else:
                ptxops.st_release(arrival_word(peer_address(peers, tidx), calls, block, rank, world), word,
                                  scope="sys")
    return ok


@cute.jit
def barrier_peer(
    pad_table: Int64,
    pad: Int64,
    rank: Int32,
    block: Int32,
    calls: Uint32,
    epoch: Uint32,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> Boolean:
    """Peer-flavour barrier of thread block ``block`` with block ``block`` of every rank:
    :func:`signal_peers` of ``epoch``, then :func:`wait_peers` for it.  Returns (in threads
    ``t < world``) whether rank ``t`` arrived before the deadline with the same size."""
    signal_peers(pad_table, rank, block, calls, epoch, size, world, sync)
    return wait_peers(pad_table, pad, rank, block, calls, epoch, deadline, err, which, size, world)


@cute.jit
def barrier_multicast(
    mc_pad: Int64,
    pad: Int64,
    rank: Int32,
    block: Int32,
    calls: Uint32,
    epoch: Uint32,
    deadline: Int64,
    err: Int64,
    which: Int32,
    size: Uint32,
    world: cutlass.Constexpr,
    sync: cutlass.Constexpr = True,
) -> Boolean:
    """Multicast-flavour barrier: :func:`signal_multicast` of ``epoch`` (one
    ``multimem.st.release.sys`` to every rank), a ``bar.sync``, then :func:`wait_peers` for
    it, ending with ``fence.proxy.alias``.  The words are the peer flavour's, so a size travels
    with its epoch (no later barrier overwrites it before a slower rank reads it) and there is
    no shared counter whose count of passed barriers would have to survive the 2^32 wrap for
    world sizes that do not divide it.  The ``bar.sync`` puts thread 0's signal (and its alias
    fence) before the store by which another thread that gives up overwrites the same word
    (:func:`gave_up`): in the peer flavour one thread makes both stores."""
    signal_multicast(mc_pad, rank, block, calls, epoch, size, world, sync)
    cute.arch.sync_threads()
    return wait_peers(mc_pad, pad, rank, block, calls, epoch, deadline, err, which, size, world, alias=True)


@cute.jit
def lamport_counts(pad: Int64, world: cutlass.Constexpr) -> list:
    """Our Lamport call count of each element width (part 0's: between kernels every part's is
    the same), for :func:`lamport_missed`: read before any thread of the kernel may store it."""
    layout = PadLayout(world=world)
    words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.lamport_counts")
    return [ptxops.ld(words + layout.lamport_step(width, 0), dtype=Uint32) for width in range(LAMPORT_WIDTHS)]


@cute.jit
def lamport_missed(pad: Int64, calls: Uint32, counts: list, world: cutlass.Constexpr) -> None:
    """In thread ``t < world`` of a bare barrier (an empty rank's, one block) whose wait for rank
    ``t`` failed in the call at count ``calls``: if rank ``t`` ran a Lamport kernel of width ``w``
    there (its arrival word's epoch is
    :func:`~collectives.layouts.lamport_epoch`), our count of ``w`` moves on as that kernel's did
    (:func:`lamport_skip` from ``counts[w]``, read by :func:`lamport_counts` before any thread
    stores it: several threads store the same words).  So the ranks' Lamport counts stay equal."""
    tidx = cute.arch.thread_idx()[0]
    if tidx < world:
        word = ptxops.ld(arrival_word(pad, calls, Int32(0), tidx, world), sem="relaxed", scope="sys", dtype=Uint64)
        epoch = Uint32(word & Uint64(0xFFFFFFFF))
        for width in cutlass.range_constexpr(LAMPORT_WIDTHS):
            if in_call(epoch, calls) and epoch == Uint32(lamport_epoch(calls, width)):
                lamport_skip(pad, width, counts[width], world)


@cute.jit
def lamport_skip(pad: Int64, width: cutlass.Constexpr, call: Uint32, world: cutlass.Constexpr) -> None:
    """Our Lamport count of ``width`` (a constant, or an ``Int32`` in :func:`lamport_missed_start`;
    ``call``, every part's) moved on as a Lamport kernel of
    that width moved its own, in a call where a peer ran one and we did not, and the buffer
    that kernel sent into marked dirty (emptied by
    :func:`~collectives.layouts.lamport_cleanup_call`, as a Lamport kernel's size mismatch marks it)."""
    layout = PadLayout(world=world)
    words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.lamport_skip")
    ptxops.st(words + (layout.lamport_dirty(width, 0) + Int32(lamport_buffer(call))),
              Uint32(lamport_tag(lamport_cleanup_call(call))))
    part = Int32(0)
    while part < LAMPORT_BLOCKS:
        ptxops.st(words + (layout.lamport_step(width, 0) + part), Uint32(lamport_next(call)))
        part += 1


@cute.jit
def lamport_missed_any(pad: Int64, calls: Uint32, world: cutlass.Constexpr, own: cutlass.Constexpr) -> None:
    """In thread 0 of block 0 of a Lamport kernel of width ``own`` whose size check failed in
    the call at count ``calls`` (ranks of different dtypes): for each other Lamport element width
    that some rank ran there (its arrival word's epoch is
    :func:`~collectives.layouts.lamport_epoch`), our count moves on as that kernel's did, once
    (:func:`lamport_skip`; one thread reads and stores the counts: no order among threads to
    keep).  Only on a failure: a call whose sizes agree never gets here."""
    if cute.arch.thread_idx()[0] == 0:
        layout = PadLayout(world=world)
        words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.lamport_missed_any")
        for width in cutlass.range_constexpr(LAMPORT_WIDTHS):
            if cutlass.const_expr(width != own):
                ran = Boolean(False)
                for r in cutlass.range_constexpr(world):
                    word = ptxops.ld(arrival_word(pad, calls, Int32(0), Int32(r), world), sem="relaxed", scope="sys",
                                     dtype=Uint64)
                    epoch = Uint32(word & Uint64(0xFFFFFFFF))
                    if in_call(epoch, calls) and epoch == Uint32(lamport_epoch(calls, width)):
                        ran = Boolean(True)
                if ran:
                    lamport_skip(pad, width, ptxops.ld(words + layout.lamport_step(width, 0), dtype=Uint32), world)


@cute.jit
def lamport_missed_start(pad_table: Int64, rank: Int32, calls: Uint32, world: cutlass.Constexpr) -> None:
    """In a barriered kernel with data whose start failed in the call at count ``calls`` (called
    on that failure branch only, by every thread; thread 0 of block 0 acts: block 0 runs on every
    rank and waited for every rank's block 0, where a Lamport kernel leaves its arrival word):
    for each Lamport element width that some rank ran there (its ``auto`` picked Lamport: its
    size far from ours), our count of it moves on as that kernel's did, once
    (:func:`lamport_skip`; one thread reads and stores the counts: no order among threads to
    keep).  So the ranks' Lamport counts stay equal.  Our pad's address is read from the pad
    table (entry ``rank``) here, and the ranks and widths are run-time loops: nothing of this
    branch is kept live across the kernel's data phase (``ptxas`` registers of the push kernels:
    tests/collectives/algorithms/test_kernel_registers.py)."""
    if cute.arch.block_idx()[0] == 0 and cute.arch.thread_idx()[0] == 0:
        pad = peer_address(pad_table, rank)  # (our pad, read here: none of its addresses kept live)
        layout = PadLayout(world=world)
        words = gmem(Uint32, pad, 4, LOCAL, "collectives.device.signals.lamport_missed_start")
        ran = Uint32(0)  # bit w: some rank ran width w
        base = arrival_word(pad, calls, Int32(0), Int32(0), world)  # (rank r's: base + r)
        r = Int32(0)
        while r < world:
            word = ptxops.ld(base + r, sem="relaxed", scope="sys", dtype=Uint64)
            # width w's epoch is lamport_epoch(calls, 0) - w (w < 3); every other epoch is further
            w = Uint32(lamport_epoch(calls, 0)) - Uint32(word & Uint64(0xFFFFFFFF))
            if w < Uint32(3):
                ran = ran | (Uint32(1) << w)
            r += 1
        width = Int32(0)
        while width < 3:
            if (ran >> Uint32(width)) & Uint32(1):
                lamport_skip(pad, width, ptxops.ld(words + layout.lamport_step(width, 0), dtype=Uint32), world)
            width += 1


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


__all__ = ["HOST", "LOCAL", "MULTICAST", "PEER", "arrival_word", "barrier_multicast", "barrier_peer", "block_all",
           "enter_call", "gave_up", "gmem", "in_call", "lamport_counts", "lamport_missed", "lamport_missed_any",
           "lamport_missed_start", "lamport_skip", "leave_call", "peer_address", "reached", "record_error", "signal",
           "signal_multicast", "signal_peers", "size_word", "spin", "wait_peers", "wait_until"]
