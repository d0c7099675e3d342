"""The MoE dispatch's routing kernel as its own source runs it (CPU, no CuTeDSL compile), against
the torch steps it replaces (:func:`collectives.moe.route_ids`: the id mapping, the mask, the
stable sort, the counts, the splits; the sort's inverse, which the packing kernel reads).

:mod:`device_sim` executes :mod:`collectives.algorithms.moe_route` from its source file over
simulated memory, threads interleaved at random at every access: ids of both dtypes from random
routings (tokens naming one expert twice, experts no entry names, ids below 0 and past the last
expert), entries fewer and more than a block's threads (two groups of lanes, each several rounds: the
counts carried from round to round and from group to group), and no entries.  The order, the mask, the bins and the splits must be the torch
steps' exactly.
"""

from __future__ import annotations

import random
import types

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.algorithms.moe_route import MoeRouteKey  # noqa: E402

FAKES = fakes()
Int32, Int64, Uint8 = FAKES["cutlass"].Int32, FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8
THREADS, LANES, UNTOUCHED = 8, 4, 0x5A  # two groups of four
ROW_BYTES = 16  # a sent row's (the messages' rows: 8 (L + 1) bytes over 16-byte rows)


def source(edits: tuple = ()) -> types.ModuleType:
    """The simulated ``collectives.algorithms.moe_route`` (``edits``: its source edits)."""
    signals = load("collectives.device.signals", FAKES)
    return load("collectives.algorithms.moe_route", {**FAKES, "collectives.device.signals": signals}, edits)


SOURCE = source()


def run_kernel(ids: torch.Tensor, experts: int, world: int, seed: int, module: types.ModuleType = SOURCE,
               topk: int = 1, gap: int = 0, head: int = 0) -> tuple[torch.Tensor, ...]:
    """The kernel on the flat ``ids``, rows of ``topk`` of them ``gap`` elements apart in memory (a
    slice of a wider tensor): what it wrote (order, valid, bins, send_splits, slots, rows, and the
    sent rows of :data:`ROW_BYTES` and the rows' splits: with ``head`` rows heading each rank's
    chunk, a low-latency dispatch's)."""
    key = MoeRouteKey.for_experts("i32" if ids.dtype == torch.int32 else "i64", experts, world)  # (its bounds)
    object.__setattr__(key, "threads", THREADS)  # scaled down: entries outnumber the threads, two groups
    object.__setattr__(key, "lanes", LANES)
    kernel = module.build(key)
    n, size = ids.numel(), ids.element_size()
    stride = topk + gap
    sim = Sim(seed)
    mem = sim.memory
    at = {name: mem.alloc(max(nbytes, 1)) for name, nbytes in [
        ("ids", size * stride * -(-n // topk)), ("order", 8 * n), ("valid", n), ("bins", 8 * (experts + world + 1)),
        ("send", 8 * world), ("slots", 8 * n), ("rows", 8 * n), ("sent", ROW_BYTES * (n + world * head)),
        ("row_splits", 8 * world)]}
    for i, v in enumerate(ids.tolist()):
        mem.store(at["ids"] + size * (i // topk * stride + i % topk), v, Int32 if size == 4 else Int64)
    for t in range(-(-n // topk)):  # the gaps hold ids of expert 0, which must not be read
        for g in range(gap):
            mem.store(at["ids"] + size * (t * stride + topk + g), 0, Int32 if size == 4 else Int64)
    sizes = {"order": 8 * n, "valid": n, "bins": 8 * (experts + world + 1), "send": 8 * world, "slots": 8 * n,
             "rows": 8 * n, "sent": ROW_BYTES * (n + world * head), "row_splits": 8 * world}
    for name, nbytes in sizes.items():
        for b in range(nbytes):
            mem.store(at[name] + b, UNTOUCHED, Uint8)
    args = types.SimpleNamespace(ids=Int64(at["ids"]), topk=Int64(topk), stride=Int64(stride), n=Int64(n),
                                 experts=Int64(experts), local=Int64(experts // world), order=Int64(at["order"]),
                                 valid=Int64(at["valid"]), bins=Int64(at["bins"]), send_splits=Int64(at["send"]),
                                 slots=Int64(at["slots"]), rows=Int64(at["rows"]), head_rows=Int64(head),
                                 sent=Int64(at["sent"]), row_bytes=Int64(ROW_BYTES),
                                 row_splits=Int64(at["row_splits"]))
    sim.spawn(lambda: sim.launch(lambda: kernel(args), Context(rank=0, call=0), 1, THREADS, [0]), Context(rank=0))
    sim.run()
    return (torch.tensor(mem.words(at["order"], n, Int64), dtype=torch.int64),
            torch.tensor(mem.words(at["valid"], n, Uint8), dtype=torch.uint8),
            torch.tensor(mem.words(at["bins"], experts + world + 1, Int64), dtype=torch.int64),
            torch.tensor(mem.words(at["send"], world, Int64), dtype=torch.int64),
            torch.tensor(mem.words(at["slots"], n, Int64), dtype=torch.int64),
            torch.tensor(mem.words(at["rows"], n, Int64), dtype=torch.int64),
            torch.tensor(mem.words(at["sent"], sizes["sent"], Uint8), dtype=torch.uint8),
            torch.tensor(mem.words(at["row_splits"], world, Int64), dtype=torch.int64))


def check(ids: torch.Tensor, experts: int, world: int, seed: int, module: types.ModuleType = SOURCE,
          topk: int = 1, gap: int = 0, head: int = 0) -> None:
    """The kernel's writes against :func:`collectives.moe.route_ids`' (``head``: with the
    messages heading each rank's chunk of the sent rows; none written without)."""
    order, valid, bins, send, slots, rows, sent, row_splits = run_kernel(ids, experts, world, seed, module, topk,
                                                                         gap, head)
    want_sent = torch.full((sent.numel() // ROW_BYTES, ROW_BYTES), UNTOUCHED, dtype=torch.uint8)
    want_splits = torch.full((world,), int.from_bytes(bytes([UNTOUCHED]) * 8, "little", signed=True))
    want = moe.route_ids(ids.view(-1, topk), experts, world,
                         head=(want_sent, head, want_splits) if head else None)
    assert torch.equal(sent, want_sent.view(-1)), (sent, want_sent)
    assert torch.equal(row_splits, want_splits), (row_splits, want_splits)
    assert torch.equal(order, want[0]), (order, want[0])
    assert torch.equal(valid, want[1].to(torch.uint8)), (valid, want[1])
    assert torch.equal(bins, want[2]), (bins, want[2])
    assert torch.equal(send, want[3]), (send, want[3])
    assert torch.equal(slots, moe.inverse(want[0])), (slots, want[0])
    assert torch.equal(rows, want[5]), (rows, want[5])


def random_ids(rng: random.Random, tokens: int, topk: int, experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Each token's ``topk`` ids: distinct experts, now and then one named twice, and out-of-range ids."""
    rows = []
    for _ in range(tokens):
        row = rng.sample(range(experts), min(topk, experts))
        if rng.random() < 0.3:
            row[-1] = row[0]
        if rng.random() < 0.3:
            row[rng.randrange(len(row))] = rng.choice([-1, -7, experts, experts + 5])
        rows.append(row)
    return torch.tensor(rows, dtype=dtype).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_routing_matches_the_torch_steps(dtype: torch.dtype) -> None:
    rng = random.Random(7 if dtype == torch.int64 else 8)
    for seed in range(4):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2), (4, 2), (1, 5)])
        experts = world * local
        tokens, topk = rng.choice([1, 2, 3, 5]), min(rng.choice([1, 2, 4]), experts)  # (random_ids' rows)
        check(random_ids(rng, tokens, topk, experts, dtype), experts, world, seed, topk=topk,
              gap=rng.choice([0, 3]))


def test_no_entries_and_every_entry_to_one_expert() -> None:
    check(torch.empty(0, dtype=torch.int64), 4, 2, seed=1)
    check(torch.full((9,), 3, dtype=torch.int64), 4, 2, seed=2)
    check(torch.full((6,), 9, dtype=torch.int32), 4, 2, seed=3)  # every id out of range


def test_many_rounds_and_a_ragged_last_group() -> None:
    """67 entries of 3 experts: each group's span several rounds, the last group's short."""
    rng = random.Random(11)
    check(torch.tensor([rng.randrange(-1, 4) for _ in range(67)], dtype=torch.int64), 3, 3, seed=4)


def test_ids_sliced_from_a_wider_tensor_are_read_at_their_stride() -> None:
    """Rows of 3 ids, 5 elements apart (the gaps: expert 0, which must not count)."""
    rng = random.Random(12)
    for seed in range(2):
        check(random_ids(rng, 7, 3, 6, torch.int64), 6, 3, seed, topk=3, gap=2)


#: 64 tokens of one id of 4 experts: spans of 32, the two groups' tokens of a round 32 apart.
SPANS = torch.tensor([random.Random(15).randrange(-1, 5) for _ in range(64)], dtype=torch.int64)
#: 20 experts (21 bins, the scan over chunks of THREADS of them, each thread several).
WIDE = random_ids(random.Random(13), 9, 3, 20, torch.int64)


def test_more_bins_than_the_block_has_threads() -> None:
    """The experts' scan over chunks of bins, the block's threads each taking several."""
    rng = random.Random(14)
    check(WIDE, 20, 4, seed=5, topk=3)
    for seed in range(2):
        check(random_ids(rng, 11, 4, 30, torch.int32), 30, 5, seed, topk=4, gap=1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_row_per_token_and_rank_across_rounds_and_groups(world: int) -> None:
    """Tokens of 3 entries over two groups of several rounds (a token's entries split between
    rounds and between the groups): its rows to 1, some and every rank, experts named twice."""
    rng = random.Random(20 + world)
    for seed in range(2):
        check(random_ids(rng, 13, 3, 2 * world, torch.int64), 2 * world, world, seed, topk=3)
    check(torch.tensor([0, 0, 1, 1, 2 * world - 1, 0, -1, 9, 3] * 3, dtype=torch.int64), 2 * world, world, 2,
          topk=3)


@pytest.mark.parametrize("topk", [2, 4, 5, 8])
def test_a_tokens_rows_within_a_round_and_across_rounds(topk: int) -> None:
    """A row's owner from the token's lanes in its group's round (2 and 4 ids a token: none
    across rounds of 4 lanes) and from its ids loaded again (5 and 8: a token's entries over
    rounds and groups), tokens naming a rank's experts several times, at a stride, with heads."""
    rng = random.Random(60 + topk)
    for seed, (world, local) in enumerate([(2, 4), (3, 3), (4, 2)]):
        experts = world * local
        ids = random_ids(rng, 9, topk, experts, torch.int32 if seed % 2 else torch.int64)
        check(ids, experts, world, seed, topk=topk, gap=seed, head=seed % 2)


@pytest.mark.parametrize(("edit", "what"), [
    (("popc(peers & ((Uint32(1) << Uint32(wl))", "popc(peers & ((Uint32(2) << Uint32(wl))"),
     "the rank among the group's round"),
    (("popc(owners & ((Uint32(1) << Uint32(wl))", "popc(owners & ((Uint32(2) << Uint32(wl))"),
     "the owners before an entry in the group's round"),
    (("popc(peers >> Uint32(wl) >> Uint32(1)", "popc(peers >> Uint32(wl)"), "the round's last entry of an expert"),
    (("popc(row_peers >> Uint32(wl) >> Uint32(1)", "popc(row_peers >> Uint32(wl)"),
     "the round's last entry of a rank"),
    (("e * (WARP // lanes) + wl // lanes)", "e * (WARP // lanes))"), "the match's group (two groups share a warp)"),
    (("table[(g8 + u) * bins + j] = total", "table[(g8 + u) * bins + j] = Int32(0)"), "the earlier groups' entries"),
    (("table[(g8 + u) * bins + j] = counts[u] + start", "table[(g8 + u) * bins + j] = counts[0] + start"),
     "each group's start"),
    (("table[group * bins + e] = at + 1", "table[group * bins + e] = at"), "the count carried to the next round"),
    (("+ lanes - 1) // lanes * lanes", ") // lanes * lanes"), "the span's rounding up"),
    (("if raw >= Int64(0):", "if raw >= Int64(-1):"), "the ids below 0"),
    (("if raw < args.experts:", "if raw < args.experts + 8:"), "the ids past the last expert"),
    (("within += up", "within = up"), "the chunk's prefix sums (the warp's shuffles)"),
    (("if wl >= (1 << level):", "if wl >= 0:"), "the shuffles' lowest lanes"),
    (("starts[j] = within - total", "starts[j] = within"), "the exclusive prefix (off by one)"),
    (("if c < j // chunk:", "if c <= j // chunk:"), "the earlier chunks' entries"),
    (("if wl == chunk - 1:", "if wl == 0:"), "a chunk's sum"),
    (("- starts[w * local])", "- starts[w * local + 1])"), "the splits"),
    (("LOCAL, by) + i, Int64(at))", "LOCAL, by) + at, Int64(i))"), "the slots"),
    (("raw, inside = load_of(args, i + lanes)", "raw, inside = load_of(args, i)"), "the next round's entry"),
    (("e, rank = expert_of(args, raw, inside)  # (loaded", "e, rank = expert_of(args, raw, Int32(1))  # (loaded"),
     "the entries past n"),
    (("Int64(token) * args.stride", "Int64(token) * args.topk"), "the ids' row stride"),
    (("raw, inside = load_of(args, group * span + lane)  # the placing",
      "raw, inside = Int64(0), Int32(1)  # the placing"), "the placing pass's first entry"),
    (("while earlier < base - first:", "while earlier < base - first - 1:"),
     "a row's owner: every earlier entry of its token before the round"),
    (("if cute.arch.popc(mates & ((Uint32(1) << Uint32(wl))", "if cute.arch.popc(mates & ((Uint32(2) << Uint32(wl))"),
     "a row's owner: the token's lanes before it in the round"),
    (("+ token % WARP) * (WARP // lanes)", ") * (WARP // lanes)"), "a row's owner: its token's lanes, not its rank's"),
    (("((rank + 1) * WARP + token", "((rank + 1) * 0 + token"), "a row's owner: its token's lanes of its rank"),
    (("+ token % WARP) * (WARP // lanes) + wl // lanes)", "+ token % WARP) * (WARP // lanes))"),
     "a row's owner: the token's lanes of its group (a token across groups: loaded)"),
    (("if bin_of(args, id_at(args, token, earlier)) // local == rank:",
      "if bin_of(args, id_at(args, token, earlier)) == rank * local:"),
     "a row's owner: the token's entries to its rank, not its expert"),
    (("Int64(row_at + owners_before + owner - 1 - n)", "Int64(row_at + owners_before - n)"), "a row's entries"),
    (("row_at + Int32(cute.arch.popc(owners))", "row_at + Int32(1)"), "the rows a round counts"),
    (("(rank + 1) * (WARP // lanes) + wl // lanes)", "(rank + 1) * (WARP // lanes))"), "the row match's group"),
    (("+ i, Int64(-1))", "+ i, Int64(0))"), "an out-of-range entry's row"),
    (("word = (j - experts) * (Int32(args.local) + 1) - 1", "word = (j - experts) * Int32(args.local) - 1"),
     "the rows' place in the message"),
])
def test_a_broken_kernel_fails_the_check(edit: tuple, what: str) -> None:
    """Each edit of the kernel's source is caught (so the check reads what the kernel does)."""
    broken = source((edit,))
    # 6 experts (-1, 7, 11 dropped); 22 entries: both groups of the scaled-down block, two rounds each
    ids = torch.tensor([0, 7, 3, 3, -1, 5, 11, 2, 3, 3, 1, 3, 0, 3, 5, 3, 3, 2, 3, 0, 3, 4], dtype=torch.int64)
    with pytest.raises(AssertionError):
        for seed in range(3):
            check(ids, 6, 2, seed, module=broken, topk=2, gap=1)
            check(WIDE, 20, 4, seed, module=broken, topk=3)  # 21 bins: the scan's three chunks of THREADS
            check(SPANS, 4, 2, seed, module=broken)  # tokens 32 apart in a warp's two groups (one round)


def heads(world: int, seed: int, module: types.ModuleType = SOURCE) -> None:
    """Each rank's message heading its chunk of the sent rows (1, 2 and 3 rows of it: 1, 2 and 5
    experts a rank), its rows after it, the chunks' rows: the torch steps' (low latency)."""
    rng = random.Random(40 + world + seed)
    for local in (1, 2, 5):
        experts = local * world
        topk = min(3, experts)
        ids = random_ids(rng, 13, topk, experts, torch.int64)
        check(ids, experts, world, seed, module, topk=topk, head=-(-8 * (local + 1) // ROW_BYTES))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_messages_head_each_ranks_chunk_of_the_rows(world: int) -> None:
    heads(world, world)


@pytest.mark.parametrize(("edit", "what"), [
    (("+ Int64(rank + 1) * args.head_rows)", "+ Int64(rank) * args.head_rows)"), "the rows after their rank's head"),
    (("- n) + Int64(r) * args.head_rows", "- n) + Int64(r)"), "a rank's head after the heads before it"),
    (("ptxops.ld(words + w, dtype=Int64) + args.head_rows)", "ptxops.ld(words + w, dtype=Int64))"),
     "a chunk's rows: its head's too"),
    (("if w - r * (local + 1) == local:", "if w - r * (local + 1) == 0:"),
     "the message's word of the rows"),
    (("if args.head_rows > Int64(0):", "if args.head_rows > Int64(1):"), "the messages written for one head row"),
])
def test_a_broken_head_fails_the_check(edit: tuple, what: str) -> None:
    broken = source((edit,))
    with pytest.raises(AssertionError):
        for world in (2, 3):
            heads(world, 0, broken)
