"""Ranks that pass a Lamport all-reduce different sizes get a clear error at once (not a hang,
not a timeout), and the next call empties the Lamport buffers and works.

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_lamport_mismatch.py
"""

from __future__ import annotations

import time

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")


def test_lamport_size_mismatch_raises_and_the_communicator_recovers() -> None:
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    ok = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    collectives.all_reduce(ok, algorithm="lamport")
    collectives.synchronize()
    assert torch.all(ok == comm.world)
    start = time.monotonic()
    t = torch.ones(512 + 8 * comm.rank, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(t, algorithm="lamport")
        collectives.synchronize()
    assert time.monotonic() - start < comm.timeout_s / 2, "the mismatch was found by a timeout"
    for size in (4096, 512, 100_003):  # every buffer phase, sizes the mismatch left data past
        ok = torch.full((size,), comm.rank + 1.0, dtype=torch.bfloat16, device="cuda")
        collectives.all_reduce(ok, algorithm="lamport")
        collectives.synchronize()
        assert torch.all(ok == comm.world * (comm.world + 1) // 2), size
    comm.ctx.host_barrier()
    collectives.current().close()
