"""The two-kernel MoE combine (:mod:`collectives.algorithms.moe_send_back`, then
:mod:`collectives.algorithms.moe_sum_back`, over :mod:`collectives.device.regions`) as the
kernels' own source runs it (CPU, no CuTeDSL compile), on every rank of a simulated world.

Each rank's host launches, call after call, the sending kernel and then the receiving one (its
next kernel starts when all blocks of the one before ended), with random delays of blocks and
late launches, counts started near the 2^32 wrap, and reads its error records after each call.
Every call's output must be bit for bit the torch steps' (each source's rows sent back as the
gather makes them, in rank order, summed as :func:`tests.collectives.test_moe_world.entry_sum`
does), or, where a rank's rows are not what its receivers' are (another row size or kind), the
call must fail with a size mismatch on every rank that touches that rank's rows and never time
out, and the next call pass.  Mutations of the kernels' source fail these checks: one half for
every call, the facts not compared, the receiver's wait not done.  ``test_region_model`` explores
the protocol's interleavings at scale; this runs its kernels.  Last, what the kernels assume of a
dispatch's handle is checked on real handles of the torch-step layer
(:func:`regions_emulated`: the kernels' addressing in torch gives the three-step combine's bits).
"""

from __future__ import annotations

import random
import types

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from tests.collectives.device.test_moe_combine_source import rounding  # noqa: E402
from tests.collectives.test_moe_world import entry_sum  # noqa: E402
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.config import CALL_EPOCHS  # noqa: E402
from collectives.layouts import (  # noqa: E402
    ERROR_FIELDS,
    ERROR_RECORDS,
    REGION_WAIT,
    SIZE_MISMATCH,
    RegionLayout,
    region_facts,
)

FAKES = fakes()
Int32, Int64, Uint8, Uint16, Uint32 = (FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8,
                                       FAKES["cutlass"].Uint16, FAKES["cutlass"].Uint32)
U32 = 1 << 32
THREADS = 4  # per block, scaled down (at least the world: threads 0..W-1 wait)
HIDDEN = 8  # bf16 elements a row: one 16-byte word
ROW_BYTES = 2 * HIDDEN
REGION_ROWS = 3
TIMEOUT_TICKS = 20000


def kernels(edits: dict | None = None) -> types.SimpleNamespace:
    """The simulated modules (``edits``: module name -> its (old, new) source edits)."""
    edits = edits or {}
    signals = load("collectives.device.signals", FAKES)
    a2a = load("collectives.device.all_to_all", {**FAKES, "collectives.device.signals": signals})
    regions = load("collectives.device.regions", {**FAKES, "collectives.device.signals": signals,
                                                  "collectives.device.all_to_all": a2a}, edits.get("regions", ()))
    device = types.SimpleNamespace(regions=regions, signals=signals, rounding=rounding(torch.bfloat16))
    base = {**FAKES, "collectives.device": device, "collectives.device.signals": signals}
    gather = load("collectives.algorithms.moe_gather", base)
    send = load("collectives.algorithms.moe_send_back", {**base, "collectives.algorithms.moe_gather": gather},
                edits.get("send", ()))
    combine = load("collectives.algorithms.moe_combine", base)
    total = load("collectives.algorithms.moe_sum_back", {**base, "collectives.algorithms.moe_combine": combine,
                                                          "collectives.algorithms.moe_send_back": send},
                 edits.get("sum", ()))
    return types.SimpleNamespace(send=send, sum=total)


SOURCE = kernels()


def rank_calls(world: int, calls: int, rng: random.Random) -> list[list[dict]]:
    """Per call, per rank: what it sends back and sums (consistent across ranks: the rows rank
    ``r`` got from ``s`` in the dispatch, ``splits[s]``, are the rows ``s`` sent it,
    ``send_splits[r]``)."""
    out = []
    for c in range(calls):
        got = [[rng.randint(0, REGION_ROWS) for _ in range(world)] for _ in range(world)]  # got[r][s]
        per = []
        for r in range(world):
            room = sum(got[r])
            experts_rows = rng.randint(1, 4)
            rows = torch.randn((experts_rows, HIDDEN), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
            place = torch.tensor([rng.randrange(experts_rows) for _ in range(room)], dtype=torch.int64)
            kept = torch.tensor([rng.random() < 0.8 for _ in range(room)], dtype=torch.bool)
            send_splits = [got[s][r] for s in range(world)]
            n = sum(send_splits)
            topk = 2
            tokens = n // topk + 1
            order = list(range(tokens * topk))
            rng.shuffle(order)
            slots = torch.tensor(order, dtype=torch.int64)
            valid = slots < n  # the entries that went (and come back as rows 0..n-1)
            slots = torch.where(valid, slots, 0)
            weights = torch.rand(tokens * topk, generator=torch.Generator().manual_seed(c * 31 + r)).float()
            per.append(dict(rows=rows.bfloat16(), place=place, kept=kept, splits=got[r], send_splits=send_splits,
                            slots=slots, valid=valid, weights=weights, tokens=tokens, topk=topk,
                            facts=region_facts(ROW_BYTES, 1)))
        out.append(per)
    return out


def expected(calls: list[list[dict]], c: int, r: int) -> torch.Tensor:
    """Rank ``r``'s output of call ``c`` by the torch steps."""
    world = len(calls[c])
    chunks = []
    for s in range(world):
        side = calls[c][s]
        back = moe.gather_rows(side["rows"], side["place"], side["kept"], torch.zeros(world, dtype=torch.int64),
                               torch.zeros(world, dtype=torch.int64), torch.empty((2, world), dtype=torch.int64),
                               torch.empty((sum(side["splits"]), HIDDEN), dtype=torch.bfloat16))
        first = sum(side["splits"][:r])
        chunks.append(back[first:first + side["splits"][r]])
    me = calls[c][r]
    entries = torch.cat(chunks + [torch.zeros((1, HIDDEN), dtype=torch.bfloat16)])
    return entry_sum(entries, me["slots"], me["valid"], me["weights"], me["tokens"], me["topk"])


class World:
    """``world`` ranks running ``calls`` (:func:`rank_calls`) from count ``start``; ``late``: rank
    -> (call, tick) it launches that call no earlier; ``slow``: the most ticks a receiving
    kernel's block starts late (a block may start ``slow`` late, or not at all late)."""

    def __init__(self, calls: list[list[dict]], seed: int, start: int = 0, source=SOURCE,
                 late: dict | None = None, timeout: int = TIMEOUT_TICKS, slow: int = 50) -> None:
        self.calls, self.source, self.timeout, self.late, self.slow = calls, source, timeout, late or {}, slow
        self.world = world = len(calls[0])
        self.layout = layout = RegionLayout(world, REGION_ROWS * ROW_BYTES)
        self.sim = sim = Sim(seed)
        self.rng = random.Random(seed)
        mem = sim.memory
        self.allocations = [mem.alloc(layout.bytes) for _ in range(world)]
        self.word_regions = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.regions_table, self.words_table = mem.alloc(8 * world), mem.alloc(8 * world)
        self.errs = [mem.alloc(4 * len(ERROR_FIELDS) * ERROR_RECORDS) for _ in range(world)]
        for r in range(world):
            mem.store(self.regions_table + 8 * r, self.allocations[r], Int64)
            mem.store(self.words_table + 8 * r, self.word_regions[r], Int64)
            for offset, value in layout.seeded_words(start).items():
                mem.store(self.word_regions[r] + 4 * offset, value, Uint32)
        self.outputs: list[list] = [[] for _ in range(world)]
        self.records: list[list] = [[] for _ in range(world)]
        for r in range(world):
            sim.spawn(lambda r=r: self._host(r), Context(rank=r))
        sim.run()

    def _tensor(self, values: torch.Tensor, dtype: type, width: int) -> int:
        mem = self.sim.memory
        at = mem.alloc(max(width * values.numel(), 1))
        for i, v in enumerate(values.reshape(-1).tolist()):
            mem.store(at + width * i, int(v), dtype)
        return at

    def _host(self, r: int) -> None:
        sim, mem, world = self.sim, self.sim.memory, self.world
        send_key = self.source.send.MoeSendBackKey(world, 16)
        sum_key = self.source.sum.MoeSumBackKey(world, "bf16", 2, 8)
        for key in (send_key, sum_key):
            object.__setattr__(key, "threads", THREADS)
        send, total = self.source.send.build(send_key), self.source.sum.build(sum_key)
        for c, call in enumerate(self.calls):
            if r in self.late and self.late[r][0] == c:
                sim.sleep_until(self.late[r][1])
            side = call[r]
            rows = self._tensor(side["rows"].view(torch.int16).to(torch.int64) % (1 << 16), Uint16, 2)
            common = dict(err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(self.timeout),
                          words=Int64(self.word_regions[r]), region_bytes=Int64(self.layout.region_bytes),
                          facts=Int64(side["facts"]))
            args = types.SimpleNamespace(
                rows=Int64(rows), place=Int64(self._tensor(side["place"], Int64, 8)),
                kept=Int64(self._tensor(side["kept"].to(torch.int64), Uint8, 1)),
                splits=Int64(self._tensor(torch.tensor(side["splits"]), Int64, 8)), row_words=Int64(1),
                regions_table=Int64(self.regions_table), words_table=Int64(self.words_table), **common)
            blocks = self.rng.choice([1, 2, 3])
            sim.launch(lambda: send(args), Context(rank=r, call=c), blocks, THREADS,
                       [self.rng.choice([0, 0, self.slow]) for _ in range(blocks)])
            out = mem.alloc(2 * side["tokens"] * HIDDEN)
            for b in range(2 * side["tokens"] * HIDDEN):
                mem.store(out + b, 0xEE, Uint8)
            args = types.SimpleNamespace(
                out=Int64(out), slots=Int64(self._tensor(side["slots"], Int64, 8)),
                valid=Int64(self._tensor(side["valid"].to(torch.int64), Uint8, 1)),
                weights=Int64(self._tensor(side["weights"].view(torch.int32).to(torch.int64) % U32, Uint32, 4)),
                tokens=Int64(side["tokens"]), hidden=Int64(HIDDEN), regions=Int64(self.allocations[r]),
                send_splits=Int64(self._tensor(torch.tensor(side["send_splits"]), Int64, 8)), **common)
            blocks = self.rng.choice([1, 2])
            sim.launch(lambda: total(args), Context(rank=r, call=c), blocks, THREADS,
                       [self.rng.choice([0, 0, self.slow]) for _ in range(blocks)])
            words = mem.words(out, side["tokens"] * HIDDEN, Uint16)
            self.outputs[r].append(torch.tensor(words, dtype=torch.int64).to(torch.int16).view(torch.bfloat16)
                                   .view(side["tokens"], HIDDEN))
            self.records[r] += [(c, index, status, phase, peer) for index, (status, phase, peer, *_) in
                                mem.take_records(self.errs[r], ERROR_RECORDS, len(ERROR_FIELDS))]

    def counts(self) -> set:
        return {self.sim.memory.load(w + 4 * self.layout.counter[0], Uint32).v for w in self.word_regions}


def check_exact(world_: World, calls: list, skip: set = frozenset()) -> None:
    for r in range(world_.world):
        for c in range(len(calls)):
            if (r, c) in skip:
                continue
            want, got = expected(calls, c, r), world_.outputs[r][c]
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (r, c, got, want)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("start", [0, U32 - 2 * CALL_EPOCHS])
def test_every_call_sums_its_sources_rows_bit_for_bit_across_the_wrap(world: int, start: int) -> None:
    seed = world + (start > 0)  # (slow blocks in half the runs)
    rng = random.Random(seed * 10 + world)
    calls = rank_calls(world, 4, rng)
    w = World(calls, seed, start, late={rng.randrange(world): (rng.randrange(4), 400)}, slow=(50, 1500)[seed % 2])
    assert w.records == [[] for _ in range(world)]
    check_exact(w, calls)
    assert w.counts() == {(start + 4 * CALL_EPOCHS) % U32}


@pytest.mark.parametrize("what", ["row size", "kind"])
def test_a_rank_whose_rows_differ_fails_the_call_on_every_rank_without_a_timeout_and_the_next_passes(what) -> None:
    world, bad, at = 3, 1, 1
    rng = random.Random(7)
    calls = rank_calls(world, 3, rng)
    calls[at][bad]["facts"] = region_facts(ROW_BYTES + 16, 1) if what == "row size" else region_facts(ROW_BYTES, 2)
    w = World(calls, 3, U32 - CALL_EPOCHS)
    for r in range(world):
        phases = {(c, status, phase) for c, _, status, phase, _ in w.records[r]}
        assert phases == {(at, SIZE_MISMATCH, REGION_WAIT)}, (r, w.records[r])
        peers = {peer for c, *_, peer in w.records[r]}
        assert peers == ({bad} if r != bad else peers - {bad}) and peers
    check_exact(w, calls, skip={(r, at) for r in range(world)})


def late_world(world: int, seed: int, source=SOURCE, timeout: int = 1500) -> tuple:
    """A world of 5 calls in which one rank launches call 1 or 2 two to four waits' bounds late,
    its blocks started up to about a bound late: (the world, its calls, the (rank, call) pairs
    that left a record)."""
    rng = random.Random(seed * 7 + world)
    calls = rank_calls(world, 5, rng)
    late = {rng.randrange(world): (rng.choice([1, 2]), rng.choice([2 * timeout, 3 * timeout, 4 * timeout]))}
    w = World(calls, seed, U32 - 2 * CALL_EPOCHS, source=source, late=late, timeout=timeout,
              slow=rng.choice([800, 1400]))
    return w, calls, {(r, c) for r in range(world) for c, *_ in w.records[r]}


@pytest.mark.parametrize("world", [2, 3])
def test_a_call_that_passes_is_right_whatever_rank_comes_late(world: int) -> None:
    """Ranks launching calls later than the bound of a wait and blocks starting up to about a
    bound late (timeouts on other ranks, blocks of one kernel judging a word apart as it arrives
    near their deadlines): every call that leaves no record on a rank is bit for bit right there,
    and some calls fail (the worlds are late enough to time out)."""
    failures = 0
    for seed in range(4):
        w, calls, failed = late_world(world, seed)
        check_exact(w, calls, skip=failed)
        failures += len(failed)
    assert failures


def test_a_sending_kernel_whose_blocks_judge_apart_refuses_the_pair() -> None:
    """Without the ``refused`` word the last block posts a pair another block did not store to
    (its wait timed out as the word arrived): a wrong call passes, in the two of 60 seeded late
    worlds of 2 and 3 ranks where the blocks judge apart (found by searching them)."""
    edit = ("if free[tidx] != Int32(0) and refused == Uint32(0):", "if free[tidx] != Int32(0):")
    broken = kernels({"send": (edit,)})
    for seed in (4, 10):
        w, calls, failed = late_world(2, seed, broken)
        with pytest.raises(AssertionError):
            check_exact(w, calls, skip=failed)
        w, calls, failed = late_world(2, seed)
        check_exact(w, calls, skip=failed)


@pytest.mark.parametrize(("edits", "what"), [
    ({"sum": (("half = Int64(call_parity(calls))", "half = Int64(0)"),),
      "send": (("half = Int64(call_parity(calls))", "half = Int64(0)"),)}, "one half"),
    ({"regions": (("if sent != facts or", "if"),)}, "facts not compared"),
    ({"regions": (("seen = poll_epoch(region_arrived_word(words, half, source, world), want, deadline)",
                   "seen = ptxops.ld(region_arrived_word(words, half, source, world), dtype=Uint64)"),)},
     "no wait for the rows"),
])
def test_a_broken_kernel_fails_the_checks(edits: dict, what: str) -> None:
    """Each edit is caught in some of a few seeded worlds: a wrong output accepted, or (the facts
    not compared) a rank whose rows differ passing unnoticed."""
    broken, caught = kernels(edits), 0
    for seed in range(4):
        if caught:
            break
        rng = random.Random(seed)
        calls = rank_calls(3, 4, rng)
        if what == "facts not compared":
            calls[1][2]["facts"] = region_facts(ROW_BYTES, 2)
        w = World(calls, seed, 0, source=broken, late={seed % 3: (1 + seed % 3, 300)}, timeout=3000, slow=1500)
        try:
            check_exact(w, calls)
        except AssertionError:
            caught += 1
            continue
        if what == "facts not compared" and not any(records for records in w.records):
            caught += 1
    assert caught > 0, what


def regions_emulated(results: list, world: int, hidden: int) -> list[torch.Tensor]:
    """The two-kernel combine's addressing in torch, on real handles (``results``: each rank's
    ``(out_rows, handle)``): rank ``s`` sends received row ``i`` (its source ``r`` and place ``j``
    in ``r``'s rows by ``recv_splits``) as row ``j`` of its region in ``r``'s allocation, the
    expert row ``place[i]`` where kept, else zeros (the sending kernel); rank ``r``'s entry row
    ``q`` is source ``s``'s row ``j`` by ``send_splits`` (the receiving kernel's
    :func:`~collectives.algorithms.moe_sum_back.region_row`), summed as the kernel sums."""
    def locate(splits: list[int], i: int) -> tuple[int, int]:
        before = 0
        for s, n in enumerate(splits):
            if i < before + n:
                return s, i - before
            before += n
        raise AssertionError(f"row {i} past the rows {splits}")

    regions: dict[tuple[int, int, int], torch.Tensor] = {}  # (receiver, source, row) -> row
    for s, (out_rows, h) in enumerate(results):
        rows = out_rows.reshape(-1, hidden)
        splits = h.recv_splits.tolist()
        for i in range(sum(splits)):
            r, j = locate(splits, i)
            regions[r, s, j] = rows[int(h.place[i])] if bool(h.kept[i]) else torch.zeros_like(rows[0])
    outs = []
    for r, (out_rows, h) in enumerate(results):
        splits = h.send_splits.tolist()
        entries = torch.stack([regions[(r, *locate(splits, q))] for q in range(sum(splits))] +
                              [torch.zeros(hidden, dtype=out_rows.dtype)])
        slots = h.slots if getattr(h, "slots", None) is not None else moe.inverse(h.order)
        outs.append(entry_sum(entries, slots, h.valid, h.weights, h.tokens, h.topk))
    return outs


@pytest.mark.parametrize(("world", "topk", "tokens", "max_tokens"), [
    (2, 2, [3, 1], 3), (3, 4, [2, 0, 5], 5), (4, 8, [1, 1, 1, 1], 1), (4, 2, [6, 2, 0, 3], 6)])
def test_the_kernels_addressing_on_real_handles_gives_the_combines_bits(world, topk, tokens, max_tokens) -> None:
    """What the kernels assume of a low-latency dispatch's handle (``recv_splits``: the rows that
    arrived from each source, in rank order, ``place`` and ``kept`` indexing them so; the entry
    rows in rank order by ``send_splits``, as ``slots`` read them) holds on the dispatch's own
    handles: the two-kernel addressing gives the three-step combine's output bit for bit, and
    each source's rows fit its region (``max_tokens x topk`` rows: a row goes back per entry)."""
    from collectives.reference.moe import expert_fn, routing
    from tests.collectives.test_moe_world import World as MoeWorld

    experts, hidden = 4 * world, 8
    xs, ids, ws = routing(world, experts, topk, tokens, 3, hidden, torch.bfloat16)
    sim, local = MoeWorld(world), experts // world

    def body(r):
        ex, _, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, max_tokens)
        out_rows = torch.stack([expert_fn(ex[le], r * local + le) for le in range(local)])
        return out_rows, handle, moe.combine_with(sim.exchange(r), out_rows, handle)

    results = sim.run(body)
    for r, (_, h, _) in enumerate(results):
        assert max(h.recv_splits.tolist() + h.send_splits.tolist()) <= max_tokens * topk  # (a row per entry)
    emulated = regions_emulated([(rows, h) for rows, h, _ in results], world, hidden)
    for r, (_, _, out) in enumerate(results):
        assert torch.equal(emulated[r].view(torch.int16), out.view(torch.int16)), r
