"""Multicast and unicast addresses of one buffer are virtual aliases, which the PTX memory model
treats as different proxies: an access through one is ordered before an access through the
other only with a ``fence.proxy.alias`` on the causality path between them (PTX ISA, memory
consistency model: "Proxies" and "Causality order", case 3 of proxy-preserved base causality
order).  These tests read the PTX of the multicast kernels (what ``python -m collectives ptx
... --backend multicast`` prints) and check that a ``fence.proxy.alias`` stands between every
multicast data access and every unicast data access that a barrier orders (either way round),
and between each barrier signal (``multimem.st``) and the poll of the same word (``ld.acquire``
through the unicast address).  No GPU: the kernels are compiled for sm_90a."""

from __future__ import annotations

import re

import pytest

from collectives.algorithms import KernelKey

pytest.importorskip("cutlass")
from collectives.runtime.kernels import kernel_ptx  # noqa: E402

SIGNAL = re.compile(r"^\s*multimem\.st\.release\.sys\.global\.b64\b")
POLL = re.compile(r"^\s*ld\.acquire\.sys\.global\.b64\b")
FENCE = re.compile(r"^\s*fence\.proxy\.alias\b")
#: Data accesses through a multicast address: reductions, stores, and (TMA) bulk stores to it.
MULTICAST = re.compile(r"^\s*(multimem\.ld_reduce|multimem\.st(?!\.release\.sys\.global\.b64)"
                       r"|cp\.async\.bulk\.global\.shared)")
#: Data accesses through a unicast address: weak loads and stores of data (not the 64-bit
#: address tables and pad words, nor the strong accesses to the pad and the error record).
UNICAST = re.compile(r"^\s*(ld|st)\.global(\.v[248])?\.(b8|b16|b32|u8|u16|u32|f16|f32|bf16)\b")

KEYS = [
    KernelKey("barrier", "one_shot", "multicast", "bf16", 2, threads=32),
    KernelKey("all_reduce", "one_shot", "multicast", "bf16", 2, stage_in=True),  # staged, ld_reduce
    KernelKey("all_reduce", "two_shot", "multicast", "f32", 4, stage_in=True, gather_out=True),
    KernelKey("all_reduce", "tma", "multicast", "bf16", 2, stage_in=True, gather_out=True),  # bulk stores
    KernelKey("reduce_scatter", "one_shot", "multicast", "bf16", 2, stage_in=True),
    KernelKey("all_gather", "one_shot", "multicast", "bf16", 2, gather_out=True),
    KernelKey("all_gather", "tma", "multicast", "bf16", 2, gather_out=True),
    KernelKey("all_reduce", "push", "multicast", "bf16", 2, stage_in=True),
]


def unfenced_pairs(ptx: str) -> list[tuple[str, str]]:
    """(first, second) lines of every pair lacking a ``fence.proxy.alias`` where the memory
    model needs one: a multicast and a unicast data access with a barrier signal between them
    (fenced before the signal, on the writer's side of the path, or after the poll that follows
    it, on the reader's), and a signal and the poll after it."""
    lines = [line.strip() for line in ptx.splitlines()]
    at = {name: [i for i, line in enumerate(lines) if pattern.match(line)]
          for name, pattern in (("fence", FENCE), ("signal", SIGNAL), ("poll", POLL))}

    def fenced(lo: int, hi: int) -> bool:
        return any(lo < f < hi for f in at["fence"])

    missing = []
    for s in at["signal"]:
        poll = min((p for p in at["poll"] if p > s), default=None)
        if poll is not None and not fenced(s, poll):
            missing.append((lines[s], lines[poll]))
    accesses = [(i, bool(MULTICAST.match(line))) for i, line in enumerate(lines)
                if MULTICAST.match(line) or UNICAST.match(line)]
    for i, first in accesses:
        for j, second in accesses:
            signal = next((s for s in at["signal"] if i < s < j), None)
            if first == second or signal is None:
                continue
            poll = max(p for p in at["poll"] + [signal] if p < j)
            if not fenced(i, signal) and not fenced(poll, j):
                missing.append((lines[i], lines[j]))
    return missing


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k.collective}-{k.algorithm}-{k.dtype}-{k.world}")
def test_an_alias_fence_stands_between_multicast_and_unicast_accesses(key: KernelKey) -> None:
    ptx = kernel_ptx(key, "sm_90a")
    assert any(SIGNAL.match(line) for line in ptx.splitlines()), "no multicast barrier signal"
    assert unfenced_pairs(ptx) == []


def test_the_check_sees_an_unfenced_pair() -> None:
    """The checker itself: a unicast store, a signal, a poll and a multicast load with no fence."""
    ptx = "\n".join(["\tst.global.v4.b32 [%rd1], {%r1, %r2, %r3, %r4};",
                     "\tmultimem.st.release.sys.global.b64 [%rd2], %rd3;",
                     "\tld.acquire.sys.global.b64 %rd4, [%rd5];",
                     "\tmultimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {%r5, %r6, %r7, %r8}, [%rd6];"])
    assert len(unfenced_pairs(ptx)) == 2
    fenced = ptx.replace("\tld.acquire", "\tfence.proxy.alias;\n\tld.acquire")
    assert len(unfenced_pairs(fenced)) == 1  # the data pair: the fence before the poll does not count
    assert unfenced_pairs(fenced.replace("\tmultimem.ld_reduce", "\tfence.proxy.alias;\n\tmultimem.ld_reduce")) == []
