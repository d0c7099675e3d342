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


def run_kernel(counts: torch.Tensor, room: int, row_bytes: int, capacity: int, exact: bool, blocks: int,
               seed: int, module: types.ModuleType = SOURCE, values: int | None = None) -> dict:
    """The kernel on ``counts`` ([W, L]) and ``room`` received rows of ``row_bytes`` (byte
    ``b`` of row ``i``: ``(7 * i + b) % 251``), ``values`` bytes of each placed (None: all;
    fewer: fp8 rows, the 4 bytes after them placed into ``scales``); what it wrote."""
    world, local = counts.shape
    out_bytes = row_bytes if values is None else values
    key = MoePlaceKey(world, local, exact, MoePlaceKey.word_for(math.gcd(row_bytes, out_bytes)),
                      scales=out_bytes < row_bytes)
    object.__setattr__(key, "threads", THREADS)  # scaled down: a row's words outnumber the threads
    kernel = module.build(key)
    rows_out = int(counts.sum()) if exact else local * capacity
    sim = Sim(seed)
    mem = sim.memory
    at = {name: mem.alloc(size) for name, size in [
        ("counts", 8 * world * local), ("received", max(room * row_bytes, 1)),
        ("expert_x", (rows_out + 1) * out_bytes), ("scales", 4 * (rows_out + 1)), ("place", 8 * room),
        ("kept", max(room, 1)), ("tallies", 8 * (local + 2 + world))]}  # counts, lost, dropped before, splits
    for s, c in enumerate(counts.reshape(-1).tolist()):
        mem.store(at["counts"] + 8 * s, c, Int64)
    mem.store(at["tallies"] + 8 * (local + 1), DROPPED_BEFORE, Int64)
    for i in range(room):
        for b in range(row_bytes):
            mem.store(at["received"] + i * row_bytes + b, (7 * i + b) % 251, Uint8)
    for name, size in (("expert_x", (rows_out + 1) * out_bytes), ("scales", 4 * (rows_out + 1))):
        for b in range(size):
            mem.store(at[name] + b, UNTOUCHED, Uint8)
    args = types.SimpleNamespace(
        counts=Int64(at["counts"]), received=Int64(at["received"]), expert_x=Int64(at["expert_x"]),
        scales=Int64(at["scales"]), out_words=Int64(out_bytes // key.word),
        place=Int64(at["place"]), kept=Int64(at["kept"]), expert_counts=Int64(at["tallies"]),
        lost=Int64(at["tallies"] + 8 * local), dropped_before=Int64(at["tallies"] + 8 * (local + 1)),
        recv_splits=Int64(at["tallies"] + 8 * (local + 2)), room=Int64(room), capacity=Int64(capacity),
        row_words=Int64(row_bytes // key.word))
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


def check(counts: torch.Tensor, room: int, row_bytes: int, capacity: int, exact: bool, blocks: int, seed: int,
          module: types.ModuleType = SOURCE, values: int | None = None, counted: bool = True) -> None:
    """The kernel's writes against the torch steps' (``counted``: the dropped count too)."""
    got = run_kernel(counts, room, row_bytes, capacity, exact, blocks, seed, module, values)
    received = torch.tensor([[(7 * i + b) % 251 for b in range(row_bytes)] for i in range(room)],
                            dtype=torch.uint8).view(room, row_bytes)
    rows_out = int(counts.sum()) if exact else counts.shape[1] * capacity
    want_x, place, kept, expert_counts, lost, scales, recv = moe.place_rows(
        counts, received, rows_out, capacity, exact, torch.tensor(DROPPED_BEFORE), values)
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


def random_counts(rng: random.Random, world: int, local: int, most: int) -> torch.Tensor:
    counts = torch.tensor([[rng.choice([0, 0, 1, 2, most]) for _ in range(local)] for _ in range(world)])
    if rng.random() < 0.5:
        counts[rng.randrange(world)] = 0  # a source that sent this rank nothing
    return counts


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
@pytest.mark.parametrize("row_bytes", [16, 24, 12, 6, 5])
def test_placement_matches_the_torch_steps(exact: bool, row_bytes: int) -> None:
    rng = random.Random(row_bytes * 2 + exact)
    for seed in range(3):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2), (4, 1)])
        counts = random_counts(rng, world, local, 3)
        capacity = rng.choice([1, 2, 4])
        room = int(counts.sum()) + rng.choice([0, 2])  # the receive buffer may have rows to spare
        check(counts, room, row_bytes, capacity, exact, blocks=rng.choice([1, 2, 3]), seed=seed)


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
@pytest.mark.parametrize(("values", "row_bytes"), [(32, 48), (28, 48), (6, 16), (16, 32)])
def test_fp8_rows_are_split_into_values_and_scales(exact: bool, values: int, row_bytes: int) -> None:
    """fp8 rows (``values`` e4m3 bytes, the scale's 4, zeros to ``row_bytes``): the values placed
    as rows of their own and the scales as f32s of their own, as the torch steps split them."""
    rng = random.Random(values + row_bytes + exact)
    for seed in range(2):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2)])
        counts = random_counts(rng, world, local, 3)
        room = int(counts.sum()) + rng.choice([0, 2])
        check(counts, room, row_bytes, rng.choice([1, 2, 4]), exact, blocks=rng.choice([1, 2]), seed=seed,
              values=values)


@pytest.mark.parametrize("exact", [False, True], ids=["low_latency", "throughput"])
def test_more_experts_and_segments_than_threads(exact: bool) -> None:
    """A thread per expert takes several (6 and 9 experts, 4 threads), the starts' prefix sums
    run over segments several times the threads."""
    rng = random.Random(11 + exact)
    for seed, (world, local) in enumerate([(2, 6), (3, 9), (1, 5)]):
        counts = random_counts(rng, world, local, 3)
        room = int(counts.sum()) + 1
        check(counts, room, 8, rng.choice([1, 2, 4]), exact, blocks=2, seed=seed)


def test_counts_past_the_room_place_only_its_rows() -> None:
    """Counts that sum past the receive buffer's rows (never from a completed exchange): only its
    rows are read, placed and flagged, as the torch steps do (the dropped count is the counts')."""
    counts = torch.tensor([[2, 1], [3, 2]])
    for exact in (False, True):
        check(counts, 5, 8, 4, exact, blocks=2, seed=5, counted=False)


def test_nothing_received() -> None:
    check(torch.zeros((2, 2), dtype=torch.int64), 3, 8, 2, False, blocks=2, seed=1)
    check(torch.zeros((2, 2), dtype=torch.int64), 0, 8, 2, True, blocks=1, seed=2)


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
    (("starts[(w + 1) * local] - starts[w * local]", "starts[(w + 1) * local]"), "the rows each source sent"),
    (("lost = ptxops.ld(gmem(Int64, args.dropped_before, 8, LOCAL, by), dtype=Int64)", "lost = Int64(0)"),
     "the entries dropped before"),
    (("v += ping[j + 1 - level % 2 - (1 << level)]", "v = ping[j + 1 - level % 2 - (1 << level)]"),
     "the starts' prefix sums"),
    (("range_constexpr(max(segments - 1, 1).bit_length())", "range_constexpr(max(segments - 1, 1).bit_length() - 1)"),
     "the prefix sums' rounds"),
    (("starts[j + 1] = before[j]", "starts[j] = before[j]"), "the sums back from the spare"),
    (("while i < arrived:", "while i < arrived - 1:"), "the arrived rows' copies"),
    (("i += grid * threads", "i += grid * threads + 1"), "the rows' places over the grid"),
    (("+ args.out_words) * key.word", "+ args.out_words + 1) * key.word"), "the scale's bytes"),
    (("LOCAL, by) + place, scale)", "LOCAL, by) + place + 1, scale)"), "the scale's word"),
    (("dst = gmem(element, args.expert_x, key.word, LOCAL, by) + place * args.out_words * per_word",
      "dst = gmem(element, args.expert_x, key.word, LOCAL, by) + place * args.row_words * per_word"),
     "the placed rows' width"),
])
def test_a_broken_kernel_fails_the_check(edit: tuple, what: str) -> None:
    """Each edit of the kernel's source is caught (so the check reads what the kernel does)."""
    broken = source((edit,))
    counts = torch.tensor([[2, 1, 0], [3, 0, 1]])  # 6 segments, 3 experts: more than the 4 threads
    with pytest.raises(AssertionError):
        for seed in range(3):
            check(counts, 8, 16, 2, False, blocks=1 + seed % 2, seed=seed, module=broken, values=8)


@pytest.mark.parametrize(("edit", "what"), [
    (("experts += first[m]", "experts += counts[m]"), "the rows of the experts before"),
    (("while m < l:", "while m <= l:"), "the experts before, not this one"),
])
def test_a_broken_throughput_kernel_fails_the_check(edit: tuple, what: str) -> None:
    broken = source((edit,))
    counts = torch.tensor([[2, 1, 0, 2, 1], [3, 0, 1, 1, 2]])  # 5 experts: more than the 4 threads
    with pytest.raises(AssertionError):
        for seed in range(3):
            check(counts, 14, 16, 2, True, blocks=2, seed=seed, module=broken)


@pytest.mark.parametrize(("edit", "what"), COPY_EDITS)
def test_a_broken_copy_fails_the_check(edit: tuple, what: str) -> None:
    """Rows of 37 one-byte words, 4 threads of LOADS words each: three rounds, the last ragged."""
    broken = source((edit,))
    with pytest.raises(AssertionError):
        for seed in range(2):
            check(torch.tensor([[2, 1], [1, 2]]), 7, 37, 4, False, blocks=2, seed=seed, module=broken)
