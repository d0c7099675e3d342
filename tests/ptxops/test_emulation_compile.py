"""Kernels traced under ``ptxops.emulate_multicast`` compile for sm_90a without a GPU, hold no
``multimem`` instruction, and emit the unicast accesses of the documented mapping; an illegal
multimem form is still an error under emulation."""

from __future__ import annotations

import pytest
from tests.support.cute_support import compile_ptx, cutlass, opcodes
from cutlass import Int32, Int64
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_stream

import ptxops
from ptxops import QualifierError

cute = cutlass.cute
ARCH = "sm_90a"
WORLD = 4


def _gmem(dtype, address, align=16):
    return cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)


def build(body, *, world: int = WORLD, windows: int = 1):
    """A launcher of one CTA of 32 threads running ``body(mc, out, flag)`` under emulation."""

    @cute.kernel
    def kernel(table: Int64, mc: Int64, out: Int64, flag: Int64):
        with ptxops.emulate_multicast(table, world=world, windows=windows):
            body(mc, out, flag)

    @cute.jit
    def launch(table: Int64, mc: Int64, out: Int64, flag: Int64, stream: cuda.CUstream):
        kernel(table, mc, out, flag).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return launch


def compiled(body, **kw) -> str:
    ptx = compile_ptx(build(body, **kw), Int64(0), Int64(0), Int64(0), Int64(0), make_fake_stream(), arch=ARCH)
    assert "multimem" not in ptx
    return ptx


def readme_all_reduce(mc, out, flag):
    """README's pattern: eight bf16 reduced through the multicast address, stored back to all."""
    offset = Int64(cute.arch.thread_idx()[0] * 8)
    src = _gmem(cutlass.BFloat16, mc) + cute.assume(offset, divby=8)
    total = ptxops.multimem_ld_reduce(src, num_elements=8, acc=cutlass.Float32, sem="relaxed", scope="sys")
    ptxops.multimem_st(src, total, sem="relaxed", scope="sys")
    ptxops.multimem_red(_gmem(cutlass.Uint32, flag, 4), cutlass.Uint32(1), sem="release", scope="sys")


def test_readme_pattern_is_unicast() -> None:
    found = opcodes(compiled(readme_all_reduce))
    assert found["ld.relaxed.sys.global.v4.b32"] == WORLD, found  # one 16-byte load per rank
    assert found["st.relaxed.sys.global.v4.b32"] == WORLD, found
    assert found["red.release.sys.global.add.u32"] == WORLD, found


def natural_offset(mc, out, flag):
    """``mc + tidx * 8`` without ``cute.assume``: the alignment proved from the arithmetic
    reaches every rank's unicast pointer (each peer's 16-byte access is checked again)."""
    src = _gmem(cutlass.BFloat16, mc) + Int64(cute.arch.thread_idx()[0] * 8)
    ptxops.multimem_st(src, ptxops.multimem_ld_reduce(src, num_elements=8), sem="relaxed", scope="sys")


def test_natural_offset_is_aligned_on_every_rank() -> None:
    found = opcodes(compiled(natural_offset))
    assert found["ld.global.v4.b32"] == WORLD and found["st.relaxed.sys.global.v4.b32"] == WORLD, found


def ordered(mc, out, flag):
    p = _gmem(cutlass.Float32, mc, 16)
    v = ptxops.multimem_ld_reduce(p, num_elements=4, sem="acquire", scope="sys")
    ptxops.multimem_st(p, v, sem="release", scope="gpu")
    ptxops.multimem_red(_gmem(cutlass.Uint32, flag, 4), cutlass.Uint32(1))  # relaxed.sys
    ptxops.multimem_red(_gmem(cutlass.Uint32, flag, 4), cutlass.Uint32(2), op="max", sem="relaxed", scope="gpu")


def test_ordering_maps_per_rank() -> None:
    found = opcodes(compiled(ordered, world=2))
    assert found["ld.acquire.sys.global.v4.b32"] == 2, found
    assert found["st.release.gpu.global.v4.b32"] == 2, found
    assert found["red.relaxed.sys.global.add.u32"] == 2, found
    assert found["red.relaxed.gpu.global.max.u32"] == 2, found


def two_windows(mc, out, flag):
    ptxops.multimem_st(_gmem(cutlass.Int32, mc, 4), Int32(7))
    ptxops.multimem_red(_gmem(cutlass.Uint32, flag, 4), cutlass.Uint32(1), sem="release", scope="sys")


def test_two_windows_compile() -> None:
    found = opcodes(compiled(two_windows, windows=2, world=8))
    assert found["st.global.b32"] >= 8 and found["red.release.sys.global.add.u32"] == 8, found


@pytest.mark.parametrize("acc", ["auto", None])
def test_half_sum_accumulates_as_named(acc) -> None:
    def body(mc, out, flag):
        v = ptxops.multimem_ld_reduce(_gmem(cutlass.Float16, mc, 16), num_elements=8, acc=acc)
        ptxops.st(_gmem(cutlass.Float16, out, 16), v)

    ptx = compiled(body, world=2)
    assert ("cvt.f32.f16" in ptx) == (acc == "auto")


def test_illegal_form_is_still_an_error() -> None:
    def body(mc, out, flag):  # .acc::f32 needs a 16-bit float type
        ptxops.multimem_ld_reduce(_gmem(cutlass.Float32, mc, 16), num_elements=4, acc="f32")

    with pytest.raises(QualifierError) as err:
        compiled(body)
    assert err.value.rule == "acc-f32-types"


def test_table_entries() -> None:
    assert ptxops.translation_table([(100, 64, [1000, 2000])]) == [100, 64, 1000, 2000]
    with pytest.raises(ValueError):
        ptxops.translation_table([(1, 2, [3]), (4, 5, [6, 7])])


def test_window_bases_address_the_entries_the_table_puts_there() -> None:
    """``bases(w)`` points at window ``w``'s ``base_0`` in the flat table (a table of peers)."""
    from cutlass import Int64

    from ptxops.ops.emulation import MulticastEmulation

    entries = ptxops.translation_table([(100, 64, [1000, 2000, 3000]), (200, 32, [4000, 5000, 6000])])
    emulation = MulticastEmulation(Int64(0), world=3, windows=2)
    for window, first in ((0, 1000), (1, 4000)):
        assert entries[int(emulation.bases(window)) // 8] == first


def multimem_bulk(mc, out, flag):
    """A bulk copy and a bulk reduction of 256 bytes of shared memory to every rank."""
    from cutlass.memory import SmemAllocator

    s = SmemAllocator().allocate_array(cutlass.Float32, num_elems=64, byte_alignment=128)
    ptxops.multimem_cp_async_bulk(_gmem(cutlass.Float32, mc), s, 256)
    ptxops.multimem_cp_reduce_async_bulk(_gmem(cutlass.Float32, mc), s, 256, op="add")
    ptxops.cp_async_bulk_commit_group()


@pytest.mark.parametrize("world", [2, WORLD])
def test_multimem_bulk_is_one_unicast_bulk_operation_per_rank(world: int) -> None:
    found = opcodes(compiled(multimem_bulk, world=world))
    assert found["cp.async.bulk.global.shared::cta.bulk_group"] == world, found
    assert found["cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"] == world, found


def test_multimem_bulk_byte_mask_is_not_emulated() -> None:
    def body(mc, out, flag):
        from cutlass.memory import SmemAllocator

        s = SmemAllocator().allocate_array(cutlass.Float32, num_elems=64, byte_alignment=128)
        ptxops.multimem_cp_async_bulk(_gmem(cutlass.Float32, mc), s, 256, byte_mask=0xFF)

    with pytest.raises(ValueError, match="byte mask is not emulated"):
        compile_ptx(build(body), Int64(0), Int64(0), Int64(0), Int64(0), make_fake_stream(), arch="sm_100a")
