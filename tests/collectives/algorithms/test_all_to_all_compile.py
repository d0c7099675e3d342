"""Every all-to-all kernel form compiles without a GPU (ptxas included): each dtype, world size
2/4/8, staged and direct receive; its PTX holds the slots' release stores and acquire polls,
takes the size out of a slot word with an unsigned shift, moves 16-byte vectors, and holds no
multimem (an all-to-all is point to point: every backend runs it)."""

from __future__ import annotations

import re

import pytest

from collectives.dtypes import DTYPES

pytest.importorskip("cutlass")
from collectives.algorithms.all_to_all import FAMILY, MAX_BLOCKS, AllToAllKey  # noqa: E402
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


def _loads_in_flight(ptx: str) -> int:
    """The most 16-byte loads in a row, with no store, barrier, return or label between them."""
    most = run = 0
    for line in ptx.splitlines():
        if "ld.global.v4.b32" in line:
            run += 1
            most = max(most, run)
        elif re.search(r"\bst\.|\bbar\.|\bret\b|^\$L", line.strip()):
            run = 0
    return most


def test_a_direct_receive_copies_nothing_out() -> None:
    """Three copies (own chunk, send, copy out of the staging buffer) against two: the staged
    kernel holds the direct one's loads and the copy-out's, whose COPY_OUT_UNROLL loads are in
    flight at once (the send's and own chunk's: UNROLL)."""
    from collectives.algorithms.all_to_all import COPY_OUT_UNROLL, UNROLL

    staged, direct = (kernel_ptx(AllToAllKey("bf16", 4, direct=d), "sm_90a") for d in (False, True))
    assert staged.count("ld.global.v4.b32") > direct.count("ld.global.v4.b32") + COPY_OUT_UNROLL
    assert _loads_in_flight(staged) == COPY_OUT_UNROLL > UNROLL == _loads_in_flight(direct)


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
    with pytest.raises(ValueError, match="transport must be one of nvlink, nvshmem, not 'rdma'"):
        AllToAllKey("bf16", 2, transport="rdma")
    with pytest.raises(ValueError, match="bounded all-to-all moves its chunks over the nvlink transport only"):
        AllToAllKey("bf16", 2, transport="nvshmem", bounded=True)


def test_the_transport_is_in_the_key_id() -> None:
    """An NVSHMEM key's id ends in /nvshmem and reads back; the NVLink key's id is the one
    recorded before the transports (the PTX-identity record's)."""
    from collectives.algorithms import key_of

    nvlink, nvshmem = (AllToAllKey("bf16", 4, 8, direct=True, transport=t) for t in ("nvlink", "nvshmem"))
    assert FAMILY.to_text(nvlink) == "all_to_all/push/peer/bf16/w4/p8/t256/d1"
    assert FAMILY.to_text(nvshmem) == "all_to_all/push/peer/bf16/w4/p8/t256/d1/nvshmem"
    assert key_of(FAMILY.to_text(nvshmem)) == nvshmem and key_of(FAMILY.to_text(nvlink)) == nvlink


@pytest.mark.parametrize("direct", [False, True])
def test_the_bounded_form_compiles_and_writes_the_rows_received(direct: bool) -> None:
    """A bounded key (its id ends in /bounded and reads back) compiles with the exact one's
    handshake (the same releases and polls, no multimem), and stores the rows each source sent
    into out_splits: one 64-bit store more per rank than the exact key's (the own chunk's and
    a sender's)."""
    from collectives.algorithms import key_of

    exact, bounded = (AllToAllKey("bf16", 4, 8, direct=direct, bounded=b) for b in (False, True))
    assert FAMILY.to_text(bounded) == FAMILY.to_text(exact) + "/bounded"
    assert key_of(FAMILY.to_text(bounded)) == bounded
    both = {key: kernel_ptx(key, "sm_90a") for key in (exact, bounded)}
    for ptx in both.values():
        assert "multimem." not in ptx
        assert ptx.count("st.release.sys.global.b64") == 3 and ptx.count("ld.acquire.sys.global.b64") == 4
    stores = {key: len(re.findall(r"st\.global\.(?:u64|b64|s64)\s", ptx)) for key, ptx in both.items()}
    assert stores[bounded] == stores[exact] + 2, stores


@pytest.mark.shard_weight(40)  # NVSHMEM's device library linked and assembled: about 20 s
def test_the_nvshmem_transport_compiles_and_links_without_a_gpu() -> None:
    """The all-to-all over NVSHMEM (collectives.algorithms.nvshmem_exchange) traces through
    ptxops.nvshmem, links NVSHMEM's bitcode for sm_90a and assembles: the part's block-scope
    put-with-signal and the signal updates are NVSHMEM's (defined in the PTX, none left
    external), the handshake's NVLink release stores are gone, and its waits are the same four
    bounded acquire polls."""
    pytest.importorskip("nvshmem.bindings.device.cute", reason="nvshmem4py is not installed: "
                                                               "pip install -e '.[nvshmem]'")
    ptx = kernel_ptx(AllToAllKey("bf16", 2, 16, transport="nvshmem"), "sm_90a")  # bf16 moves as Int16
    defined = set(re.findall(r"^\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M))
    external = set(re.findall(r"^\.extern\s+\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M))
    assert {"nvshmemx_int16_put_signal_block", "nvshmemx_signal_op"} <= defined, "NVSHMEM's bitcode not linked"
    assert not {f for f in external if "nvshmem" in f}, sorted(external)
    entry = ptx[ptx.index(".entry"):]
    entry = entry[:entry.index("\n}\n")]
    assert entry.count("st.release.sys.global.b64") == 0 and entry.count("ld.acquire.sys.global.b64") == 4
    assert "multimem." not in ptx
