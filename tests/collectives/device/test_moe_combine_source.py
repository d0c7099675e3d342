"""The MoE combine's weighted-sum kernel as its own source runs it (CPU, no CuTeDSL compile),
against the torch steps it replaces.

:mod:`device_sim` executes :mod:`collectives.algorithms.moe_combine` from its source file over
simulated memory, with its float arithmetic (:mod:`collectives.device.rounding`: ``widen``,
``mul_rn``, ``add_rn``, ``narrow``) done by numpy's f32 and torch's conversions, each step
rounded as the PTX's ``mul.rn.f32`` / ``add.rn.f32`` / ``cvt.rn`` are (the PTX itself is checked
in ``tests/collectives/algorithms/test_moe_kernels_compile.py``).  So this checks which rows the
kernel reads for which token and weight, in which order it sums them, and that an unsent entry's
row (NaN here) never reaches an output: every output bit must be the torch steps'
(``tests/collectives/test_moe_world.py``'s ``entry_sum``, which gives the reference layer's
bits).  Grids of fewer threads than pieces (each thread takes several), 16-byte vectors and
single elements.
"""

from __future__ import annotations

import random
import types

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from tests.collectives.test_moe_world import entry_sum  # noqa: E402
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives.algorithms.moe_combine import MoeCombineKey  # noqa: E402
from collectives.dtypes import DTYPES  # noqa: E402

FAKES = fakes()
Int64, Uint8, Uint16, Uint32 = (FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8, FAKES["cutlass"].Uint16,
                                FAKES["cutlass"].Uint32)
THREADS = 4
#: A dtype's bits as torch holds them, and as the simulation does.
BITS = {torch.float32: (torch.int32, Uint32), torch.bfloat16: (torch.int16, Uint16),
        torch.float16: (torch.int16, Uint16)}


def rounding(rows: torch.dtype) -> types.SimpleNamespace:
    """:mod:`collectives.device.rounding` on simulated values: loads are bits (16-bit ones are
    ``rows``' elements, 32-bit ones f32), arithmetic is numpy's f32 (one rounding per step)."""

    def widen(value) -> np.float32:
        if isinstance(value, np.float32):
            return value
        dtype = torch.float32 if value.width == 32 else rows
        return np.float32(torch.tensor(value.v, dtype=BITS[dtype][0]).view(dtype).item())

    def narrow(values: list, dtype) -> object:
        bits_type, num = BITS[rows]
        out = [num(torch.tensor(float(v), dtype=torch.float32).to(rows).view(bits_type).item()) for v in values]
        return out[0] if len(out) == 1 else out

    return types.SimpleNamespace(zero=lambda: np.float32(0.0), widen=widen, narrow=narrow,
                                 mul_rn=lambda a, b: np.float32(a) * np.float32(b),
                                 add_rn=lambda a, b: np.float32(a) + np.float32(b))


def source(rows: torch.dtype, edits: tuple = ()) -> types.ModuleType:
    signals = load("collectives.device.signals", FAKES)
    return load("collectives.algorithms.moe_combine", {
        **FAKES,
        "collectives.device.signals": signals,
        "collectives.device": types.SimpleNamespace(rounding=rounding(rows)),
    }, edits)


def case(tokens: int, topk: int, hidden: int, dtype: torch.dtype, seed: int) -> tuple:
    """Received entries in a random sorted order (unsent ones NaN), their slots, valid flags
    and f32 weights (NaN where not valid: the kernel takes them as 0), as the combine passes them."""
    gen = torch.Generator().manual_seed(seed)
    n = tokens * topk
    order = torch.randperm(n, generator=gen)
    slots = torch.empty_like(order).scatter_(0, order, torch.arange(n))
    valid = torch.rand(n, generator=gen) < 0.8
    valid[order[0]] = False  # row 0, which the kernel reads for every unsent entry, is NaN too
    entries = torch.randn((n + 2, hidden), generator=gen).to(dtype)  # rows to spare, as a receive buffer has
    entries[slots[~valid]] = float("nan")
    weights = torch.where(valid, torch.rand(n, generator=gen), float("nan")).float()  # unsent: NaN, taken as 0
    return entries, slots, valid, weights


def run_kernel(module, entries, slots, valid, weights, tokens: int, topk: int, vec: int, blocks: int, seed: int):
    dtype, hidden = entries.dtype, entries.shape[1]
    key = MoeCombineKey(DTYPES_BY_TORCH[dtype], topk, vec)
    object.__setattr__(key, "threads", THREADS)  # scaled down: pieces outnumber the threads
    kernel = module.build(key)
    sim = Sim(seed)
    mem = sim.memory
    bits_type, num = BITS[dtype]
    width = entries.element_size()
    at = {"entries": mem.alloc(entries.numel() * width), "out": mem.alloc(max(tokens * hidden * width, 1)),
          "slots": mem.alloc(8 * max(slots.numel(), 1)), "valid": mem.alloc(max(valid.numel(), 1)),
          "weights": mem.alloc(4 * max(weights.numel(), 1))}
    for i, v in enumerate(entries.view(bits_type).reshape(-1).tolist()):
        mem.store(at["entries"] + i * width, v, num)
    for i, v in enumerate(slots.tolist()):
        mem.store(at["slots"] + 8 * i, v, Int64)
    for i, v in enumerate(valid.tolist()):
        mem.store(at["valid"] + i, int(v), Uint8)
    for i, v in enumerate(weights.view(torch.int32).tolist()):
        mem.store(at["weights"] + 4 * i, v, Uint32)
    args = types.SimpleNamespace(out=Int64(at["out"]), entries=Int64(at["entries"]), slots=Int64(at["slots"]),
                                 valid=Int64(at["valid"]), weights=Int64(at["weights"]), tokens=Int64(tokens),
                                 hidden=Int64(hidden))
    sim.spawn(lambda: sim.launch(lambda: kernel(args), Context(rank=0, call=0), blocks, THREADS), Context(rank=0))
    sim.run()
    words = mem.words(at["out"], tokens * hidden, num)
    return torch.tensor(words, dtype=torch.int64).to(bits_type).view(dtype).view(tokens, hidden)


DTYPES_BY_TORCH = {DTYPES[name].torch: name for name in ("f32", "f16", "bf16")}


@pytest.mark.parametrize(("dtype", "topk", "hidden", "vec"), [
    (torch.bfloat16, 4, 16, 8), (torch.bfloat16, 3, 5, 1), (torch.float16, 2, 8, 8), (torch.float32, 8, 8, 4),
    (torch.float32, 1, 3, 1)])
def test_weighted_sum_matches_the_torch_steps(dtype: torch.dtype, topk: int, hidden: int, vec: int) -> None:
    module = source(dtype)
    rng = random.Random(topk * 31 + hidden)
    for seed in range(2):
        tokens = rng.choice([1, 2, 3])
        entries, slots, valid, weights = case(tokens, topk, hidden, dtype, seed)
        got = run_kernel(module, entries, slots, valid, weights, tokens, topk, vec, blocks=rng.choice([1, 2]),
                         seed=seed)
        want = entry_sum(entries, slots, valid, weights, tokens, topk)
        assert not torch.isnan(want).any()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (seed, got, want)


@pytest.mark.parametrize("edit", [
    ("e = cutlass.select_(sent != Uint8(0), e, rounding.zero())", "e = e"),  # an unsent row's NaN gets through
    ("w = cutlass.select_(sent != Uint8(0), w, rounding.zero())", "w = w"),  # an unsent entry's NaN weight too
    ("f = t * topk + k", "f = t * topk + (topk - 1 - k)"),  # sums in the other order
    ("total[i] = term if cutlass.const_expr(k == 0) else rounding.add_rn(total[i], term)",
     "total[i] = term"),  # keeps the last term only
])
def test_a_broken_kernel_fails_the_check(edit: tuple) -> None:
    """Each edit of the kernel's source is caught (f32 rows: an order of the sum shows in the bits)."""
    broken = source(torch.float32, (edit,))
    entries, slots, valid, weights = case(3, 8, 8, torch.float32, 0)
    got = run_kernel(broken, entries, slots, valid, weights, 3, 8, 4, blocks=2, seed=0)
    want = entry_sum(entries, slots, valid, weights, 3, 8)
    assert not torch.equal(got.view(torch.uint8), want.view(torch.uint8))
