"""Call counts, epochs and Lamport tags are unsigned: no kernel shifts, divides or orders them as
signed values (:mod:`collectives.tools.signed_scan` reads the PTX), and the Lamport size entry
``tag << 32 | elements`` matches its own call for every tag, across 2^31 and the wrap.

The bug this guards (found on one GPU): ``sizes_agree`` loaded the size entry through an
offset pointer, which CuTeDSL types as ``Int64``, so ``seen >> 32`` was ``shr.s64`` and every
call whose tag had bit 31 set (counts 2^31 - 1 ... 3 * 2^30 - 1) waited out its deadline."""

from __future__ import annotations

import pytest

from collectives.config import LAMPORT_CALLS
from collectives.layouts import lamport_next, lamport_tag
from collectives.tools.signed_scan import scan

LOADED = "ld.relaxed.sys.global.b64 %rd1, [%rd9];"


def _ptx(*body: str) -> str:
    return "\n".join(["{", LOADED, *body, "}"])


def test_the_scan_finds_an_arithmetic_shift_of_a_loaded_word() -> None:
    (finding,) = scan(_ptx("mov.b64 %rd2, %rd1;", "shr.s64 %rd3, %rd2, 32;", "setp.ne.b64 %p1, %rd3, %rd4;"))
    assert "shr.s64" in finding.text and LOADED in finding.origin


@pytest.mark.parametrize("op", ["div.s32 %r3, %r2, 3;", "rem.s32 %r3, %r2, 3;", "setp.lt.s32 %p1, %r2, %r5;",
                                "cvt.s64.s32 %rd3, %r2;", "mul.wide.s32 %rd3, %r2, 8;"])
def test_the_scan_finds_signed_division_remainder_order_and_extension(op: str) -> None:
    assert scan("\n".join(["ld.global.b32 %r1, [%rd9];", "add.s32 %r2, %r1, 1;", op]))


@pytest.mark.parametrize("body", [
    ["cvt.u32.u64 %r1, %rd1;", "sub.s32 %r2, %r1, %r7;", "setp.lt.s32 %p1, %r2, 0;"],  # wrap-safe difference
    ["cvt.u32.u64 %r1, %rd1;", "not.b32 %r2, %r7;", "add.s32 %r3, %r2, %r1;", "setp.lt.s32 %p1, %r3, 0;"],
    ["cvt.u32.u64 %r1, %rd1;", "and.b32 %r2, %r1, 1;", "shr.s32 %r3, %r2, 1;"],  # a parity
    ["shr.u64 %rd2, %rd1, 32;", "setp.lt.s64 %p1, %rd2, %rd5;"],  # a tag out of its entry: top bit clear
    ["shr.u64 %rd2, %rd1, 32;", "setp.ne.b64 %p1, %rd2, %rd5;"],
])
def test_the_scan_passes_differences_masks_and_logical_shifts(body: list[str]) -> None:
    assert scan(_ptx(*body)) == []


def test_a_plain_64_bit_load_is_an_address_not_a_word() -> None:
    assert scan("ld.global.b64 %rd1, [%rd9];\nsetp.lt.s64 %p1, %rd1, %rd2;") == []


@pytest.mark.parametrize(("collective", "backend", "dtype", "world"),
                         [("all_reduce", "peer", "bf16", 2), ("all_reduce", "multicast", "f32", 8),
                          ("reduce_scatter", "peer", "bf16", 4), ("all_gather", "multicast", "f32", 4)])
def test_lamport_kernels_compare_tags_unsigned(collective: str, backend: str, dtype: str, world: int) -> None:
    """Before the fix: ``shr.s64`` of the loaded entry, twice (the poll and the check after)."""
    pytest.importorskip("cutlass")
    from collectives.algorithms import KernelKey
    from collectives.runtime.kernels import kernel_ptx

    ptx = kernel_ptx(KernelKey(collective, "lamport", backend, dtype, world, threads=256))
    assert [str(f) for f in scan(ptx)] == []


@pytest.mark.parametrize("key", ["wait", "post"])
def test_stream_flag_kernels_count_unsigned(key: str) -> None:
    pytest.importorskip("cutlass")
    from collectives.runtime.kernels import kernel_ptx

    assert [str(f) for f in scan(kernel_ptx(key, "sm_90a"))] == []


# -- the tag model: the kernel's 64-bit compare, pure Python -------------------------------------

MASK64 = (1 << 64) - 1


def entry(call: int, elements: int) -> int:
    """The size entry a rank announces for Lamport call ``call``: ``tag << 32 | elements``."""
    return (lamport_tag(call) << 32 | elements) & MASK64


def shift_right(word: int, by: int, signed: bool) -> int:
    """``shr.s64`` (``signed``) or ``shr.u64`` of a 64-bit register, as an unsigned 64-bit value."""
    if signed and word >> 63:
        return ((word - (1 << 64)) >> by) & MASK64
    return word >> by


def tags_match(seen: int, mine: int, signed_seen: bool) -> bool:
    """The kernel's ``(seen >> 32) == (entry >> 32)``, the loaded word shifted as ``signed_seen``."""
    return shift_right(seen, 32, signed_seen) == shift_right(mine, 32, False)


#: Counts around every boundary a tag crosses: 2^31 (bit 31 of the tag, bit 63 of the entry),
#: the top of the count and its wrap to 0 (the tag stays below 2^32).
AROUND = [c % LAMPORT_CALLS for edge in ((1 << 31) - 1, LAMPORT_CALLS) for c in range(edge - 3, edge + 4)]


@pytest.mark.parametrize("call", AROUND)
def test_every_tag_matches_its_own_entry_and_no_neighbours(call: int) -> None:
    mine = entry(call, 512)
    assert tags_match(mine, mine, signed_seen=False)
    for other in (lamport_next(call), lamport_next(lamport_next(call))):
        assert not tags_match(entry(other, 512), mine, signed_seen=False)
    assert lamport_tag(call) < 1 << 32


def test_the_signed_shift_fails_exactly_from_tag_2_31() -> None:
    """The bug's model: with ``shr.s64`` the first failing count is 2^31 - 1 (tag 2^31), and
    every count up to the last (tag :data:`LAMPORT_CALLS` < 2^32) fails."""
    failing = [c for c in AROUND if not tags_match(entry(c, 8), entry(c, 8), signed_seen=True)]
    assert failing == [c for c in AROUND if lamport_tag(c) >= 1 << 31]
    assert (1 << 31) - 1 in failing and (1 << 31) - 2 not in failing and LAMPORT_CALLS - 1 in failing
