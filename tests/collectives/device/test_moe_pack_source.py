"""The MoE dispatch's fp8 packing kernel as its own source runs it (CPU, no CuTeDSL compile),
against the torch steps it replaces (:func:`collectives.moe.pack_rows`: :func:`~collectives.moe.quantize`,
the packing of values and scale, the gather of the sent rows).

:mod:`device_sim` executes :mod:`collectives.algorithms.moe_pack` from its source file over
simulated memory, with its float arithmetic (:mod:`collectives.device.rounding`: ``widen``,
``amax``, ``fp8_scale``, ``div_rn``, ``e4m3``, ``narrow``) done by numpy's f32 and torch's
conversion, each step rounded as its PTX is (``max.NaN.f32``, ``div.rn.f32``; the PTX, and
``e4m3``'s NaN past 464 where PTX saturates, are checked in
``tests/collectives/algorithms/test_moe_kernels_compile.py``).  So this checks which token each
sent row quantizes, the block's largest magnitude (a tree over threads fewer than the row's
pieces), the scale's bytes, the zeros after them and every value byte: each row must be the
torch steps' bit for bit.  Rows: random, a zero row (scale 1), one with a NaN (scale 1: its
values past 464 become NaN, as torch's conversion makes them), and one of tiny values.
"""

from __future__ import annotations

import random
import types

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from tests.support import device_sim  # noqa: E402
from tests.support.device_sim import Context, Sim, fakes, load  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.algorithms.moe_pack import MoePackKey  # noqa: E402
from collectives.runtime.moe import pack_key  # noqa: E402

FAKES = fakes()
Int64, Uint8, Uint16, Uint32 = (FAKES["cutlass"].Int64, FAKES["cutlass"].Uint8, FAKES["cutlass"].Uint16,
                                FAKES["cutlass"].Uint32)
THREADS = 4
BITS = {torch.float32: (torch.int32, Uint32), torch.bfloat16: (torch.int16, Uint16),
        torch.float16: (torch.int16, Uint16), torch.float8_e4m3fn: (torch.uint8, Uint8)}


class F32(device_sim.Float32):
    """``Float32`` as the kernel makes values of it (shared memory, constants): numpy's f32."""

    def __new__(cls, value: float = 0.0) -> np.float32:
        return np.float32(value)


def rounding(rows: torch.dtype) -> types.SimpleNamespace:
    """:mod:`collectives.device.rounding` on simulated values (loads are ``rows``' bits)."""

    def widen(value) -> np.float32:
        if isinstance(value, np.floating):
            return np.float32(value)
        dtype = torch.float32 if value.width == 32 else rows
        return np.float32(torch.tensor(value.v, dtype=BITS[dtype][0]).view(dtype).item())

    def e4m3(value) -> Uint8:
        return Uint8(torch.tensor([float(value)], dtype=torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)[0])

    def narrow(values: list, dtype) -> Uint32:
        assert len(values) == 1
        return Uint32(torch.tensor([float(values[0])], dtype=torch.float32).view(torch.int32).item())

    return types.SimpleNamespace(
        zero=lambda: np.float32(0.0), widen=widen, e4m3=e4m3, narrow=narrow,
        amax=lambda most, v: np.maximum(np.float32(most), np.abs(np.float32(v))),
        div_rn=lambda a, b: np.float32(a) / np.float32(b),
        fp8_scale=lambda most: np.float32(most) / np.float32(moe.E4M3_MAX) if most > 0 else np.float32(1.0))


def source(rows: torch.dtype, edits: tuple = (), warp: int = 2) -> types.ModuleType:
    """The kernel's module over simulated memory, its warps of ``warp`` lanes (2: a block of
    :data:`THREADS` is two warps, so both the shuffles and the warps' round in shared memory run)."""
    signals = load("collectives.device.signals", FAKES)
    cute = types.SimpleNamespace(**{**vars(FAKES["cutlass.cute"]),
                                    "arch": types.SimpleNamespace(**{**vars(FAKES["cutlass.cute"].arch),
                                                                     "WARP_SIZE": warp})})
    return load("collectives.algorithms.moe_pack", {
        **FAKES,
        "cutlass.cute": cute,
        "cutlass": types.SimpleNamespace(**{**vars(FAKES["cutlass"]), "Float32": F32, "cute": cute}),
        "collectives.device.signals": signals,
        "collectives.device": types.SimpleNamespace(rounding=rounding(rows)),
    }, edits)


def tokens_of(dtype: torch.dtype, tokens: int, hidden: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((tokens, hidden), generator=gen) * 3
    x[0] = 0  # scale 1
    if tokens > 1:  # a NaN: scale 1, and values past 464 are NaN in torch's conversion
        x[1, 0], x[1, 1], x[1, 2] = float("nan"), 470.0, -1000.0
    if tokens > 2:
        x[2] = x[2] * 1e-6  # tiny values (subnormal e4m3 bytes)
    if tokens > 3 and hidden > 176:  # largest magnitudes past a thread's registers (16 pieces of 8 bf16 at 4
        x[3, 130] = 50.0  # threads): in the first piece of the next batch, and in its second piece
        x[2, 170] = -1e-3
    return x.to(dtype)


def run_kernel(x: torch.Tensor, routed: tuple, world: int, topk: int, blocks: int, seed: int,
               module: types.ModuleType, fp8: bool = True) -> torch.Tensor:
    """The kernel's sent rows (as bytes) for tokens ``x`` routed by :func:`collectives.moe.route_ids`
    (``routed``: its order, send splits and rows)."""
    order, send, carriers = routed
    tokens, hidden = x.shape
    key = pack_key(x.dtype, hidden, fp8)
    object.__setattr__(key, "threads", THREADS)  # scaled down: a row's pieces outnumber the threads
    kernel = module.build(key)
    layout = moe.wire(hidden, x.element_size(), fp8, topk)
    n, sent = carriers.numel(), int(carriers.max()) + 1 if carriers.numel() else 0
    sim = Sim(seed)
    mem = sim.memory
    at = {name: mem.alloc(size) for name, size in [
        ("rows", max(sent * layout.bytes, 1)), ("x", max(x.numel() * x.element_size(), 1)), ("slots", max(8 * n, 1)),
        ("carriers", max(8 * n, 1)), ("send", 8 * world)]}
    bits_type, num = BITS[x.dtype]
    for i, v in enumerate(x.reshape(-1).view(bits_type).tolist()):
        mem.store(at["x"] + i * x.element_size(), v, num)
    for name, values in (("slots", moe.inverse(order)), ("carriers", carriers), ("send", send)):
        for i, v in enumerate(values.tolist()):
            mem.store(at[name] + 8 * i, v, Int64)
    for b in range(sent * layout.bytes):
        mem.store(at["rows"] + b, 0xEE, Uint8)
    args = types.SimpleNamespace(rows=Int64(at["rows"]), x=Int64(at["x"]), carriers=Int64(at["carriers"]),
                                 slots=Int64(at["slots"]), send_splits=Int64(at["send"]), world=Int64(world),
                                 tokens=Int64(tokens), topk=Int64(topk), hidden=Int64(hidden),
                                 header=Int64(layout.header), row_bytes=Int64(layout.bytes))
    rng = random.Random(seed)
    sim.spawn(lambda: sim.launch(lambda: kernel(args), Context(rank=0, call=0), blocks, THREADS,
                                 [rng.choice([0, 0, 50]) for _ in range(blocks)]), Context(rank=0))
    sim.run()
    return torch.tensor(mem.words(at["rows"], sent * layout.bytes, Uint8), dtype=torch.uint8).view(sent, layout.bytes)


def routing_of(tokens: int, topk: int, world: int, seed: int) -> torch.Tensor:
    """Ids of 2 experts a rank: tokens to one rank, to some, to every rank; an expert named twice,
    ids out of range."""
    rng = random.Random(seed)
    rows = []
    for t in range(tokens):
        kind = t % 3
        row = [(rng.randrange(world) if kind == 0 else k % world if kind == 1 else rng.randrange(world)) * 2
               + rng.randrange(2) for k in range(topk)]
        if kind == 0:
            row = [row[0] // 2 * 2 + rng.randrange(2) for _ in range(topk)]
        if rng.random() < 0.3:
            row[rng.randrange(topk)] = rng.choice([-1, 2 * world])
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64).view(tokens, topk)


def check(dtype: torch.dtype, tokens: int, hidden: int, topk: int, blocks: int, seed: int,
          module: types.ModuleType | None = None, fp8: bool = True, world: int = 3) -> None:
    """The rows as the torch steps make them (:func:`collectives.moe.pack_rows`), a row per
    (token, rank) from the routing's."""
    x = tokens_of(dtype, tokens, hidden, seed)
    order, _, _, send, _, carriers = moe.route_ids(routing_of(tokens, topk, world, seed), 2 * world, world)
    got = run_kernel(x, (order, send, carriers), world, topk, blocks, seed, module or source(dtype), fp8)
    layout = moe.wire(hidden, x.element_size(), fp8, topk)
    want = torch.full((got.shape[0] + 1, layout.bytes), 0xEE, dtype=torch.uint8)
    moe.pack_rows(x, carriers, moe.inverse(order), send, topk, layout, want)
    assert torch.equal(got, want[:-1]), (got != want[:-1]).nonzero()[:4].tolist()


@pytest.mark.parametrize(("dtype", "hidden"), [(torch.bfloat16, 16), (torch.bfloat16, 64), (torch.bfloat16, 12),
                                               (torch.float16, 24), (torch.float32, 8), (torch.float32, 20)])
def test_rows_are_the_torch_steps_bit_for_bit(dtype: torch.dtype, hidden: int) -> None:
    """16-byte vectors (bf16 16 and 64, f16 24, f32 8 and 20) and single values (bf16 12), rows
    padded to 16 bytes or not, grids of fewer blocks than tokens, rows of more pieces than threads."""
    check(dtype, tokens=4, hidden=hidden, topk=2, blocks=3, seed=hidden)


@pytest.mark.parametrize("warp", [2, 4], ids=["2-warps", "1-warp"])
@pytest.mark.parametrize(("dtype", "hidden"), [(torch.bfloat16, 128), (torch.bfloat16, 200), (torch.bfloat16, 100),
                                               (torch.float32, 68)])
def test_tokens_past_the_registers(dtype: torch.dtype, hidden: int, warp: int) -> None:
    """Tokens of more pieces than a thread holds in registers (``LOADS`` x :data:`THREADS`): bf16
    128 exactly the registers' 16 pieces, 200 (25 pieces: the reloaded batch ends mid-share), 100
    (single values, 100 pieces), f32 68 (17 pieces); warps of 2 lanes (two warps a block) and of 4."""
    check(dtype, tokens=4, hidden=hidden, topk=3, blocks=3, seed=hidden + warp, module=source(dtype, warp=warp))


def test_grid_strides_past_the_blocks() -> None:
    """A block makes several tokens' rows in turn (tokens past the grid: :data:`MAX_BLOCKS` is
    the most a launch takes), each token's registers, largest magnitude and rows its own."""
    check(torch.bfloat16, tokens=7, hidden=200, topk=4, blocks=2, seed=7)


@pytest.mark.parametrize(("dtype", "hidden"), [(torch.bfloat16, 64), (torch.bfloat16, 12), (torch.float32, 20),
                                               (torch.float8_e4m3fn, 32)])
def test_rows_without_fp8_are_their_tokens(dtype: torch.dtype, hidden: int) -> None:
    """Without fp8 each sent row is its token's bits (16-byte vectors or single values; fp8
    tokens too: any registered dtype)."""
    check(dtype, tokens=4, hidden=hidden, topk=3, blocks=2, seed=hidden, fp8=False,
          module=source(torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype))


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "copy"])
def test_entries_past_the_threads(world: int, fp8: bool) -> None:
    """Top-k 6 over blocks of 4 threads (the token's entries in two chunks, its rows owned by
    either), W = 2, 3, 4."""
    check(torch.bfloat16, tokens=5, hidden=16, topk=6, blocks=2, seed=world, fp8=fp8, world=world)


def test_the_host_takes_what_the_kernel_takes() -> None:
    assert pack_key(torch.bfloat16, 7168) == MoePackKey("bf16", 8)
    assert pack_key(torch.bfloat16, 100) == MoePackKey("bf16", 1)
    assert pack_key(torch.float32, 128) == MoePackKey("f32", 4)
    assert pack_key(torch.bfloat16, 30) is None  # the scale's store needs hidden % 4 == 0
    assert pack_key(torch.float8_e4m3fn, 128) is None
    assert pack_key(torch.float8_e4m3fn, 128, fp8=False) == MoePackKey("e4m3", 16, quantize=False)
    assert pack_key(torch.bfloat16, 30, fp8=False) == MoePackKey("bf16", 1, quantize=False)
    assert pack_key(torch.int32, 128, fp8=False) is None
    with pytest.raises(ValueError, match="vec"):
        MoePackKey("bf16", 4)


@pytest.mark.parametrize(("edit", "what"), [
    (("if ptxops.ld(carriers + earlier, dtype=Int64) == row:", "if ptxops.ld(carriers + k, dtype=Int64) == row:"),
     "one writer a row (its owner, the token's first entry there)"),
    (("carriers = gmem(Int64, args.carriers, 8, LOCAL, by) + token * args.topk\n",
      "carriers = gmem(Int64, args.carriers, 8, LOCAL, by) + token\n"), "the token's rows"),
    (("if slot < first + count:", "if slot <= first + count:"), "an entry's rank"),
    (("if ptxops.ld(carriers + token * args.topk + k, dtype=Int64) == i:", "if True:"),
     "the header's slots of entries the row does not carry"),
    (("+ args.header + 4 * k, 4", "+ args.header + 4 * j, 4"), "a header slot's entry"),
    (("b += 4 * args.topk", "b += 4"), "the zeros after the header"),
    (("b = values\n", "b = values + 1\n"), "the zeros after the values"),
    (("put(args, owned, chunk, scale, batch[u], p + u * threads)", "put(args, owned, chunk, scale, batch[u], p + u)"),
     "the quantized pieces of a reloaded batch"),
    (("put(args, owned, chunk, scale, held[u], tidx + u * threads)", "put(args, owned, chunk, scale, held[0], "
      "tidx + u * threads)"), "the registers' pieces"),
    (("if tidx + u * threads <= last:", "if tidx + u * threads < last:"), "the registers' last piece"),
    (("a = tidx + step", "a = tidx + step + threads"), "the largest magnitude past the registers"),
    (("p = tidx + step\n", "p = tidx + step + threads\n"), "the pieces past the registers"),
    (("m = largest(m, seen)", "m = largest(m, seen[:1])"), "the largest magnitude's batch"),
    (("largest(rounding.zero(), held)", "largest(rounding.zero(), held[:1])"),
     "the largest magnitude of the registers"),
    (("for e in range(vec):\n                most", "for e in range(vec - 1):\n                most"),
     "the largest magnitude of every value of a piece"),
    (("while j < chunk:  # a thread per row", "while j < chunk - 1:  # a thread per row"),
     "every row's scale and zeros"),
    (("while j < chunk:  # the chunk's rows (fp8 vectors)", "while j < chunk - 1:  # the chunk's rows (fp8 vectors)"),
     "every row's values"),
    (("while j < chunk:  # the chunk's rows (fp8 bytes)", "while j < chunk - 1:  # the chunk's rows (fp8 bytes)"),
     "every row's values (single bytes)"),
    (("while j < chunk:  # the chunk's rows\n                            i =",
      "while j < chunk - 1:  # the chunk's rows\n                            i ="), "every row's copy"),
    (("owned[tidx] = row_of(args, token, base + tidx)", "owned[tidx] = row_of(args, token, tidx)"),
     "the entries of a chunk"),
    (("while pair < chunk * args.topk:", "while pair < args.topk:"), "every row's header"),
    (("values = args.hidden + 4\n", "values = args.hidden\n"), "the scale before the zeros"),
    (("if p + u * threads <= last:\n                                        ptxops.st(row",
      "if p + u * threads < last:\n                                        ptxops.st(row"), "a copy's last piece"),
    (("for u in range(LOADS)]\n                        batch",
      "for u in range(1, LOADS + 1)]\n                        batch"), "the pieces of a batch (copy)"),
    (("lanes.bit_length() - 1):", "lanes.bit_length() - 2):"), "the warp's largest magnitude"),
    (("range_constexpr(1, warps):", "range_constexpr(1, 1):"), "the block's largest magnitude"),
    (("most_of_all = rounding.amax(most_of_all, most[w])", "most_of_all = most[w]"), "the warps' largest magnitudes"),
    (("most[tidx // Int64(lanes)] = m", "most[Int64(0)] = m"), "each warp's largest magnitude"),
    (("(Uint32(q[4 * w + 2]) << Uint32(16))", "(Uint32(q[4 * w + 2]) << Uint32(8))"), "the bytes' order"),
])
def test_a_broken_kernel_fails_the_check(edit: tuple, what: str) -> None:
    """Each edit of the kernel's source is caught (so the check reads what the kernel does)."""
    fp8 = "copy" not in what
    module = source(torch.bfloat16, (edit,))
    with pytest.raises(AssertionError):
        # (hidden 200: past the registers; 100: single values; top-k 6: two chunks of entries)
        for seed, topk, hidden in ((1, 2, 64), (2, 2, 200), (3, 2, 100), (2, 6, 64), (4, 6, 200)):
            check(torch.bfloat16, tokens=4, hidden=hidden, topk=topk, blocks=2, seed=seed, module=module, fp8=fp8)
