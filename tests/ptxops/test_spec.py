"""The pure spec API: names, defaults, error messages, and golden rendered text."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ptxops import QualifierError, spec

# -- golden rendered text ------------------------------------------------------------------------

GOLDEN = [
    (
        ("multimem.ld_reduce", dict(sem="relaxed", scope="sys", space="global", op="add", acc="f32", vec=4, type="bf16x2")),
        "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2",
        "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l,~{memory}",
    ),
    (
        ("multimem.ld_reduce", dict(op="add", acc="f16", vec=4, type="e4m3", target="sm_100a")),
        "multimem.ld_reduce.add.acc::f16.v4.e4m3",
        "{ .reg .b8 %ptxops_d0, %ptxops_d1, %ptxops_d2, %ptxops_d3; "
        "multimem.ld_reduce.add.acc::f16.v4.e4m3 {%ptxops_d0, %ptxops_d1, %ptxops_d2, %ptxops_d3}, [$1]; "
        "mov.b32 $0, {%ptxops_d0, %ptxops_d1, %ptxops_d2, %ptxops_d3}; }",
        "=r,l,~{memory}",
    ),
    (
        ("multimem.st", dict(sem="release", scope="gpu", space="global", vec=2, type="f32")),
        "multimem.st.release.gpu.global.v2.f32",
        "multimem.st.release.gpu.global.v2.f32 [$0], {$1, $2};",
        "l,r,r,~{memory}",
    ),
    (
        ("ld", dict(space="global", l1_eviction="evict_last", cache_hint="cache_hint", prefetch="128B", vec=2, type="b32")),
        "ld.global.L1::evict_last.L2::cache_hint.L2::128B.v2.b32",
        "ld.global.L1::evict_last.L2::cache_hint.L2::128B.v2.b32 {$0, $1}, [$2], $3;",
        "=r,=r,l,l,~{memory}",
    ),
    (
        ("ld", dict(space="global", cache="cg", nc="nc", vec=4, type="b32")),
        "ld.global.cg.nc.v4.b32",
        "ld.global.cg.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l,~{memory}",
    ),
    (
        ("st", dict(sem="release", scope="sys", space="global", cache_hint="cache_hint", type="u64")),
        "st.release.sys.global.L2::cache_hint.u64",
        "st.release.sys.global.L2::cache_hint.u64 [$0], $1, $2;",
        "l,l,l,~{memory}",
    ),
    (
        ("st", dict(space="global", l2_eviction="evict_last", vec=8, type="b32", target="sm_100a")),
        "st.global.L2::evict_last.v8.b32",
        "st.global.L2::evict_last.v8.b32 [$0], {$1, $2, $3, $4, $5, $6, $7, $8};",
        "l,r,r,r,r,r,r,r,r,~{memory}",
    ),
    (
        ("ld", dict(space="const", vec=4, type="u32")),
        "ld.const.v4.u32",
        "ld.const.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l,~{memory}",
    ),
    (
        ("multimem.red", dict(sem="release", scope="sys", space="global", op="add", type="u32")),
        "multimem.red.release.sys.global.add.u32",
        "multimem.red.release.sys.global.add.u32 [$0], $1;",
        "l,r,~{memory}",
    ),
    (
        ("atom", dict(sem="acq_rel", scope="gpu", space="global", op="add", vec=2, type="f16x2")),
        "atom.acq_rel.gpu.global.add.noftz.v2.f16x2",
        "atom.acq_rel.gpu.global.add.noftz.v2.f16x2 {$0, $1}, [$2], {$3, $4};",
        "=r,=r,l,r,r,~{memory}",
    ),
    (
        ("atom", dict(space="shared::cta", op="cas", type="b16")),
        "atom.shared::cta.cas.b16",
        "atom.shared::cta.cas.b16 $0, [$1], $2, $3;",
        "=h,r,h,h,~{memory}",
    ),
    (
        ("atom", dict(sem="relaxed", scope="sys", space="global", op="exch", type="b128")),
        "atom.relaxed.sys.global.exch.b128",
        "{ .reg .b128 %ptxops_d0; .reg .b128 %ptxops_b0; mov.b128 %ptxops_b0, {$3, $4}; "
        "atom.relaxed.sys.global.exch.b128 %ptxops_d0, [$2], %ptxops_b0; "
        "mov.b128 {$0, $1}, %ptxops_d0; }",
        "=l,=l,l,l,l,~{memory}",
    ),
    (
        ("red", dict(sem="release", scope="sys", space="global", op="add", type="s32")),
        "red.release.sys.global.add.s32",
        "red.release.sys.global.add.s32 [$0], $1;",
        "l,r,~{memory}",
    ),
    (
        ("ld", dict(sem="acquire", scope="sys", space="global", type="b32")),
        "ld.acquire.sys.global.b32",
        "ld.acquire.sys.global.b32 $0, [$1];",
        "=r,l,~{memory}",
    ),
    (
        ("ld", dict(space="global", vec=8, type="b32", target="sm_100a")),
        "ld.global.v8.b32",
        "ld.global.v8.b32 {$0, $1, $2, $3, $4, $5, $6, $7}, [$8];",
        "=r,=r,=r,=r,=r,=r,=r,=r,l,~{memory}",
    ),
    (
        ("st", dict(sem="volatile", space="shared::cta", vec=2, type="u16")),
        "st.volatile.shared::cta.v2.u16",
        "st.volatile.shared::cta.v2.u16 [$0], {$1, $2};",
        "r,h,h,~{memory}",
    ),
    (
        ("st", dict(sem="mmio.relaxed", scope="sys", space="global", type="u32")),
        "st.mmio.relaxed.sys.global.u32",
        "st.mmio.relaxed.sys.global.u32 [$0], $1;",
        "l,r,~{memory}",
    ),
    (("fence", dict(sem="sc", scope="sys")), "fence.sc.sys", "fence.sc.sys;", "~{memory}"),
    (("fence", dict(proxy="async.global")), "fence.proxy.async.global", "fence.proxy.async.global;", "~{memory}"),
    (
        ("fence", dict(proxy="tensormap::generic", sem="acquire", scope="gpu")),
        "fence.proxy.tensormap::generic.acquire.gpu",
        "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;",
        "l,~{memory}",
    ),
    (
        ("fence", dict(sem="acquire", sync_restrict="shared::cluster", scope="cluster")),
        "fence.acquire.sync_restrict::shared::cluster.cluster",
        "fence.acquire.sync_restrict::shared::cluster.cluster;",
        "~{memory}",
    ),
    (
        ("cp.async.bulk", dict(dst="shared::cluster", src="global", completion="mbarrier::complete_tx::bytes")),
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
        "r,l,r,r,~{memory}",
    ),
    (
        ("cp.async.bulk", dict(dst="global", src="shared::cta", completion="bulk_group")),
        "cp.async.bulk.global.shared::cta.bulk_group",
        "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
        "l,r,r,~{memory}",
    ),
    (
        ("cp.async.bulk.commit_group", {}),
        "cp.async.bulk.commit_group", "cp.async.bulk.commit_group;", "~{memory}",
    ),
    (
        ("cp.async.bulk.wait_group", dict(read="read")),
        "cp.async.bulk.wait_group.read", "cp.async.bulk.wait_group.read $0;", "n,~{memory}",
    ),
    (
        ("mbarrier.init", dict(space="shared::cta")),
        "mbarrier.init.shared::cta.b64", "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}",
    ),
    (
        ("mbarrier.arrive", dict(expect_tx="expect_tx", sem="release", scope="cta", space="shared::cta")),
        "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64",
        "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 $0, [$1], $2;",
        "=l,r,r,~{memory}",
    ),
    (
        ("mbarrier.arrive", dict(sem="release", scope="cluster", space="shared::cluster")),
        "mbarrier.arrive.release.cluster.shared::cluster.b64",
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [$0];",
        "r,~{memory}",
    ),
    (
        ("mbarrier.try_wait", dict(parity="parity", sem="acquire", scope="cta", space="shared::cta")),
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",
        "{ .reg .pred %ptxops_p0; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 "
        "%ptxops_p0, [$1], $2; selp.u32 $0, 1, 0, %ptxops_p0; }",
        "=r,r,r,~{memory}",
    ),
    (
        ("mbarrier.try_wait", dict(space="shared")),
        "mbarrier.try_wait.shared.b64",
        "{ .reg .pred %ptxops_p0; mbarrier.try_wait.shared.b64 %ptxops_p0, [$1], $2; "
        "selp.u32 $0, 1, 0, %ptxops_p0; }",
        "=r,r,l,~{memory}",
    ),
    (
        ("cp.reduce.async.bulk", dict(dst="global", src="shared::cta", completion="bulk_group", op="add", type="bf16")),
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16",
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [$0], [$1], $2;",
        "l,r,r,~{memory}",
    ),
    (
        ("cp.reduce.async.bulk", dict(dst="shared::cluster", src="shared::cta", completion="mbarrier::complete_tx::bytes", op="min", type="s32")),
        "cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.min.s32",
        "cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.min.s32 [$0], [$1], $2, [$3];",
        "r,r,r,r,~{memory}",
    ),
    (
        ("st.async", dict(space="shared::cluster", completion="mbarrier::complete_tx::bytes", vec=2, type="b64")),
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64",
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [$0], {$1, $2}, [$3];",
        "r,l,l,r,~{memory}",
    ),
    (
        ("st.async", dict(completion="mbarrier::complete_tx::bytes", type="b32")),
        "st.async.mbarrier::complete_tx::bytes.b32",
        "st.async.mbarrier::complete_tx::bytes.b32 [$0], $1, [$2];",
        "l,r,l,~{memory}",
    ),
    (
        ("red.async", dict(sem="release", scope="sys", space="global", op="add", type="u64", target="sm_100a")),
        "red.async.release.sys.global.add.u64",
        "red.async.release.sys.global.add.u64 [$0], $1;",
        "l,l,~{memory}",
    ),
    (
        ("red.async", dict(sem="relaxed", scope="cluster", space="shared::cluster", completion="mbarrier::complete_tx::bytes", op="inc", type="u32")),
        "red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.inc.u32",
        "red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.inc.u32 [$0], $1, [$2];",
        "r,r,r,~{memory}",
    ),
    (
        ("mapa", dict(space="shared::cluster", type="u32")),
        "mapa.shared::cluster.u32", "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r,~{memory}",
    ),
    (("mapa", dict(type="u64")), "mapa.u64", "mapa.u64 $0, $1, $2;", "=l,l,r,~{memory}"),
    (("nanosleep", {}), "nanosleep.u32", "nanosleep.u32 $0;", "r,~{memory}"),
    (
        ("griddepcontrol.launch_dependents", {}),
        "griddepcontrol.launch_dependents", "griddepcontrol.launch_dependents;", "~{memory}",
    ),
    (("griddepcontrol.wait", {}), "griddepcontrol.wait", "griddepcontrol.wait;", "~{memory}"),
    (("membar", dict(level="gl")), "membar.gl", "membar.gl;", "~{memory}"),
    (
        ("elect.sync", {}),
        "elect.sync",
        "{ .reg .pred %ptxops_p0; elect.sync $0|%ptxops_p0, $2; selp.u32 $1, 1, 0, %ptxops_p0; }",
        "=r,=r,r,~{memory}",
    ),
    (("prefetch", dict(space="global", level="L2::evict_last")), "prefetch.global.L2::evict_last", "prefetch.global.L2::evict_last [$0];", "l,~{memory}"),
    (("prefetch", dict(level="tensormap")), "prefetch.tensormap", "prefetch.tensormap [$0];", "l,~{memory}"),
    (("prefetchu", dict(level="L1")), "prefetchu.L1", "prefetchu.L1 [$0];", "l,~{memory}"),
    (
        ("cp.async.bulk.prefetch", dict(cache_hint="cache_hint")),
        "cp.async.bulk.prefetch.L2.global.L2::cache_hint",
        "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$0], $1, $2;",
        "l,r,l,~{memory}",
    ),
    (
        ("st.bulk", dict(sem="weak", space="shared::cta", target="sm_100a")),
        "st.bulk.weak.shared::cta", "st.bulk.weak.shared::cta [$0], $1, 0;", "r,l,~{memory}",
    ),
    (
        ("clusterlaunchcontrol.try_cancel", dict(space="shared::cta", target="sm_100a")),
        "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128",
        "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128 [$0], [$1];",
        "r,r,~{memory}",
    ),
    (
        ("clusterlaunchcontrol.query_cancel", dict(query="get_first_ctaid", target="sm_100a")),
        "clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128",
        "{ .reg .b128 %ptxops_response0; mov.b128 %ptxops_response0, {$4, $5}; "
        "clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128 {$0, $1, $2, $3}, %ptxops_response0; }",
        "=r,=r,=r,=r,l,l,~{memory}",
    ),
    (
        ("clusterlaunchcontrol.query_cancel", dict(query="is_canceled", target="sm_100a")),
        "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128",
        "{ .reg .pred %ptxops_p0; .reg .b128 %ptxops_response0; mov.b128 %ptxops_response0, {$1, $2}; "
        "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 %ptxops_p0, %ptxops_response0; "
        "selp.u32 $0, 1, 0, %ptxops_p0; }",
        "=r,l,l,~{memory}",
    ),
    (
        ("cp.async.bulk.tensor", dict(dim="3d", dst="shared::cluster", src="global", load_mode="im2col", completion="mbarrier::complete_tx::bytes", multicast="multicast::cluster", cache_hint="cache_hint")),
        "cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint",
        "cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint "
        "[$0], [$1, {$2, $3, $4}], [$5], {$6}, $7, $8;",
        "r,l,r,r,r,r,h,h,l,~{memory}",
    ),
    (
        ("cp.async.bulk.tensor", dict(dim="1d", dst="shared::cta", src="global", completion="mbarrier::complete_tx::bytes")),
        "cp.async.bulk.tensor.1d.shared::cta.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.tensor.1d.shared::cta.global.mbarrier::complete_tx::bytes [$0], [$1, {$2}], [$3];",
        "r,l,r,r,~{memory}",
    ),
    (
        ("cp.async.bulk.tensor", dict(dim="2d", dst="global", src="shared::cta", load_mode="tile", completion="bulk_group")),
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group",
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [$0, {$1, $2}], [$3];",
        "l,r,r,r,~{memory}",
    ),
    (
        ("cp.reduce.async.bulk.tensor", dict(dim="5d", op="max", load_mode="im2col_no_offs", cache_hint="cache_hint")),
        "cp.reduce.async.bulk.tensor.5d.global.shared::cta.max.im2col_no_offs.bulk_group.L2::cache_hint",
        "cp.reduce.async.bulk.tensor.5d.global.shared::cta.max.im2col_no_offs.bulk_group.L2::cache_hint "
        "[$0, {$1, $2, $3, $4, $5}], [$6], $7;",
        "l,r,r,r,r,r,r,l,~{memory}",
    ),
    (
        ("cp.async.bulk.prefetch.tensor", dict(dim="4d", load_mode="im2col")),
        "cp.async.bulk.prefetch.tensor.4d.L2.global.im2col",
        "cp.async.bulk.prefetch.tensor.4d.L2.global.im2col [$0, {$1, $2, $3, $4}], {$5, $6};",
        "l,r,r,r,r,h,h,~{memory}",
    ),
    (
        ("tensormap.replace", dict(field="box_dim", space="shared::cta", type="b32", target="sm_90a")),
        "tensormap.replace.tile.box_dim.shared::cta.b1024.b32",
        "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [$0], $1, $2;",
        "r,n,r,~{memory}",
    ),
    (
        ("tensormap.replace", dict(field="global_address", type="b64", target="sm_90a")),
        "tensormap.replace.tile.global_address.b1024.b64",
        "tensormap.replace.tile.global_address.b1024.b64 [$0], $1;",
        "l,l,~{memory}",
    ),
    (
        ("tensormap.replace", dict(field="elemtype", space="global", type="b32", target="sm_90a")),
        "tensormap.replace.tile.elemtype.global.b1024.b32",
        "tensormap.replace.tile.elemtype.global.b1024.b32 [$0], $1;",
        "l,n,~{memory}",
    ),
    (
        ("tensormap.cp_fenceproxy", dict(scope="cluster")),
        "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.cluster.sync.aligned",
        "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.cluster.sync.aligned [$0], [$1], 128;",
        "l,r,~{memory}",
    ),
    (
        ("multimem.cp.async.bulk", dict(cp_mask="cp_mask", target="sm_100a")),
        "multimem.cp.async.bulk.global.shared::cta.bulk_group.cp_mask",
        "multimem.cp.async.bulk.global.shared::cta.bulk_group.cp_mask [$0], [$1], $2, $3;",
        "l,r,r,h,~{memory}",
    ),
    (
        ("multimem.cp.reduce.async.bulk", dict(op="add", type="bf16")),
        "multimem.cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16",
        "multimem.cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [$0], [$1], $2;",
        "l,r,r,~{memory}",
    ),
]


@pytest.mark.parametrize(("call", "opcode", "template", "constraints"), GOLDEN, ids=[g[1] for g in GOLDEN])
def test_golden_rendering(call, opcode, template, constraints) -> None:
    family, qualifiers = call
    inst = spec.instruction(family, **qualifiers)
    assert inst.opcode == opcode
    assert inst.template == template
    assert inst.constraints == constraints


def test_effective_defaults_of_mbarrier_and_bulk_forms() -> None:
    assert spec.instruction("mbarrier.arrive", space="shared::cta").effective["sem"] == "release"
    wait = spec.instruction("mbarrier.try_wait", parity="parity", space="shared::cta")
    assert wait.effective["sem"] == "acquire" and wait.effective["scope"] == "cta"
    assert [o.role for o in wait.operands] == ["p", "a", "phase"]
    assert wait.statement == "mbarrier.try_wait.parity.shared::cta.b64 p, [a], phase;"
    bulk = spec.instruction(
        "cp.async.bulk", dst="shared::cta", src="global", completion="mbarrier::complete_tx::bytes"
    )
    assert [(o.role, o.bits) for o in bulk.operands] == [("dst", 32), ("src", 64), ("size", 32), ("mbar", 32)]
    assert bulk.statement.endswith("[dst], [src], size, [mbar];")


def test_instruction_carries_effective_defaults() -> None:
    inst = spec.instruction("atom", op="add", type="u32")
    assert inst.opcode == "atom.add.u32"
    assert inst.effective["sem"] == "relaxed" and inst.effective["scope"] == "gpu"
    assert inst.effective["space"] == "generic"
    assert spec.instruction("multimem.red", op="add", type="u32").effective["scope"] == "sys"
    assert spec.instruction("ld", type="b32").effective["sem"] == "weak"
    assert spec.instruction("fence", scope="gpu").effective["sem"] == "acq_rel"


# -- errors name the rule, the offending qualifiers, the legal values and the target -------------


def test_acc_f32_with_min_names_rule_legal_values_and_target() -> None:
    with pytest.raises(QualifierError) as info:
        spec.instruction("multimem.ld_reduce", op="min", acc="f32", vec=2, type="bf16x2", target="sm_90a")
    err = info.value
    text = str(err)
    assert err.rule == "acc-add-only" and "acc-add-only" in text
    assert "multimem.ld_reduce" in text and "sm_90a" in text
    assert "acc='f32'" in text
    assert err.legal["acc"] == [None] and err.legal["op"] == ["add"]
    assert isinstance(err, ValueError)


def test_fp8_on_hopper_names_the_target() -> None:
    with pytest.raises(QualifierError, match=r"fp8-target[\s\S]*sm_100a") as info:
        spec.instruction("multimem.ld_reduce", op="add", vec=4, type="e4m3x4", target="sm_90a")
    assert info.value.target == "sm_90a"
    assert "sm_90a" in str(info.value)
    assert "sm_100a" in info.value.legal["target"]


@pytest.mark.parametrize(
    ("family", "qualifiers", "rule"),
    [
        ("multimem.ld_reduce", dict(sem="weak", scope="sys", op="add", type="u32"), "scope-needs-order"),
        ("multimem.ld_reduce", dict(sem="relaxed", op="add", type="u32"), "order-needs-scope"),
        ("multimem.ld_reduce", dict(op="add", type="f16"), "vec-width-f16"),
        ("multimem.ld_reduce", dict(op="add", type="s64"), "op-add-types"),
        ("multimem.red", dict(op="min", type="f16x2"), "minmax-packed-needs-vec"),
        ("atom", dict(op="inc", type="u64"), "inc-types"),
        ("atom", dict(op="add", vec=2, space="shared::cta", type="f32"), "vector-global-only"),
        ("ld", dict(sem="mmio.relaxed", scope="gpu", type="u32"), "mmio-sys-scope"),
        ("ld", dict(sem="mmio.acquire", scope="sys", type="u32"), "mmio-needs-ptx-9.3"),
        ("ld", dict(vec=8, type="b32", target="sm_90a"), "v8-wide"),
        ("st", dict(sem="volatile", scope="gpu", type="u32"), "scope-needs-order"),
        ("ld", dict(sem="relaxed", scope="gpu", space="global", cache="cg", type="u32"), "cache-op-weak-only"),
        ("ld", dict(space="global", cache="cg", l1_eviction="evict_last", type="u32"), "cache-op-or-eviction"),
        ("ld", dict(space="global", l2_eviction="evict_last", type="u32", target="sm_100a"), "l2-eviction-256-bit"),
        ("ld", dict(space="shared", cache_hint="cache_hint", type="u32"), "cache-hint-global-only"),
        ("ld", dict(space="local", l1_eviction="evict_first", type="u32"), "eviction-global-only"),
        ("ld", dict(sem="volatile", space="local", type="u32"), "ordering-spaces"),
        ("ld", dict(nc="nc", type="u32"), "nc-global"),
        ("ld", dict(nc="nc", sem="weak", space="global", type="u32"), "nc-no-sem"),
        ("ld", dict(nc="nc", cache="lu", space="global", type="u32"), "nc-cache-ops"),
        ("st", dict(space="global", cache="wt", l2_eviction="evict_last", vec=8, type="b32", target="sm_100a"), "cache-op-or-l2-eviction"),
        ("st", dict(space="const", type="u32"), "st-no-const"),
        ("st", dict(space="param::entry", type="u32"), "st-param-func"),
        ("fence", dict(sem="sc"), "scope-required"),
        ("fence", dict(op_restrict="mbarrier_init", sem="release", scope="gpu"), "mbarrier-init"),
        ("cp.async.bulk", dict(dst="global", src="global", completion="bulk_group"), "global-source-to-shared"),
        ("cp.async.bulk", dict(dst="shared::cta", src="shared::cta", completion="mbarrier::complete_tx::bytes"), "shared-source-out"),
        ("cp.async.bulk", dict(dst="shared::cta", src="global", completion="bulk_group"), "shared-destination-completes-on-mbarrier"),
        ("cp.async.bulk", dict(dst="global", src="shared::cta", completion="mbarrier::complete_tx::bytes"), "global-destination-bulk-group"),
        ("mbarrier.init", dict(space="shared::cluster"), "init-local"),
        ("mbarrier.arrive", dict(sem="release", space="shared::cta"), "sem-needs-scope"),
        ("mbarrier.arrive", dict(scope="cluster", space="shared::cta"), "scope-needs-sem"),
        ("mbarrier.try_wait", dict(parity="parity", space="shared::cluster"), "wait-local"),
        ("cp.reduce.async.bulk", dict(dst="global", src="shared::cta", completion="bulk_group", op="add", type="s64"), "add-types-global"),
        ("cp.reduce.async.bulk", dict(dst="shared::cluster", src="shared::cta", completion="bulk_group", op="add", type="u32"), "shared-destination-completes-on-mbarrier"),
        ("st.async", dict(space="shared::cluster", type="b32"), "shared-cluster-completes-on-mbarrier"),
        ("st.async", dict(sem="release", scope="gpu", space="global", type="b32"), "release-target"),
        ("st.async", dict(space="shared::cta", completion="mbarrier::complete_tx::bytes", type="b32"), "no-own-shared-memory"),
        ("st.async", dict(completion="mbarrier::complete_tx::bytes", vec=4, type="b64"), "v4-32bit"),
        ("red.async", dict(sem="relaxed", scope="gpu", op="add", type="u32"), "relaxed-completes-on-mbarrier"),
        ("red.async", dict(sem="relaxed", scope="cluster", completion="mbarrier::complete_tx::bytes", op="max", type="b32"), "max-types"),
        ("red.async", dict(sem="release", scope="cluster", op="add", type="u32", target="sm_100a"), "release-scope"),
        ("prefetch", dict(space="const", level="L1"), "cache-spaces"),
        ("prefetch", dict(space="local", level="L2::evict_last"), "eviction-priority-global"),
        ("prefetch", dict(space="global", level="tensormap"), "tensormap-spaces"),
        ("prefetch", dict(space="param", level="tensormap"), "param-not-wrapped"),
        ("st.bulk", dict(target="sm_90a"), "target"),
        ("clusterlaunchcontrol.try_cancel", dict(target="sm_90a"), "target"),
        ("clusterlaunchcontrol.query_cancel", dict(query="is_canceled", target="sm_90a"), "target"),
        ("cp.async.bulk.tensor", dict(dim="2d", dst="shared::cta", src="global", load_mode="im2col", completion="mbarrier::complete_tx::bytes"), "im2col-3d-or-more"),
        ("cp.async.bulk.tensor", dict(dim="3d", dst="global", src="shared::cta", load_mode="im2col", completion="bulk_group"), "im2col-no-offs-stores"),
        ("cp.async.bulk.tensor", dict(dim="3d", dst="shared::cta", src="global", load_mode="im2col_no_offs", completion="mbarrier::complete_tx::bytes"), "im2col-loads"),
        ("cp.async.bulk.tensor", dict(dim="1d", dst="shared::cta", src="global", completion="mbarrier::complete_tx::bytes", multicast="multicast::cluster"), "multicast-into-cluster"),
        ("cp.async.bulk.tensor", dict(dim="1d", dst="shared::cluster", src="shared::cta", completion="mbarrier::complete_tx::bytes"), "shared-source-to-global"),
        ("cp.async.bulk.tensor", dict(dim="1d", dst="global", src="global", completion="bulk_group"), "global-source-to-shared"),
        ("cp.async.bulk.tensor", dict(dim="1d", dst="shared::cta", src="global", completion="bulk_group"), "shared-destination-completes-on-mbarrier"),
        ("cp.reduce.async.bulk.tensor", dict(dim="2d", op="add", load_mode="im2col_no_offs"), "im2col-3d-or-more"),
        ("cp.async.bulk.prefetch.tensor", dict(dim="1d", load_mode="im2col"), "im2col-3d-or-more"),
        ("tensormap.replace", dict(field="rank", type="b32"), "replace-target"),
        ("tensormap.replace", dict(field="global_stride", type="b32", target="sm_90a"), "wide-fields-b64"),
        ("tensormap.replace", dict(field="rank", type="b64", target="sm_90a"), "narrow-fields-b32"),
        ("tensormap.replace", dict(field="swizzle_atomicity", type="b32", target="sm_90a"), "swizzle-atomicity-target"),
        ("multimem.cp.async.bulk", dict(cp_mask="cp_mask", target="sm_90a"), "cp-mask-target"),
        ("multimem.cp.reduce.async.bulk", dict(op="add", type="s64"), "add-types"),
        ("multimem.cp.reduce.async.bulk", dict(op="min", type="f64"), "min-types"),
        ("multimem.cp.reduce.async.bulk", dict(op="inc", type="u64"), "inc-types"),
    ],
)
def test_each_rule_reports_itself(family: str, qualifiers: dict, rule: str) -> None:
    with pytest.raises(QualifierError) as info:
        spec.instruction(family, **qualifiers)
    assert info.value.rule == rule
    assert f"[{rule}]" in str(info.value)


def test_unknown_keys_and_misspelled_values_are_errors() -> None:
    with pytest.raises(QualifierError, match=r"unknown qualifier key\(s\) 'order'"):
        spec.instruction("ld", order="relaxed", type="u32")
    with pytest.raises(QualifierError, match=r"did you mean 'relaxed'"):
        spec.instruction("ld", sem="relax", scope="gpu", type="u32")
    with pytest.raises(QualifierError, match=r"needs op="):
        spec.instruction("atom", type="u32")
    with pytest.raises(QualifierError, match=r"unknown instruction family 'multimem.ld'"):
        spec.instruction("multimem.ld")
    with pytest.raises(QualifierError, match="acc"):
        spec.instruction("ld", acc=None, type="u32")


def test_const_local_and_param_spaces() -> None:
    """ld.const and ld.local are wrapped; .param is legal PTX that ptxops does not wrap, and
    the error says so, never that the PTX is illegal; stores to .const are illegal."""
    assert spec.instruction("ld", space="const", type="u32").opcode == "ld.const.u32"
    assert spec.instruction("st", space="local", cache="wt", type="u32").opcode == "st.local.wt.u32"
    for family in ("ld", "st"):
        with pytest.raises(QualifierError, match="legal PTX that ptxops does not wrap") as info:
            spec.instruction(family, space="param", type="u32")
        assert info.value.rule == "param-not-wrapped" and "not allowed" not in str(info.value)
    with pytest.raises(QualifierError, match="Stores to const memory are illegal"):
        spec.instruction("st", space="const", type="u32")


def test_vec_spellings() -> None:
    assert spec.instruction("ld", vec="v4", type="b32").opcode == "ld.v4.b32"
    assert spec.instruction("ld", vec=4, type="b32").opcode == "ld.v4.b32"


# -- properties of the rules ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(spec.FAMILIES))
def test_forms_are_legal_distinct_and_reproducible(name: str) -> None:
    for target in ("sm_90a", "sm_100a"):
        forms = list(spec.forms(name, target=target))
        opcodes = [f.opcode for f in forms]
        assert len(opcodes) == len(set(opcodes))
        assert spec.FAMILIES[name].count(target=target) == len(forms)
        for f in forms[:: max(1, len(forms) // 50)]:
            given = {k: v for k, v in f.qualifiers.items() if v is not None}
            assert spec.instruction(name, **given).opcode == f.opcode


@pytest.mark.parametrize("name", list(spec.FAMILIES))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_every_rejection_offers_a_legal_way_out(name: str, data) -> None:
    """Any form in the domain is legal, or its error lists values that make it legal."""
    family = spec.FAMILIES[name]
    q = {k: data.draw(st.sampled_from(family.domain(k)), label=k) for k in family.keys}
    try:
        family.check(q)
    except QualifierError as err:
        assert err.rule and err.target == q["target"]
        fixes = [(k, v) for k, vs in err.legal.items() for v in vs]
        assert fixes, str(err)
        k, v = fixes[0]
        fixed = {**q, k: v}
        assert family.broken(fixed) is None or family.broken(fixed)[0] is not family.broken(q)[0]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_count_agrees_with_enumeration_with_qualifiers_fixed(data) -> None:
    """``Family.count`` (the memoised walk ``python -m ptxops list`` uses) counts exactly the
    forms ``enumerate`` yields, whatever qualifiers are held fixed (legal or not).  Whole
    families are compared in the test above."""
    family = spec.FAMILIES[data.draw(st.sampled_from(list(spec.FAMILIES)), label="family")]
    keys = data.draw(st.sets(st.sampled_from(family.keys), min_size=1, max_size=3), label="fixed")
    fixed = {k: data.draw(st.sampled_from(family.domain(k)), label=k) for k in sorted(keys)}
    counted = family.count(**fixed)
    assume(counted <= 2000)  # keep the enumeration cheap
    assert counted == sum(1 for _ in family.enumerate(**fixed))


def test_fp8_forms_only_where_the_target_has_them() -> None:
    hopper = {f.opcode for f in spec.forms("multimem.ld_reduce", target="sm_90a")}
    blackwell = {f.opcode for f in spec.forms("multimem.ld_reduce", target="sm_100a")}
    assert hopper < blackwell
    assert all("e4m3" in o or "e5m2" in o for o in blackwell - hopper)


def test_forms_can_hold_qualifiers_fixed() -> None:
    forms = list(spec.forms("multimem.ld_reduce", target="sm_90a", op="add", acc="f32"))
    assert forms and all(".add.acc::f32." in f.opcode for f in forms)


def test_membar_levels_are_the_fence_sc_scopes() -> None:
    """membar.{cta,gl,sys} is fence.sc.{cta,gpu,sys} (PTX ISA): every level maps to a scope
    the fence family takes with sem=sc."""
    from ptxops.spec.membar import FENCE_SCOPE

    assert [f.qualifiers["level"] for f in spec.forms("membar") if f.qualifiers["proxy"] is None] == list(FENCE_SCOPE)
    for level, scope in FENCE_SCOPE.items():
        assert spec.instruction("fence", sem="sc", scope=scope).opcode == f"fence.sc.{scope}"
    with pytest.raises(QualifierError, match="legal values: .*'cta', 'gl', 'sys'"):
        spec.instruction("membar", level="gpu")
    with pytest.raises(QualifierError, match="level-needed"):
        spec.instruction("membar")


def test_membar_proxy_kinds_are_the_fence_proxy_kinds() -> None:
    """membar.proxy.kind is fence.proxy.kind: every kind the ISA lists is a bidirectional proxy
    fence; ptxas assembles membar.proxy.alias and (from 13.5 on) .async only, and the rule offers
    fence for the rest."""
    from ptxops.spec.membar import PROXY_KINDS

    for kind in PROXY_KINDS:
        assert spec.instruction("fence", proxy=kind).opcode == f"fence.proxy.{kind}"
    assert [f.opcode for f in spec.forms("membar") if f.qualifiers["proxy"]] == [
        "membar.proxy.alias", "membar.proxy.async"]
    with pytest.raises(QualifierError, match=r"proxy-kinds-ptxas[\s\S]*fence\(proxy=\.\.\.\)"):
        spec.instruction("membar", proxy="async.global")
    with pytest.raises(QualifierError, match="level-or-proxy"):
        spec.instruction("membar", level="gl", proxy="alias")


@pytest.mark.parametrize("name", ["st.bulk", "clusterlaunchcontrol.try_cancel", "clusterlaunchcontrol.query_cancel"])
def test_blackwell_families_exist_from_sm_100_only(name: str) -> None:
    for target in spec.TARGETS:
        has = next(spec.forms(name, target=target), None) is not None
        assert has == (target not in ("sm_90", "sm_90a")), (name, target)


@pytest.mark.parametrize(
    "name", ["cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor", "cp.async.bulk.prefetch.tensor"]
)
def test_tensor_operands_follow_the_qualifiers(name: str) -> None:
    """Every legal tensor form: one 32-bit coordinate per dimension inside the tensor map's
    brackets (five for the four rows of .tile::gather4/.tile::scatter4, of a 2-D tensor), im2col
    offsets (dimensions less two, 16-bit) exactly with .im2col, {wHalo, wOffset} (two 16-bit)
    exactly with .im2col::w and .im2col::w::128, a ctaMask exactly with .multicast::cluster, a
    cache policy exactly with .L2::cache_hint."""
    from ptxops.spec.tensor import ROWS, WIDE

    seen = set()
    for target in ("sm_90a", "sm_100a"):
        for inst in spec.forms(name, target=target):
            q, roles = inst.qualifiers, {o.role: o for o in inst.operands}
            seen.add(q["load_mode"])
            dims = int(str(q["dim"])[0])
            role, count = ("gather", 5) if q["load_mode"] in ROWS else ("coords", dims)
            assert q["load_mode"] not in ROWS or dims == 2
            assert (roles["tmap"].bits, roles[role].count, roles[role].bits) == (64, count, 32)
            coords = ", ".join(f"{role}{i}" for i in range(count)) if count > 1 else role
            assert f"[tmap, {{{coords}}}]" in inst.statement
            assert ("im2col" in roles) == (q["load_mode"] == "im2col")
            if "im2col" in roles:
                assert (roles["im2col"].count, roles["im2col"].bits) == (dims - 2, 16)
            assert ("wide" in roles) == (q["load_mode"] in WIDE)
            if "wide" in roles:
                assert (roles["wide"].count, roles["wide"].bits) == (2, 16) and "{wide0, wide1}" in inst.statement
            assert ("mask" in roles) == (q.get("multicast") is not None)
            assert ("policy" in roles) == (q["cache_hint"] is not None)
            assert ("mbar" in roles) == (q.get("dst", "global") != "global")
    assert seen == set(spec.family(name).domain("load_mode"))


def test_sm100_tma_forms_follow_ptxas_targets() -> None:
    """The sm_100 TMA additions on the targets ptxas 13.0 and 13.5 take them: CTA groups,
    scatter4 and im2col::w::128 on the sm_100 family only; gather4 and im2col::w into
    .shared::cta on sm_120a too."""
    def targets(name, **q):
        return [t for t in spec.TARGETS if any(True for _ in spec.forms(name, target=t, **q))]

    family = ["sm_100a", "sm_100f", "sm_103a"]
    assert targets("cp.async.bulk.tensor", cta_group="cta_group::2") == family
    assert targets("cp.async.bulk.tensor", load_mode="tile::scatter4") == family
    assert targets("cp.async.bulk.tensor", load_mode="im2col::w::128") == family
    assert targets("cp.async.bulk.tensor", load_mode="tile::gather4", dst="shared::cta") == [*family, "sm_120a"]
    assert targets("cp.async.bulk.tensor", load_mode="im2col::w", dst="shared::cluster") == family
    assert targets("cp.reduce.async.bulk.tensor", load_mode="tile::scatter4") == family
    assert targets("cp.async.bulk.prefetch.tensor", load_mode="tile::gather4") == family
    with pytest.raises(QualifierError, match="cta-group-loads"):
        spec.instruction("cp.async.bulk.tensor", dim="2d", dst="global", src="shared::cta",
                         completion="bulk_group", cta_group="cta_group::1", target="sm_100a")


def test_multimem_bulk_forms_need_ptx_isa_9_1() -> None:
    """The multimem bulk families are PTX ISA 9.1 (the oracle picks an assembler that reads
    it); every other family is 9.0, the system ptxas's."""
    newer = {n for n, f in spec.FAMILIES.items() if f.ptx_version != "9.0"}
    assert newer == {"multimem.cp.async.bulk", "multimem.cp.reduce.async.bulk"}
    assert all(spec.FAMILIES[n].ptx_version == "9.1" for n in newer)
