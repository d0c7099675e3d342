"""The all-to-all's device protocol as the kernel's own source runs it (CPU, no CuTeDSL compile).

:mod:`device_sim` executes :mod:`collectives.device.all_to_all` (with
:mod:`collectives.device.signals`) and the kernel of :mod:`collectives.algorithms.all_to_all`
from their source files, every GPU thread a simulated thread (blocks scaled down to
:data:`THREADS`), over simulated slot regions, symmetric allocations, split arrays and error
records; each rank's host runs its calls one after the other (its next kernel starts when all
its blocks ended, as a stream runs them), keeps going after a failed call and reads and clears
its error records after each call.  So an edit of the device protocol is an edit of what these
tests run; :mod:`test_exchange_model` restates the protocol in Python to explore interleavings
at scale.

Every call is judged against the host model (:func:`collectives.layouts.chunk`, the
receivers' :func:`~collectives.layouts.receiving`): a pair whose sizes and receive identity
agree delivers its chunk, bit for bit; any other fails on both of its ends as a size mismatch
(the recoverable record), never a timeout, and no byte outside a delivered chunk changes in any
rank's allocation or output.

What a sequentially consistent simulation cannot see (the ``bar.sync`` that carries a block's
stores into the release after it) is pinned in the PTX (``test_block_syncs_before_releases``).
"""

from __future__ import annotations

import random
import types
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, fakes, load, me  # noqa: E402

from collectives import layouts as model  # noqa: E402
from collectives.config import CALL_EPOCHS  # noqa: E402
from collectives.dtypes import DTYPES  # noqa: E402
from collectives.layouts import (  # noqa: E402
    ERROR_FIELDS,
    ERROR_RECORDS,
    FATAL_RECORD,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
)

FAKES = fakes()
Int32, Int64, Uint8, Uint32, Uint64 = (FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8,
                                       FAKES["cutlass"].Uint32, FAKES["cutlass"].Uint64)
U32 = 1 << 32
THREADS = 4  # per block, scaled down: a part's elements outnumber them
PARTS = 2
CANARY = 0xEE
STALE = 0xDD
TIMEOUT_TICKS = 20000
SHORT = 2000  # the bound of runs where every wait times out anyway (a spinning wait costs a step a tick)
ALLOCATION = 1  # the receive allocations' number (the same on every rank)


def kernels(edits: dict | None = None) -> types.SimpleNamespace:
    """The simulated ``signals``, ``exchange`` and ``all_to_all`` modules (``edits``: module ->
    its (old, new) source edits)."""
    edits = edits or {}
    signals = load("collectives.device.signals", FAKES, edits.get("signals", ()))
    exchange = load("collectives.device.all_to_all", {**FAKES, "collectives.device.signals": signals},
                    edits.get("exchange", ()))
    all_to_all = load("collectives.algorithms.all_to_all", {
        **FAKES, "collectives.device": types.SimpleNamespace(all_to_all=exchange, signals=signals),
        "collectives.device.signals": signals,
    }, edits.get("all_to_all", ()))
    return types.SimpleNamespace(signals=signals, exchange=exchange, all_to_all=all_to_all)


SOURCE = kernels()


@dataclass
class Side:
    """One rank's call: its splits (rows of ``row`` elements), dtype, whether it receives
    directly into a symmetric ``out`` (at ``offset`` bytes into its allocation) and the sizes
    of its input and output in rows (default: its splits' sums); ``bounded``: the kernel of
    :attr:`~collectives.algorithms.all_to_all.AllToAllKey.bounded` (``out_splits`` then only
    sizes the output: the kernel overwrites them with the rows received)."""

    in_splits: list
    out_splits: list
    row: int = 2
    dtype: str = "f32"
    direct: bool = False
    offset: int = 0
    in_rows: int | None = None
    out_rows: int | None = None
    parts: int = PARTS
    bounded: bool = False

    def __post_init__(self) -> None:
        if self.in_rows is None:
            self.in_rows = max(0, sum(self.in_splits))
        if self.out_rows is None:
            self.out_rows = max(0, sum(self.out_splits))

    @property
    def bytes(self) -> int:
        return DTYPES[self.dtype].bytes


class World:
    """``world`` ranks, each running ``calls`` (per call, each rank's :class:`Side`), starting
    every count (and slot word) at ``start``, or ``starts[r]`` on rank ``r``."""

    def __init__(self, calls: list, seed: int, start: int = 0, starts: dict | None = None,
                 source: types.SimpleNamespace = SOURCE, timeout: int = TIMEOUT_TICKS, late: dict | None = None) -> None:
        self.calls, self.seed, self.start, self.starts = calls, seed, start, starts or {}
        self.late = late or {}  # rank -> (call, tick): it launches that call no earlier
        self.source, self.timeout = source, timeout
        self.world = world = len(self.calls[0])
        self.sim = sim = Sim(self.seed)
        self.rng = random.Random(self.seed)
        mem = sim.memory
        self.layout = layout = model.ExchangeLayout(world, PARTS)
        self.regions = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.slot_table = mem.alloc(8 * world)
        self.alloc_bytes = 8 + max(s.offset + s.out_rows * s.row * s.bytes for call in self.calls for s in call)
        self.allocations = [mem.alloc(self.alloc_bytes) for _ in range(world)]
        self.recv_table = mem.alloc(8 * world)
        self.errs = [mem.alloc(4 * len(ERROR_FIELDS) * ERROR_RECORDS) for _ in range(world)]
        for r in range(world):
            start = self.starts.get(r, self.start)
            mem.store(self.slot_table + 8 * r, self.regions[r], Int64)
            mem.store(self.recv_table + 8 * r, self.allocations[r], Int64)
            for word in [layout.ready(q) for q in range(world)] + [
                    layout.arrived(s, j) for s in range(world) for j in range(PARTS)] + [layout.counter[0]]:
                mem.store(self.regions[r] + 4 * word, start, Uint32)
        self.records: list[list] = [[] for _ in range(world)]  # (call, record, status, phase, peer)
        self.outputs: list[list] = [[] for _ in range(world)]  # per call: (out bytes, allocation bytes)
        self.received: list[list] = [[] for _ in range(world)]  # per call: out_splits after it
        self.built: dict = {}
        for r in range(world):
            sim.spawn(lambda r=r: self._host(r), Context(rank=r))
        sim.run()
        self.final = [bytes(mem.words(a, self.alloc_bytes, Uint8)) for a in self.allocations]

    def kernel(self, side: Side):
        key = self.source.all_to_all.AllToAllKey(side.dtype, self.world, side.parts, direct=side.direct, pdl=False,
                                                 bounded=side.bounded)
        object.__setattr__(key, "threads", THREADS)
        if key not in self.built:
            self.built[key] = self.source.all_to_all.build(key)
        return key, self.built[key]

    def _fill(self, address: int, nbytes: int, value) -> None:
        for b in range(nbytes):
            self.sim.memory.store(address + b, value(b), Uint8)

    def _host(self, r: int) -> None:
        sim, mem = self.sim, self.sim.memory
        for c, call in enumerate(self.calls):
            me().ctx.call = c
            if r in self.late and self.late[r][0] == c:
                sim.sleep_until(self.late[r][1])
            side = call[r]
            e = side.bytes
            key, kernel = self.kernel(side)
            src = mem.alloc(max(1, side.in_rows * side.row * e))
            self._fill(src, side.in_rows * side.row * e, lambda b: source_byte(r, c, b))
            splits = mem.alloc(16 * self.world)
            for q in range(self.world):
                mem.store(splits + 8 * q, side.in_splits[q], Int64)
                mem.store(splits + 8 * (self.world + q), side.out_splits[q], Int64)
            # a staging buffer holds an earlier call's bytes (never copied out unless delivered)
            self._fill(self.allocations[r], self.alloc_bytes, lambda b: CANARY if side.direct else STALE)
            out_n = side.out_rows * side.row
            if side.direct:
                out = recv = self.allocations[r] + side.offset
            else:
                recv = self.allocations[r]
                out = mem.alloc(max(1, out_n * e + 8))
                self._fill(out, out_n * e + 8, lambda b: CANARY)
            args = types.SimpleNamespace(
                recv_table=Int64(self.recv_table), recv_id=Int64(model.receiving(ALLOCATION, side.dtype)),
                recv=Int64(recv), out=Int64(out), src=Int64(src), in_splits=Int64(splits),
                out_splits=Int64(splits + 8 * self.world), row=Int64(side.row), in_n=Int64(side.in_rows * side.row),
                out_n=Int64(out_n), slot_table=Int64(self.slot_table), slots=Int64(self.regions[r]),
                err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(self.timeout))
            delays = [self.rng.choice([0, 0, self.timeout // 16]) for _ in range(key.blocks)]
            sim.launch(lambda: kernel(args), Context(rank=r, call=c), key.blocks, THREADS, delays)
            outside = self.alloc_bytes if side.direct else 0
            self.outputs[r].append((bytes(mem.words(out, out_n * e + 8, Uint8)),
                                    bytes(mem.words(self.allocations[r], outside, Uint8)), out - self.allocations[r]))
            self.received[r].append([mem.load(splits + 8 * (self.world + q), Int64).v for q in range(self.world)])
            self.records[r] += [(c, index, status, phase, peer) for index, (status, phase, peer, *_) in
                                mem.take_records(self.errs[r], ERROR_RECORDS, len(ERROR_FIELDS))]

    def statuses(self, r: int) -> set:
        """(call, record, status) of rank ``r``'s records."""
        return {(c, index, status) for c, index, status, *_ in self.records[r]}

    def counts(self) -> set:
        return {self.sim.memory.load(region + 4 * self.layout.counter[0], Uint32).v for region in self.regions}


def source_byte(rank: int, call: int, b: int) -> int:
    """Byte ``b`` of rank ``rank``'s input at call ``call``: never the canary."""
    return (31 * rank + 7 * call + b) % 200 + 1


def pair_ok(call: list, s: int, r: int) -> bool:
    """Whether sender ``s``'s chunk for ``r`` moves, as the host model judges the pair."""
    send, recv = call[s], call[r]
    sent = model.chunk(send.in_splits, r, send.in_rows * send.row, send.row)[2]
    expected = model.chunk(recv.out_splits, s, recv.out_rows * recv.row, recv.row)[2]
    same = s == r or model.receiving(ALLOCATION, send.dtype) == model.receiving(ALLOCATION, recv.dtype)
    return sent == expected and sent != model.REFUSED and same


def check(world: World) -> None:
    """Every call of every rank as the host model says: delivered chunks bit for bit, nothing
    else written, a size mismatch recorded on both ends of each failed pair and nowhere else,
    no timeout, the counts one call on each."""
    W = world.world
    for c, call in enumerate(world.calls):
        for r in range(W):
            side = call[r]
            e = side.bytes
            out, allocation, at = world.outputs[r][c]
            want = bytearray([CANARY] * len(out))
            for s in range(W):
                if pair_ok(call, s, r):
                    begin, count, _ = model.chunk(side.out_splits, s, side.out_rows * side.row, side.row)
                    sender = call[s]
                    from_at = model.chunk(sender.in_splits, r, sender.in_rows * sender.row, sender.row)[0]
                    want[begin * e:(begin + count) * e] = bytes(source_byte(s, c, from_at * e + b)
                                                                for b in range(count * e))
            assert out == bytes(want), f"rank {r} call {c}: out {list(out)} != {list(want)}"
            if allocation:
                beyond = allocation[:at] + allocation[at + len(out) - 8:]
                assert set(beyond) <= {CANARY}, f"rank {r} call {c}: its allocation was written outside out"
            failed = any(not pair_ok(call, s, r) or not pair_ok(call, r, s) for s in range(W))
            want_records = {(c, RECOVERABLE_RECORD, SIZE_MISMATCH)} if failed else set()
            got = {x for x in world.statuses(r) if x[0] == c}
            assert got == want_records, (r, c, world.records)
    assert world.counts() == {(world.start + len(world.calls) * CALL_EPOCHS) % U32}


SEEDS = range(3)


def equal_calls(source) -> None:
    """Uneven splits that agree, staged and direct (at different places of the allocations),
    f32 and bf16, across the 2^32 wrap: every chunk delivered, nothing recorded."""
    for seed in SEEDS:
        rng = random.Random(seed)
        world, calls = 2 + seed % 2, []
        for c in range(3):
            sends = [[rng.choice([0, 1, 3]) for _ in range(2 + seed % 2)] for _ in range(world)]
            dtype = rng.choice(["f32", "bf16"])
            direct = c % 2 == 1
            calls.append([Side(sends[r], [sends[s][r] for s in range(world)], dtype=dtype, direct=direct,
                               offset=16 * rng.choice([0, 1, 3]) + 8 * c) for r in range(world)])
        check(World(calls, seed, start=U32 - 2 * CALL_EPOCHS, source=source))


def a_size_mismatch(source) -> None:
    """Rank 1 expects 2 rows from rank 0, which sends 1: that pair fails on both ends (a size
    mismatch, no timeout); every other pair delivers, and the next call passes."""
    for seed in SEEDS:
        good = [Side([1, 2], [1, 3]), Side([3, 1], [2, 1])]
        bad = [Side([1, 1], [1, 3]), Side([3, 1], [2, 1])]
        check(World([good, bad, good], seed, source=source))


def splits_past_the_tensor(source) -> None:
    """Rank 0's splits sum past its input (one row short): every pair it sends refuses, both
    ends of each record a size mismatch, and rank 0 reads nothing past its input."""
    for seed in SEEDS:
        calls = [[Side([2, 2], [2, 1], in_rows=3), Side([1, 1], [2, 1])]]
        check(World(calls, seed, source=source))


def different_dtypes(source) -> None:
    """Rank 0 sends f32 where rank 1 receives bf16, equal element counts (issue 48 item 3):
    both ends of the pairs between them fail as a size mismatch, and no f32 bytes land past
    rank 1's bf16 output."""
    for seed in SEEDS:
        calls = [[Side([2, 3], [2, 1], dtype="f32", direct=True), Side([1, 1], [3, 1], dtype="bf16", direct=True)]]
        check(World(calls, seed, source=source))


def a_rank_a_call_behind(source) -> None:
    """Rank 1's count is a call behind rank 0's (a rank that missed a call): rank 0 waits for
    words rank 1 never writes, and rank 1 must not pass on rank 0's words of the later call:
    both record a timeout, and nothing is delivered between them."""
    for seed in SEEDS:
        calls = [[Side([1, 2], [1, 2], direct=True), Side([2, 1], [2, 1], direct=True)]]
        world = World(calls, seed, start=CALL_EPOCHS, starts={1: 0}, source=source, timeout=SHORT)
        for r in range(2):
            assert (0, FATAL_RECORD, TIMEOUT) in world.statuses(r), world.records
        row = 2 * 4  # bytes
        assert set(world.outputs[0][0][0][row:3 * row]) == {CANARY}, "rank 0 received from a rank a call behind"
        assert set(world.outputs[1][0][0][:2 * row]) == {CANARY}, "rank 1 received from a rank a call ahead"


def a_late_sender(source) -> None:
    """Rank 1 launches two timeouts late: rank 0 times out (a receiver that leaves rewrites its
    ready as given up), and rank 1, coming after rank 0's host raised, must time out too instead
    of storing into rank 0's output (issue 48, low: the gave-up word)."""
    for seed in SEEDS:
        calls = [[Side([1, 2], [1, 2], direct=True), Side([2, 1], [2, 1], direct=True)]]
        world = World(calls, seed, late={1: (0, 2 * SHORT)}, source=source, timeout=SHORT)
        for r in range(2):
            assert (0, FATAL_RECORD, TIMEOUT) in world.statuses(r), world.records
        assert world.final[0] == world.outputs[0][0][1], "a late sender stored into a rank that had left the call"


def test_equal_calls_deliver_every_chunk_and_record_nothing() -> None:
    equal_calls(SOURCE)


def test_a_size_mismatch_fails_both_ends_of_its_pair_only() -> None:
    a_size_mismatch(SOURCE)


def test_splits_past_the_tensor_are_refused() -> None:
    splits_past_the_tensor(SOURCE)


def test_a_sender_and_a_receiver_of_different_dtypes_are_a_size_mismatch() -> None:
    different_dtypes(SOURCE)


def test_a_rank_a_call_behind_times_out_on_both_sides() -> None:
    a_rank_a_call_behind(SOURCE)


def test_a_sender_after_its_receiver_gave_up_stores_nothing() -> None:
    a_late_sender(SOURCE)


# -- mutations of the device source, each caught -------------------------------------------------

#: Edits that break the protocol (module, old text, new text), and the check that catches each.
MUTATIONS = {
    "no in_call check": (
        "exchange", "if not reached(epoch, want) or not in_call(epoch, calls):", "if not reached(epoch, want):",
        a_rank_a_call_behind),
    "ready published before its place": (
        "exchange",
        "    ptxops.st(gmem(Int64, region, 8, PEER, by) + layout.offset(0) // 2 + rank, offset, sem=\"relaxed\", "
        "scope=\"sys\")\n    ptxops.st_release(gmem(Uint64, region, 8, PEER, by) + layout.ready(0) // 2 + rank, "
        "pack(size, epoch),\n                      scope=\"sys\")\n",
        "    ptxops.st_release(gmem(Uint64, region, 8, PEER, by) + layout.ready(0) // 2 + rank, pack(size, epoch),\n"
        "                      scope=\"sys\")\n    ptxops.st(gmem(Int64, region, 8, PEER, by) + layout.offset(0) // 2 "
        "+ rank, offset, sem=\"relaxed\", scope=\"sys\")\n",
        equal_calls),
    "the place packed at the wrong bit": (
        "exchange", "return (allocation << Int64(PLACE_BITS)) | offset",
        "return (allocation << Int64(PLACE_BITS - 1)) | offset", equal_calls),
    "a refused pair posts no arrived": (
        "all_to_all", "release\n        if status != Int32(TIMEOUT) and tidx == 0:",
        "release\n        if status == 0 and tidx == 0:", a_size_mismatch),
    "splits past the tensor accepted": (
        "all_to_all", "if valid and total <= n:", "if valid:", splits_past_the_tensor),
    "no check of the receiver's allocation": (
        "all_to_all", "elif allocation != args.recv_id:", "elif False:", different_dtypes),
    "no size compare": (
        "exchange", "elif size != expected or size == Uint32(REFUSED):", "elif size == Uint32(REFUSED):",
        a_size_mismatch),
    "the own chunk copied whatever its sizes": (
        "all_to_all", "if send_size == recv_size and send_size != Uint32(REFUSED):", "if True:",
        splits_past_the_tensor),
    "no leave_call": (
        "all_to_all", "        signals.leave_call(slots, calls, last, world, counter=counter)\n", "", equal_calls),
    "no gave-up word": (
        "all_to_all", "if status == Int32(TIMEOUT):  # we leave", "if status == Int32(-7):  # we leave",
        a_late_sender),
    "the receiver copies out whatever its wait said": (
        "all_to_all", "                if shared[2] == Int64(0):", "                if True:", a_size_mismatch),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_of_the_protocol_fails_its_check(name: str) -> None:
    module, old, new, run = MUTATIONS[name]
    with pytest.raises((AssertionError, RuntimeError)):
        run(kernels({module: ((old, new),)}))
