"""Typed use of the device functions inside kernels: values in and out as CuTeDSL numerics and
TensorSSA, the form each call chooses, and illegal uses rejected at trace time by rule."""

from __future__ import annotations

import pytest

from tests.support.cute_support import compile_ptx, cute, cutlass, global_tensor, opcodes
from cutlass.memory import SmemAllocator

import ptxops
from ptxops import QualifierError

BF16, F16, F32, F64 = cutlass.BFloat16, cutlass.Float16, cutlass.Float32, cutlass.Float64
I32, U32, I64 = cutlass.Int32, cutlass.Uint32, cutlass.Int64


def launcher(body, dtype=I32):
    """A one-block kernel running ``body(ptr)`` on a 32-byte aligned global tensor."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        body(g.iterator)

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return launch, global_tensor(dtype)


def ptx_of(body, dtype=I32, arch: str = "sm_90a") -> str:
    launch, arg = launcher(body, dtype)
    return compile_ptx(launch, arg, arch=arch)


@pytest.mark.parametrize(
    ("dtype", "n", "load", "reduce"),
    [
        (BF16, 8, "ld.global.v4.b32", "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2"),
        (F16, 4, "ld.global.v2.b32", "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v2.f16x2"),
        (F32, 4, "ld.global.v4.b32", "multimem.ld_reduce.relaxed.sys.global.add.v4.f32"),
        (F64, 1, "ld.global.b64", "multimem.ld_reduce.relaxed.sys.global.add.f64"),
        (I32, 1, "ld.global.b32", "multimem.ld_reduce.relaxed.sys.global.add.s32"),
    ],
)
def test_values_round_trip_through_typed_calls(dtype, n, load, reduce) -> None:
    def body(ptr):
        p = cute.recast_ptr(ptr, dtype=dtype)
        values = ptxops.ld(p, num_elements=n)
        reduced = ptxops.multimem_ld_reduce(p, num_elements=n, sem="relaxed", scope="sys")
        ptxops.st(p + 16 // (dtype.width // 8) * 2, reduced)
        ptxops.multimem_st(p, values, sem="relaxed", scope="sys")

    found = opcodes(ptx_of(body, dtype))
    assert found[load] == 1 and found[reduce] == 1, found


def test_arithmetic_on_returned_values_and_scalars() -> None:
    def body(ptr):
        p = cute.recast_ptr(ptr, dtype=BF16)
        x = ptxops.ld(p, num_elements=8)
        ptxops.st(p + 8, (x.to(F32) * 2.0).to(BF16))
        q = cute.recast_ptr(ptr, dtype=F32)
        old = ptxops.atom_add(q, F32(1.5), sem="relaxed", scope="gpu")
        ptxops.st_release(q + 4, old + F32(1.0), scope="sys")

    found = opcodes(ptx_of(body))
    assert found["atom.relaxed.gpu.global.add.f32"] == 1
    assert found["st.release.sys.global.b32"] == 1


def test_value_dtype_picks_signedness() -> None:
    """CuTeDSL pointers are signless; a Uint32 value makes an atomic max unsigned."""

    def body(ptr):
        ptxops.atom(ptr, U32(7), op="max", sem="relaxed", scope="gpu")
        ptxops.atom(ptr, I32(7), op="max", sem="relaxed", scope="gpu")
        ptxops.red(ptr, I64(1), op="add", dtype=I64)

    found = opcodes(ptx_of(body))
    assert found["atom.relaxed.gpu.global.max.u32"] == 1
    assert found["atom.relaxed.gpu.global.max.s32"] == 1
    assert found["red.global.add.u64"] == 1


def test_fp8_on_blackwell_accumulates_in_f16() -> None:
    def body(ptr):
        p = cute.recast_ptr(ptr, dtype=cutlass.Float8E4M3FN)
        v = ptxops.multimem_ld_reduce(p, num_elements=16)
        ptxops.multimem_st(p, v)

    found = opcodes(ptx_of(body, arch="sm_100a"))
    assert found["multimem.ld_reduce.global.add.acc::f16.v4.e4m3x4"] == 1
    assert found["multimem.st.global.v4.e4m3x4"] == 1


def test_shared_memory_pointer_selects_shared_space() -> None:
    def body(ptr):
        smem = SmemAllocator()
        s = smem.allocate_array(I32, num_elems=8, byte_alignment=16)
        ptxops.st(s, ptxops.ld_acquire(ptr, scope="gpu"), sem="relaxed", scope="cta")
        ptxops.atom_add(s + 1, I32(1))

    found = opcodes(ptx_of(body))
    assert found["st.relaxed.cta.shared::cta.b32"] == 1
    assert found["atom.shared::cta.add.s32"] == 1


# -- illegal uses: QualifierError at trace time, naming the rule and the target -----------------


@pytest.mark.parametrize(
    ("body", "arch", "pattern"),
    [
        (lambda p: ptxops.multimem_ld_reduce(cute.recast_ptr(p, dtype=BF16), num_elements=8, op="min",
                                             acc=F32), "sm_90a", r"acc-add-only[\s\S]*"),
        (lambda p: ptxops.multimem_ld_reduce(cute.recast_ptr(p, dtype=cutlass.Float8E4M3FN),
                                             num_elements=16), "sm_90a", r"sm_90a[\s\S]*fp8-target"),
        (lambda p: ptxops.multimem_ld_reduce(cute.recast_ptr(p, dtype=BF16), num_elements=8,
                                             sem="relaxed"), "sm_90a", r"order-needs-scope"),
        (lambda p: ptxops.multimem_ld_reduce(cute.recast_ptr(p, dtype=BF16), num_elements=1),
         "sm_90a", r"legal num_elements here: 2, 4, 8"),
        (lambda p: ptxops.ld(cute.recast_ptr(p, dtype=F32), num_elements=8), "sm_90a", r"v8-wide"),
        (lambda p: ptxops.ld_acquire(p, scope="gpus"), "sm_90a", r"did you mean .gpu."),
        (lambda p: ptxops.st(p, I32(1), sem="volatile", scope="gpu"), "sm_90a", r"scope-needs-order"),
        (lambda p: ptxops.fence(sem="sc"), "sm_90a", r"scope-required"),
    ],
    ids=["acc-with-min", "fp8-on-hopper", "relaxed-without-scope", "one-bf16", "v8-on-hopper",
         "bad-scope", "volatile-with-scope", "fence-without-scope"],
)
def test_illegal_use_raises_at_trace_time(body, arch: str, pattern: str) -> None:
    with pytest.raises(QualifierError, match=pattern) as info:
        ptx_of(body, arch=arch)
    assert info.value.target == arch


def test_multimem_on_shared_memory_is_rejected() -> None:
    def body(ptr):
        smem = SmemAllocator()
        s = smem.allocate_array(I32, num_elems=8, byte_alignment=16)
        ptxops.multimem_red(s, I32(1), sem="release", scope="sys")

    with pytest.raises(QualifierError, match=r"pointer-space[\s\S]*global"):
        ptx_of(body)


def test_misaligned_vector_access_is_rejected() -> None:
    def body(ptr):
        p = cute.recast_ptr(ptr, dtype=BF16) + 1  # 2-byte aligned
        ptxops.ld(p, num_elements=8)

    with pytest.raises(QualifierError, match=r"pointer-alignment[\s\S]*16-byte"):
        ptx_of(body)


def _tidx():
    return cute.arch.thread_idx()[0]


@pytest.mark.parametrize(
    "offset",
    [
        lambda: _tidx() * 8,  # the README's natural code
        lambda: (_tidx() << 4) + 16,
        lambda: _tidx() * 16 + cute.arch.block_idx()[0] * 8,
        lambda: cute.assume(_tidx() * 3, divby=8),  # not provable: the caller's promise
    ],
    ids=["tidx*8", "(tidx<<4)+16", "sum-of-multiples", "assume"],
)
def test_alignment_follows_the_offset_arithmetic(offset) -> None:
    """On a 32-byte aligned tensor, ``bf16_ptr + offset`` is 16-byte aligned whenever the
    offset is provably a multiple of 8 elements: the 16-byte accesses compile as written."""

    def body(ptr):
        p = cute.recast_ptr(ptr, dtype=BF16) + offset()
        ptxops.multimem_st(p, ptxops.multimem_ld_reduce(p, num_elements=8), sem="relaxed", scope="sys")

    found = opcodes(ptx_of(body))
    assert found["multimem.st.relaxed.sys.global.v4.bf16x2"] == 1, found
    assert found["multimem.ld_reduce.global.add.acc::f32.v4.bf16x2"] == 1, found


def loop_ptx(step: int) -> str:
    """A kernel copying 8 bf16 values at ``base + i`` for ``i`` from ``16 * block`` in steps of
    ``step`` (the loop is in the kernel itself: CuTeDSL turns only its loops into IR loops)."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        base = cute.recast_ptr(g.iterator, dtype=BF16)
        for i in cutlass.range(cute.arch.block_idx()[0] * 16, 256, step):
            ptxops.st(base + i, ptxops.ld(base + i, num_elements=8))

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return compile_ptx(launch, global_tensor(I32))


def test_alignment_follows_a_loop_step() -> None:
    assert opcodes(loop_ptx(8))["ld.global.v4.b32"] >= 1  # LLVM may unroll the loop


def test_unprovable_alignment_names_what_was_proved_and_the_assume_fix() -> None:
    """``tidx * 4`` bf16 elements is only 8-byte aligned: the 16-byte access is refused with
    the alignment proved and ``cute.assume(offset, divby=8)``; the same for a loop step of 4."""

    def by_thread(ptr):
        p = cute.recast_ptr(ptr, dtype=BF16) + _tidx() * 4
        ptxops.multimem_st(p, ptxops.ld(p, num_elements=8), sem="relaxed", scope="sys")

    for compile_it in (lambda: ptx_of(by_thread), lambda: loop_ptx(4)):
        with pytest.raises(QualifierError, match=r"pointer-alignment") as info:
            compile_it()
        message = str(info.value)
        assert "known to be 8-byte aligned" in message, message
        assert "cute.assume(offset, divby=8)" in message and info.value.offending == {"alignment": 8}


# -- TMA bulk copies and mbarriers ---------------------------------------------------------------


def test_bulk_copy_round_trip_through_an_mbarrier() -> None:
    """One thread loads 256 bytes into shared memory with a bulk copy that completes on an
    mbarrier, waits on the phase in a loop, and stores them back in a bulk async-group."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        smem = SmemAllocator()
        bar = smem.allocate_array(I64, num_elems=1, byte_alignment=8)
        buf = smem.allocate_array(I32, num_elems=64, byte_alignment=16)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            ptxops.mbarrier_init(bar, 1)
            ptxops.fence(op_restrict="mbarrier_init", sem="release", scope="cluster")
            ptxops.mbarrier_arrive(bar, 256)
            ptxops.cp_async_bulk(buf, g.iterator, 256, mbar=bar)
            done = ptxops.mbarrier_try_wait(bar, phase=0)
            while not done:
                done = ptxops.mbarrier_try_wait(bar, phase=0)
            ptxops.cp_async_bulk(g.iterator + 64, buf, 256)
            ptxops.cp_async_bulk_commit_group()
            ptxops.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    ptx = compile_ptx(launch, global_tensor(), arch="sm_90a")
    found = opcodes(ptx)
    assert found["mbarrier.init.shared::cta.b64"] == 1
    assert found["mbarrier.arrive.expect_tx.shared::cta.b64"] == 1
    assert found["cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes"] == 1
    assert found["mbarrier.try_wait.parity.shared::cta.b64"] == 2
    assert found["cp.async.bulk.global.shared::cta.bulk_group"] == 1
    assert found["cp.async.bulk.commit_group"] == 1
    assert found["cp.async.bulk.wait_group.read"] == 1
    assert "cp.async.bulk.wait_group.read 0;" in ptx


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda g, s: ptxops.cp_async_bulk(s, g, 256), QualifierError,
         r"shared-destination-completes-on-mbarrier"),
        (lambda g, s: ptxops.cp_async_bulk(g, s, 256, mbar=s), QualifierError,
         r"global-destination-bulk-group"),
        (lambda g, s: ptxops.cp_async_bulk(s, g, 256, completion="mbarrier::complete_tx::bytes"),
         ValueError, r"needs mbar="),
        (lambda g, s: ptxops.cp_async_bulk(g, s, 24), ValueError, r"multiple of 16"),
        (lambda g, s: ptxops.cp_async_bulk(g, g + 4, 32), QualifierError, r"global-source-to-shared"),
        (lambda g, s: ptxops.cp_async_bulk(s + 2, g, 32, mbar=s), QualifierError,
         r"pointer-alignment[\s\S]*16-byte"),
        (lambda g, s: ptxops.mbarrier_arrive(s, sem="relaxed"), QualifierError, r"sem-needs-scope"),
        (lambda g, s: ptxops.mbarrier_try_wait(s, phase=0, space="shared::cluster"), QualifierError,
         r"pointer-space|wait-local"),
        (lambda g, s: ptxops.mbarrier_try_wait(s), ValueError, r"exactly one of state= and phase="),
        (lambda g, s: ptxops.cp_async_bulk_wait_group(-1), ValueError, r"non-negative"),
    ],
    ids=["load-without-mbar", "store-with-mbar", "explicit-completion-without-mbar", "size-not-16", "global-to-global", "misaligned",
         "arrive-sem-without-scope", "wait-on-cluster-barrier", "wait-without-phase",
         "negative-wait-group"],
)
def test_illegal_bulk_and_mbarrier_uses(call, error, pattern) -> None:
    def body(ptr):
        smem = SmemAllocator()
        s = smem.allocate_array(I32, num_elems=64, byte_alignment=16)
        call(ptr, s)

    with pytest.raises(error, match=pattern):
        ptx_of(body)


def test_cache_hinted_load_and_non_coherent_load() -> None:
    """A cache policy becomes the 64-bit operand of .L2::cache_hint; nc=True is ld.global.nc;
    a write-through store with an L1 hint is refused by rule."""

    def body(ptr):
        policy = ptxops.ld(cute.recast_ptr(ptr, dtype=I64) + 2, nc=True)
        x = ptxops.ld(ptr, cache_policy=policy, prefetch=128, l1_eviction="evict_last")
        y = ptxops.ld(ptr + 4, nc=True, cache="cg", num_elements=4)
        ptxops.st(ptr, x + y[0], cache="wt")

    found = opcodes(ptx_of(body))
    assert found["ld.global.nc.b64"] == 1
    assert found["ld.global.L1::evict_last.L2::cache_hint.L2::128B.b32"] == 1
    assert found["ld.global.cg.nc.v4.b32"] == 1
    assert found["st.global.wt.b32"] == 1
    with pytest.raises(QualifierError, match="cache-op-or-eviction"):
        ptx_of(lambda ptr: ptxops.st(ptr, I32(1), cache="wt", l1_eviction="evict_first"))
    with pytest.raises(QualifierError, match="legal PTX that ptxops does not wrap"):
        ptx_of(lambda ptr: ptxops.ld(ptr, space="param"))


# -- bulk reductions, cluster stores and reductions, mapa, nanosleep ----------------------------


def test_bulk_reductions_choose_their_type_from_the_dtype() -> None:
    """BFloat16 add into global memory is ``.add.noftz.bf16``; Int32 max ``.max.s32``; an
    Int64 add into another CTA's shared memory (through mapa) completes on its mbarrier."""

    def body(ptr):
        smem = SmemAllocator()
        bar = smem.allocate_array(I64, num_elems=1, byte_alignment=8)
        buf = smem.allocate_array(I64, num_elems=32, byte_alignment=16)
        ptxops.cp_reduce_async_bulk(cute.recast_ptr(ptr, dtype=BF16), cute.recast_ptr(buf, dtype=BF16), 256)
        ptxops.cp_reduce_async_bulk(ptr, cute.recast_ptr(buf, dtype=I32), 128, op="max")
        ptxops.cp_async_bulk_commit_group()
        ptxops.cp_reduce_async_bulk(ptxops.mapa(buf, 1), buf, 256, mbar=ptxops.mapa(bar, 1))

    found = opcodes(ptx_of(body))
    assert found["cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16"] == 1
    assert found["cp.reduce.async.bulk.global.shared::cta.bulk_group.max.s32"] == 1
    assert found["cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.add.u64"] == 1
    assert found["mapa.shared::cluster.u32"] == 2


def test_cluster_stores_and_reductions_complete_on_the_receivers_mbarrier() -> None:
    """Four Float32 go to rank 1's buffer as one ``.v4.b32``; an Int32 add and a Uint32 inc
    reduce into it; a backoff sleeps in a register-held and a constant delay."""

    def body(ptr):
        smem = SmemAllocator()
        bar = smem.allocate_array(I64, num_elems=1, byte_alignment=8)
        buf = smem.allocate_array(F32, num_elems=8, byte_alignment=16)
        remote, remote_bar = ptxops.mapa(buf, 1), ptxops.mapa(bar, 1)
        ptxops.st_async(remote, ptxops.ld(cute.recast_ptr(ptr, dtype=F32), num_elements=4), remote_bar)
        counters = cute.recast_ptr(remote, dtype=I32)
        ptxops.red_async(counters + 4, I32(1), remote_bar)
        ptxops.red_async(counters + 5, U32(7), remote_bar, op="inc")
        ptxops.nanosleep(I32(32) * 2)
        ptxops.nanosleep(100)

    found = opcodes(ptx_of(body))
    assert found["st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32"] == 1
    assert found["red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.s32"] == 1
    assert found["red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.inc.u32"] == 1
    assert found["nanosleep.u32"] == 2


def test_release_forms_of_st_async_and_red_async_on_blackwell() -> None:
    def body(ptr):
        ptxops.st_async(ptr, I32(1), sem="release", scope="gpu")
        ptxops.red_async(cute.recast_ptr(ptr, dtype=I64) + 4, I64(1), scope="sys")

    found = opcodes(ptx_of(body, arch="sm_100a"))
    assert found["st.async.release.gpu.global.b32"] == 1
    assert found["red.async.release.sys.global.add.u64"] == 1


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda g, s, b: ptxops.cp_reduce_async_bulk(
            ptxops.mapa(cute.recast_ptr(s, dtype=F32), 1), cute.recast_ptr(s, dtype=F32), 64,
            mbar=ptxops.mapa(b, 1)), QualifierError, r"add-types-shared-cluster"),
        (lambda g, s, b: ptxops.st_async(s, I32(1), b), QualifierError, r"no-own-shared-memory"),
        (lambda g, s, b: ptxops.red_async(g, I32(1), scope="gpu"), QualifierError,
         r"release-target[\s\S]*sm_100a"),
        (lambda g, s, b: ptxops.mapa(g, 1), QualifierError, r"pointer-space"),
        (lambda g, s, b: ptxops.nanosleep(2_000_000), ValueError, r"\[0, 1000000\]"),
    ],
    ids=["f32-add-into-shared-cluster", "st-async-to-own-shared", "release-red-async-on-hopper",
         "mapa-of-global", "sleep-longer-than-1ms"],
)
def test_illegal_cluster_and_reduction_uses(call, error, pattern) -> None:
    def body(ptr):
        smem = SmemAllocator()
        bar = smem.allocate_array(I64, num_elems=1, byte_alignment=8)
        s = smem.allocate_array(I32, num_elems=64, byte_alignment=16)
        call(ptr, s, bar)

    with pytest.raises(error, match=pattern):
        ptx_of(body)


# -- control, prefetch and Blackwell families ---------------------------------------------------


def test_prefetches_follow_the_pointer() -> None:
    """A global pointer prefetches ``.global``; a tensor map in global memory is prefetched
    through its generic address; a register-memory pointer ``.local``; a cache policy adds
    ``.L2::cache_hint`` to the bulk prefetch."""

    def body(ptr):
        local = cute.make_rmem_tensor((4,), I32)
        ptxops.prefetch(ptr, "L2::evict_last")
        ptxops.prefetch(ptr, "tensormap")
        ptxops.prefetch(cute.recast_ptr(local.iterator, dtype=I32), "L1")
        ptxops.prefetchu(ptr)
        ptxops.cp_async_bulk_prefetch(ptr, 256, cache_policy=ptxops.ld(cute.recast_ptr(ptr, dtype=I64)))

    found = opcodes(ptx_of(body))
    assert found["prefetch.global.L2::evict_last"] == 1
    assert found["prefetch.tensormap"] == 1
    assert found["prefetch.local.L1"] == 1
    assert found["prefetchu.L1"] == 1
    assert found["cp.async.bulk.prefetch.L2.global.L2::cache_hint"] == 1


def test_cluster_launch_control_round_trip_and_bulk_zeroing_on_blackwell() -> None:
    """try_cancel into shared memory on an mbarrier expecting 16 bytes, a wait on its phase,
    the response read back as two Int64 and decoded; st.bulk zeroes shared and global memory."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        smem = SmemAllocator()
        bar = smem.allocate_array(I64, num_elems=1, byte_alignment=8)
        resp = smem.allocate_array(I64, num_elems=2, byte_alignment=16)
        ptxops.mbarrier_init(bar, 1)
        ptxops.mbarrier_arrive(bar, 16)
        ptxops.clusterlaunchcontrol_try_cancel(resp, bar)
        done = ptxops.mbarrier_try_wait(bar, phase=0)
        while not done:
            done = ptxops.mbarrier_try_wait(bar, phase=0)
        halves = ptxops.ld(resp, num_elements=2)
        if ptxops.clusterlaunchcontrol_query_cancel(halves):
            x, y, z = ptxops.clusterlaunchcontrol_query_cancel(halves, "get_first_ctaid")
            ptxops.st(g.iterator, x + y + z + ptxops.clusterlaunchcontrol_query_cancel(halves, "get_first_ctaid::z"))
        ptxops.st_bulk(resp, 16)
        ptxops.st_bulk(g.iterator + 8, I64(64))

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    found = opcodes(compile_ptx(launch, global_tensor(), arch="sm_100a"))
    assert found["clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128"] == 1
    assert found["clusterlaunchcontrol.query_cancel.is_canceled.pred.b128"] == 1
    assert found["clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128"] == 1
    assert found["clusterlaunchcontrol.query_cancel.get_first_ctaid::z.b32.b128"] == 1
    assert found["st.bulk.shared::cta"] == 1 and found["st.bulk"] == 1


@pytest.mark.parametrize(
    ("call", "arch", "error", "pattern"),
    [
        (lambda g, s: ptxops.st_bulk(g, 64), "sm_90a", QualifierError, r"\[target\][\s\S]*sm_100a"),
        (lambda g, s: ptxops.st_bulk(g, 12), "sm_100a", ValueError, r"multiple of 8"),
        (lambda g, s: ptxops.st_bulk(g + 1, 64), "sm_100a", QualifierError, r"pointer-alignment[\s\S]*8-byte"),
        (lambda g, s: ptxops.clusterlaunchcontrol_try_cancel(s + 1, s), "sm_100a", QualifierError,
         r"pointer-alignment[\s\S]*16-byte"),
        (lambda g, s: ptxops.clusterlaunchcontrol_try_cancel(g, s), "sm_100a", QualifierError, r"pointer-space"),
        (lambda g, s: ptxops.prefetch(s, "L2"), "sm_90a", QualifierError, r"pointer-space"),
        (lambda g, s: ptxops.prefetch(g, "L1::evict_last"), "sm_90a", QualifierError, r"did you mean"),
        (lambda g, s: ptxops.cp_async_bulk_prefetch(g, 24), "sm_90a", ValueError, r"multiple of 16"),
        (lambda g, s: ptxops.elect_sync(0), "sm_90a", ValueError, r"non-zero 32-bit lane mask"),
        (lambda g, s: ptxops.membar("gpu"), "sm_90a", QualifierError, r"'cta', 'gl', 'sys'"),
    ],
    ids=["st-bulk-on-hopper", "st-bulk-size-12", "st-bulk-misaligned", "try-cancel-misaligned",
         "try-cancel-global-response", "prefetch-shared", "prefetch-l1-eviction",
         "bulk-prefetch-size-24", "elect-empty-mask", "membar-gpu-level"],
)
def test_illegal_control_and_prefetch_uses(call, arch, error, pattern) -> None:
    def body(ptr):
        smem = SmemAllocator()
        s = smem.allocate_array(I64, num_elems=4, byte_alignment=16)
        call(ptr, s)

    with pytest.raises(error, match=pattern):
        ptx_of(body, arch=arch)


@pytest.mark.parametrize(
    ("size", "proved"),
    [(lambda n: n * 16, None), (lambda n: cute.assume(n, divby=16), None), (lambda n: 48, None),
     (lambda n: n * 8, "is known to be a multiple of 8"), (lambda n: n, "is known to be a multiple of 1"),
     (lambda n: I32(40), "is 40")],
    ids=["n*16", "assumed", "constant-48", "n*8", "n", "Int32(40)"],
)
def test_bulk_sizes_are_proved_multiples_of_16(size, proved) -> None:
    """A bulk copy's (and a bulk prefetch's) byte count must be a multiple of 16: proved from
    its arithmetic like an offset's alignment, or refused naming what was proved and the fix."""

    @cute.kernel
    def kernel(g: cute.Tensor, n: I32):
        s = SmemAllocator().allocate_array(I32, num_elems=64, byte_alignment=128)
        ptxops.cp_async_bulk(g.iterator, s, size(n))
        ptxops.cp_async_bulk_prefetch(g.iterator, size(n))

    @cute.jit
    def launch(g: cute.Tensor, n: I32):
        kernel(g, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

    if proved is None:
        found = opcodes(compile_ptx(launch, global_tensor(I32), I32(3)))
        assert found["cp.async.bulk.global.shared::cta.bulk_group"] == 1
        assert found["cp.async.bulk.prefetch.L2.global"] == 1
    else:
        with pytest.raises(QualifierError, match=rf"size {proved}, but it must be a multiple of 16[\s\S]*"
                           r"size-multiple[\s\S]*cute\.assume\(size, divby=16\)") as info:
            compile_ptx(launch, global_tensor(I32), I32(3))
        assert info.value.rule == "size-multiple"
