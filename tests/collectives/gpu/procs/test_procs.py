"""The real init path with all ranks on one GPU: torchrun processes, ``collectives.init()``
(device chosen by default: GPU 0 where only one is visible, not ``LOCAL_RANK``) and NVSHMEM
with every PE on the same GPU; each collective once per algorithm and backend, exact, then a
clean close.  A smoke test (cross-process waits cost a time slice each: ~2 ms a barrier).

    CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/procs/test_procs.py
"""

from __future__ import annotations

import os

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world("it is the torchrun-processes path (bash .ci/gpu procs)")]
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def comm():
    pytest.importorskip("nvshmem.core")
    if "LOCAL_RANK" not in os.environ:
        pytest.skip("needs torchrun")
    import collectives
    from collectives.runtime.communicator import communicator

    ctx = collectives.init()  # no device=: one visible GPU means device 0 for every rank
    assert ctx.device == torch.cuda.current_device() < torch.cuda.device_count()
    assert ctx.backend == "peer" and not ctx.caps.multicast
    c = communicator()
    yield c
    torch.cuda.current_stream().synchronize()
    ctx.close()
    assert ctx.closed


@pytest.mark.parametrize("backend", ["peer", "multicast_emulated"])
def test_each_collective_once_per_algorithm(comm, backend: str) -> None:
    import collectives
    from collectives.algorithms.base import algorithms

    world, rank = comm.world, comm.rank
    n = 4096 * world
    for algorithm in algorithms("all_reduce"):
        t = collectives.empty(n, torch.float32)
        t.fill_(rank + 1)
        collectives.all_reduce(t, algorithm=algorithm, backend=backend)
        collectives.synchronize()
        assert torch.all(t == world * (world + 1) // 2), algorithm
    for algorithm in algorithms("reduce_scatter"):
        inp = collectives.empty(n, torch.float32)
        inp.fill_(rank + 1)
        out = torch.empty(n // world, dtype=torch.float32, device="cuda")
        collectives.reduce_scatter(out, inp, algorithm=algorithm, backend=backend)
        collectives.synchronize()
        assert torch.all(out == world * (world + 1) // 2), algorithm
    for algorithm in algorithms("all_gather"):
        out = collectives.empty(n, torch.float32)
        inp = torch.full((n // world,), float(rank), device="cuda")
        collectives.all_gather(out, inp, algorithm=algorithm, backend=backend)
        collectives.synchronize()
        assert torch.equal(out, torch.arange(world, device="cuda").repeat_interleave(n // world).float()), algorithm
    collectives.barrier(backend)
    collectives.synchronize()


@pytest.mark.parametrize("transport", ["nvlink", "nvshmem"])
def test_all_to_all_per_transport(comm, transport: str) -> None:
    """The all-to-all with both PEs on one GPU, bit for bit against the reference: random
    routings (staged and symmetric outputs, bf16 and e4m3, unaligned rows) over NVLink stores
    and over NVSHMEM put-with-signal (NVSHMEM's device bitcode: collectives/tools/devbitcode.sh)."""
    from tests.collectives.gpu.ranks.test_all_to_all import one_call, splits

    world, rank = comm.world, comm.rank
    for case, (hidden, dtype, symmetric_out) in enumerate([(3, "bf16", False), (128, "bf16", True),
                                                           (7168, "e4m3", False), (33, "e4m3", True)]):
        one_call(rank, world, None, splits(world, 300 + case, 7), hidden, dtype, case, symmetric_out=symmetric_out,
                 device_splits=bool(case % 2), transport=transport)
