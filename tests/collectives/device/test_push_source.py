"""The push all-reduce and reduce-scatter as their own source runs them (CPU, no CuTeDSL compile).

:mod:`device_sim` executes :class:`collectives.algorithms.push.PushKernel` with
:mod:`collectives.algorithms.design`'s building blocks, :mod:`collectives.device.reduce` and
:mod:`collectives.device.signals` from their source files, every GPU thread a simulated thread,
over simulated receive buffers, result buffers, pads and error records: the peer backend's
pipeline (the rounds of :mod:`~collectives.algorithms.push`'s docstring) and the multicast
backend's one round between two barriers.  Each rank runs its calls in order (sizes changing,
the buffers reused; the eager reduce-scatter alternates two) and reads and clears its error
records after each; rank 0 runs 4 times as fast as the others, so it reaches each wait early.
Scaled down where nothing depends on the size: 4 threads a block, 1 or 2 blocks, at most
:data:`MAX_ROUNDS` rounds (32 in the kernel), so slots of a few grid strides take several
rounds, the last one shorter, and rounds of 4 strides run the 4-vector unrolled reduction.

Floats: a vector load is a ``TensorSSA`` stand-in (:class:`Vector`); converting and adding
values are numpy's f32, and an f32's conversion to the data type rounds to nearest even
(``cvt.rn``; ml_dtypes for the 16-bit floats).  The kernel's order
(:func:`~collectives.device.reduce.load_reduce_peer` over the owner's slots, slot ``s`` rank
``s``'s): every rank's value converted to the accumulator (f32 for bf16, f16 and f32), added in
rank order, ``((x0 + x1) + x2) + x3``, each addition rounded to f32, then one rounding to the
data type.  The reference is torch's same sum of the ranks' inputs (a reduce-scatter's output
``r``: their ``r``-th parts): every element of every rank's output must be its bits, nothing
past the output written, no error recorded.  The inputs (:func:`inputs`) make a sum in another
rank order (at W = 4) or rounded to a 16-bit type at each step differ.
"""

from __future__ import annotations

import random
import types

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from tests.support import device_sim  # noqa: E402
from tests.support.device_sim import Context, Num, Ptr, Sim, fakes, load, me  # noqa: E402

from collectives.algorithms import REGISTRY, KernelKey, tuning  # noqa: E402
from collectives.config import CALL_EPOCHS  # noqa: E402
from collectives.dtypes import DTYPES  # noqa: E402
from collectives.layouts import ERROR_FIELDS, ERROR_RECORDS, PadLayout  # noqa: E402

FAKES = fakes()
Int32, Int64, Uint8, Uint16, Uint32, Uint64 = (getattr(FAKES["cutlass"], name) for name in (
    "Int32", "Int64", "Uint8", "Uint16", "Uint32", "Uint64"))
THREADS = 4
MAX_ROUNDS = 2  # PUSH_MAX_ROUNDS, scaled down: slots of 5 strides take rounds of 4 and 1
STALE = 0xDD  # every byte of the buffers before the first call
CANARY = 0xEE  # the output's bytes past n
TIMEOUT = 200000
BITS = {2: (Uint16, torch.int16), 4: (Uint32, torch.int32)}  # an element's bits, by its bytes


class Vector(list):
    """CuTeDSL's ``TensorSSA`` as a vector load returns it: its elements (bits, or numpy f32
    once converted); ``to`` converts each element, ``+`` adds elementwise."""

    def to(self, dtype: type) -> Vector:
        return Vector(dtype(x) for x in self)

    def __add__(self, other: Vector) -> Vector:
        return Vector(a + b for a, b in zip(self, other, strict=True))


def ld(ptr: Ptr, dtype: type | None = None, num_elements: int = 1, **qualifiers) -> Num | Vector:
    """``ptxops.ld``: several values a :class:`Vector` (ptxops's a ``TensorSSA``), one a scalar."""
    values = FAKES["ptxops"].ld(ptr, dtype, num_elements, **qualifiers)
    return Vector(values) if num_elements > 1 else values


def numbers(name: str) -> types.SimpleNamespace:
    """``DTYPES[name]`` as the kernel reads it: stand-ins of its CuTeDSL type (``cute``: makes an
    f32 its bits, rounded to nearest even) and of its accumulator's, f32 (``accumulator.cute``:
    makes its bits an f32)."""
    array = np.dtype(DTYPES[name].numpy)
    carrier = np.dtype(f"uint{8 * array.itemsize}")

    class Data(device_sim.Float32):
        width = 8 * array.itemsize

        def __new__(cls, value: np.float32) -> Num:
            return BITS[array.itemsize][0](int(np.asarray(value, np.float32).astype(array).view(carrier)))

    class F32(device_sim.Float32):
        def __new__(cls, value: Num | np.float32) -> np.float32:
            if isinstance(value, np.floating):
                return np.float32(value)
            # (a load through a moved pointer is signed: its bits are the low ones)
            return np.asarray(value.v & (1 << Data.width) - 1, carrier).view(array).astype(np.float32)[()]

    return types.SimpleNamespace(cute=Data, accumulator=types.SimpleNamespace(cute=F32))


def kernels(edits: dict | None = None) -> types.ModuleType:
    """The simulated ``collectives.algorithms.push`` (``edits``: module, one of ``push``,
    ``design``, ``reduce`` and ``signals``, -> its (old, new) source edits)."""
    edits = edits or {}
    cute = types.SimpleNamespace(**{**vars(FAKES["cutlass.cute"]), "TensorSSA": Vector})
    sim = {**FAKES, "cutlass.cute": cute, "cutlass": types.SimpleNamespace(**{**vars(FAKES["cutlass"]), "cute": cute}),
           "ptxops": types.SimpleNamespace(**{**vars(FAKES["ptxops"]), "ld": ld})}
    signals = load("collectives.device.signals", sim, edits.get("signals", ()))
    reduce = load("collectives.device.reduce", {**sim, "collectives.device.signals": signals}, edits.get("reduce", ()))
    device = types.SimpleNamespace(reduce=reduce, signals=signals)
    design = load("collectives.algorithms.design", {
        **sim, "collectives.device": device,
        "collectives.dtypes": types.SimpleNamespace(DTYPES={name: numbers(name) for name in ("bf16", "f16", "f32")}),
    }, edits.get("design", ()))
    registered = dict(REGISTRY)  # the copy's Push class registers itself: put the real one back
    try:
        push = load("collectives.algorithms.push", {
            **sim, "collectives.device": device,
            "collectives.algorithms": types.SimpleNamespace(design=design, tuning=tuning),  # (the real table)
        }, edits.get("push", ()))
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)
    push.PUSH_MAX_ROUNDS = MAX_ROUNDS  # push_round_strides reads it from its module
    return push


SOURCE = kernels()


def key_of(collective: str, dtype: str, world: int, unroll: int, backend: str = "peer",
           end_barrier: bool = True) -> KernelKey:
    """A push kernel's key as ``Push.plan`` makes it, of :data:`THREADS` threads."""
    key = KernelKey(collective, "push", backend, dtype, world, stage_in=True, end_barrier=end_barrier, pdl=False,
                    unroll=unroll)
    object.__setattr__(key, "threads", THREADS)
    return key


def inputs(world: int, n: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Each rank's ``n`` elements: random, magnitudes spread over 2^-8..2^8, but every fifth,
    which is 2^15 on rank 0, -2^15 on the last rank and 2^-9 on those between.  Their sum in
    rank order is 0 (each 2^-9 a tie lost to 2^15's rounding to even); in reverse order it is
    not (-2^15 + 2^-9 is exact)."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, generator=gen) * 2.0 ** torch.randint(-8, 9, (n,), generator=gen) for _ in range(world)]
    for q, x in enumerate(xs):
        x[::5] = 2.0**15 if q == 0 else -(2.0**15) if q == world - 1 else 2.0**-9
    return [x.to(dtype) for x in xs]


class World:
    """``key.world`` ranks each running ``key``'s push kernel on ``blocks`` blocks for calls of
    ``sizes`` elements in turn (an all-reduce's tensor, a reduce-scatter's output) of
    :func:`inputs`."""

    def __init__(self, key: KernelKey, sizes: list[int], seed: int, blocks: int,
                 source: types.ModuleType = SOURCE) -> None:
        self.key, self.sizes, self.blocks = key, sizes, blocks
        self.world = world = key.world
        self.all_reduce = key.collective == "all_reduce"
        self.bytes, self.vec = DTYPES[key.dtype].bytes, key.elements_per_access
        self.sim = sim = Sim(seed, max_steps=4 * 10**6, speed={0: 4})
        self.rng = random.Random(seed)
        mem = sim.memory
        parts = 1 if self.all_reduce else world
        self.inputs = [inputs(world, parts * n, DTYPES[key.dtype].torch, seed + c) for c, n in enumerate(sizes)]
        slot = max(source.push_slice_elements(n, world, self.vec) if self.all_reduce else n for n in sizes)
        layout = PadLayout(world=world)
        self.pads = [mem.alloc(4 * layout.words) for _ in range(world)]
        self.counts = [pad + 4 * layout.calls for pad in self.pads]
        self.pad_table = self.table(self.pads)
        self.pad_mc = mem.alloc_multicast(self.pads, 4 * layout.words) if key.backend == "multicast" else 0
        # the receive buffers' tables (the eager reduce-scatter's two, in turn), the result buffers'
        eager = key.collective == "reduce_scatter" and not key.end_barrier
        self.receive = [self.table(self.buffers(world * slot)) for _ in range(1 + eager)]
        self.results = self.table(self.buffers(world * slot)) if self.all_reduce else 0
        self.errs = [mem.alloc(4 * len(ERROR_FIELDS) * ERROR_RECORDS) for _ in range(world)]
        self.src = [mem.alloc(self.bytes * parts * max(sizes)) for _ in range(world)]
        self.out = [mem.alloc(self.bytes * (max(sizes) + self.vec)) for _ in range(world)]
        self.kernel = source.PushKernel(key).launcher()
        self.records: list[list] = [[] for _ in range(world)]  # (call, record, status)
        self.outputs: list[list] = [[] for _ in range(world)]  # each call's output bits, and vec more
        for r in range(world):
            sim.spawn(lambda r=r: self._host(r), Context(rank=r))
        sim.run()

    def buffers(self, elements: int) -> list[int]:
        """A buffer of ``elements`` on every rank, its bytes :data:`STALE`."""
        mem, nbytes = self.sim.memory, self.bytes * elements
        found = [mem.alloc(nbytes) for _ in range(self.world)]
        for buffer in found:
            for at in range(0, nbytes, 8):
                mem.store(buffer + at, STALE * 0x0101010101010101, Uint64)
        return found

    def table(self, addresses: list[int]) -> int:
        """A device table of every rank's address."""
        table = self.sim.memory.alloc(8 * self.world)
        for r, address in enumerate(addresses):
            self.sim.memory.store(table + 8 * r, address, Int64)
        return table

    def _host(self, r: int) -> None:
        sim, mem, e = self.sim, self.sim.memory, self.bytes
        element, view = BITS[e]
        for c, n in enumerate(self.sizes):
            me().ctx.call = c
            for i, v in enumerate(self.inputs[c][r].view(view).tolist()):
                mem.store(self.src[r] + e * i, v, element)
            for b in range(e * (n + self.vec)):
                mem.store(self.out[r] + b, CANARY, Uint8)
            args = types.SimpleNamespace(
                data_table=Int64(self.receive[c % len(self.receive)]), data_mc=Int64(0), results=Int64(self.results),
                out=Int64(self.out[r]), src=Int64(self.src[r]), n=Int64(n), kinds=Int32(0),
                pad_table=Int64(self.pad_table), pad_mc=Int64(self.pad_mc), pad=Int64(self.pads[r]),
                err=Int64(self.errs[r]), rank=Int32(r), timeout_ns=Int64(TIMEOUT))
            sim.launch(lambda args=args: self.kernel(args), Context(rank=r, call=c), self.blocks, THREADS,
                       [self.rng.choice([0, 0, 300]) for _ in range(self.blocks)])
            self.outputs[r].append(mem.words(self.out[r], n + self.vec, element))
            self.records[r] += [(c, index, status) for index, (status, *_) in
                                mem.take_records(self.errs[r], ERROR_RECORDS, len(ERROR_FIELDS))]

    def expected(self, c: int, r: int) -> list[int]:
        """Rank ``r``'s output bits of call ``c``, and the canary past them: the ranks' values of
        its elements summed in f32 in rank order, then rounded once to the dtype."""
        n = self.sizes[c]
        part = slice(0, n) if self.all_reduce else slice(r * n, (r + 1) * n)
        total = self.inputs[c][0][part].float()
        for q in range(1, self.world):
            total = total + self.inputs[c][q][part].float()
        bits = total.to(self.inputs[c][0].dtype).view(BITS[self.bytes][1]).tolist()
        canary = int.from_bytes(bytes([CANARY]) * self.bytes, "little")
        return [b & ((1 << 8 * self.bytes) - 1) for b in bits] + [canary] * self.vec


def check(world: World) -> None:
    """Every rank's output of every call the reference's, bit for bit, nothing written past it,
    no error recorded, and every rank's call count on by a call's epochs a call."""
    for r in range(world.world):
        assert world.records[r] == [], world.records
        for c, n in enumerate(world.sizes):
            got, want = world.outputs[r][c], world.expected(c, r)
            wrong = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
            assert not wrong, f"rank {r} call {c} (n {n}): elements {wrong[:8]}: {got[wrong[0]]:#x} != " \
                              f"{want[wrong[0]]:#x}"
    counts = {world.sim.memory.load(at, Uint32).v for at in world.counts}
    assert counts == {len(world.sizes) * CALL_EPOCHS}, counts


def sizes(collective: str, world: int, vec: int, blocks: int) -> list[int]:
    """Element counts whose slots take 1 grid stride (an all-reduce's slices partial or empty:
    no whole vector), 3 (rounds of 2 strides and 1) and 5 (rounds of 4 and 1), the last slot
    ending in elements past its last whole vector."""
    stride = blocks * THREADS * vec
    slots = [3, 3 * stride - vec // 2 - 1, 5 * stride - vec - 3]
    return [world * m - 5 if collective == "all_reduce" else m for m in slots]


def run(key: KernelKey, source: types.ModuleType = SOURCE) -> None:
    """:func:`check` of ``key``'s kernel for calls of :func:`sizes`, on 2 blocks at W = 2 and 1
    at W = 4."""
    blocks = 2 if key.world == 2 else 1
    check(World(key, sizes(key.collective, key.world, key.elements_per_access, blocks), key.world + key.unroll,
                blocks, source))


@pytest.mark.parametrize("unroll", [2, 4])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_all_reduce_is_the_rank_order_f32_sum_bit_for_bit(dtype: str, world: int, unroll: int) -> None:
    """The pipeline: each owner reduces its slice, stores it on every rank, and each rank copies
    the other owners' slices out of its result buffer."""
    run(key_of("all_reduce", dtype, world, unroll))


@pytest.mark.parametrize(("dtype", "world", "unroll", "end_barrier"),
                         [("f16", 2, 2, False), ("f32", 4, 4, False), ("bf16", 4, 2, True), ("f32", 2, 4, True)])
def test_reduce_scatter_is_the_rank_order_f32_sum_bit_for_bit(dtype: str, world: int, unroll: int,
                                                               end_barrier: bool) -> None:
    """The pipeline, eager (two receive buffers in turn, no final wait) and captured (one
    buffer, the end barrier's final wait)."""
    run(key_of("reduce_scatter", dtype, world, unroll, end_barrier=end_barrier))


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize(("dtype", "world", "unroll"), [("bf16", 4, 4), ("f32", 2, 2)])
def test_the_multicast_backend_is_the_same_sum(collective: str, dtype: str, world: int, unroll: int) -> None:
    """Push, barrier, reduce (the all-reduce's into the owner's own result region), barrier,
    pull: one round."""
    run(key_of(collective, dtype, world, unroll, backend="multicast"))
