"""A freed symmetric allocation takes its peer table and plans with it (issue 48, item 1), on GPUs:
allocations freed and made again, each all-reduced in place (zero-copy: the kernel reads every
rank's copy through the buffer's peer table) and checked.  Where a new allocation lands at a
freed one's local address while another rank's copy moved (a one-GPU world: the ranks share
torch's caching allocator, and a rank thread may take the block another just freed), a stale
table reads and writes the freed memory (the CPU reproduction:
``tests/collectives/runtime/test_freed_buffers.py``).

Run under torchrun on 2 or 4 GPUs (``bash .ci/gpu peer N``), or in a one-GPU world
(``bash .ci/gpu world W``):
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_freed_buffers.py
Never launches a multimem kernel: NVLink multicast stays off (the context's backend is peer).
"""

from __future__ import annotations

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from tests.collectives.gpu.ranks.collectives_cases import comm  # noqa: E402,F401  (the fixture)


@pytest.mark.parametrize("algorithm", ["two_shot", "tma"])  # (in place on a symmetric tensor: zero-copy)
def test_allocations_freed_and_made_again_reduce_right(comm, algorithm: str) -> None:
    import collectives

    want = comm.world * (comm.world + 1) // 2
    for i in range(40):
        n = (4096, 8192)[i % 2 if i < 20 else 0]  # sizes alternating, then one size again and again
        t = collectives.empty(n, torch.float32)
        t.fill_(comm.rank + 1)
        collectives.all_reduce(t, algorithm=algorithm, backend="peer")
        collectives.synchronize()
        assert bool((t == want).all()), (i, n, t[:4].tolist())
        comm.ctx.free(t)
