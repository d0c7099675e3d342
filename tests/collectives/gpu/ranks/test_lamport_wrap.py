"""Lamport all-reduces across the wrap of the call count (seeded just below it with the
test-only COLLECTIVES_TEST_SEED_CALL), with a size mismatch on the way, on the peer and the
multicast_emulated backends (tests/collectives/algorithms/test_lamport_model.py is the model).

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_lamport_wrap.py
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.collectives.gpu.ranks.collectives_cases import device_values, values

from collectives import reference
from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from tests.collectives.gpu.world.test_world import pdl  # noqa: E402,F401 (the fixture: with and without PDL)
from tests.support.world_support import close_rank_context, fresh_communicator, rank_value  # noqa: E402


@pytest.fixture(scope="module")
def seeded():
    """A communicator whose Lamport counts start 4 calls below the wrap."""
    import os

    from collectives.algorithms.lamport import SEED_CALL_ENV
    from collectives.config import LAMPORT_CALLS

    os.environ[SEED_CALL_ENV] = str(LAMPORT_CALLS - 4)
    try:
        yield rank_value(fresh_communicator)
    finally:
        del os.environ[SEED_CALL_ENV]
    torch.cuda.current_stream().synchronize()
    close_rank_context()


@pytest.mark.parametrize("backend", ["peer", "multicast_emulated"])
def test_lamport_across_the_wrap_with_a_mismatch(seeded, backend: str, pdl: bool) -> None:
    import collectives

    comm = seeded
    for call in range(14):  # 4 below the wrap, then past it; every buffer phase twice
        if call == 5:  # a mismatch just after the wrap: the calls after it reuse its buffer
            t = torch.ones(512 + 8 * comm.rank, dtype=torch.bfloat16, device="cuda")
            with pytest.raises(collectives.CollectiveError, match="different sizes"):
                collectives.all_reduce(t, algorithm="lamport", backend=backend, group=comm)
                collectives.synchronize(group=comm)
            continue
        n = (4096, 520, 100_003)[call % 3]  # sizes past the mismatch's, where it left data
        t = device_values(comm.rank + call, n, "bf16")
        collectives.all_reduce(t, algorithm="lamport", backend=backend, group=comm)
        collectives.synchronize(group=comm)
        inputs = [reference.round_to(values(r + call, n), "bf16") for r in range(comm.world)]
        assert np.array_equal(t.float().cpu().numpy(), reference.all_reduce(inputs, "bf16")), (backend, call)
