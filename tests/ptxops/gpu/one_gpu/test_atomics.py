"""GPU tests of ptxops' atomics and ordered memory operations on one GPU.

Run: ``python -m pytest -q -m gpu tests/ptxops/gpu/one_gpu/test_atomics.py`` (skipped without a GPU).

* ``atom`` in every op x sem x scope (sems: absent, relaxed, acquire, release, acq_rel; scopes:
  absent, cta, cluster, gpu, sys) on 2 x SMs CTAs x 128 threads, every thread on every
  combination's own counter, so all SMs contend: exact final values; for ``add.s32`` every
  old value seen exactly once; for ``exch`` the olds plus the final value are the initial
  value plus the values stored; ``cas`` as a CAS-loop counter (each thread retries until it
  increments; every old value seen once).  ``red`` in every op x sem (absent, relaxed,
  release) x scope, exact.  Vector ``atom.add`` (.v2/.v4.f32, f16x2, .v4.f16x2).
* Message passing between CTAs, many rounds in one launch: weak payload stores published by
  ``st_release`` / ``red`` release / ``fence`` + relaxed store, read after ``ld_acquire`` /
  relaxed load + ``fence``; zero mismatches, zero timeouts.

Every wait in these kernels is bounded (a globaltimer deadline and a poll count), so a bug
costs seconds.  The kernel builders (``make_*_launcher``) take cute.Tensor arguments and a
stream and need neither torch nor a GPU: tests/ptxops/test_gpu_kernels_compile.py compiles them all
for sm_90a on CPU.  The test functions do the torch part.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable
from typing import Any

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

import cuda.bindings.driver as cuda  # noqa: E402  (a dependency of CuTeDSL)
from cutlass import Int32, Int64  # noqa: E402
from cutlass.cute.runtime import from_dlpack  # noqa: E402
from tests.support.gpu_support import (  # noqa: E402
    THREADS,
    compile_for_device,
    current_stream,
    sm_count,
    spin_until,
)

import ptxops  # noqa: E402

try:
    import numpy as np
except ImportError:  # CI compiles the kernels without numpy; the GPU tests need it
    np = None
try:
    import torch
except ImportError:  # CI has no torch: the builders below still import and compile
    torch = None

pytestmark = pytest.mark.gpu

ATOM_SEMS = (None, "relaxed", "acquire", "release", "acq_rel")
RED_SEMS = (None, "relaxed", "release")
SCOPES = (None, "cta", "cluster", "gpu", "sys")
ATOM_COMBOS = tuple((s, c) for s in ATOM_SEMS for c in SCOPES)
RED_COMBOS = tuple((s, c) for s in RED_SEMS for c in SCOPES)

#: inc/dec operands: one at least the thread count (no wrap), one that wraps many times.
BIG_BOUND = 0x7FFFFFFF
SMALL_BOUND = 999

#: Per-launch time budget of every kernel that waits (ns of %globaltimer).
BUDGET_NS = 5_000_000_000


# --------------------------------------------------------------------------------------
# What each read-modify-write kernel does: a list of cases, one counter slot each.
# --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """One ``atom``/``red`` instruction that every thread executes on the case's own slot."""

    op: str
    dtype: str  # cutlass type name
    sem: str | None
    scope: str | None
    operand: int | None = None  # a constant operand (the inc/dec bound); None: per-thread values
    record: bool = False  # keep every thread's old value

    @property
    def label(self) -> str:
        bound = "" if self.operand is None else f" b={self.operand}"
        return f"{self.op}.{self.dtype}{bound} sem={self.sem} scope={self.scope}"


@dataclasses.dataclass(frozen=True)
class Suite:
    """The cases of one kernel.  Slot ``i`` (8 bytes, the value in its low bytes) is case i's
    counter; per-thread operands come from a table with one 8-byte column per (op, dtype);
    recorded old values go to a table with one 8-byte column per recording case."""

    name: str
    family: str  # "atom" or "red"
    cases: tuple[Case, ...]

    @functools.cached_property
    def columns(self) -> dict[tuple[str, str], int]:
        keys = dict.fromkeys((c.op, c.dtype) for c in self.cases if c.operand is None)
        return {k: i for i, k in enumerate(keys)}

    @functools.cached_property
    def records(self) -> dict[int, int]:
        return {i: j for j, i in enumerate(i for i, c in enumerate(self.cases) if c.record)}


def _suite(name: str, family: str, specs: list[tuple], combos=ATOM_COMBOS) -> Suite:
    """``specs``: (op, dtype, operand, record) tuples, each repeated over every combo."""
    return Suite(name, family, tuple(
        Case(op, dt, sem, scope, operand, record)
        for op, dt, operand, record in specs
        for sem, scope in combos
    ))


ADD_TYPES = ("Int32", "Uint32", "Int64", "Float32", "Float64")
MINMAX_TYPES = ("Int32", "Uint32", "Int64", "Uint64")
BIT_TYPES = ("Int32", "Int64")
INCDEC = [(op, "Uint32", b, False) for op in ("inc", "dec") for b in (BIG_BOUND, SMALL_BOUND)]

ATOM_SUITES = {
    s.name: s
    for s in (
        _suite("add", "atom", [("add", t, None, t == "Int32") for t in ADD_TYPES]),
        _suite("minmax", "atom", [(op, t, None, False) for op in ("min", "max") for t in MINMAX_TYPES]),
        _suite("incdec", "atom", INCDEC),
        _suite("bits", "atom", [(op, t, None, False) for op in ("and", "or", "xor") for t in BIT_TYPES]),
        _suite("exch", "atom", [("exch", t, None, True) for t in BIT_TYPES]),
    )
}
RED_SUITE = _suite(
    "red", "red",
    [("add", t, None, False) for t in ADD_TYPES]
    + [(op, t, None, False) for op in ("min", "max") for t in MINMAX_TYPES]
    + INCDEC
    + [(op, t, None, False) for op in ("and", "or", "xor") for t in BIT_TYPES],
    combos=RED_COMBOS,
)

#: CAS-loop counters: thread g works on case g % len(CAS_CASES) (every CTA covers every case).
CAS_TYPES = ("Int16", "Int32", "Int64")
CAS_CASES = tuple((t, sem, scope) for t in CAS_TYPES for sem, scope in ATOM_COMBOS)
MAX_CAS_TRIES = 1 << 20

#: Vector atom.add: (dtype, num_elements), each over every combo; 16-byte slots.
VEC_SHAPES = (("Float32", 2), ("Float32", 4), ("Float16", 2), ("Float16", 8))
VEC_CASES = tuple((t, n, sem, scope) for t, n in VEC_SHAPES for sem, scope in ATOM_COMBOS)
VEC_LANES = sum(n for t, n, _, _ in VEC_CASES)
VEC_BLOCKS = 4


def vec_lane_value(dtype: str, lane: int) -> float:
    """What each thread adds to ``lane``: small integers, so every sum is exact in f16."""
    return float(lane + 1) if dtype == "Float32" else float(lane % 2 + 1)


# --------------------------------------------------------------------------------------
# Kernel builders (no torch, no GPU)
# --------------------------------------------------------------------------------------
def _T(name: str) -> type[cutlass.Numeric]:
    return getattr(cutlass, name)


def _global_id() -> Int32:
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    return bidx * THREADS + tidx


def _emit_rmw(suite: Suite, slots: cute.Pointer, vals: cute.Pointer, olds: cute.Pointer) -> None:
    """Every case of ``suite`` once (trace-time loop): ``vals``/``olds`` point at this
    thread's row of the operand / old-value tables (Int64 cells)."""
    loaded: dict[int, Any] = {}
    for i, case in enumerate(suite.cases):
        dt = _T(case.dtype)
        if case.operand is not None:
            value = dt(case.operand)
        else:
            col = suite.columns[(case.op, case.dtype)]
            if col not in loaded:
                loaded[col] = ptxops.ld(cute.recast_ptr(vals + col, dtype=dt), dtype=dt)
            value = loaded[col]
        ptr = cute.recast_ptr(slots + i, dtype=dt)
        q = {"op": case.op, "sem": case.sem, "scope": case.scope, "dtype": dt}
        if suite.family == "red":
            ptxops.red(ptr, value, **q)
            continue
        old = ptxops.atom(ptr, value, **q)
        if i in suite.records:
            ptxops.st(cute.recast_ptr(olds + suite.records[i], dtype=dt), old, dtype=dt)


def make_rmw_launcher(suite: Suite) -> Callable:
    """``launch(slots, vals, olds, nblocks, stream)``: Int64 tensors of len(cases) slots,
    (threads, columns) operands and (threads, records) olds."""
    ncols = max(1, len(suite.columns))
    nrec = max(1, len(suite.records))

    @cute.kernel
    def rmw_kernel(slots: cute.Tensor, vals: cute.Tensor, olds: cute.Tensor):
        g = _global_id()
        _emit_rmw(suite, slots.iterator, vals.iterator + g * ncols, olds.iterator + g * nrec)

    @cute.jit
    def launch(slots: cute.Tensor, vals: cute.Tensor, olds: cute.Tensor, nblocks: Int32,
               stream: cuda.CUstream):
        rmw_kernel(slots, vals, olds).launch(grid=[nblocks, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


def make_cas_launcher() -> Callable:
    """``launch(slots, olds, results, nblocks, budget_ns, stream)``: thread g increments case
    g % len(CAS_CASES)'s counter with a CAS loop (bounded by MAX_CAS_TRIES and the deadline)
    and stores the old value it won with at olds[g]; results[0] counts threads that gave up."""
    ncases = len(CAS_CASES)

    @cute.kernel
    def cas_kernel(slots: cute.Tensor, olds: cute.Tensor, results: cute.Tensor, budget_ns: Int64):
        g = _global_id()
        deadline = cute.arch.globaltimer() + budget_ns
        sel = g % ncases
        for i, (tname, sem, scope) in enumerate(CAS_CASES):
            if sel == i:
                dt = _T(tname)
                ptr = cute.recast_ptr(slots.iterator + i, dtype=dt)
                cur = dt(0)
                state = Int32(0)  # 0 trying, 1 won, 2 gave up
                tries = Int32(0)
                while state == 0:
                    old = ptxops.atom_cas(ptr, cur, cur + dt(1), sem=sem, scope=scope, dtype=dt)
                    if old == cur:
                        state = Int32(1)
                    else:
                        cur = old
                        tries += 1
                        if tries >= MAX_CAS_TRIES:
                            state = Int32(2)
                        if cute.arch.globaltimer() > deadline:
                            state = Int32(2)
                ptxops.st(cute.recast_ptr(olds.iterator + g, dtype=dt), cur, dtype=dt)
                if state == 2:
                    ptxops.red(results.iterator, Int32(1))

    @cute.jit
    def launch(slots: cute.Tensor, olds: cute.Tensor, results: cute.Tensor, nblocks: Int32,
               budget_ns: Int64, stream: cuda.CUstream):
        cas_kernel(slots, olds, results, budget_ns).launch(
            grid=[nblocks, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


def make_vec_launcher() -> Callable:
    """``launch(slots, olds, stream)``: every thread of VEC_BLOCKS CTAs does each vector
    atom.add of VEC_CASES on its 16-byte slot (slots: Int64, 2 per case) and stores every
    lane's old value in its row of olds (Int64 cells, VEC_LANES per thread)."""

    @cute.kernel
    def vec_kernel(slots: cute.Tensor, olds: cute.Tensor):
        g = _global_id()
        row = olds.iterator + g * VEC_LANES
        lane_cell = 0
        for i, (tname, n, sem, scope) in enumerate(VEC_CASES):
            dt = _T(tname)
            ptr = cute.recast_ptr(slots.iterator + 2 * i, dtype=dt)
            old = ptxops.atom(
                ptr, [dt(vec_lane_value(tname, j)) for j in range(n)], op="add", sem=sem,
                scope=scope, dtype=dt, num_elements=n,
            )
            for j in cutlass.range_constexpr(n):
                ptxops.st(cute.recast_ptr(row + lane_cell, dtype=dt), old[j], dtype=dt)
                lane_cell += 1

    @cute.jit
    def launch(slots: cute.Tensor, olds: cute.Tensor, stream: cuda.CUstream):
        vec_kernel(slots, olds).launch(grid=[VEC_BLOCKS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


# --- message passing between CTAs -------------------------------------------------------
MP_VARIANTS = ("st_release", "red_release", "fence")
MP_WORDS = 2048  # payload words per producer/consumer pair (16 per thread per round)
MP_FLAG_STRIDE = 32  # Int32s between flags (one 128-byte line each)
MP_ROUNDS = 300


def mp_value(epoch: Int32, pair: Int32, idx: Int32) -> Int32:
    """Payload word ``idx`` of round ``epoch`` of pair ``pair`` (distinct across rounds)."""
    return epoch * 65599 + pair * 31 + idx


def make_mp_launcher(variant: str) -> Callable:
    """``launch(payload, flags, results, nblocks, rounds, budget_ns, stream)`` (Int32 tensors).

    CTAs [0, nblocks/2) are producers, CTA nblocks/2 + p consumes what producer p writes.  Per
    round e = 1..rounds the producer waits for the consumer's ack of round e-1, stores
    MP_WORDS payload words with plain weak ``st`` (every thread 16), and publishes them on its
    ready flag; the consumer waits for the flag, reads every word (written by another thread
    than the reader), counts mismatches and acks.  Publication per ``variant``:

    * ``st_release``: bar.sync, then thread 0 ``st_release(flag, e, scope="gpu")``; the waiter's
      thread 0 polls ``ld_acquire(flag, scope="gpu")``, then bar.sync.
    * ``red_release``: every thread ``red(flag, 1, sem="release", scope="gpu")`` after its own
      stores; thread 0 waits for ``ld_acquire(flag) >= 128 * e``.
    * ``fence``: bar.sync, thread 0 ``fence(sem="acq_rel", scope="gpu")`` then a relaxed
      ``st``; the waiter polls a relaxed ``ld``, then ``fence``, then bar.sync.

    results (atomically added): [0] mismatched words, [1] timed-out waits, [2] rounds
    consumers saw published, [3] rounds producers saw acked.
    """
    if variant not in MP_VARIANTS:
        raise ValueError(variant)
    per_round = THREADS if variant == "red_release" else 1  # flag increments per round
    acquire = variant != "fence"

    @cute.kernel
    def mp_kernel(payload: cute.Tensor, flags: cute.Tensor, results: cute.Tensor, rounds: Int32,
                  budget_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nblocks, _, _ = cute.arch.grid_dim()
        half = nblocks // 2
        deadline = cute.arch.globaltimer() + budget_ns
        mismatches = Int32(0)
        timeouts = Int32(0)
        seen = Int32(0)
        # role: producer (CTA < half) waits on its ack flag (round e-1), signals ready;
        # consumer waits on ready (round e), signals ack
        pair = bidx
        lag = Int32(0)
        wait_off = Int32(0)
        signal_off = Int32(MP_FLAG_STRIDE)
        if bidx < half:
            lag = Int32(1)
            wait_off = Int32(MP_FLAG_STRIDE)
            signal_off = Int32(0)
        else:
            pair = bidx - half
        words = payload.iterator + pair * MP_WORDS
        base = flags.iterator + pair * (2 * MP_FLAG_STRIDE)
        wait_flag = base + wait_off
        signal_flag = base + signal_off

        for r in range(rounds):
            e = r + 1
            # ---- wait: producer for the ack of round e-1, consumer for round e's payload
            if tidx == 0:
                late = spin_until(wait_flag, (e - lag) * per_round, deadline, acquire, "gpu")
                timeouts += late
                seen += 1 - late
                if cutlass.const_expr(not acquire):
                    ptxops.fence(sem="acq_rel", scope="gpu")
            cute.arch.sync_threads()
            # ---- the data: producers store the payload, consumers check it
            if bidx < half:
                for j in cutlass.range_constexpr(MP_WORDS // THREADS):
                    idx = j * THREADS + tidx
                    ptxops.st(words + idx, mp_value(e, pair, idx))
            else:
                for j in cutlass.range_constexpr(MP_WORDS // THREADS):
                    idx = MP_WORDS - 1 - (j * THREADS + tidx)  # another thread wrote it
                    got = ptxops.ld(words + idx)
                    if got != mp_value(e, pair, idx):
                        mismatches += 1
            # ---- signal: producer publishes round e, consumer acks it
            if cutlass.const_expr(variant == "red_release"):
                ptxops.red(signal_flag, Int32(1), sem="release", scope="gpu")
            else:
                cute.arch.sync_threads()
                if tidx == 0:
                    if cutlass.const_expr(variant == "st_release"):
                        ptxops.st_release(signal_flag, e, scope="gpu")
                    else:
                        ptxops.fence(sem="acq_rel", scope="gpu")
                        ptxops.st(signal_flag, e, sem="relaxed", scope="gpu")

        ptxops.red(results.iterator + 0, mismatches)
        if tidx == 0:
            ptxops.red(results.iterator + 1, timeouts)
            if bidx < half:
                ptxops.red(results.iterator + 3, seen)
            else:
                ptxops.red(results.iterator + 2, seen)

    @cute.jit
    def launch(payload: cute.Tensor, flags: cute.Tensor, results: cute.Tensor, nblocks: Int32,
               rounds: Int32, budget_ns: Int64, stream: cuda.CUstream):
        mp_kernel(payload, flags, results, rounds, budget_ns).launch(
            grid=[nblocks, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


def builders() -> dict[str, Callable[[], Callable]]:
    """Every kernel of this file: name -> builder of its launcher."""
    b: dict[str, Callable[[], Callable]] = {
        f"atom_{name}": functools.partial(make_rmw_launcher, s) for name, s in ATOM_SUITES.items()
    }
    b["red"] = functools.partial(make_rmw_launcher, RED_SUITE)
    b["cas"] = make_cas_launcher
    b["vec"] = make_vec_launcher
    for v in MP_VARIANTS:
        b[f"mp_{v}"] = functools.partial(make_mp_launcher, v)
    return b


# --------------------------------------------------------------------------------------
# Host side (torch, numpy): values, expected results, launches
# --------------------------------------------------------------------------------------
_NP = {
    "Int16": "int16", "Int32": "int32", "Uint32": "uint32", "Int64": "int64",
    "Uint64": "uint64", "Float16": "float16", "Float32": "float32", "Float64": "float64",
}


def _nd(name: str):
    return np.dtype(_NP[name])


def _to_cells(values, name: str):
    """Values of dtype ``name`` into the low bytes of Int64 cells."""
    nd = _nd(name)
    cells = np.zeros(len(values), np.int64)
    cells.view(nd)[:: 8 // nd.itemsize] = values
    return cells


def _from_cells(cells, name: str):
    nd = _nd(name)
    return np.ascontiguousarray(cells).view(nd)[:: 8 // nd.itemsize]


def _bits(x: Any, name: str) -> int:
    """The bit pattern of an integer value of dtype ``name`` (comparisons are bitwise)."""
    nd = _nd(name)
    return int(np.array([x], dtype=nd).view(f"u{nd.itemsize}")[0])


def _wrap(x: int, name: str):
    """A Python int modulo 2**width, as dtype ``name``."""
    nd = _nd(name)
    return np.array([x % (1 << (8 * nd.itemsize))], dtype=f"u{nd.itemsize}").view(nd)[0]


def host_values(family: str, op: str, name: str, n: int, rng) -> Any:
    """Per-thread operands (thread g gets element g)."""
    nd = _nd(name)
    g = np.arange(n, dtype=np.int64)
    width = 8 * nd.itemsize
    rand = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)  # 64 random bits
    random_bits = rand.astype(f"u{nd.itemsize}").view(nd)
    if op == "add":
        if name == "Int32":
            return np.ones(n, nd) if family == "atom" else (g % 2001 - 1000).astype(nd)
        if name == "Float32":
            return ((g % 13 + 1) * 0.5).astype(nd)  # multiples of 0.5: every partial sum exact
        if name == "Float64":
            return ((g % 29 + 1) * 2.0**28).astype(nd)  # needs 53 bits in sum, exact
        return random_bits  # Uint32 / Int64: wraps around
    if op in ("min", "max", "xor"):
        return random_bits
    if op == "and":
        return (~(np.uint64(1) << (g % (width - 8)).astype(np.uint64))).astype(f"u{nd.itemsize}").view(nd)
    if op == "or":
        return (np.uint64(1) << (g % (width - 8)).astype(np.uint64)).astype(f"u{nd.itemsize}").view(nd)
    if op == "exch":
        return ((g + 1) * (1 if width == 32 else 2**33 + 7)).astype(nd)  # distinct
    raise AssertionError(op)


def host_init(case: Case, n: int) -> Any:
    nd = _nd(case.dtype)
    if nd.kind == "f":
        return nd.type(0.5 if case.dtype == "Float32" else 0.25)
    info = np.iinfo(nd)
    return nd.type({
        "add": 0 if case.dtype == "Int32" else info.max - 12345,
        "min": info.max, "max": info.min,
        "inc": 0, "dec": n if case.operand == BIG_BOUND else 0,
        "and": -1 if info.min < 0 else info.max,
        "or": info.min if info.min < 0 else 1 << (8 * nd.itemsize - 1),
        "xor": 0x5A5A5A5A,
        "exch": -1,
    }[case.op])


@functools.cache
def _incdec(op: str, x: int, bound: int, n: int) -> int:
    for _ in range(n):  # every thread applies the same operation, so order does not matter
        if op == "inc":
            x = 0 if x >= bound else x + 1
        else:
            x = bound if (x == 0 or x > bound) else x - 1
    return x


def host_expected(case: Case, init: Any, values: Any, n: int) -> Any:
    """The final value of case's slot after every thread's operation (not for exch, whose
    final value depends on the order: its olds check covers it)."""
    nd = _nd(case.dtype)
    if case.op in ("inc", "dec"):
        return nd.type(_incdec(case.op, int(init), case.operand, n))
    if case.op == "add":
        if nd.kind == "f":
            return nd.type(float(init) + float(values.astype(np.float64).sum()))
        # sum of the bit patterns modulo 2**64 (numpy wraps), then modulo the type's width
        total = int(values.view(f"u{nd.itemsize}").astype(np.uint64).sum(dtype=np.uint64))
        return _wrap(int(init) + total, case.dtype)
    both = np.concatenate([np.array([init], nd), values])
    if case.op == "min":
        return both.min()
    if case.op == "max":
        return both.max()
    u = both.view(f"u{nd.itemsize}")
    red = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[case.op]
    return np.array([red.reduce(u)]).view(nd)[0]


def _same(got: Any, want: Any, name: str) -> bool:
    if _nd(name).kind == "f":
        return float(got) == float(want)
    return _bits(got, name) == _bits(want, name)


@functools.cache
def _launcher(name: str) -> Callable:
    return builders()[name]()


_COMPILED: dict[str, Any] = {}


def _run(name: str, *args: Any) -> None:
    """Compile kernel ``name`` once (for this GPU, on the first call's arguments) and launch
    it on the current stream; cute.Tensor args come from torch tensors."""
    conv = [from_dlpack(a, assumed_align=16) if torch.is_tensor(a) else a for a in args]
    stream = current_stream()
    if name not in _COMPILED:
        _COMPILED[name] = compile_for_device(_launcher(name), *conv, stream)
    _COMPILED[name](*conv, stream)


@pytest.fixture(scope="module")
def gpu() -> dict[str, Any]:
    if torch is None or np is None:
        pytest.skip("needs torch and numpy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU visible to torch")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("ptxops' atom/red forms with .cluster scope and vector atomics need sm_90+")
    blocks = 2 * sm_count()
    return {"blocks": blocks, "threads": blocks * THREADS, "dev": torch.device("cuda")}


def rmw_inputs(suite: Suite, n: int) -> dict[str, Any]:
    """Host arrays for ``n`` threads: slots (initial values), vals (operand table), olds, and
    the per-(op, dtype) operands and per-case initial values they were built from."""
    rng = np.random.default_rng(zlib.crc32(suite.name.encode()))
    values = {(op, t): host_values(suite.family, op, t, n, rng) for op, t in suite.columns}
    vals = np.zeros((n, max(1, len(suite.columns))), np.int64)
    for (op, t), col in suite.columns.items():
        vals[:, col] = _to_cells(values[(op, t)], t)
    inits = [host_init(c, n) for c in suite.cases]
    slots = np.concatenate([_to_cells(np.array([v], _nd(c.dtype)), c.dtype) for c, v in zip(suite.cases, inits)])
    olds = np.zeros((n, max(1, len(suite.records))), np.int64)
    return {"slots": slots, "vals": vals, "olds": olds, "values": values, "inits": inits}


def rmw_failures(suite: Suite, n: int, inputs: dict[str, Any], slots_out, olds_out) -> list[str]:
    """What is wrong with the slots and olds a launch left (empty: all exact)."""
    failures = []
    for i, case in enumerate(suite.cases):
        got = _from_cells(slots_out[i:i + 1], case.dtype)[0]
        v = inputs["values"].get((case.op, case.dtype))
        init = inputs["inits"][i]
        want = None if case.op == "exch" else host_expected(case, init, v, n)  # exch: olds check
        if want is not None and not _same(got, want, case.dtype):
            failures.append(f"{suite.family} {case.label}: final {got!r}, expected {want!r}")
        if i in suite.records:
            old = _from_cells(olds_out[:, suite.records[i]], case.dtype)
            nd = _nd(case.dtype)
            if case.op == "add":  # every thread added 1 to 0: each of 0..n-1 seen once
                ok = np.array_equal(np.sort(old), np.arange(n, dtype=nd))
            else:  # exch: olds + final == initial + stored values, as multisets
                ok = np.array_equal(np.sort(np.append(old, got)), np.sort(np.append(v, init)))
            if not ok:
                failures.append(f"{suite.family} {case.label}: old values are not the expected "
                                f"multiset (first olds {old[:8].tolist()})")
    return failures


def cas_failures(n: int, slots_out, olds_out) -> list[str]:
    failures = []
    k = len(CAS_CASES)
    for i, (t, sem, scope) in enumerate(CAS_CASES):
        members = np.arange(i, n, k)
        got = int(_from_cells(slots_out[i:i + 1], t)[0])
        won = np.sort(_from_cells(olds_out, t)[members].astype(np.int64))
        olds_ok = np.array_equal(won, np.arange(len(members)))
        if got != len(members) or not olds_ok:
            failures.append(f"cas.{t} sem={sem} scope={scope}: final {got} (expected {len(members)}), "
                            f"olds {'ok' if olds_ok else won[:8].tolist()}")
    return failures


def vec_failures(n: int, slots_out, olds_out) -> list[str]:
    raw = np.ascontiguousarray(slots_out).view(np.uint8)
    failures, cell = [], 0
    for i, (t, k, sem, scope) in enumerate(VEC_CASES):
        nd = _nd(t)
        finals = raw[16 * i: 16 * i + k * nd.itemsize].view(nd)
        for j in range(k):
            step = vec_lane_value(t, j)
            old = np.sort(_from_cells(olds_out[:, cell], t).astype(np.float64))
            if float(finals[j]) != n * step or not np.array_equal(old, step * np.arange(n)):
                failures.append(f"atom.add {k} x {t} lane {j} sem={sem} scope={scope}: final "
                                f"{float(finals[j])} (expected {n * step}), olds sorted {old[:6].tolist()}")
            cell += 1
    return failures


def _rmw_check(suite: Suite, gpu: dict[str, Any]) -> None:
    n, dev = gpu["threads"], gpu["dev"]
    inputs = rmw_inputs(suite, n)
    t_slots, t_vals, t_olds = (torch.from_numpy(inputs[k]).to(dev) for k in ("slots", "vals", "olds"))
    _run(suite.name if suite.family == "red" else f"atom_{suite.name}", t_slots, t_vals, t_olds, gpu["blocks"])
    torch.cuda.synchronize()
    failures = rmw_failures(suite, n, inputs, t_slots.cpu().numpy(), t_olds.cpu().numpy())
    assert not failures, f"{len(failures)} of {len(suite.cases)} cases wrong:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize("suite", list(ATOM_SUITES))
def test_atom_all_sms_contend(gpu: dict[str, Any], suite: str) -> None:
    _rmw_check(ATOM_SUITES[suite], gpu)


def test_red_all_sms_contend(gpu: dict[str, Any]) -> None:
    _rmw_check(RED_SUITE, gpu)


def test_atom_cas_loop_counter(gpu: dict[str, Any]) -> None:
    n, dev = gpu["threads"], gpu["dev"]
    slots = torch.zeros(len(CAS_CASES), dtype=torch.int64, device=dev)
    olds = torch.full((n,), -1, dtype=torch.int64, device=dev)
    results = torch.zeros(4, dtype=torch.int32, device=dev)
    _run("cas", slots, olds, results, gpu["blocks"], BUDGET_NS)
    torch.cuda.synchronize()
    assert int(results[0]) == 0, f"{int(results[0])} threads gave up their CAS loop"
    failures = cas_failures(n, slots.cpu().numpy(), olds.cpu().numpy())
    assert not failures, "\n".join(failures[:40])


def test_atom_vector_add(gpu: dict[str, Any]) -> None:
    n = VEC_BLOCKS * THREADS
    slots = torch.zeros(2 * len(VEC_CASES), dtype=torch.int64, device=gpu["dev"])
    olds = torch.zeros((n, VEC_LANES), dtype=torch.int64, device=gpu["dev"])
    _run("vec", slots, olds)
    torch.cuda.synchronize()
    failures = vec_failures(n, slots.cpu().numpy(), olds.cpu().numpy())
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("variant", MP_VARIANTS)
def test_message_passing_between_ctas(gpu: dict[str, Any], variant: str) -> None:
    blocks, dev = gpu["blocks"], gpu["dev"]
    pairs = blocks // 2
    payload = torch.zeros(pairs * MP_WORDS, dtype=torch.int32, device=dev)
    flags = torch.zeros(pairs * 2 * MP_FLAG_STRIDE, dtype=torch.int32, device=dev)
    results = torch.zeros(4, dtype=torch.int32, device=dev)
    _run(f"mp_{variant}", payload, flags, results, blocks, MP_ROUNDS, BUDGET_NS)
    torch.cuda.synchronize()
    mismatches, timeouts, consumed, acked = results.tolist()
    assert (mismatches, timeouts) == (0, 0), (
        f"{variant}: {mismatches} stale/wrong payload words, {timeouts} timed-out waits "
        f"({pairs} pairs x {MP_ROUNDS} rounds)")
    assert consumed == acked == pairs * MP_ROUNDS, (consumed, acked, pairs * MP_ROUNDS)
