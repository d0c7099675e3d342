"""The MoE layer's local kernels compile without a GPU (ptxas included).

The combine's weighted sum: each dtype it takes, top-k 1 to 16, 16-byte vectors and single
elements; its PTX rounds every product and every sum on its own (``mul.rn.f32``,
``add.rn.f32``: no ``fma``, which would round once where torch rounds twice).  The dispatch's
placement: both layouts, every word size, 1 to 1024 segments.  The host picks their keys as
documented."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
from collectives import moe  # noqa: E402
from collectives.algorithms.moe_gather import MoeGatherKey  # noqa: E402
from collectives.algorithms.moe_pack import MoePackKey  # noqa: E402
from collectives.algorithms.moe_combine import MAX_TOPK, MoeCombineKey  # noqa: E402
from collectives.algorithms.moe_place import LOADS, MAX_BLOCKS, MAX_SEGMENTS, PLACE_BLOCKS, SMS  # noqa: E402
from collectives.algorithms.moe_place import MoePlaceKey  # noqa: E402
from collectives.algorithms.moe_route import BATCH, MAX_EXPERTS, SMEM_BYTES, MoeRouteKey  # noqa: E402
from collectives.runtime.kernels import kernel_ptx  # noqa: E402
from collectives.runtime.moe import combine_key as key_for  # noqa: E402
from collectives.runtime.moe import place_key, route_key  # noqa: E402
from ptxops import ptxas  # noqa: E402

FORMS = [("bf16", 8, 8), ("bf16", 1, 1), ("f16", 3, 8), ("f32", 16, 4), ("f32", 2, 1), ("bf16", 16, 8)]


def _count(ptx: str, op: str) -> int:
    return len(re.findall(rf"^\s*{re.escape(op)}\s", ptx, re.M))


@pytest.mark.parametrize(("dtype", "topk", "vec"), FORMS)
def test_kernel_rounds_each_product_and_sum_on_its_own(dtype: str, topk: int, vec: int) -> None:
    ptx = kernel_ptx(MoeCombineKey(dtype, topk, vec), "sm_90a")
    assert "fma." not in ptx
    assert _count(ptx, "mul.rn.f32") == topk * vec  # one per term and element
    assert _count(ptx, "add.rn.f32") == (topk - 1) * vec
    assert "multimem." not in ptx and ".sys" not in ptx  # one GPU's memory, no ordering
    if vec > 1:
        assert _count(ptx, "ld.global.v4.b32") == topk and _count(ptx, "st.global.v4.b32") == 1
    if dtype != "f32":  # widened exactly, rounded once to nearest even
        assert _count(ptx, f"cvt.f32.{dtype}") == topk * vec
        assert re.search(rf"cvt\.rn\.{dtype}(x2)?\.f32", ptx)


def test_host_picks_vectors_where_the_rows_allow_and_declines_what_it_cannot_round_as_torch() -> None:
    assert key_for(torch.bfloat16, 7168, 8) == MoeCombineKey("bf16", 8, 8)
    assert key_for(torch.bfloat16, 7170, 8) == MoeCombineKey("bf16", 8, 1)
    assert key_for(torch.float32, 128, 2) == MoeCombineKey("f32", 2, 4)
    assert key_for(torch.float8_e4m3fn, 7168, 8) is None  # torch's fp8 rounding is not PTX's saturating one
    assert key_for(torch.bfloat16, 7168, MAX_TOPK + 1) is None


def test_keys_reject_bad_choices_and_size_the_grid() -> None:
    with pytest.raises(ValueError, match="dtypes"):
        MoeCombineKey("e4m3", 8)
    with pytest.raises(ValueError, match="topk"):
        MoeCombineKey("bf16", 0)
    with pytest.raises(ValueError, match="vec"):
        MoeCombineKey("bf16", 8, 4)
    with pytest.raises(ValueError, match="threads"):
        MoeCombineKey("bf16", 8, threads=96)
    key = MoeCombineKey("bf16", 8, 8)
    assert key.blocks(0, 7168) == 1
    assert key.blocks(1, 7168) == 4  # 896 vectors over 256 threads
    assert key.blocks(4096, 7168) == 1024  # capped: the grid strides


PLACE_FORMS = [(2, 128, False, 16), (8, 32, True, 16), (4, 2, False, 4), (8, 128, True, 4), (2, 1, False, 1),
               (8, 128, False, 2), (1, 1024, True, 8)]
#: (element type bits, elements) of a word's load and store in the PTX.
WORD_ACCESS = {16: "v4.b32", 8: "v2.b32", 4: "b32", 2: "b16", 1: "b8"}


def _loads_before_stores(ptx: str, access: str) -> None:
    """A row's copy: ``LOADS`` loads of its words, all issued before the first of their stores."""
    ops = re.findall(rf"^\s*(?:@%p\d+\s+)?(ld|st)\.global\.{re.escape(access)}\s", ptx, re.M)
    assert " ".join(["ld"] * LOADS + ["st"]) in " ".join(ops), ops


@pytest.mark.parametrize(("world", "local", "exact", "word"), PLACE_FORMS)
def test_placement_compiles_and_moves_rows_in_its_words(world: int, local: int, exact: bool, word: int) -> None:
    ptx = kernel_ptx(MoePlaceKey(world, local, exact, word), "sm_90a")
    assert "multimem." not in ptx and ".sys" not in ptx and "atom." not in ptx  # one GPU, no ordering, no atomics
    access = WORD_ACCESS[word]
    _loads_before_stores(ptx, access)
    assert "bar.sync" in ptx  # the shared prefix sums before any row
    # the counts, into shared memory (no prefix step waits on a global load), each source's rows
    # (the sources' before a thread's: unrolled) and the entries the dispatch dropped before,
    # added to the dropped count
    assert _count(ptx, "ld.global.b64") == 2 + world
    assert "st.global.b8" in ptx  # the kept flags


def test_fp8_placement_moves_the_values_in_vectors_and_the_scale_apart() -> None:
    """fp8 rows (``scales``): the values still in 16-byte words (LOADS at a time: the compiler
    may issue a second copy of the batch's loads, and unroll the stores to the row's places),
    the scale's 4 bytes by a thread per header slot (its place from shared memory: the header
    read once, a thread a slot, not again for the scale), in one 4-byte load where the words are
    aligned to 4, else byte by byte."""
    plain, split = (kernel_ptx(MoePlaceKey(8, 32, False, 16, scales=s), "sm_90a") for s in (False, True))
    for ptx in (plain, split):
        assert _count(ptx, "ld.global.v4.b32") % LOADS == 0 and _count(ptx, "st.global.v4.b32") % LOADS == 0
        _loads_before_stores(ptx, "v4.b32")
        assert _count(ptx, "ld.global.b32") - (ptx is split) == 1  # the header's slot (and the scale)
    assert _count(plain, "ld.global.b8") == 0 and _count(split, "ld.global.b8") == 0
    assert _count(split, "st.global.b32") == _count(plain, "st.global.b32") + 1
    plain, split = (kernel_ptx(MoePlaceKey(8, 32, False, 2, scales=s), "sm_90a") for s in (False, True))
    assert _count(plain, "ld.global.b8") == 0 and _count(split, "ld.global.b8") == 4
    assert _count(split, "st.global.b8") == _count(plain, "st.global.b8") + 4


@pytest.mark.parametrize(("key", "blocks"), [
    (MoePlaceKey(4, 64, False, 16), PLACE_BLOCKS), (MoePlaceKey(4, 64, False, 16, scales=True), PLACE_BLOCKS),
    (MoePlaceKey(8, 32, True, 16), PLACE_BLOCKS), (MoeGatherKey(16), MAX_BLOCKS)], ids=str)
def test_the_grid_fits_the_sms_at_once(key, blocks: int) -> None:
    """The placement's and the gather's largest grids are resident at once on 132 SMs (``blocks //
    SMS`` blocks an SM by ptxas's register count, 64 Ki registers an SM): no block waits for
    another's SM (the placement's 792 blocks did: 60 registers a thread fit 4 blocks an SM)."""
    try:
        (usage,) = ptxas.resource_usage(kernel_ptx(key, "sm_90a"), "sm_90a")
    except ptxas.PtxasUnavailable as err:
        pytest.skip(str(err))
    assert usage.registers * key.threads * (blocks // SMS) <= 65536 and blocks % SMS == 0, usage


def test_host_picks_the_placement_key() -> None:
    assert place_key(8, 32, moe.wire(7168, 2, False, 8), False) == MoePlaceKey(8, 32, False, 16)
    fp8 = MoePlaceKey(8, 32, True, 16, scales=True)  # 7168 e4m3 values, the scale, the header, zeros to 7216
    assert place_key(8, 32, moe.wire(7168, 2, True, 8), True) == fp8
    assert place_key(2, 1, moe.wire(100, 2, True, 2), False) == MoePlaceKey(2, 1, False, 4, scales=True)
    assert place_key(2, 1, moe.wire(3, 2, False, 1), False) == MoePlaceKey(2, 1, False, 2)
    assert place_key(2, MAX_SEGMENTS, moe.wire(8, 2, False, 1), False) is None
    assert place_key(2, 4, moe.wire(0, 2, False, 1), False) is None
    with pytest.raises(ValueError, match="segments|experts"):
        MoePlaceKey(4, MAX_SEGMENTS)
    with pytest.raises(ValueError, match="word"):
        MoePlaceKey(2, 2, word=3)
    assert MoePlaceKey(2, 2).blocks(0) == 1 and MoePlaceKey(2, 2).blocks(5000) == PLACE_BLOCKS == 528


@pytest.mark.parametrize(("dtype", "vec"), [("bf16", 8), ("f16", 1), ("f32", 4)])
def test_fp8_packing_quantizes_as_torch_does(dtype: str, vec: int) -> None:
    """The fp8 rows' kernel: IEEE division (``div.rn.f32``: each value, and the scale by 448),
    a NaN-keeping largest magnitude (``max.NaN.f32``, as torch's ``amax``), e4m3 by
    ``cvt.rn.satfinite`` with torch's NaN past 464 (``0f43E80000``) where PTX saturates, no
    ``fma``; tokens read in 16-byte vectors where ``vec`` says, bytes stored ``vec`` at once; the
    largest magnitude by 5 butterfly shuffles (a warp of 32) and one shared-memory round of the
    warps' (two block barriers a token: the rows and magnitudes in, then done with them), the
    registers' pieces kept without spilling."""
    ptx = kernel_ptx(MoePackKey(dtype, vec), "sm_90a")
    conversions = _count(ptx, "cvt.rn.satfinite.e4m3x2.f32")  # a multiple of vec where the compiler unrolls
    assert conversions % vec == 0 and conversions >= vec
    assert _count(ptx, "div.rn.f32") == conversions + 1  # each value's, and the scale's
    assert "max.NaN.f32" in ptx and "0f43E80000" in ptx and "0f43E00000" in ptx  # 464, 448
    assert "fma." not in ptx and "multimem." not in ptx and ".sys" not in ptx
    if vec > 1:
        assert _count(ptx, "ld.global.v4.b32") >= 2  # the largest magnitude's pass and the values'
        assert _count(ptx, "st.global.v2.b32" if vec == 8 else "st.global.b32") >= 1
    assert _count(ptx, "st.global.b32") >= 1  # the scale
    assert _count(ptx, "st.global.b64") == 0 and _count(ptx, "ld.global.b64") >= 1  # the rows' slots: read
    assert _count(ptx, "st.shared.b64") == 1  # each entry's row found once (a thread each), not at each store
    assert _count(ptx, "shfl.sync.bfly.b32") == 5 and _count(ptx, "bar.sync") == 2
    assert "ld.local" not in ptx and "st.local" not in ptx


def test_rows_without_fp8_are_copied_in_vectors() -> None:
    """The sent rows without fp8: 16-byte loads of the token's row, ``LOADS`` of them in flight
    before their stores, each stored to the token's rows (each entry's row found once, into shared
    memory), no arithmetic on the values."""
    ptx = kernel_ptx(MoePackKey("bf16", 8, quantize=False), "sm_90a")
    _loads_before_stores(ptx, "v4.b32")
    assert _count(ptx, "ld.global.v4.b32") >= 1 and _count(ptx, "st.global.v4.b32") >= 1  # (unrolled as it likes)
    assert _count(ptx, "st.global.b64") == 0 and _count(ptx, "ld.global.b64") >= 1
    assert "cvt.rn" not in ptx and "div.rn" not in ptx
    assert _count(ptx, "st.shared.b64") == 1 and ".shared.v" not in ptx  # shared: each entry's row, found once
    assert _count(ptx, "bar.sync") == 2 and _count(ptx, "shfl.sync.bfly.b32") == 0  # (the copy: no largest magnitude)


@pytest.mark.parametrize("word", [16, 4, 1])
def test_gather_moves_rows_in_its_words_and_zeros_the_rest(word: int) -> None:
    """The combine's gather: a kept row's words loaded, ``LOADS`` of them before their stores,
    one GPU's memory, no ordering."""
    ptx = kernel_ptx(MoeGatherKey(word), "sm_90a")
    access = WORD_ACCESS[word]
    assert _count(ptx, f"ld.global.{access}") == LOADS + (word == 1)  # (word 1: the kept flag is a byte too)
    _loads_before_stores(ptx, access)
    assert "multimem." not in ptx and ".sys" not in ptx and "atom." not in ptx


@pytest.mark.parametrize("ids", ["i32", "i64"])
def test_routing_compiles_reads_its_ids_and_uses_no_atomics(ids: str) -> None:
    """The dispatch's routing: the ids loaded in their width (each pass's first round's, then the
    next round's during each round), its counts and chunks in shared memory, a round's entries
    ranked by one ``match.any.sync`` of the warp (their rows by one more and a ballot of their
    owners, the owners by one more: their token's lanes) (not compared one by one through shared
    memory)
    and its syncs the warp's (no block-wide barrier per round), four block barriers, the groups' counts of an expert
    loaded ``BATCH`` at once before their stores, no spills, no atomics (the order is the stable
    sort's whatever the scheduling), no 64-bit division, one GPU's memory, no ordering."""
    ptx = kernel_ptx(MoeRouteKey.for_experts(ids, 256, 8), "sm_90a")
    # a round's three (its expert's, its row's, its token's), in each pass (the compiler may peel rounds)
    matches = _count(ptx, "match.any.sync.b32")
    assert matches >= 6 and matches % 3 == 0 and _count(ptx, "popc.b32") >= 2 * matches // 3  # (ranks: popc)
    assert _count(ptx, "vote.sync.ballot.b32") == matches // 3  # (the row's owners)
    # the next round's id, and each pass's first, with their tokens' ids before the round (a loop)
    assert _count(ptx, f"ld.global.{'b32' if ids == 'i32' else 'b64'}") >= 2 + matches // 3
    assert ".shared" in ptx and _count(ptx, "bar.warp.sync") == 2 * matches // 3
    # four block barriers: the table zeroed, the counts in, the chunks' sums in, the starts in (the
    # experts' scan: shuffles up each warp's chunk of 32 bins, not a barrier a doubling step)
    assert _count(ptx, "bar.sync") == 4 and _count(ptx, "shfl.sync.up.b32") == 5
    shared = " ".join(re.findall(r"^\s*(ld|st)\.shared\.", ptx, re.M))
    assert " ".join(["ld"] * BATCH + ["st"]) in shared
    assert ".local" not in ptx and "local.u" not in ptx
    assert not re.search(r"^\s*(div|rem)\.[su]64", ptx, re.M)
    assert "multimem." not in ptx and ".sys" not in ptx and not re.search(r"^\s*(atom|red)\.", ptx, re.M)


def test_host_picks_the_routing_key() -> None:
    # 32 groups of 257 counts and 4 ranks' rows
    assert route_key(torch.int64, 256, 4) == MoeRouteKey("i64", 1024, experts=256, ranks=4)
    assert route_key(torch.int32, 200, 8) == MoeRouteKey("i32", 1024, experts=256, ranks=8)
    assert route_key(torch.int64, 257, 3) == MoeRouteKey("i64", 512, experts=512, ranks=4)
    assert route_key(torch.int64, MAX_EXPERTS, 8) == MoeRouteKey("i64", 256, experts=MAX_EXPERTS, ranks=8)
    assert route_key(torch.int64, MAX_EXPERTS + 1, 8) is None  # its counts would not fit shared memory
    for experts in (1, 3, 64, 256, 300, 1000, MAX_EXPERTS):
        for world in {1, min(experts, 2), min(experts, 8), experts}:
            key = route_key(torch.int64, experts, world)
            assert key.experts >= experts and key.ranks >= world and key.smem_bytes() <= SMEM_BYTES
    with pytest.raises(ValueError, match="shared memory"):
        MoeRouteKey("i64", 1024, experts=MAX_EXPERTS)
    with pytest.raises(ValueError, match="power of two"):
        MoeRouteKey("i64", experts=300)
    with pytest.raises(ValueError, match="lanes"):
        MoeRouteKey("i64", lanes=64)
    assert route_key(torch.int16, 256, 8) is None
    with pytest.raises(ValueError, match="ranks"):
        MoeRouteKey("i64", experts=4, ranks=8)
    with pytest.raises(ValueError, match="ids"):
        MoeRouteKey("i16")
