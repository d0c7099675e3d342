"""The MoE combine's gather kernel as its own source runs it (CPU, no CuTeDSL compile), against
the torch steps it replaces (:func:`collectives.moe.gather_rows`).

:mod:`device_sim` executes :mod:`collectives.algorithms.moe_gather` from its source file over
simulated memory: expert output rows whose every byte names its row, places from the torch
placement of random counts (rows dropped past a capacity, rows of the receive buffer nothing
arrived in), every word size, grids of fewer blocks than rows and threads fewer than a row's
words.  Every row sent back must be the torch steps' (a placed row's bytes, else zeros), the
rows not kept read nothing (their places point past the rows), and the rows past those that
arrived (never sent back) are not written.
"""

from __future__ import annotations

import random
import types

import pytest

torch = pytest.importorskip("torch")
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.algorithms.moe_gather import MoeGatherKey  # noqa: E402
from collectives.algorithms.moe_place import MoePlaceKey  # noqa: E402

FAKES = fakes()
Int64, Uint8 = FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8
THREADS = 4


def source(edits: tuple = ()) -> types.ModuleType:
    signals = load("collectives.device.signals", FAKES)
    return load("collectives.algorithms.moe_gather", {**FAKES, "collectives.device.signals": signals}, edits)


SOURCE = source()


def random_counts(rng: random.Random, world: int, local: int, most: int) -> torch.Tensor:
    counts = torch.tensor([[rng.choice([0, 0, 1, 2, most]) for _ in range(local)] for _ in range(world)])
    if rng.random() < 0.5:
        counts[rng.randrange(world)] = 0  # a source that sent this rank nothing
    return counts


def check(counts: torch.Tensor, room: int, row_bytes: int, capacity: int, blocks: int, seed: int,
          module: types.ModuleType = SOURCE) -> None:
    world, local = counts.shape
    layout = moe.wire(1, 1, False, 1)  # (the places only: no row arrives)
    message = torch.cat((counts, torch.zeros((world, 1), dtype=counts.dtype)), 1)
    received = torch.zeros((world * moe.header_rows(local, layout), layout.bytes), dtype=torch.uint8)  # regions
    place, kept = moe.place_rows(message, received, room, local * capacity, capacity, False, layout=layout)[1:3]
    rows = torch.tensor([[(7 * i + b) % 251 for b in range(row_bytes)] for i in range(local * capacity)],
                        dtype=torch.uint8).view(-1, row_bytes)
    key = MoeGatherKey(MoePlaceKey.word_for(row_bytes))
    object.__setattr__(key, "threads", THREADS)
    kernel = module.build(key)
    sim = Sim(seed)
    mem = sim.memory
    at = {name: mem.alloc(size) for name, size in [
        ("out", max(room * row_bytes, 1)), ("rows", max(rows.numel(), 1)), ("place", max(8 * room, 1)),
        ("kept", max(room, 1)), ("splits", 8 * world), ("send", 8 * world), ("copy", 16 * world)]}
    splits = counts.sum(1)
    send = torch.arange(world) * 3 + 1  # what this rank sent each rank (the copy's first row)
    for i, (v, u) in enumerate(zip(splits.tolist(), send.tolist())):
        mem.store(at["splits"] + 8 * i, v, Int64)
        mem.store(at["send"] + 8 * i, u, Int64)
    for i, v in enumerate(rows.reshape(-1).tolist()):
        mem.store(at["rows"] + i, v, Uint8)
    for i, (p, k) in enumerate(zip(place.tolist(), kept.tolist())):
        mem.store(at["place"] + 8 * i, p, Int64)
        mem.store(at["kept"] + i, int(k), Uint8)
    for b in range(room * row_bytes):
        mem.store(at["out"] + b, 0xEE, Uint8)
    args = types.SimpleNamespace(out=Int64(at["out"]), rows=Int64(at["rows"]), place=Int64(at["place"]),
                                 kept=Int64(at["kept"]), room=Int64(room), splits=Int64(at["splits"]),
                                 world=Int64(world), send_splits=Int64(at["send"]), copy=Int64(at["copy"]),
                                 row_words=Int64(row_bytes // key.word))
    rng = random.Random(seed)
    sim.spawn(lambda: sim.launch(lambda: kernel(args), Context(rank=0, call=0), blocks, THREADS,
                                 [rng.choice([0, 0, 50]) for _ in range(blocks)]), Context(rank=0))
    sim.run()
    got = torch.tensor(mem.words(at["out"], room * row_bytes, Uint8), dtype=torch.uint8).view(room, row_bytes)
    arrived = int(splits.sum())
    copy = torch.empty((2, world), dtype=torch.int64)
    assert torch.equal(got[:arrived], moe.gather_rows(rows, place, kept, send, splits, copy,
                                                        torch.empty_like(got))[:arrived])
    assert bool((got[arrived:] == 0xEE).all()), "a row nothing arrived in was written"
    assert torch.equal(torch.tensor(mem.words(at["copy"], 2 * world, Int64)).view(2, world), copy)


@pytest.mark.parametrize("row_bytes", [16, 24, 12, 6, 5])
def test_gather_matches_the_torch_steps(row_bytes: int) -> None:
    rng = random.Random(row_bytes)
    for seed in range(3):
        world, local = rng.choice([(2, 1), (2, 3), (3, 2)])
        counts = random_counts(rng, world, local, 3)
        room = int(counts.sum()) + rng.choice([0, 2])  # rows nothing arrived in
        check(counts, room, row_bytes, rng.choice([1, 2, 4]), blocks=rng.choice([1, 2, 3]), seed=seed)


@pytest.mark.parametrize("edit", [
    ("LOCAL, by) + i) != Uint8(0):", "LOCAL, by) + i) == Uint8(0):"),  # (kept rows zeroed, dropped ones copied)
    ("+ place * args.row_words * per_word", "+ i * args.row_words * per_word"),
    ("words[e] = element(0)", "words[e] = element(1)"),
    ("while i < end:", "while i < args.room:"),
    ("j += Int64(1)", "j += Int64(2)"),
    ("LOCAL, by) + args.world + j,", "LOCAL, by) + j,"),
])
def test_a_broken_kernel_fails_the_check(edit: tuple) -> None:
    """Each edit of the kernel's source is caught (so the check reads what the kernel does)."""
    broken = source((edit,))
    with pytest.raises((AssertionError, IndexError)):
        for seed in range(3):
            check(torch.tensor([[1, 2], [2, 1]]), 8, 8, 2, blocks=2, seed=seed, module=broken)


@pytest.mark.parametrize("edit", [
    ("if w + u * threads <= last:", "if w + u * threads < last:"),  # the row's last word
    ("w += LOADS * threads", "w += LOADS * threads + threads"),  # the rounds' stride
    ("min(w + u * threads, last)", "min(w + u, last)"),  # the words of a round
])
def test_a_broken_copy_fails_the_check(edit: tuple) -> None:
    """Rows of 37 one-byte words, fewer threads than LOADS x threads words: three rounds, the last ragged."""
    broken = source((edit,))
    with pytest.raises(AssertionError):
        for seed in range(2):
            check(torch.tensor([[1, 2], [2, 1]]), 8, 37, 2, blocks=2, seed=seed, module=broken)
