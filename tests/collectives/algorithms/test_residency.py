"""Co-residency arithmetic of ranks sharing one GPU (pure Python): CUDA's occupancy rules for a
block, each rank's share of the grid, PDL successors counted, and a clear error (not a hang)
where a configuration cannot fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from collectives.algorithms.residency import (CoResidencyError, Occupancy, Residency, SmLimits, blocks_per_sm,
                                             free_sms, share)
from collectives.config import LAMPORT_BLOCKS

H100 = SmLimits(sms=132)


def key(threads: int = 512, pdl: bool = False, algorithm: str = "one_shot") -> SimpleNamespace:
    return SimpleNamespace(threads=threads, pdl=pdl, algorithm=algorithm, collective="all_reduce")


@pytest.mark.parametrize(("threads", "registers", "shared", "blocks"), [
    (512, 32, 0, 4),      # threads bound: 2048 / 512
    (512, 64, 0, 2),      # registers: 64 x 32 = 2048 per warp, 65536 / 2048 = 32 warps = 2 blocks
    (512, 128, 0, 1),     # the most a 512-thread block may take
    (512, None, 0, 1),    # unknown registers: assume the most
    (256, 40, 0, 6),      # 40 x 32 = 1280 per warp -> 51 warps -> 6 blocks of 8 warps
    (256, 41, 0, 5),      # 41 x 32 = 1312, rounded up to 1536 per warp -> 42 warps -> 5 blocks
    (32, 16, 0, 32),      # the barrier's one warp: the block limit
    (512, 32, 100 * 1024, 2),  # shared memory: 228 KB / 100 KB
    (512, 32, 300 * 1024, 0),  # does not fit at all
])
def test_blocks_per_sm_follows_cuda_occupancy(threads: int, registers: int | None, shared: int, blocks: int) -> None:
    assert blocks_per_sm(H100, threads, registers, shared) == blocks


def test_the_share_gives_each_spinning_block_an_sm_keeps_some_free_and_halves_for_pdl() -> None:
    assert free_sms(H100) == 16 and free_sms(SmLimits(sms=4)) == 1
    assert share(H100, 1, pdl=False) == 116
    assert share(H100, 4, pdl=False) == 29
    assert share(H100, 4, pdl=True) == 14
    assert share(H100, 8, pdl=True) == 7
    for sms in (8, 78, 114, 132, 148):
        limits = SmLimits(sms=sms)
        for ranks in range(1, 9):
            for pdl in (False, True):
                if ranks * (2 if pdl else 1) > sms - free_sms(limits):
                    continue
                taken = ranks * share(limits, ranks, pdl) * (2 if pdl else 1)
                # one SM per block: wherever the GPU puts them, free_sms SMs hold none
                assert taken <= sms - free_sms(limits)
                assert taken + ranks * (2 if pdl else 1) > sms - free_sms(limits)  # and no block to spare


def test_a_world_where_no_block_fits_is_refused() -> None:
    with pytest.raises(CoResidencyError, match="cannot each have one block"):
        share(SmLimits(sms=4), 8, pdl=False)
    with pytest.raises(CoResidencyError, match=r"\(x2: PDL successors\)"):
        share(SmLimits(sms=16), 8, pdl=True)


def test_lamport_runs_on_fewer_blocks_than_parts_in_every_world() -> None:
    """128 parts; even 2 ranks without PDL may have only 58 blocks on an H100 (at 3 x 44, all
    132 SMs taken, another rank's kernel did not start): its blocks run several parts each."""
    forty = Occupancy(registers=40)
    assert Residency(H100, 2).cap(key(256, algorithm="lamport"), forty) == 58 < LAMPORT_BLOCKS
    assert Residency(H100, 8).cap(key(256, algorithm="lamport"), forty) == 14
    assert Residency(H100, 4).cap(key(256, pdl=True, algorithm="lamport"), forty) == 14


def test_more_blocks_per_sm_do_not_enlarge_the_share() -> None:
    """The driver's blocks per SM (from the cubin) decide whether a block fits at all (registers
    and shared memory are the fallback); the share is one SM per block whatever they are."""
    assert Occupancy(per_sm=3, registers=128).blocks(H100, 512) == 3
    assert Occupancy(registers=128).blocks(H100, 512) == 1
    assert Residency(H100, 2).cap(key(), Occupancy(per_sm=6)) == Residency(H100, 2).cap(key(), Occupancy(per_sm=1)) == 58
    assert Residency(H100, 2).cap(key(pdl=True), Occupancy(per_sm=2)) == 29


def test_the_cap_of_a_block_that_does_not_fit_names_it() -> None:
    with pytest.raises(CoResidencyError, match="does not fit one SM"):
        Residency(H100, 2).cap(key(), Occupancy(registers=32, shared=300 * 1024))


def test_limits_are_read_from_device_properties() -> None:
    props = SimpleNamespace(multi_processor_count=78, max_threads_per_multi_processor=1536,
                            regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=100 * 1024)
    assert SmLimits.of(props) == SmLimits(sms=78, threads=1536, shared=100 * 1024)
    assert SmLimits.of(SimpleNamespace(multi_processor_count=132)) == H100


# -- every algorithm honours the share: the real API and plans on a fake communicator -----------

CALLS = {
    "all_reduce": [("one_shot", 1), ("two_shot", 1), ("tma", 1), ("push", 1), ("auto", 1)],
    "reduce_scatter": [("one_shot", 8), ("tma", 8), ("push", 8)],
    "all_gather": [("one_shot", 8), ("tma", 8)],
}


def _world_comm(monkeypatch, ranks: int | None, per_sm: int = 1):
    pytest.importorskip("torch")
    from tests.support.fake_comm import FakeComm, FakeHeap, install

    comm = FakeComm(FakeHeap(world_size=8))
    install(monkeypatch, comm, [False])
    if ranks is not None:
        comm.residency = Residency(SmLimits(sms=132), ranks)
        monkeypatch.setattr(comm, "_occupancy", lambda key: Occupancy(per_sm=per_sm))
    return comm


def _call_everything(comm) -> None:
    from tests.support.fake_comm import FakeTensor

    from collectives import api

    n, address = 1 << 22, iter(range(0x7F00_0000_0000, 0x7F10_0000_0000, 1 << 30))
    for collective, cases in CALLS.items():
        for algorithm, whole in cases:
            big, block = FakeTensor(next(address), n * whole), FakeTensor(next(address), n * whole // 8)
            if collective == "all_reduce":
                api.all_reduce(big, algorithm=algorithm, backend="peer")
            elif collective == "reduce_scatter":
                api.reduce_scatter(block, big, algorithm=algorithm, backend="peer")
            else:
                api.all_gather(big, block, algorithm=algorithm, backend="peer")


def test_every_algorithm_launches_within_the_rank_share(monkeypatch) -> None:
    """8 ranks on 132 SMs, 16 kept free, one SM per block, PDL: 7 blocks each.  Alone on the GPU
    the same calls take more (the test can fail)."""
    alone = _world_comm(monkeypatch, None)
    _call_everything(alone)
    assert max(blocks for _, blocks in alone.grids) > 7
    shared = _world_comm(monkeypatch, 8)
    _call_everything(shared)
    assert {key.algorithm for key, _ in shared.grids} >= {"one_shot", "two_shot", "tma", "push"}
    assert max(blocks for _, blocks in shared.grids) <= 7


def test_lamport_runs_its_parts_on_the_rank_share(monkeypatch) -> None:
    """Lamport honours the share like the others: 7 blocks for its 128 parts at 8 ranks."""
    from tests.support.fake_comm import FakeTensor

    from collectives import api

    comm = _world_comm(monkeypatch, 8)
    api.all_reduce(FakeTensor(0x7E00_0000_0000, 4096), algorithm="lamport", backend="peer")
    assert [b for k, b in comm.grids if k.algorithm == "lamport"] == [7]
    alone = _world_comm(monkeypatch, None)
    api.all_reduce(FakeTensor(0x7E10_0000_0000, 4096), algorithm="lamport", backend="peer")
    assert [b for k, b in alone.grids if k.algorithm == "lamport"] == [LAMPORT_BLOCKS]
    for world, expected in ((8, 7), (None, LAMPORT_BLOCKS)):  # the reduce-scatter and all-gather alike
        comm = _world_comm(monkeypatch, world)
        api.reduce_scatter(FakeTensor(0x7E20_0000_0000, 512), FakeTensor(0x7E30_0000_0000, 4096),
                           algorithm="lamport", backend="peer")
        api.all_gather(FakeTensor(0x7E40_0000_0000, 4096), FakeTensor(0x7E50_0000_0000, 512),
                       algorithm="lamport", backend="peer")
        assert [(k.collective, b) for k, b in comm.grids if k.algorithm == "lamport"] == [
            ("reduce_scatter", expected), ("all_gather", expected)]
    api.reduce_scatter(FakeTensor(0x7E60_0000_0000, 512), FakeTensor(0x7E70_0000_0000, 4096),
                       algorithm="lamport", backend="peer", max_blocks=3)  # a GEMM beside it keeps the rest
    assert comm.grids[-1][1] == 3


def test_setting_the_timeout_replans_so_the_kernels_take_the_new_bound(monkeypatch) -> None:
    """A plan's launch arguments hold the bound: setting ``timeout_s`` after a call must not
    leave the cached plan launching with the old one (found in a one-GPU world)."""
    from tests.support.fake_comm import FakeTensor

    from collectives import api

    comm = _world_comm(monkeypatch, None)
    t = FakeTensor(0x7D00_0000_0000, 4096)
    api.all_reduce(t, algorithm="one_shot", backend="peer")
    (plan,) = set(comm.plans._plans.values())  # (cached by its key and as the plan of its facts)
    assert int(comm.timeout_s * 1e9) in plan.args[0]
    comm.errors.timeout_s = 2.0
    api.all_reduce(t, algorithm="one_shot", backend="peer")
    (plan,) = set(comm.plans._plans.values())  # (cached by its key and as the plan of its facts)
    assert int(2e9) in plan.args[0]


def test_a_tma_block_is_bounded_by_its_pipelines_shared_memory() -> None:
    """CuTeDSL sizes shared memory at launch (the cubin declares none): the occupancy is asked
    with the TMA pipeline's budget, one block per SM, whatever its registers."""
    from collectives.algorithms import KernelKey
    from collectives.algorithms.residency import shared_bound
    from collectives.config import TMA_SMEM_BYTES

    tma = KernelKey("reduce_scatter", "tma", "peer", "bf16", 8)
    assert shared_bound(tma) == TMA_SMEM_BYTES + 1024
    assert Occupancy(registers=32, shared=shared_bound(tma)).blocks(H100, tma.threads) == 1
    one_shot = KernelKey("all_reduce", "one_shot", "peer", "bf16", 8)
    assert Occupancy(registers=32, shared=shared_bound(one_shot)).blocks(H100, one_shot.threads) == 4


def test_where_ranks_share_the_gpu_a_calls_first_plan_plans_the_barrier_of_a_rank_with_nothing_to_move(
        monkeypatch) -> None:
    """A rank with nothing to move launches a barrier instead of the call's kernel: in a world its
    kernel is planned (so loaded) with the first plan of a call, not at that rank's first empty
    call, when the others' kernels may already spin for it (a load waits for them)."""
    from tests.support.fake_comm import FakeTensor

    from collectives import api, config

    shared = _world_comm(monkeypatch, 2)
    api.all_reduce(FakeTensor(0x7C00_0000_0000, 4096), algorithm="one_shot", backend="peer")
    assert ("barrier", "peer", config.PDL) in shared.plans._plans
    alone = _world_comm(monkeypatch, None)
    api.all_reduce(FakeTensor(0x7C10_0000_0000, 4096), algorithm="one_shot", backend="peer")
    assert not any(k[0] == "barrier" for k in alone.plans._plans if isinstance(k, tuple))


@pytest.mark.parametrize("world", range(2, 9))
def test_the_all_to_all_grid_fits_each_ranks_share(world: int) -> None:
    """Where ranks share a GPU the all-to-all's grid (``world x parts`` blocks, every one
    spinning on a peer) stays within the rank's share, with one block per pair at least; PDL
    goes where its successors' room would leave less (8 ranks on an H100)."""
    pytest.importorskip("cutlass")
    from collectives import config
    from collectives.algorithms.all_to_all import default_parts, grid

    assert grid(world, None) == (default_parts(world), config.PDL)
    parts, pdl = grid(world, Residency(H100, world))
    assert 1 <= parts <= default_parts(world)
    assert world * parts <= share(H100, world, pdl)
    assert pdl == (config.PDL and share(H100, world, pdl=True) >= world)
    assert (world, pdl) != (8, True) or not config.PDL


def test_an_all_to_all_grid_that_cannot_fit_raises() -> None:
    pytest.importorskip("cutlass")
    from collectives.algorithms.all_to_all import grid

    small = SmLimits(sms=20)  # 2 kept free: 18 SMs, 2 each for 8 ranks without PDL
    with pytest.raises(CoResidencyError, match="one block per pair of ranks"):
        grid(8, Residency(small, 8))
    assert grid(2, Residency(small, 2)) == (2, True)  # 18 // (2 x 2) = 4 blocks: 2 parts each
