"""The hierarchical collectives on 4 GPUs split into 2 forced "nodes" of 2 (our kernels inside
each pair, NCCL across), checked against flat NCCL over all 4.

Run: ``COLLECTIVES_NODE_SIZE=2 torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/four_ranks/test_hierarchical.py``
(``bash .ci/gpu four_ranks 4``).  NVLink multicast stays off (switches forced below).
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world(
    "it compares with NCCL over torch.distributed process groups; the ranks here are threads")]

torch = pytest.importorskip("torch")
if os.environ.get("WORLD_SIZE") != "4" or os.environ.get("COLLECTIVES_NODE_SIZE") != "2":
    pytest.skip("needs COLLECTIVES_NODE_SIZE=2 torchrun --nproc-per-node 4", allow_module_level=True)
pytest.importorskip("nvshmem.core")

from collectives.symmetric.capability import force_multicast_off  # noqa: E402

force_multicast_off()

import torch.distributed as dist  # noqa: E402
from tests.support.gpu_support import small_ints  # noqa: E402

import collectives  # noqa: E402
from collectives import hierarchical  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402

RANK = int(os.environ["RANK"])
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@pytest.fixture(scope="module")
def node():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    ctx = collectives.init(device=local)  # the NVSHMEM job of this forced node: 2 ranks
    yield ctx
    torch.cuda.synchronize()
    ctx.close()


def test_the_node_is_the_symmetric_domain(node) -> None:
    assert node.world_size == 2 and node.rank == RANK % 2
    with pytest.raises(CollectiveError, match="spans nodes"):
        collectives.all_reduce(torch.ones(4, device="cuda"))
    lv = hierarchical.levels()
    assert (lv.intra.size, lv.inter.size) == (2, 2) and isinstance(lv.intra, hierarchical.KernelLevel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 12293, 1 << 22])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_all_reduce_matches_flat_nccl(node, dtype, n, op) -> None:
    for step in range(2):
        t = small_ints(n, RANK + step, dtype)
        want = t.clone()
        dist.all_reduce(want, op=OPS[op])
        hierarchical.all_reduce(t, op)
        collectives.synchronize(node)
        assert torch.equal(t, want), (n, (t != want).nonzero()[:4])


@pytest.mark.parametrize("m", [1, 999, 1 << 20])
def test_reduce_scatter_and_all_gather_match_flat_nccl(node, m) -> None:
    inp = small_ints(4 * m, RANK, torch.bfloat16)
    out, want = torch.empty(m, dtype=torch.bfloat16, device="cuda"), torch.empty(m, dtype=torch.bfloat16, device="cuda")
    hierarchical.reduce_scatter(out, inp)
    dist.reduce_scatter_tensor(want, inp)
    gathered, whole = (torch.empty(4 * m, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    hierarchical.all_gather(gathered, want)
    dist.all_gather_into_tensor(whole, want)
    collectives.synchronize(node)
    assert torch.equal(out, want)
    assert torch.equal(gathered, whole)
