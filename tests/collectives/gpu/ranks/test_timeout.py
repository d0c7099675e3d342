"""A rank that never arrives makes the others raise CollectiveTimeout within the bound.

Run on its own (it leaves the communicator broken):
    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_timeout.py
"""

from __future__ import annotations

import time

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")


def test_absent_rank_times_out_the_others() -> None:
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    comm.errors.timeout_s = 2.0
    absent = comm.world - 1
    collectives.barrier()  # everyone: the pad works
    collectives.synchronize()
    comm.ctx.host_barrier()
    if comm.rank != absent:
        start = time.monotonic()
        with pytest.raises(collectives.CollectiveTimeout) as info:
            collectives.barrier()
            collectives.synchronize()
        elapsed = time.monotonic() - start
        assert elapsed < comm.timeout_s + 5, elapsed
        assert absent in info.value.missing_ranks
        with pytest.raises(collectives.CollectiveTimeout):  # the communicator stays failed
            collectives.barrier()
    comm.ctx.host_barrier()
    collectives.current().close()
