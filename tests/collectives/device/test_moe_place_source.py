"""The MoE dispatch's placement kernel as its own source runs it (CPU, no CuTeDSL compile),
against the torch steps it replaces (:func:`collectives.moe.place_rows`, the path the GPU runs
have proven).

:mod:`device_sim` executes :mod:`collectives.algorithms.moe_place` from its source file over
simulated memory: received rows whose every word names its row, counts from random routings
(experts with no rows, sources that sent nothing, a receive buffer with room to spare), both
layouts (low latency with a capacity that drops rows, throughput's packed one), every word size,
and grids of fewer blocks than rows (each block takes several) with threads fewer than a row's
words.  Every place, every kept flag, every placed row, each expert's count and the count of
dropped rows must be the torch steps'; the trash row and unplaced rows are never written.
"""

from __future__ import annotations

import math
import random
import types

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.algorithms.moe_place import WORDS, MoePlaceKey  # noqa: E402

FAKES = fakes()
Int64, Uint8 = FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8
THREADS, UNTOUCHED = 4, 0xEE
DROPPED_BEFORE = 5  # the dispatch's entries out of range, which the dropped count adds


def source(edits: tuple = ()) -> types.ModuleType:
    """The simulated ``collectives.algorithms.moe_place`` (``edits``: its source edits)."""
    signals = load("collectives.device.signals", FAKES)
    return load("collectives.algorithms.moe_place", {
        **FAKES,
        "collectives.device.signals": signals,
    }, edits)


SOURCE = source()


def run_kernel(counts: torch.Tensor, received: torch.Tensor, layout: moe.Wire, room: int, capacity: int,
               exact: bool, blocks: int, seed: int, module: types.ModuleType = SOURCE) -> dict:
    """The kernel on the counts' messages ``counts`` ([W, L + 1]) and the ``received`` rows (uint8,
    :class:`collectives.moe.Wire` ``layout``), ``room`` entries; what it wrote."""
    world, local = counts.shape[0], counts.shape[1] - 1
    rows, row_bytes = received.shape
    out_bytes = layout.values
    key = MoePlaceKey(world, local, exact, MoePlaceKey.word_for(math.gcd(row_bytes, out_bytes)), scales=layout.scale)
    object.__setattr__(key, "threads", THREADS)  # scaled down: a row's words outnumber the threads
    kernel = module.build(key)
    rows_out = int(counts[:, :local].sum()) if exact else local * capacity
    sim = Sim(seed)
    mem = sim.memory
    at = {name: mem.alloc(size) for name, size in [
        ("counts", 8 * counts.numel()), ("received", max(rows * row_bytes, 1)),
        ("expert_x", (rows_out + 1) * out_bytes), ("scales", 4 * (rows_out + 1)), ("place", max(8 * room, 1)),
        ("kept", max(room, 1)), ("tallies", 8 * (local + 2 + world))]}  # counts, lost, dropped before, splits
    for s, c in enumerate(counts.reshape(-1).tolist()):
        mem.store(at["counts"] + 8 * s, c, Int64)
    mem.store(at["tallies"] + 8 * (local + 1), DROPPED_BEFORE, Int64)
    for b, v in enumerate(received.reshape(-1).tolist()):
        mem.store(at["received"] + b, v, Uint8)
    for name, size in (("expert_x", (rows_out + 1) * out_bytes), ("scales", 4 * (rows_out + 1))):
        for b in range(size):
            mem.store(at[name] + b, UNTOUCHED, Uint8)
    args = types.SimpleNamespace(  # (low latency: the messages at the heads of the sources' regions)
        counts=Int64(at["counts" if exact else "received"]), received=Int64(at["received"]),
        expert_x=Int64(at["expert_x"]),
        scales=Int64(at["scales"]), out_words=Int64(out_bytes // key.word),
        place=Int64(at["place"]), kept=Int64(at["kept"]), expert_counts=Int64(at["tallies"]),
        lost=Int64(at["tallies"] + 8 * local), dropped_before=Int64(at["tallies"] + 8 * (local + 1)),
        recv_splits=Int64(at["tallies"] + 8 * (local + 2)), room=Int64(room), rows=Int64(rows),
        capacity=Int64(capacity), row_words=Int64(row_bytes // key.word), topk=Int64(layout.topk),
        header=Int64(layout.header))
    rng = random.Random(seed)
    sim.spawn(lambda: sim.launch(lambda: kernel(args), Context(rank=0, call=0), blocks, THREADS,
                                 [rng.choice([0, 0, 50]) for _ in range(blocks)]), Context(rank=0))
    sim.run()
    return {
        "place": torch.tensor(mem.words(at["place"], room, Int64), dtype=torch.int64),
        "kept": torch.tensor(mem.words(at["kept"], room, Uint8), dtype=torch.bool),
        "expert_x": torch.tensor(mem.words(at["expert_x"], (rows_out + 1) * out_bytes, Uint8),
                                 dtype=torch.uint8).view(rows_out + 1, out_bytes),
        "scales": torch.tensor(mem.words(at["scales"], 4 * (rows_out + 1), Uint8),
                               dtype=torch.uint8).view(rows_out + 1, 4),
        "expert_counts": torch.tensor(mem.words(at["tallies"], local, Int64), dtype=torch.int64),
        "lost": mem.words(at["tallies"] + 8 * local, 1, Int64)[0],
        "recv_splits": torch.tensor(mem.words(at["tallies"] + 8 * (local + 2), world, Int64), dtype=torch.int64),
    }


def arrivals(rng: random.Random, world: int, local: int, topk: int, hidden: int, fp8: bool, seed: int,
             spare: int = 0, tokens: int = 3) -> tuple[torch.Tensor, torch.Tensor, moe.Wire]:
    """What rank 0 receives from every source's routing (ids to one rank, some, every rank, an
    expert named twice, ids out of range; up to ``tokens`` tokens), the torch steps'
    (:func:`collectives.moe.route_ids`, :func:`collectives.moe.pack_rows`): the counts' messages
    ``[W, L + 1]``, the rows (``spare`` more of stale bytes) and their layout."""
    experts, gen = world * local, torch.Generator().manual_seed(seed)
    layout = moe.wire(hidden, 2, fp8, topk)
    messages, rows = [], []
    for _ in range(world):
        n = rng.randrange(tokens + 1)
        ids = torch.tensor([[rng.choice([0, 0, rng.randrange(experts), -1, experts]) if rng.random() < 0.7
                             else rng.randrange(local) for _ in range(topk)] for _ in range(n)],
                           dtype=torch.int64).view(n, topk)
        x = (torch.randn((n, hidden), generator=gen) * 3).to(torch.bfloat16)
        order, _, bins, send, _, carriers = moe.route_ids(ids, experts, world)
        out = torch.full((n * topk + 1, layout.bytes), UNTOUCHED, dtype=torch.uint8)
        moe.pack_rows(x, carriers, moe.inverse(order), send, topk, layout, out)
        messages.append(bins[:local + 1])  # rank 0's: its experts' entries, its rows (the first)
        rows.append(out[:int(bins[local])])
    stale = torch.full((spare, layout.bytes), 0x5A, dtype=torch.uint8)
    return torch.stack(messages), torch.cat(rows + [stale]), layout


def regions(counts: torch.Tensor, received: torch.Tensor, layout: moe.Wire) -> tuple[torch.Tensor, torch.Tensor]:
    """The low-latency layout of the messages ``counts`` and the rows ``received`` in arrival
    order (its rows past the sources' stale): a region per source of the same rows, its message's
    rows (:func:`collectives.moe.header_rows`), its rows, then stale rows; and the messages as the
    dispatch views them there."""
    world, local = counts.shape[0], counts.shape[1] - 1
    head, sent = moe.header_rows(local, layout), counts[:, local].tolist()
    region = head + max(received.shape[0] - sum(sent) + max(sent), 1)
    out = torch.full((world * region, layout.bytes), 0x5A, dtype=torch.uint8)
    at = 0
    for s, n in enumerate(sent):
        words = torch.zeros(head * layout.bytes, dtype=torch.uint8)
        words[:8 * (local + 1)] = counts[s].contiguous().view(torch.uint8)
        out[s * region:s * region + head] = words.view(head, -1)
        out[s * region + head:s * region + head + n] = received[at:at + n]
        at += n
    return out.view(world, -1)[:, :8 * (local + 1)].view(torch.int64), out


def check(counts: torch.Tensor, received: torch.Tensor, layout: moe.Wire, room: int, capacity: int, exact: bool,
          blocks: int, seed: int, module: types.ModuleType = SOURCE, counted: bool = True) -> None:
    """The kernel's writes against the torch steps' (``counted``: the dropped count too; low
    latency: in the sources' regions, :func:`regions`)."""
    if not exact:
        counts, received = regions(counts, received, layout)
    got = run_kernel(counts, received, layout, room, capacity, exact, blocks, seed, module)
    local = counts.shape[1] - 1
    rows_out = int(counts[:, :local].sum()) if exact else local * capacity
    want_x, place, kept, expert_counts, lost, scales, recv = moe.place_rows(
        counts, received, room, rows_out, capacity, exact, torch.tensor(DROPPED_BEFORE), layout=layout)
    assert torch.equal(got["place"], place)
    assert torch.equal(got["kept"], kept)
    assert torch.equal(got["expert_counts"], expert_counts)
    assert got["lost"] == int(lost) or not counted
    assert torch.equal(got["recv_splits"], recv)
    placed = torch.zeros(rows_out + 1, dtype=torch.bool)
    placed[place[kept]] = True
    assert torch.equal(got["expert_x"][placed], want_x[placed])
    assert bool((got["expert_x"][~placed] == UNTOUCHED).all()), "a row no received row was placed at was written"
    if scales is None:
        assert bool((got["scales"] == UNTOUCHED).all()), "scales written for rows without them"
    else:
        assert torch.equal(got["scales"][placed], scales.view(torch.uint8).view(-1, 4)[placed])
        assert bool((got["scales"][~placed] == UNTOUCHED).all())


def entries_of(counts: torch.Tensor) -> int:
    return int(counts[:, :-1].sum())


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
@pytest.mark.parametrize("hidden", [8, 12, 6, 3])
def test_placement_matches_the_torch_steps(exact: bool, hidden: int) -> None:
    """bf16 rows of 16-, 8-, 4- and 2-byte words (values and header: 16 + 8, 24 + 8, ...)."""
    rng = random.Random(hidden * 2 + exact)
    for seed in range(3):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2), (4, 1)])
        counts, received, layout = arrivals(rng, world, local, rng.choice([1, 2, 3]), hidden, False, seed,
                                            spare=rng.choice([0, 2]))
        room = entries_of(counts) + rng.choice([0, 2])  # room to spare for entries too
        check(counts, received, layout, room, rng.choice([1, 2, 4]), exact, blocks=rng.choice([1, 2, 3]), seed=seed)


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
@pytest.mark.parametrize("hidden", [32, 28, 8, 16])
def test_fp8_rows_are_split_into_values_and_scales(exact: bool, hidden: int) -> None:
    """fp8 rows (``hidden`` e4m3 bytes, the scale's 4, the header): the values placed as rows of
    their own and the scales as f32s of their own, as the torch steps split them."""
    rng = random.Random(hidden + exact)
    for seed in range(2):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2)])
        counts, received, layout = arrivals(rng, world, local, rng.choice([1, 2, 4]), hidden, True, seed,
                                            spare=rng.choice([0, 2]))
        check(counts, received, layout, entries_of(counts) + rng.choice([0, 2]), rng.choice([1, 2, 4]), exact,
              blocks=rng.choice([1, 2]), seed=seed)


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
def test_more_experts_and_segments_than_threads(exact: bool) -> None:
    """A thread per expert takes several (6 and 9 experts, 4 threads), the starts' prefix sums
    run over segments several times the threads."""
    rng = random.Random(11 + exact)
    for seed, (world, local) in enumerate([(2, 6), (3, 9), (1, 5)]):
        counts, received, layout = arrivals(rng, world, local, 3, 4, False, seed, tokens=4)
        check(counts, received, layout, entries_of(counts) + 1, rng.choice([1, 2, 4]), exact, blocks=2, seed=seed)


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_header_slots_past_the_threads(world: int, fp8: bool) -> None:
    """Top-k 6 over blocks of 4 threads: a row's header slots in two chunks, the places of
    either's entries found a thread a slot (W = 2, 3, 4; drops past a capacity of 2)."""
    rng = random.Random(world + 10 * fp8)
    for seed in range(2):
        counts, received, layout = arrivals(rng, world, 2, 6, 8, fp8, seed, spare=1, tokens=4)
        check(counts, received, layout, entries_of(counts) + 1, 2, False, blocks=2, seed=seed)


def test_counts_past_the_room_place_only_its_entries() -> None:
    """Counts that sum past the entries' room (never from a completed exchange): only its
    entries are placed and flagged, as the torch steps do (the dropped count is the counts')."""
    rng = random.Random(5)
    counts, received, layout = arrivals(rng, 2, 2, 3, 8, False, 5, tokens=4)
    while entries_of(counts) < 3:
        counts, received, layout = arrivals(rng, 2, 2, 3, 8, False, 5, tokens=4)
    for exact in (False, True):
        check(counts, received, layout, entries_of(counts) - 2, 4, exact, blocks=2, seed=6, counted=False)


def test_nothing_received() -> None:
    layout = moe.wire(8, 2, False, 2)
    nothing = torch.zeros((2, 3), dtype=torch.int64)
    check(nothing, torch.full((3, layout.bytes), 0x5A, dtype=torch.uint8), layout, 3, 2, False, blocks=2, seed=1)
    check(nothing, torch.zeros((0, layout.bytes), dtype=torch.uint8), layout, 0, 2, True, blocks=1, seed=2)


def test_the_words_move_every_byte_of_a_row() -> None:
    for row_bytes in (16, 8, 4, 2, 1, 48):
        assert row_bytes % MoePlaceKey.word_for(row_bytes) == 0
        assert MoePlaceKey.word_for(row_bytes) == max(w for w in WORDS if row_bytes % w == 0)


COPY_EDITS = [
    (("if w + u * threads <= last:", "if w + u * threads < last:"), "the row's last word"),
    (("w += LOADS * threads", "w += LOADS * threads + threads"), "the rounds' stride"),
    (("min(w + u * threads, last)", "min(w + u, last)"), "the words of a round"),
]


@pytest.mark.parametrize(("edit", "what"), [
    (("if starts[mid + 1] <= i:", "if starts[mid + 1] < i:"), "the search's right end"),
    (("elif slot < args.capacity:", "elif slot <= args.capacity:"), "the capacity"),
    (("before[s] = acc", "before[s] = Int64(0)"), "the earlier sources' rows"),
    (("lost += c - room", "lost += c"), "the dropped count"),
    (("starts[(w + 1) * local] - starts[w * local]", "starts[(w + 1) * local]"), "the entries each source sent"),
    (("lost = ptxops.ld(gmem(Int64, args.dropped_before, 8, LOCAL, by), dtype=Int64)", "lost = Int64(0)"),
     "the entries dropped before"),
    (("v += ping[j + 1 - level % 2 - (1 << level)]", "v = ping[j + 1 - level % 2 - (1 << level)]"),
     "the starts' prefix sums"),
    (("range_constexpr(max(segments - 1, 1).bit_length())", "range_constexpr(max(segments - 1, 1).bit_length() - 1)"),
     "the prefix sums' rounds"),
    (("starts[j + 1] = before[j]", "starts[j] = before[j]"), "the sums back from the spare"),
    (("while i < arrived:", "while i < arrived - 1:"), "the arrived rows' copies"),
    (("i += grid * threads", "i += grid * threads + 1"), "the entries' places over the grid"),
    (("+ args.out_words) * key.word", "+ args.out_words + 1) * key.word"), "the scale's bytes"),
    (("LOCAL, by) + place, scale)", "LOCAL, by) + place + 1, scale)"), "the scale's word"),
    (("at = place * args.out_words * per_word", "at = place * args.row_words * per_word"), "the placed rows' width"),
    (("c = ptxops.ld(message + (j // local) * stride + j % local, dtype=Int64)",
      "c = ptxops.ld(message + j, dtype=Int64)"), "the message's counts (each source's in its region)"),
    (("message + source * stride + local, dtype=Int64)", "message + source * stride, dtype=Int64)"),
     "the message's rows"),
    (("row = lo * region + head + i - row_starts[lo]", "row = lo * region + i - row_starts[lo]"),
     "a row's place in its source's region (after the message)"),
    (("head = (Int64(8 * (local + 1)) + row_bytes - 1) // row_bytes", "head = Int64(8 * (local + 1)) // row_bytes"),
     "the message's rows in a region"),
    (("region = args.rows // world", "region = args.rows // world - 1"), "the regions' rows"),
    (("if Int64(source) < w:", "if Int64(source) <= w:"), "the rows of the sources before"),
    (("if row_starts[mid + 1] <= i:", "if row_starts[mid + 1] < i:"), "a row's source"),
    (("entries = starts[lo * local]", "entries = starts[lo]"), "the source's first entry"),
    (("+ args.header) // 4", "+ args.header + 4) // 4"), "the header's place in a row"),
])
def test_a_broken_kernel_fails_the_check(edit: tuple, what: str) -> None:
    """Each edit of the kernel's source is caught (so the check reads what the kernel does)."""
    broken = source((edit,))
    rng = random.Random(3)
    with pytest.raises(AssertionError):
        for seed in range(3):  # 3 sources of 2 experts each (6 segments: more than the 4 threads), drops
            counts, received, layout = arrivals(rng, 3, 2, 3, 8, True, seed, tokens=4)
            check(counts, received, layout, entries_of(counts) + 1, 3, False, blocks=1 + seed % 2, seed=seed,
                  module=broken)


@pytest.mark.parametrize(("edit", "what"), [
    (("header + base + tidx, dtype=Int32", "header + tidx, dtype=Int32"), "the slots of a chunk"),
    (("if kept == Int64(1):\n                                spot = place",
      "if True:\n                                spot = place"), "the dropped entries' places (the trash row)"),
    (("while k < chunk:\n                        place = places[k]\n                        if place >= Int64(0):\n"
      "                            at = place", "while k < chunk - 1:\n                        place = places[k]\n"
      "                        if place >= Int64(0):\n                            at = place"), "every slot's values"),
    (("while k < chunk:\n                        place = places[k]\n                        if place >= Int64(0):\n"
      "                            at = (row", "while k < chunk - 1:\n                        place = places[k]\n"
      "                        if place >= Int64(0):\n                            at = (row"), "every slot's scale"),
])
def test_a_broken_chunk_fails_the_check(edit: tuple, what: str) -> None:
    """Each edit of the header's chunks is caught: top-k 3 (one chunk of 4 threads) and 6 (two)."""
    broken = source((edit,))
    rng = random.Random(7)
    with pytest.raises(AssertionError):
        for seed, topk in ((0, 3), (1, 3), (2, 6), (3, 6)):
            counts, received, layout = arrivals(rng, 3, 2, topk, 8, True, seed, tokens=4)
            check(counts, received, layout, entries_of(counts) + 1, 2, False, blocks=2, seed=seed, module=broken)


@pytest.mark.parametrize(("edit", "what"), [
    (("experts += first[m]", "experts += counts[m]"), "the rows of the experts before"),
    (("while m < l:", "while m <= l:"), "the experts before, not this one"),
])
def test_a_broken_throughput_kernel_fails_the_check(edit: tuple, what: str) -> None:
    broken = source((edit,))
    rng = random.Random(4)
    with pytest.raises(AssertionError):
        for seed in range(3):  # 5 experts: more than the 4 threads
            counts, received, layout = arrivals(rng, 2, 5, 3, 8, False, seed, tokens=4)
            check(counts, received, layout, entries_of(counts), 2, True, blocks=2, seed=seed, module=broken)


@pytest.mark.parametrize(("edit", "what"), COPY_EDITS)
def test_a_broken_copy_fails_the_check(edit: tuple, what: str) -> None:
    """fp8 rows of 37 one-byte words, 4 threads of LOADS words each: three rounds, the last ragged."""
    broken = source((edit,))
    rng = random.Random(6)
    with pytest.raises(AssertionError):
        for seed in range(2):
            counts, received, layout = arrivals(rng, 2, 2, 2, 37, True, seed, tokens=3)
            check(counts, received, layout, entries_of(counts), 4, False, blocks=2, seed=seed, module=broken)
