"""Lamport all-reduces across the wrap of the call count (seeded just below it with the
test-only COLLECTIVES_TEST_SEED_CALL), with a size mismatch on the way, on the peer and the
multicast_emulated backends (tests/collectives/algorithms/test_lamport_model.py is the model);
then Lamport reduce-scatters and all-gathers mixed with all-reduces (one set of buffers and
counts) across the next wrap, with a mismatch of sizes and one of collectives.

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_lamport_wrap.py
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.collectives.gpu.ranks.collectives_cases import device_values, values

from collectives import reference
from collectives.config import LAMPORT_CALLS
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


def _lamport(collective: str, x: torch.Tensor, world: int, backend: str, comm) -> torch.Tensor:
    """``collective`` of ``x`` (Lamport); the tensor holding the result."""
    import collectives

    if collective == "all_reduce":
        collectives.all_reduce(x, algorithm="lamport", backend=backend, group=comm)
        return x
    if collective == "reduce_scatter":
        out = torch.empty(x.numel() // world, dtype=x.dtype, device="cuda")
        collectives.reduce_scatter(out, x, algorithm="lamport", backend=backend, group=comm)
        return out
    out = torch.empty(world * x.numel(), dtype=x.dtype, device="cuda")
    collectives.all_gather(out, x, algorithm="lamport", backend=backend, group=comm)
    return out


@pytest.mark.parametrize("backend", ["peer", "multicast_emulated"])
def test_lamport_collectives_mixed_across_the_wrap(seeded, backend: str) -> None:
    """Calls of the three collectives in turn up to and past the next wrap (the count seeded
    below it again); call 4: sizes differ, call 8: rank 0 all-gathers where the others
    reduce-scatter the same count; every other call right, none hung."""
    import collectives
    from collectives.algorithms.lamport import seed_counts

    comm, world = seeded, seeded.world
    seed_counts(comm, LAMPORT_CALLS - 4)  # every rank between two calls: nothing in flight
    for call in range(14):
        collective = ("reduce_scatter", "all_gather", "all_reduce")[call % 3]
        m = (4096, 520, 60_001)[call % 4 % 3]
        if call in (4, 8):
            kind = "reduce_scatter" if call == 4 or comm.rank else "all_gather"
            n = 512 + 8 * comm.rank if call == 4 else 512
            x = torch.ones(world * n if kind == "reduce_scatter" else n, dtype=torch.bfloat16, device="cuda")
            with pytest.raises(collectives.CollectiveError, match="different sizes"):
                _lamport(kind, x, world, backend, comm)
                collectives.synchronize(group=comm)
            continue
        count = world * m if collective == "reduce_scatter" else m
        got = _lamport(collective, device_values(comm.rank + call, count, "bf16"), world, backend, comm)
        collectives.synchronize(group=comm)
        inputs = [reference.round_to(values(r + call, count), "bf16") for r in range(world)]
        want = {"all_reduce": lambda: reference.all_reduce(inputs, "bf16"),
                "reduce_scatter": lambda: reference.reduce_scatter(inputs, "bf16")[comm.rank],
                "all_gather": lambda: reference.all_gather(inputs)}[collective]()
        assert np.array_equal(got.float().cpu().numpy(), want), (backend, call, collective)
