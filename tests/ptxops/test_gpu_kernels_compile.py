"""Every kernel of the GPU test files compiles for sm_90a on a machine without a GPU (and
without torch), and its PTX holds the instructions the GPU tests mean to run: every scalar
``atom``/``red`` form (op x type x sem x scope) that ptxops' spec allows on global memory,
except the 16-bit float and 128-bit types, and no ``multimem`` at all."""

from __future__ import annotations

from collections import Counter

import pytest
from tests.ptxops.gpu.one_gpu import test_atomics as A  # noqa: E402  (kernel builders; its tests skip without a GPU)
from tests.ptxops.gpu.ranks import test_peer as P  # noqa: E402
from tests.support.cute_support import compile_ptx, cutlass, opcodes
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

from ptxops import spec

ARCH = "sm_90a"
THREADS_FAKE = 4 * A.THREADS  # tables are sized per thread; any size compiles


def _t(dtype, *shape):
    return make_fake_compact_tensor(dtype, shape, assumed_align=16)


def _atomics_args(name: str) -> tuple:
    i64, i32 = cutlass.Int64, cutlass.Int32
    if name.startswith("atom_") or name == "red":
        suite = A.RED_SUITE if name == "red" else A.ATOM_SUITES[name[5:]]
        return (_t(i64, len(suite.cases)), _t(i64, THREADS_FAKE, max(1, len(suite.columns))),
                _t(i64, THREADS_FAKE, max(1, len(suite.records))), 4, make_fake_stream())
    if name == "cas":
        return (_t(i64, len(A.CAS_CASES)), _t(i64, THREADS_FAKE), _t(i32, 4), 4, A.BUDGET_NS,
                make_fake_stream())
    if name == "vec":
        return (_t(i64, 2 * len(A.VEC_CASES)), _t(i64, A.VEC_BLOCKS * A.THREADS, A.VEC_LANES),
                make_fake_stream())
    if name.startswith("mp_"):
        return (_t(i32, 2 * A.MP_WORDS), _t(i32, 4 * A.MP_FLAG_STRIDE), _t(i32, 4), 4, A.MP_ROUNDS,
                A.BUDGET_NS, make_fake_stream())
    raise AssertionError(name)


@pytest.fixture(scope="module")
def atomics_ptx() -> dict[str, str]:
    return {name: compile_ptx(build(), *_atomics_args(name), arch=ARCH)
            for name, build in A.builders().items()}


@pytest.fixture(scope="module")
def peer_ptx() -> dict[str, str]:
    return {name: compile_ptx(build(), *P.fake_args(name), arch=ARCH)
            for name, build in P.builders().items()}


def test_kernel_count_is_modest() -> None:
    assert len(A.builders()) + len(P.builders()) <= 25


def _covered(family: str, tested: set[str]) -> tuple[set[str], set[str]]:
    skip_types = {"b128", "f16", "bf16", "f16x2", "bf16x2"}
    legal = {
        f.opcode for f in spec.forms(family, target=ARCH, space="global")
        if f.qualifiers.get("vec") is None and f.qualifiers["type"] not in skip_types
    }
    return legal - tested, tested - legal


def test_atom_kernels_cover_every_scalar_form(atomics_ptx: dict[str, str]) -> None:
    found = Counter()
    for name, ptx in atomics_ptx.items():
        if name.startswith("atom_") or name == "cas":
            found += opcodes(ptx)
    atoms = {op for op in found if op.startswith("atom.")}
    missing, extra = _covered("atom", atoms)
    assert not missing, f"atom forms no GPU test runs: {sorted(missing)[:20]}"
    assert not extra, f"atom forms outside the spec: {sorted(extra)[:20]}"
    for name, suite in A.ATOM_SUITES.items():  # one instruction per case, none lost or doubled
        n = sum(k for op, k in opcodes(atomics_ptx[f"atom_{name}"]).items() if op.startswith("atom."))
        assert n == len(suite.cases), (name, n, len(suite.cases))


def test_red_kernel_covers_every_scalar_form(atomics_ptx: dict[str, str]) -> None:
    reds = {op for op in opcodes(atomics_ptx["red"]) if op.startswith("red.")}
    missing, extra = _covered("red", reds)
    assert not missing, f"red forms no GPU test runs: {sorted(missing)[:20]}"
    assert not extra, f"red forms outside the spec: {sorted(extra)[:20]}"


def test_vector_kernel_holds_every_vector_case(atomics_ptx: dict[str, str]) -> None:
    ops = opcodes(atomics_ptx["vec"])
    vec = [op for op in ops if op.startswith("atom.")]
    assert len(vec) == len(A.VEC_CASES), sorted(vec)
    assert sum(".v2.f32" in op for op in vec) == sum(".v4.f32" in op for op in vec) == 25
    assert sum(op.endswith(".add.noftz.f16x2") for op in vec) == 25
    assert sum(".v4.f16x2" in op for op in vec) == 25


@pytest.mark.parametrize("variant,expect", [
    ("st_release", {"st.release.gpu.global.b32", "ld.acquire.gpu.global.b32"}),
    ("red_release", {"red.release.gpu.global.add.s32", "ld.acquire.gpu.global.b32"}),
    ("fence", {"fence.acq_rel.gpu", "st.relaxed.gpu.global.b32", "ld.relaxed.gpu.global.b32"}),
])
def test_message_passing_kernels(atomics_ptx: dict[str, str], variant: str, expect: set[str]) -> None:
    ops = opcodes(atomics_ptx[f"mp_{variant}"])
    assert expect <= set(ops), sorted(ops)
    assert "st.global.b32" in ops and "ld.global.b32" in ops  # the weak payload
    assert "%globaltimer" in atomics_ptx[f"mp_{variant}"]  # bounded waits


def test_peer_kernels(peer_ptx: dict[str, str]) -> None:
    mp = opcodes(peer_ptx["mp"])
    assert {"st.release.sys.global.b32", "ld.acquire.sys.global.b32", "st.global.b32",
            "ld.global.b32"} <= set(mp), sorted(mp)
    assert "%globaltimer" in peer_ptx["mp"]
    assert "red.release.sys.global.add.s32" in opcodes(peer_ptx["red"])
    assert "red.release.sys.global.add.u64" in opcodes(peer_ptx["red"])
    atom = opcodes(peer_ptx["atom"])
    assert {o for o in atom if o.startswith("atom.")} == {
        "atom.sys.global.add.s32", "atom.acq_rel.sys.global.add.s32", "atom.release.sys.global.add.s32",
    }, sorted(atom)


def test_no_multimem_anywhere(atomics_ptx: dict[str, str], peer_ptx: dict[str, str]) -> None:
    for name, ptx in {**atomics_ptx, **peer_ptx}.items():
        assert "multimem" not in ptx, name


# --------------------------------------------------------------------------------------
# The host-side checks of the GPU tests, against a CPU model of a correct GPU (serial
# application in a random thread order) and against a corrupted result.
# --------------------------------------------------------------------------------------
SIM_THREADS = 3 * A.THREADS


def _apply(op: str, x, v, dtype: str, operand):
    nd = A._nd(dtype)
    if op == "exch":
        return v
    if op in ("min", "max"):
        return min(x, v) if op == "min" else max(x, v)
    if nd.kind == "f":
        return nd.type(x + v)
    if op == "add":
        return A._wrap(int(x) + int(v), dtype)
    if op in ("and", "or", "xor"):
        a, b = A._bits(x, dtype), A._bits(v, dtype)
        return A._wrap({"and": a & b, "or": a | b, "xor": a ^ b}[op], dtype)
    return nd.type(A._incdec(op, int(x), operand, 1))


def _simulate_rmw(suite, n: int, inputs: dict, rng):
    slots, olds = inputs["slots"].copy(), inputs["olds"].copy()
    for i, case in enumerate(suite.cases):
        nd = A._nd(case.dtype)
        x = A._from_cells(slots[i:i + 1], case.dtype)[0]
        if case.operand is None:  # decode the operand table the kernel reads
            vals = A._from_cells(inputs["vals"][:, suite.columns[(case.op, case.dtype)]], case.dtype)
        seen = np.zeros(n, nd)
        for g in rng.permutation(n):
            v = nd.type(case.operand) if case.operand is not None else vals[g]
            seen[g], x = x, _apply(case.op, x, v, case.dtype, case.operand)
        slots[i:i + 1] = A._to_cells(np.array([x], nd), case.dtype)
        if i in suite.records:
            olds[:, suite.records[i]] = A._to_cells(seen, case.dtype)
    return slots, olds


np = None


@pytest.fixture(scope="module")
def numpy_module():
    global np
    np = pytest.importorskip("numpy")
    return np


@pytest.mark.parametrize("name", [*A.ATOM_SUITES, "red"])
def test_rmw_host_checks_accept_correct_and_reject_wrong(numpy_module, name: str) -> None:
    suite = A.RED_SUITE if name == "red" else A.ATOM_SUITES[name]
    inputs = A.rmw_inputs(suite, SIM_THREADS)
    slots, olds = _simulate_rmw(suite, SIM_THREADS, inputs, np.random.default_rng(7))
    assert A.rmw_failures(suite, SIM_THREADS, inputs, slots, olds) == []
    bad = slots.copy()
    bad[len(bad) // 2] ^= 1  # one lost update in one slot
    assert len(A.rmw_failures(suite, SIM_THREADS, inputs, bad, olds)) == 1
    if suite.records:
        bad_olds = olds.copy()
        bad_olds[1] = bad_olds[0]  # one old value seen twice
        assert len(A.rmw_failures(suite, SIM_THREADS, inputs, slots, bad_olds)) == len(suite.records)


def test_cas_and_vector_host_checks(numpy_module) -> None:
    n, k = SIM_THREADS, len(A.CAS_CASES)
    slots = np.zeros(k, np.int64)
    olds = np.full(n, -1, np.int64)
    rng = np.random.default_rng(3)
    for i, (t, _, _) in enumerate(A.CAS_CASES):
        members = rng.permutation(np.arange(i, n, k))
        slots[i:i + 1] = A._to_cells(np.array([len(members)], A._nd(t)), t)
        for rank, g in enumerate(members):
            olds[g:g + 1] = A._to_cells(np.array([rank], A._nd(t)), t)
    assert A.cas_failures(n, slots, olds) == []
    olds[0], olds[k] = olds[k], olds[0]  # same case, swapped: still fine
    assert A.cas_failures(n, slots, olds) == []
    olds[0] = olds[2 * k]
    assert len(A.cas_failures(n, slots, olds)) == 1

    n = A.VEC_BLOCKS * A.THREADS
    vslots = np.zeros(2 * len(A.VEC_CASES), np.int64)
    volds = np.zeros((n, A.VEC_LANES), np.int64)
    raw = vslots.view(np.uint8)
    cell = 0
    for i, (t, lanes, _, _) in enumerate(A.VEC_CASES):
        nd = A._nd(t)
        for j in range(lanes):
            step = A.vec_lane_value(t, j)
            raw[16 * i + j * nd.itemsize: 16 * i + (j + 1) * nd.itemsize] = np.array([n * step], nd).view(np.uint8)
            volds[:, cell] = A._to_cells(rng.permutation(step * np.arange(n)).astype(nd), t)
            cell += 1
    assert A.vec_failures(n, vslots, volds) == []
    volds[5, 3] = volds[6, 3]
    assert len(A.vec_failures(n, vslots, volds)) == 1
