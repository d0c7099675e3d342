"""Every all-to-all kernel form compiles without a GPU (ptxas included): each dtype, world size
2/4/8, staged and direct receive; its PTX holds the slots' release stores and acquire polls,
takes the size out of a slot word with an unsigned shift, moves 16-byte vectors, and holds no
multimem (an all-to-all is point to point: every backend runs it)."""

from __future__ import annotations

import re

import pytest

from collectives.dtypes import DTYPES

pytest.importorskip("cutlass")
from collectives.algorithms.all_to_all import MAX_BLOCKS, AllToAllKey  # noqa: E402
from collectives.runtime.kernels import kernel_ptx  # noqa: E402

FORMS = [(dtype, world, direct) for dtype in DTYPES for world in (2, 4, 8) for direct in (False, True)]


@pytest.mark.parametrize(("dtype", "world", "direct"), FORMS)
def test_kernel_compiles(dtype: str, world: int, direct: bool) -> None:
    key = AllToAllKey(dtype, world, direct=direct)
    ptx = kernel_ptx(key, "sm_90a")
    assert "multimem." not in ptx
    assert ptx.count("st.release.sys.global.b64") == 3  # ready, arrived, ready again when the receiver gives up
    assert "st.relaxed.sys.global.b64" in ptx  # the ready's offset, before its release
    assert ptx.count("ld.acquire.sys.global.b64") == 4  # each wait: its first poll and its loop
    assert re.search(r"shr\.u64\s+%rd\d+, %rd\d+, 32;", ptx)  # the size half, unsigned
    assert not re.search(r"shr\.s64\s+%rd\d+, %rd\d+, 32;", ptx)
    assert "atom.acq_rel.gpu.global.add.u32" in ptx  # the call's ticket (enter_call)
    assert f".reqntid {key.threads}," in ptx or f".maxntid {key.threads}," in ptx
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx


def test_a_direct_receive_copies_nothing_out() -> None:
    """Three copies (own chunk, send, copy out of the staging buffer) against two."""
    staged, direct = (kernel_ptx(AllToAllKey("bf16", 4, direct=d), "sm_90a") for d in (False, True))
    assert 2 * staged.count("ld.global.v4.b32") == 3 * direct.count("ld.global.v4.b32")


def test_keys_reject_bad_choices() -> None:
    with pytest.raises(ValueError, match="world size"):
        AllToAllKey("bf16", 9)
    with pytest.raises(ValueError, match="parts must be 1..16 for world 8"):
        AllToAllKey("bf16", 8, parts=MAX_BLOCKS // 8 + 1)
    with pytest.raises(ValueError, match="parts"):
        AllToAllKey("bf16", 2, parts=0)
    with pytest.raises(ValueError, match="threads"):
        AllToAllKey("bf16", 2, threads=96)
    with pytest.raises(ValueError, match="dtype"):
        AllToAllKey("f64", 2)
