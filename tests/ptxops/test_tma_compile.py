"""The tensor-map (TMA), tensor-map editing and multicast bulk device functions in kernels as a
user writes them (runtime coordinates, typed values), compiled for sm_90a without a GPU: the
PTX holds the instruction, and misuse is a clear error at trace time."""

from __future__ import annotations

import pytest
from tests.support.cute_support import compile_ptx, cute, cutlass, global_tensor, opcodes
from cutlass.memory import SmemAllocator

import ptxops
from ptxops import QualifierError


def compiled(body, *, arch: str = "sm_90a", align: int = 64) -> str:
    """PTX of one CTA running ``body(gmem, tensor_map, smem, tidx)``: ``tensor_map`` a global
    pointer with the alignment ``align``, ``smem`` 256 bytes of 128-byte aligned shared memory."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        smem = SmemAllocator().allocate_array(cutlass.Int32, num_elems=64, byte_alignment=128)
        tmap = cute.make_ptr(cutlass.Int64, g.iterator.toint(), cute.AddressSpace.gmem, assumed_align=align)
        body(g.iterator, tmap, smem, cutlass.Int32(cute.arch.thread_idx()[0]))

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return compile_ptx(launch, global_tensor(align=64), arch=arch)


def test_tensor_load_and_store() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.cp_async_bulk_tensor(smem, tmap, (tidx * 64, cutlass.Int32(0)), mbar=smem)
        ptxops.cp_async_bulk_tensor(
            smem, tmap, (0, tidx, 0), mbar=smem, load_mode="im2col", im2col_offsets=(1,),
            cta_mask=0b11, cache_policy=cutlass.Int64(0), dst_space="shared::cluster",
        )
        ptxops.cp_async_bulk_tensor(tmap, smem, (tidx, 0))

    found = opcodes(compiled(body))
    assert found["cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes"] == 1
    assert found["cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
                 ".multicast::cluster.L2::cache_hint"] == 1
    assert found["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"] == 1


def test_tensor_reduce() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.cp_reduce_async_bulk_tensor(tmap, smem, (tidx, 0, 0), op="min", load_mode="im2col_no_offs")

    assert opcodes(compiled(body))[
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.min.im2col_no_offs.bulk_group"] == 1


def test_tensor_prefetch() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.cp_async_bulk_prefetch_tensor(tmap, (tidx, 0, 0, 0), load_mode="im2col", im2col_offsets=(0, 1))

    assert opcodes(compiled(body))["cp.async.bulk.prefetch.tensor.4d.L2.global.im2col"] == 1


def test_tensormap_edit_and_publish() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.tensormap_replace(smem, "global_address", g.toint())
        ptxops.tensormap_replace(smem, "global_dim", tidx + 1, ord=1)
        ptxops.tensormap_replace(smem, "elemtype", 12)
        ptxops.tensormap_cp_fenceproxy(tmap, smem, scope="gpu")

    found = opcodes(compiled(body))
    assert found["tensormap.replace.tile.global_address.shared::cta.b1024.b64"] == 1
    assert found["tensormap.replace.tile.global_dim.shared::cta.b1024.b32"] == 1
    assert found["tensormap.replace.tile.elemtype.shared::cta.b1024.b32"] == 1
    assert found["tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned"] == 1


def test_multimem_bulk_copy_and_reduce() -> None:
    def body(g, tmap, smem, tidx):
        bf16 = cute.recast_ptr(smem, dtype=cutlass.BFloat16)
        mc = cute.make_ptr(cutlass.BFloat16, g.toint(), cute.AddressSpace.gmem, assumed_align=16)
        ptxops.multimem_cp_async_bulk(mc, bf16, 256)
        ptxops.multimem_cp_reduce_async_bulk(mc, bf16, 256)  # BFloat16 add: .add.noftz.bf16

    found = opcodes(compiled(body))
    assert found["multimem.cp.async.bulk.global.shared::cta.bulk_group"] == 1
    assert found["multimem.cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16"] == 1


def test_byte_mask_needs_sm_100() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.multimem_cp_async_bulk(g, smem, 256, byte_mask=0x0F0F)

    assert opcodes(compiled(body, arch="sm_100a"))["multimem.cp.async.bulk.global.shared::cta.bulk_group.cp_mask"] == 1
    with pytest.raises(QualifierError) as err:
        compiled(body)
    assert err.value.rule == "cp-mask-target"


@pytest.mark.parametrize(
    ("body", "error", "match"),
    [
        (lambda g, t, s, i: ptxops.cp_async_bulk_tensor(s, t, (i,)), QualifierError, "completes on an mbarrier"),
        (lambda g, t, s, i: ptxops.cp_async_bulk_tensor(s, t, (i, 0, 0), mbar=s, load_mode="im2col"),
         ValueError, "needs the im2col"),
        (lambda g, t, s, i: ptxops.cp_async_bulk_tensor(s, t, (i, 0), mbar=s, im2col_offsets=(0,)),
         ValueError, "takes no im2col"),
        (lambda g, t, s, i: ptxops.cp_async_bulk_tensor(s, t, (0,) * 6, mbar=s), ValueError, "1 to 5"),
        (lambda g, t, s, i: ptxops.tensormap_replace(s, "box_dim", i), ValueError, "ord= is needed"),
        (lambda g, t, s, i: ptxops.tensormap_replace(s, "elemtype", 13), QualifierError, "0..12"),
        (lambda g, t, s, i: ptxops.tensormap_replace(s, "swizzle_mode", i), QualifierError, "immediate"),
        (lambda g, t, s, i: ptxops.cp_async_bulk_prefetch_tensor(s, (i,)), QualifierError, "pointer-space"),
    ],
)
def test_misuse_is_a_clear_error(body, error, match) -> None:
    with pytest.raises(error, match=match):
        compiled(body)


def test_tensor_map_must_be_64_byte_aligned() -> None:
    def body(g, tmap, smem, tidx):
        ptxops.cp_async_bulk_prefetch_tensor(tmap, (tidx,))

    with pytest.raises(QualifierError, match="tensor map") as err:
        compiled(body, align=16)
    assert err.value.rule == "pointer-alignment"
    assert "cp.async.bulk.prefetch.tensor.1d.L2.global" in compiled(body)


def test_sub_byte_element_types_on_sm_100() -> None:
    """``.elemtype`` 13..15 (the sub-byte types) exist from sm_100a on (ptxas's range)."""
    def body(g, tmap, smem, tidx):
        ptxops.tensormap_replace(tmap, "elemtype", 15)

    assert "tensormap.replace.tile.elemtype.global.b1024.b32" in compiled(body, arch="sm_100a")
