"""Sub-group communicators on 4 GPUs (peer backend): two TP groups of 2 and one over all 4, in
one process each, interleaved, checked against NCCL on the same groups.

Run: ``torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/four_ranks/test_groups.py`` (``bash .ci/gpu four_ranks 4``).
NVLink multicast stays off: the switches are forced below and no sub-group has a multicast object.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world(
    "sub-groups are torch.distributed process groups over processes; the ranks here are threads")]

torch = pytest.importorskip("torch")
if os.environ.get("WORLD_SIZE") != "4":
    pytest.skip("needs torchrun --nproc-per-node 4", allow_module_level=True)
pytest.importorskip("nvshmem.core")

from collectives.symmetric.capability import force_multicast_off  # noqa: E402

force_multicast_off()

import torch.distributed as dist  # noqa: E402
from tests.support.gpu_support import small_ints  # noqa: E402

import collectives  # noqa: E402
from collectives.errors import CollectiveError, MulticastUnavailable  # noqa: E402

RANK = int(os.environ["RANK"])


@pytest.fixture(scope="module")
def groups():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    world = collectives.init(device=local)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    odd = dist.new_group([1, 3])
    tp = collectives.init(group=pairs[RANK // 2])
    yield world, tp, pairs[RANK // 2], odd
    torch.cuda.synchronize()
    world.close()


def test_contexts_per_group(groups) -> None:
    world, tp, pair, odd = groups
    assert (tp.rank, tp.world_size, tp.backend) == (RANK % 2, 2, "peer")
    assert collectives.init(group=pair) is tp and world.world_size == 4
    with pytest.raises(MulticastUnavailable):
        collectives.init(group=pair, backend="multicast")
    if RANK % 2 == 0:
        with pytest.raises(CollectiveError, match="not a member"):
            collectives.init(group=odd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [7, 4096, 1 << 20])
@pytest.mark.parametrize("algorithm", ["auto", "one_shot", "two_shot", "lamport", "push"])
def test_all_reduce_on_two_pairs_and_the_world_interleaved(groups, dtype, n, algorithm) -> None:
    _, _, pair, _ = groups
    if algorithm == "lamport" and n * torch.empty((), dtype=dtype).element_size() > (1 << 20):
        pytest.skip("over Lamport's size")
    for step in range(3):
        a, b = small_ints(n, RANK + step, dtype), small_ints(n, 3 * RANK + step, dtype)
        want_a, want_b = a.clone(), b.clone()
        dist.all_reduce(want_a, group=pair)
        dist.all_reduce(want_b)
        collectives.all_reduce(a, algorithm=algorithm, group=pair)
        collectives.all_reduce(b, algorithm=algorithm)
        collectives.synchronize(pair)
        collectives.synchronize()
        assert torch.equal(a, want_a), (step, (a != want_a).nonzero()[:4])
        assert torch.equal(b, want_b), (step, (b != want_b).nonzero()[:4])


@pytest.mark.parametrize("n", [5, 4096])
def test_reduce_scatter_and_all_gather_on_a_pair_with_its_own_symmetric_memory(groups, n) -> None:
    _, tp, pair, _ = groups
    inp = collectives.empty(2 * n, torch.float32, group=pair)
    assert tp.is_symmetric(inp) and not collectives.current().is_symmetric(inp)
    inp.copy_(small_ints(2 * n, RANK, torch.float32))
    out = torch.empty(n, device="cuda")
    want = torch.empty(n, device="cuda")
    dist.reduce_scatter_tensor(want, inp.clone(), group=pair)
    collectives.reduce_scatter(out, inp, group=pair)
    gathered = torch.empty(2 * n, device="cuda")
    collectives.all_gather(gathered, out, group=tp)
    collectives.synchronize(pair)
    assert torch.equal(out, want)
    whole = torch.empty(2 * n, device="cuda")
    dist.all_gather_into_tensor(whole, want, group=pair)
    assert torch.equal(gathered, whole)


def test_a_pair_tensor_in_a_world_collective_is_staged(groups) -> None:
    """A tensor of the pair's pool lies in the world heap, but is symmetric over the pair only:
    the world all-reduce must stage it, not read it in place on every rank."""
    n = 1 << 16
    t = collectives.empty(n, torch.float32, group=groups[2])
    t.copy_(small_ints(n, RANK, torch.float32))
    want = t.clone()
    dist.all_reduce(want)
    collectives.all_reduce(t, algorithm="two_shot")
    collectives.synchronize()
    assert torch.equal(t, want)


def test_barriers_of_overlapping_groups(groups) -> None:
    _, _, pair, odd = groups
    for _ in range(100):
        collectives.barrier(group=pair)
        collectives.barrier()
        if RANK % 2:
            collectives.barrier(group=odd)
    collectives.synchronize(pair)
    collectives.synchronize()
