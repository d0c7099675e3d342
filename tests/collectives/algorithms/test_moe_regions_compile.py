"""The two-kernel combine's kernels (:mod:`collectives.algorithms.moe_send_back`,
:mod:`collectives.algorithms.moe_sum_back`) compile without a GPU (ptxas included), for every
world and word size, and their PTX orders what the protocol needs
(:class:`collectives.layouts.RegionLayout`): the sender's waits acquire at system scope before
any store to a peer, its ticket is an ``atom.acq_rel.sys`` after a ``bar.sync`` (every block's
stores before the last block's posts), each post is a relaxed ``facts`` store then an
``st.release.sys`` of the 64-bit ``arrived``; the receiver acquires each source's word at system
scope and a ``bar.sync`` stands between its waits and its first load of a row.  No multicast."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass")
from collectives.algorithms.moe_send_back import MoeSendBackKey  # noqa: E402
from collectives.algorithms.moe_sum_back import MoeSumBackKey  # noqa: E402
from collectives.runtime.kernels import kernel_ptx  # noqa: E402


def _lines(ptx: str, pattern: str) -> list[int]:
    return [i for i, line in enumerate(ptx.splitlines()) if re.search(pattern, line)]


@pytest.mark.parametrize(("world", "word"), [(2, 16), (4, 16), (8, 16), (3, 2), (4, 1)])
def test_the_sending_kernel_compiles_and_releases_after_its_ticket(world: int, word: int) -> None:
    ptx = kernel_ptx(MoeSendBackKey(world, word), "sm_90a")
    assert "multimem." not in ptx
    ticket = _lines(ptx, r"atom\.acq_rel\.sys\.global\.add\.u32")
    releases = _lines(ptx, r"st\.release\.sys\.global\.b64")
    facts = _lines(ptx, r"st\.relaxed\.sys\.global\.b64")
    acquires = _lines(ptx, r"ld\.acquire\.sys\.global\.b64")
    syncs = _lines(ptx, r"bar\.sync")
    assert len(ticket) == 1 and len(releases) == 2 and len(facts) == 1 and acquires  # post, refuse; the wait
    assert any(s < ticket[0] for s in syncs)  # the block's stores before its ticket
    assert min(releases + facts) > ticket[0] and max(facts) < max(releases)
    stores = _lines(ptx, r"st\.global\.(v4\.)?b(8|16|32)\b")  # the rows (and the tickets' reset)
    assert min(stores) > min(acquires)


@pytest.mark.parametrize(("world", "dtype", "topk", "vec"), [(2, "bf16", 8, 8), (4, "f32", 2, 1), (8, "f16", 4, 8)])
def test_the_receiving_kernel_compiles_and_waits_before_it_reads(world: int, dtype: str, topk: int, vec: int) -> None:
    ptx = kernel_ptx(MoeSumBackKey(world, dtype, topk, vec), "sm_90a")
    assert "multimem." not in ptx and "fma." not in ptx
    acquires = _lines(ptx, r"ld\.acquire\.sys\.global\.b64")
    rows = _lines(ptx, r"ld\.global\.(v4\.b32|b16|b32)\s")
    assert acquires and rows
    syncs = [s for s in _lines(ptx, r"bar\.sync") if s > max(acquires)]
    assert syncs and min(syncs) < min(r for r in rows if r > max(acquires))


def test_keys_check_their_world_and_threads() -> None:
    with pytest.raises(ValueError, match="world size"):
        MoeSendBackKey(9)
    with pytest.raises(ValueError, match="world size"):
        MoeSumBackKey(1, "bf16", 8)
    with pytest.raises(ValueError, match="dtypes"):
        MoeSumBackKey(2, "e4m3", 8)
    assert MoeSendBackKey(4).blocks(0) == 1 and MoeSumBackKey(4, "bf16", 8, 8).blocks(1, 7168) == 4
