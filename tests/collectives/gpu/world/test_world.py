"""What the one-GPU world adds to the multi-rank suite (run under torchrun as well, except where
a test says it needs the world): Lamport calls whose tags cross 2^31 (the tag bug: every call
with bit 31 of its tag set timed out), the largest calls of every algorithm with all ranks'
grids on one GPU (co-residency), Lamport's fixed parts on fewer blocks where ranks share a GPU, and
the world's own host-side guarantees (module loading eager, a collective capture).

    COLLECTIVES_TEST_WORLD=4 CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 python -m pytest -q tests/collectives/gpu/world/test_world.py
    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/world/test_world.py
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")

from tests.collectives.gpu.ranks.collectives_cases import backend, device_values, values  # noqa: E402,F401
from tests.support.world_support import WORLD, close_rank_context, fresh_communicator, rank_value  # noqa: E402

from collectives import reference  # noqa: E402


@pytest.fixture(scope="module")
def lamport_at_2_31():
    """A communicator whose Lamport counts start 8 calls below 2^31 - 1 (the first count whose tag
    has bit 31 set)."""
    from collectives.algorithms.lamport import SEED_CALL_ENV

    os.environ[SEED_CALL_ENV] = str((1 << 31) - 1 - 8)
    try:
        yield rank_value(fresh_communicator)
    finally:
        del os.environ[SEED_CALL_ENV]
    close_rank_context()


@pytest.fixture(params=[True, False], ids=["pdl", "no_pdl"])
def pdl(request):
    """Kernels launched with programmatic dependent launch or not (set in the main thread, for
    every rank): without it a kernel's successor takes no room while it runs, so Lamport's fixed
    grid fits more ranks on one GPU."""
    from collectives import config

    before, config.PDL = config.PDL, request.param
    yield request.param
    config.PDL = before


def test_lamport_tags_across_2_31(lamport_at_2_31, backend: str, pdl: bool) -> None:
    """16 calls from count 2^31 - 9: the tags cross 2^31 at the 9th; every result exact."""
    import collectives

    comm = lamport_at_2_31
    for call in range(16):
        n = (4096, 520, 100_003)[call % 3]
        t = device_values(comm.rank + call, n, "bf16")
        collectives.all_reduce(t, algorithm="lamport", backend=backend, group=comm)
        collectives.synchronize(group=comm)
        inputs = [reference.round_to(values(r + call, n), "bf16") for r in range(comm.world)]
        assert np.array_equal(t.float().cpu().numpy(), reference.all_reduce(inputs, "bf16")), (backend, call)


@pytest.fixture(scope="module")
def comm():
    from collectives.runtime.communicator import communicator

    yield rank_value(communicator)
    close_rank_context()


@pytest.mark.parametrize(("collective", "algorithm"), [
    ("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_reduce", "tma"), ("all_reduce", "push"),
    ("reduce_scatter", "one_shot"), ("reduce_scatter", "tma"), ("reduce_scatter", "push"),
    ("all_gather", "one_shot"), ("all_gather", "tma"),
])
def test_the_largest_grids_of_every_algorithm_are_resident_together(comm, backend: str, collective: str,
                                                                       algorithm: str) -> None:
    """16 MB per rank: every algorithm at its largest grid (the share of the GPU), three calls
    back to back, exact (small integers)."""
    import collectives

    n = (16 << 20) // 4 // (4 * comm.world) * (4 * comm.world)  # each rank's block 16-byte aligned (TMA tiles)
    world = comm.world
    whole = collectives.empty(n, torch.float32)  # the symmetric tensor: every call reuses it
    block = torch.empty(n // world, dtype=torch.float32, device="cuda")
    for call in range(3):
        if collective == "all_reduce":
            whole.fill_(comm.rank + call)
            collectives.all_reduce(whole, algorithm=algorithm, backend=backend)
            collectives.synchronize()
            assert torch.all(whole == sum(r + call for r in range(world))), call
        elif collective == "reduce_scatter":
            whole.fill_(comm.rank + call)
            collectives.reduce_scatter(block, whole, algorithm=algorithm, backend=backend)
            collectives.synchronize()
            assert torch.all(block == sum(r + call for r in range(world))), call
        else:
            block.fill_(comm.rank + call)
            collectives.all_gather(whole, block, algorithm=algorithm, backend=backend)
            collectives.synchronize()
            want = torch.arange(world, device="cuda").repeat_interleave(n // world) + call
            assert torch.equal(whole, want.float()), call


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_lamport_runs_its_parts_on_fewer_blocks_where_ranks_share_a_gpu(comm, backend: str, dtype: str,
                                                                         pdl: bool, collective: str) -> None:
    """Lamport's 128 parts on the rank's share of the GPU (fewer blocks than parts in every
    world: each block runs several), sizes that fill every part and leave some empty, back to
    back, each input made by torch kernels just before the call; exact.  (With the grids of
    every rank on all the SMs, a rank's input kernels waited out the others' deadline.)  The
    reduce-scatter and all-gather (collectives.algorithms.lamport_blocks) run the same parts."""
    import collectives
    from collectives.algorithms import KernelKey
    from collectives.config import LAMPORT_BLOCKS

    world = comm.world
    key = KernelKey(collective, "lamport", backend, dtype, world, threads=256)
    blocks = key.impl.blocks(comm, key, 0)
    assert 1 <= blocks <= LAMPORT_BLOCKS
    if WORLD:
        assert blocks == min(LAMPORT_BLOCKS, comm.block_cap(key))
    for call, n in enumerate([1, 100, 4096, 3 * 4096 + 5, (1 << 19) // (2 if dtype == "bf16" else 4)] * 2):
        count = world * n if collective == "reduce_scatter" else n
        t = device_values(comm.rank + call, count, dtype)
        inputs = [reference.round_to(values(r + call, count), dtype) for r in range(world)]
        if collective == "all_reduce":
            collectives.all_reduce(t, algorithm="lamport", backend=backend)
            got, want = t, reference.all_reduce(inputs, dtype)
        elif collective == "reduce_scatter":
            got = torch.empty(n, dtype=t.dtype, device="cuda")
            collectives.reduce_scatter(got, t, algorithm="lamport", backend=backend)
            want = reference.reduce_scatter(inputs, dtype)[comm.rank]
        else:
            got = torch.empty(world * n, dtype=t.dtype, device="cuda")
            collectives.all_gather(got, t, algorithm="lamport", backend=backend)
            want = reference.all_gather(inputs)
        collectives.synchronize()
        assert np.array_equal(got.float().cpu().numpy(), want), (call, n, blocks)


#: Host barriers shared by the rank threads of a world, by name and world size.
_MEETINGS: dict[tuple[str, int], threading.Barrier] = {}


@pytest.mark.skipif(not WORLD, reason="the world's own guarantees (COLLECTIVES_TEST_WORLD=W)")
@pytest.mark.parametrize(("algorithm", "nbytes", "symmetric"), [("lamport", 1 << 19, False), ("one_shot", 16 << 20, True)])
def test_a_late_ranks_other_kernels_start_while_the_others_spin(comm, algorithm: str, nbytes: int,
                                                                 symmetric: bool) -> None:
    """Every rank but the last launches a collective at its full share and spins for the last,
    which only then launches a one-thread kernel of torch's: it starts at once (on an H100 at
    W = 4, with the grids on all 132 SMs, it waited out the others' deadline)."""
    import collectives

    meet = _MEETINGS.setdefault((algorithm, comm.world), threading.Barrier(comm.world))
    n = nbytes // 4
    t = collectives.empty(n, torch.float32) if symmetric else torch.empty(n, device="cuda")
    t.fill_(1.0)
    collectives.all_reduce(t, algorithm=algorithm)  # the warm-up: plans and loads
    collectives.synchronize()
    t.fill_(1.0)
    torch.cuda.current_stream().synchronize()
    meet.wait(timeout=60)
    late = comm.rank == comm.world - 1
    waited = 0.0
    if not late:
        collectives.all_reduce(t, algorithm=algorithm)
        meet.wait(timeout=60)
    else:
        meet.wait(timeout=60)
        time.sleep(0.05)  # the others' grids are spinning by now
        start = time.monotonic()
        torch.cuda._sleep(1000)
        done = torch.cuda.Event()
        done.record()
        while not done.query() and time.monotonic() - start < 5.0:
            time.sleep(0.001)
        waited = time.monotonic() - start
        collectives.all_reduce(t, algorithm=algorithm)
    collectives.synchronize()
    assert waited < 1.0, f"the late rank's kernel started after {waited:.3f}s"
    assert torch.equal(t, torch.full_like(t, comm.world))


@pytest.mark.skipif(not WORLD, reason="the world's own guarantees (COLLECTIVES_TEST_WORLD=W)")
def test_the_world_loads_modules_eagerly(comm) -> None:
    from cuda.bindings import driver

    err, mode = driver.cuModuleGetLoadingMode()
    assert err == driver.CUresult.CUDA_SUCCESS and mode == driver.CUmoduleLoadingMode.CU_MODULE_EAGER_LOADING


@pytest.mark.skipif(not WORLD, reason="the world's own guarantees (COLLECTIVES_TEST_WORLD=W)")
def test_a_capture_returns_once_every_rank_has_instantiated_its_graph(comm) -> None:
    """The last rank captures half a second after the others: their ``capture`` returns only
    once it has instantiated its graph, so that no rank replays (its kernel spinning for the
    others) while another instantiates (instantiation can wait for every running kernel)."""
    import time

    import collectives
    from collectives.testing import capture

    t = torch.ones(4096, device="cuda")
    collectives.all_reduce(t)  # the warm-up: plans and loads outside the capture
    collectives.synchronize()
    late = comm.rank == comm.world - 1
    if late:
        time.sleep(0.5)
    graph = torch.cuda.CUDAGraph()
    start = time.monotonic()
    with capture(graph):
        collectives.all_reduce(t)
    waited = time.monotonic() - start
    assert late or waited > 0.4, f"capture returned after {waited:.3f}s, before the late rank's"
    t.fill_(1.0)
    graph.replay()
    collectives.synchronize()
    assert torch.equal(t, torch.full_like(t, comm.world))
