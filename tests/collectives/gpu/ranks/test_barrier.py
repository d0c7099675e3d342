"""The barriers' call counts on real GPUs: a size mismatch that changes the grid, and the 2^32
wrap of the epochs (the model of both: tests/collectives/algorithms/test_barrier_model.py).

Run under torchrun on 2 or 4 GPUs (``bash .ci/gpu peer N`` runs it twice: as it is, and with
``COLLECTIVES_TEST_SEED_EPOCH`` set so that every call of the file runs near the wrap):
    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_barrier.py
Never launches a multimem kernel: NVLink multicast stays off (the context's backend is peer;
``multicast_emulated`` runs the multicast kernels with unicast accesses).
"""

from __future__ import annotations

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from tests.collectives.gpu.ranks.collectives_cases import backend, comm  # noqa: E402,F401  (the fixtures: both backends, the communicator)

#: One-shot f32: 2048 elements take one block, 2056 two (the issue's example).
ONE_BLOCK, TWO_BLOCKS = 2048, 2056


def call_and_check(comm, t: torch.Tensor, i: int, backend: str, algorithm: str) -> None:
    """All-reduce rank-dependent small integers (exact in f32) and check the sum."""
    import collectives

    scale = i % 7 + 1
    t.fill_(scale * (comm.rank + 1))
    collectives.all_reduce(t, algorithm=algorithm, backend=backend)
    collectives.synchronize()
    want = scale * comm.world * (comm.world + 1) // 2
    assert torch.all(t == want), (i, t.numel(), algorithm, t[:4].tolist())


def test_a_mismatch_that_changes_the_grid_then_1000_correct_calls(comm, backend: str) -> None:
    """Rank 0 brings 2048 elements (one block), the others 2056 (two): every rank raises a size
    mismatch (no timeout: the second block of the others stops on rank 0's first block's size),
    and the next 1,000 calls, of both sizes alike on every rank, are right."""
    import collectives

    t = torch.empty(TWO_BLOCKS, dtype=torch.float32, device="cuda")
    n = ONE_BLOCK if comm.rank == 0 else TWO_BLOCKS
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(t[:n], algorithm="one_shot", backend=backend)
        collectives.synchronize()
    for i in range(1000):
        call_and_check(comm, t[:(ONE_BLOCK, TWO_BLOCKS)[i % 2]], i, backend, "one_shot")


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot", "tma", "push"])
def test_calls_across_the_wrap_of_the_call_count(comm, backend: str, algorithm: str) -> None:
    """The call count seeded 3 calls below 2^32 (what COLLECTIVES_TEST_SEED_EPOCH does at
    start-up), then calls of several grids, a mismatch and barriers across the wrap."""
    import collectives
    from collectives.config import CALL_EPOCHS
    from collectives.layouts import PadLayout

    torch.cuda.current_stream().synchronize()
    comm.ctx.host_barrier()  # no rank's earlier signal is still on its way to our pad
    seed = (1 << 32) - 3 * CALL_EPOCHS
    comm._seed_epochs(seed)
    t = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    sizes = [ONE_BLOCK, TWO_BLOCKS, 1 << 20, ONE_BLOCK, 4096 * 3 + 8, TWO_BLOCKS]
    for i, n in enumerate(sizes):
        call_and_check(comm, t[:n], i, backend, algorithm)
        collectives.barrier(backend)
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(t[:ONE_BLOCK + 8 * comm.rank], algorithm=algorithm, backend=backend)
        collectives.synchronize()
    for i, n in enumerate(sizes):
        call_and_check(comm, t[:n], i, backend, algorithm)
    calls = int(comm.pad[PadLayout(world=comm.world).calls]) % (1 << 32)
    assert calls < seed, "the count did not wrap"
