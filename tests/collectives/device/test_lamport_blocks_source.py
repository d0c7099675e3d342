"""The Lamport reduce-scatter and all-gather as their own source runs them (CPU, no CuTeDSL
compile): :mod:`collectives.algorithms.lamport_blocks` over the simulated all-reduce module of
``test_lamport_source`` (the same scaled-down world: 4 threads, 64-byte slots, 4 parts on 2
blocks).  Every call's output must be the reduce-scatter's or all-gather's of that call's
inputs; calls of the three collectives share the receive buffers and call counts; sizes that
differ, or ranks that call different collectives with the same count, fail as a size mismatch
on every rank, and the buffer is clean by its next use.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
from tests.collectives.device.test_lamport_source import FAKES, PARTS, World, combine  # noqa: E402
from tests.support.device_sim import load  # noqa: E402

from collectives.algorithms import REGISTRY  # noqa: E402
from collectives.layouts import RECOVERABLE_RECORD, SIZE_MISMATCH  # noqa: E402


def kernels(edits: tuple = ()) -> dict:
    """Each collective's simulated Lamport kernel class (``edits``: source edits of
    ``lamport_blocks``)."""
    signals = load("collectives.device.signals", FAKES)
    device_lamport = load("collectives.device.lamport", {**FAKES, "collectives.device.signals": signals})
    reduce = types.SimpleNamespace(convert=lambda values, dtype: values, combine=combine)
    device = types.SimpleNamespace(lamport=device_lamport, reduce=reduce, signals=signals)
    registered = dict(REGISTRY)  # the copies' classes register themselves: put the real ones back
    try:
        base = load("collectives.algorithms.lamport", {**FAKES, "collectives.device": device})
        base.LAMPORT_BLOCKS = PARTS  # the kernel reads its count of parts from its module
        blocks = load("collectives.algorithms.lamport_blocks",
                      {**FAKES, "collectives.device": device, "collectives.algorithms.lamport": base}, edits)
        return {"all_reduce": base.LamportKernel, **blocks.KERNELS}
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)


KERNELS = kernels()


def check(world: World, failed: set[int]) -> None:
    """Calls in ``failed`` are a size mismatch on every rank; every other call's output is right."""
    for r in range(world.world):
        assert world.records[r] == [(c, RECOVERABLE_RECORD, SIZE_MISMATCH) for c in sorted(failed)], world.records
        for c in range(len(world.calls)):
            if c not in failed:
                assert world.results[r][c] == world.expected(c, r), (r, c)


def mismatch_is_cleaned_up(collective: str, world: int, classes: dict) -> None:
    """Call 2's sizes differ (rank 1 brings 8 elements, the others 4); its buffer (2) is used
    again by call 5, after call 4 emptied it."""
    calls = [([collective] * world, sizes) for sizes in
             [[8] * world] * 2 + [[4 + 4 * (r == 1) for r in range(world)]] + [[8] * world] * 4]
    for seed in range(3):
        check(World(world, calls, seed, kernels=classes), {2})


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("world", [2, 3])
def test_agreeing_calls_are_right_and_a_mismatch_is_cleaned_up(collective: str, world: int) -> None:
    mismatch_is_cleaned_up(collective, world, KERNELS)


def test_the_three_collectives_share_buffers_and_counts() -> None:
    """All-reduce, reduce-scatter and all-gather calls in turn (each buffer reused by another
    collective, sizes changing): every output right, no error."""
    order = ["all_reduce", "reduce_scatter", "all_gather", "reduce_scatter", "all_reduce", "all_gather", "all_gather"]
    calls = [([c] * 3, [4 + 4 * (i % 2)] * 3) for i, c in enumerate(order)]
    for seed in range(3):
        check(World(3, calls, seed, kernels=KERNELS), set())


def test_different_collectives_of_one_count_are_a_size_mismatch() -> None:
    """Rank 1 calls an all-gather where the others reduce-scatter (call 1) or all-reduce (call 3),
    with the same count: a size mismatch on every rank (the size entries' collective codes), and
    the calls after it right."""
    calls = [(["reduce_scatter"] * 3, [4] * 3), (["reduce_scatter", "all_gather", "reduce_scatter"], [4] * 3),
             (["all_gather"] * 3, [8] * 3), (["all_reduce", "all_gather", "all_reduce"], [4] * 3),
             (["reduce_scatter"] * 3, [8] * 3), (["all_gather"] * 3, [4] * 3)]
    for seed in range(3):
        check(World(3, calls, seed, kernels=KERNELS), {1, 3})


MUTATIONS = {
    "scatter sends block 0 to every rank": ("src + Int64(q) * stride, None", "src, None"),
    "gather stores every slot at block 0": ("block_out = out + Int64(q) * nbytes", "block_out = out"),
    "scatter sends to rank 0 only": ("lamport.send(blocks[q], [addrs[q] + at]", "lamport.send(blocks[q], [addrs[0] + at]"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_mutation_fails(name: str) -> None:
    classes = kernels((MUTATIONS[name],))
    with pytest.raises(AssertionError):
        for collective in ("reduce_scatter", "all_gather"):
            mismatch_is_cleaned_up(collective, 2, classes)


def test_without_the_collective_code_different_collectives_pass_as_equal() -> None:
    classes = kernels((('CODES = {"reduce_scatter": 1, "all_gather": 2}', 'CODES = {"reduce_scatter": 0, "all_gather": 0}'),))
    calls = [(["reduce_scatter", "all_gather"], [4, 4])]
    with pytest.raises(AssertionError):
        check(World(2, calls, 0, kernels=classes), {0})
