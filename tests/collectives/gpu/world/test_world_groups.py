"""Groups of a one-GPU world (:func:`collectives.testing.new_group`): tensor-parallel pairs
(ranks {0, 1}, {2, 3}, ...; an odd world's last rank in none), a data-parallel group of every
pair's first rank, and the whole world, their calls interleaved and each result checked
against :mod:`collectives.reference` (the world's counterpart of
``four_ranks/test_groups.py``, which compares with NCCL under torchrun on 4 GPUs).

Each test's first round makes every group's first call of its kernels in step, between
barriers of the whole world, one before each call and one after the round (a kernel's first
call loads it, and a load waits for every kernel on the GPU: see
:func:`~collectives.testing.new_group`); the rounds after it interleave freely.  (Without the
barrier after the round, a world of 6 or more lost every pair's first call of a new kernel: the
ranks outside the data-parallel group went on to their next pair call, whose kernels spun for
their partners, who were loading the data-parallel group's kernel of 3 ranks, and the load
waited for those kernels until their timeout.)

    COLLECTIVES_TEST_WORLD=4 CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 python -m pytest -q tests/collectives/gpu/world/test_world_groups.py
"""

from __future__ import annotations

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

torch = pytest.importorskip("torch")

from tests.collectives.gpu.ranks.collectives_cases import comm, device_values, values  # noqa: E402,F401
from tests.support.world_support import WORLD, rank_value  # noqa: E402

from collectives import reference  # noqa: E402
from collectives.config import LAMPORT_MAX_BYTES  # noqa: E402

pytestmark = [pytest.mark.multigpu,
              pytest.mark.skipif(WORLD < 4, reason="groups of a world's ranks: COLLECTIVES_TEST_WORLD=W, W >= 4 "
                                                   "(under torchrun: four_ranks/test_groups.py)")]

BYTES = {"f32": 4, "bf16": 2}


@pytest.fixture(scope="module")
def groups():
    """This rank's ``(world rank, pair, its members, dp group, its members)``: the contexts of
    its groups (None outside one) and their world ranks, every rank having asked for all."""
    def make():
        from collectives.runtime.communicator import communicator
        from collectives.testing import new_group

        base = communicator()
        paired = base.world // 2 * 2
        pairs = [[p, p + 1] for p in range(0, paired, 2)]
        made = [new_group(members) for members in pairs]
        dp_members = list(range(0, paired, 2))
        dp = new_group(dp_members)
        mine = next((i for i, g in enumerate(made) if g is not None), None)
        return (base.rank, made[mine] if mine is not None else None, pairs[mine] if mine is not None else [], dp,
                dp_members)

    return rank_value(make)


def _barrier() -> None:
    """Every rank of the world here, its work done (the base context's host barrier)."""
    import collectives

    collectives.synchronize()
    collectives.current().host_barrier()


def _inputs(members: list[int], salt: int, n: int, dtype: str) -> list:
    return [reference.round_to(values(r * 7 + salt, n), dtype) for r in members]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n", [7, 4096, 1 << 18])
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot", "push", "lamport"])
def test_all_reduce_on_pairs_the_dp_group_and_the_world_interleaved(comm, groups, algorithm, n, dtype) -> None:
    import collectives

    if algorithm == "lamport" and n * BYTES[dtype] > LAMPORT_MAX_BYTES:
        pytest.skip("over Lamport's size")
    rank, pair, pair_members, dp, dp_members = groups
    calls = [(pair, pair_members), (comm, list(range(comm.world))), (dp, dp_members)]
    for step in range(4):
        for k, (group, members) in enumerate(calls):
            if step == 0:
                _barrier()  # the first call of each group's kernel: in step
            if group is None:
                continue
            salt = 3 * step + k
            t = device_values(rank * 7 + salt, n, dtype)
            collectives.all_reduce(t, algorithm=algorithm, group=group)
            collectives.synchronize(group)
            want = reference.all_reduce(_inputs(members, salt, n, dtype), dtype)
            got = t.float().cpu().numpy()
            assert (got == want).all(), (step, k, members, int((got != want).argmax()))
        if step == 0:
            _barrier()  # ... and done before any rank's next pair call (its partner may be loading the dp kernel)


@pytest.mark.parametrize("n", [5, 4096])
def test_reduce_scatter_on_the_dp_group_and_all_gather_on_pairs(comm, groups, n) -> None:
    import collectives

    rank, pair, pair_members, dp, dp_members = groups
    for step in range(3):
        if step == 0:
            _barrier()
        if dp is not None:
            size = len(dp_members)
            t = device_values(rank * 7 + step, size * n, "f32")
            out = torch.empty(n, device="cuda")
            collectives.reduce_scatter(out, t, group=dp)
            collectives.synchronize(dp)
            want = reference.reduce_scatter(_inputs(dp_members, step, size * n, "f32"), "f32")[dp.rank]
            assert (out.cpu().numpy() == want).all(), step
        if step == 0:
            _barrier()
        if pair is not None:
            t = device_values(rank * 7 + step, n, "bf16")
            out = torch.empty(2 * n, dtype=torch.bfloat16, device="cuda")
            collectives.all_gather(out, t, group=pair)
            collectives.synchronize(pair)
            want = reference.all_gather(_inputs(pair_members, step, n, "bf16"))
            assert (out.float().cpu().numpy() == want).all(), step
        if step == 0:
            _barrier()
