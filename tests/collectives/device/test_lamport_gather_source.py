"""The bit-exact Lamport all-gather (:class:`collectives.algorithms.lamport_blocks.GatherKernel`,
tagged 8-byte words) as its own source runs it, in the scaled-down world of
``test_lamport_source`` (4 threads, 4 parts on 2 blocks; slots of 128 bytes: 64 data bytes).
Every bit pattern arrives as sent: -0.0 (the other Lamport kernels' empty lane), NaNs with
payloads, all ones, at each element width (f32, bf16, fp8), in sizes that are not whole
16-byte vectors, over calls that cross the buffer rotation and the wrap of the call count,
between Lamport all-reduces and reduce-scatters of the same buffers, and after size mismatches.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tests.collectives.device.test_lamport_blocks_source import check, kernels  # noqa: E402
from tests.collectives.device.test_lamport_source import World  # noqa: E402

from collectives.algorithms import KernelKey  # noqa: E402
from collectives.config import LAMPORT_CALLS  # noqa: E402
from collectives.device.lamport import negative_zero  # noqa: E402

SLOT = 128
TIMEOUT = 30000  # ticks: element-by-element sends of 64 elements to 4 ranks outlast the default
#: Bit patterns each width must carry: -0.0, NaNs with payloads (quiet, signalling, negative),
#: all ones, +0.0, and the -0.0 of every narrower lane.
SPECIAL = {
    32: [0x80000000, 0x7FC12345, 0x7F800001, 0xFFA5A5A5, 0xFFFFFFFF, 0, 0x80008000, 0x80808080],
    16: [0x8000, 0x7FC1, 0x7F81, 0xFFA5, 0xFFFF, 0, 0x7E01, 0x8080],
    8: [0x80, 0x7F, 0xFF, 0xFE, 0x7E, 0],
}
DTYPE = {32: "f32", 16: "bf16", 8: "e4m3"}


def word(bits: int):
    """Rank ``r``'s element ``i`` of call ``c``: a special pattern, or an ordinary value."""
    special, mask = SPECIAL[bits], (1 << bits) - 1

    def element(c: int, r: int, i: int) -> int:
        k = c + 3 * r + i
        return special[k // 2 % len(special)] if k % 2 else (0x1357 * (c + 1) + 97 * r + i) & mask

    return element


def gather(bits: int, world: int, vector: int, edits: tuple = ()):
    """A simulated all-gather kernel of ``bits``-wide elements (``vector`` 1: data not 16-byte
    aligned, element by element; 0: whole aligned vectors)."""
    key = KernelKey("all_gather", "lamport", "peer", DTYPE[bits], world, threads=256, vector=vector)
    return kernels(edits)["all_gather"](key)


def exact(bits: int, world: int, sizes: list[int], vector: int, seed_call: int = 0, edits: tuple = (),
          seeds: range = range(2)) -> None:
    """Calls of ``sizes`` elements (one per call, equal on every rank): every output is the
    inputs bit for bit, nothing recorded."""
    calls = [(["all_gather"] * world, [n] * world) for n in sizes]
    for seed in seeds:
        check(World(world, calls, seed, kernels={"all_gather": gather(bits, world, vector, edits)}, word=word(bits),
                    slot=SLOT, timeout=TIMEOUT, seed_call=seed_call), set())


#: Per width, sizes (elements) of whole 16-byte vectors and of others (tails of every length).
ALIGNED = {32: [4, 16, 8], 16: [8, 32, 16], 8: [16, 64, 32]}
UNALIGNED = {32: [1, 3, 5, 15], 16: [1, 3, 9, 31], 8: [1, 5, 13, 63]}


@pytest.mark.parametrize("bits", [32, 16, 8])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_bit_arrives_across_the_rotation_and_the_wrap(bits: int, world: int) -> None:
    """Seven calls from three below the wrap: both formats' sizes, every buffer twice."""
    exact(bits, world, UNALIGNED[bits] + ALIGNED[bits][:3], 1, LAMPORT_CALLS - 3, seeds=range(1))
    exact(bits, world, ALIGNED[bits] * 2 + ALIGNED[bits][:1], 0, LAMPORT_CALLS - 3, seeds=range(1))


@pytest.mark.parametrize("bits", [32, 16, 8])
def test_a_tag_equal_to_an_empty_words_half_still_waits_for_the_data(bits: int) -> None:
    """Calls whose :func:`~collectives.layouts.lamport_tag` is the width's empty 32-bit half
    (-0.0 in every lane): the tag's low bit keeps an empty word from passing for a written one."""
    empty_tag_call = negative_zero(32, bits) - 1
    exact(bits, 2, [4 * 32 // bits] * 4, 0, empty_tag_call - 1)


def test_mixed_with_all_reduces_and_reduce_scatters_of_the_same_buffers() -> None:
    """f32 all-gathers (unaligned) between Lamport all-reduces and reduce-scatters over the
    same buffers and counts, at W = 3 across the wrap: every output right, no error (a
    receiver that left its tagged words would feed the next all-reduce garbage)."""
    classes = {**kernels(), "all_gather": gather(32, 3, 1)}
    order = ["all_gather", "all_reduce", "all_gather", "reduce_scatter", "all_gather", "all_gather", "all_reduce",
             "reduce_scatter", "all_reduce", "all_gather"]
    calls = [([c] * 3, [4 + 3 * (i % 3)] * 3) for i, c in enumerate(order)]
    for seed in range(2):
        check(World(3, calls, seed, kernels=classes, word=word(32), slot=SLOT, timeout=TIMEOUT, seed_call=LAMPORT_CALLS - 4), set())


@pytest.mark.parametrize("bits", [32, 8])
def test_aligned_and_unaligned_ranks_agree_on_the_words(bits: int) -> None:
    """Ranks whose tensors differ in alignment (one loads 8 bytes at once, the other element by
    element) exchange the same words: word ``k`` is bytes ``4k .. 4k + 3`` of the block."""
    ranks = [gather(bits, 3, vector) for vector in (0, 1, 0)]
    calls = [(["all_gather"] * 3, [n] * 3) for n in ALIGNED[bits] * 2]
    check(World(3, calls, 0, kernels={"all_gather": ranks}, word=word(bits), slot=SLOT, timeout=TIMEOUT), set())


def test_size_mismatches_then_exact_calls() -> None:
    """Call 1: rank 1 all-reduces where the others all-gather, the same count; call 3: the
    all-gathers' sizes differ; call 9: rank 2 all-gathers where the others all-reduce, with
    vectors in a part the all-reduce leaves out.  Each is a size mismatch on every rank; every
    other call, the buffers reused after the clean-up, is exact."""
    classes = {**kernels(), "all_gather": gather(32, 3, 1)}
    calls = [(["all_gather"] * 3, [5] * 3), (["all_gather", "all_reduce", "all_gather"], [8] * 3),
             (["all_gather"] * 3, [7] * 3), (["all_gather"] * 3, [3, 16, 3]), (["all_reduce"] * 3, [16] * 3),
             (["all_gather"] * 3, [16] * 3), (["all_gather"] * 3, [9] * 3), (["reduce_scatter"] * 3, [4] * 3),
             (["all_gather"] * 3, [11] * 3), (["all_reduce", "all_reduce", "all_gather"], [16] * 3),
             (["all_gather"] * 3, [16] * 3), (["all_reduce"] * 3, [16] * 3), (["all_gather"] * 3, [15] * 3)]
    for seed in range(2):  # (call 9: the all-gather's 16 elements reach part 1, the all-reduce's part 0 only)
        check(World(3, calls, seed, kernels=classes, word=word(32), slot=SLOT, timeout=TIMEOUT), {1, 3, 9})


def test_the_data_as_its_own_flag_loses_a_negative_zero() -> None:
    """The -0.0 format (the all-reduce's send and wait, :class:`~collectives.algorithms.lamport.LamportKernel`,
    storing slot ``q`` at block ``q``: the all-gather before the tagged words) fails the check."""
    source = kernels()
    old = type("OldGather", (source["all_reduce"],), {"code": 2, "deliver": _old_deliver})
    key = KernelKey("all_gather", "lamport", "peer", "f32", 2, threads=256)
    with pytest.raises(AssertionError):
        check(World(2, [(["all_gather"] * 2, [4] * 2)] * 2, 0, kernels={"all_gather": old(key)}, word=word(32),
                    slot=SLOT, timeout=TIMEOUT), set())


def _old_deliver(self, slots, out, stride) -> None:
    """The -0.0 all-gather's delivery: slot ``q``'s words to block ``q`` (as it was)."""
    from tests.collectives.device.test_lamport_source import FAKES

    for q in range(self.world):
        for i, w in enumerate(slots[q]):
            FAKES["ptxops"].st(_ptr(out + q * stride + 4 * i), w)


def _ptr(address):
    from tests.collectives.device.test_lamport_source import FAKES
    from tests.support.device_sim import _reach

    from collectives.device.signals import LOCAL

    return _reach(FAKES["cutlass"].cute.make_ptr(FAKES["cutlass"].Uint32, address), LOCAL)


MUTATIONS = {
    "the tag's low bit not set": ("(entry | Uint64(1 << 32)) & Uint64", "(entry | Uint64(0)) & Uint64"),
    "any word not empty taken for this call's": ("if (slots[q][0] & high) != tag or", "if (slots[q][0] & high) == Uint64(0) or"),
    "aligned data read 16 bytes a vector": ("lamport.load_words(data, src + v * 8,", "lamport.load_words(data, src + v * 16,"),
    "elements packed a byte apart": ("<< (8 * self.bytes * i))", "<< (8 * i))"),
    "a lone last word not sent": ("                    lamport.send(last, [a + at for a in addrs], data_mc, False)\n",
                                  "                    pass\n"),
    "the words not emptied": ("                    lamport.clear(slots[q], where[q], self.bits)\n",
                              "                    pass\n"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_fails(name: str) -> None:
    edits = (MUTATIONS[name],)
    with pytest.raises(AssertionError):
        _mutated(edits)


def _mutated(edits: tuple) -> None:
    """The checks above that a mutation of the kernel should fail."""
    for bits in (32, 16, 8):
        exact(bits, 2, UNALIGNED[bits], 1, negative_zero(32, bits) - 3, edits, seeds=range(1))
    exact(32, 2, ALIGNED[32], 0, 0, edits, seeds=range(1))
    classes = {**kernels(edits), "all_gather": gather(32, 3, 1, edits)}
    order = ["all_gather", "all_reduce", "all_gather", "reduce_scatter", "all_reduce", "all_gather", "all_reduce"]
    calls = [([c] * 3, [4 + 3 * (i % 3)] * 3) for i, c in enumerate(order)]
    check(World(3, calls, 0, kernels=classes, word=word(32), slot=SLOT, timeout=TIMEOUT), set())
