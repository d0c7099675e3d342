"""Staging growth on some ranks only (a caller's size mismatch) raises a clear CollectiveError
within the timeout and never pairs the group's collectives wrongly (CPU, two gloo processes,
the fake heap of tests/collectives/symmetric/test_symmetric_host.py)."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import CollectiveError, SymmetricMemoryError  # noqa: E402
from collectives.runtime.staging import STAGING_MIN_BYTES  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap  # noqa: E402
from collectives.symmetric.context import Context  # noqa: E402
from tests.collectives.symmetric.test_symmetric_host import FakeHeap as HostHeap  # noqa: E402
from tests.collectives.symmetric.test_symmetric_host import caps, on_ranks  # noqa: E402


def _growth(ctx, rank: int, out: list[str]) -> None:
    ctx.agree_bounded("grow", [3, 2, 1 << 21], 10.0)
    out.append("agreed")
    try:
        ctx.agree_bounded("grow", [4, 2, (1 << 21) << rank], 10.0)  # rank 1 needs more
        out.append("no error")
    except SymmetricMemoryError as e:
        out.append("disagree:" + str(e))
    start = time.monotonic()
    if rank == 0:  # only rank 0 grows: rank 1 never comes
        try:
            ctx.agree_bounded("grow", [5, 0, 1 << 22], 2.0)
            out.append("no error")
        except SymmetricMemoryError as e:
            out.append(f"missing:{time.monotonic() - start < 10}:" + str(e))
    a = ctx.empty(64, torch.float32)  # the group's collectives are still paired
    out.append(f"ok:{a.shape[0]}")
    ctx.close()


def test_ranks_that_disagree_on_growth_raise_and_stay_paired(tmp_path: os.PathLike[str]) -> None:
    results = on_ranks(_growth, 2, tmp_path)
    for rank in range(2):
        out = results[rank]
        assert out[0] == "agreed", out
        assert out[1].startswith("disagree:") and "[[4, 2, 2097152], [4, 2, 4194304]]" in out[1], out
        assert out[-1] == "ok:64", out
    assert results[0][2].startswith("missing:True:") and "ranks [1] did not arrive" in results[0][2], results[0]


def _refuse(what: str, values: list[int], timeout_s: float) -> None:
    raise SymmetricMemoryError(f"{what}: ranks [1] did not arrive within {timeout_s:g}s")


def test_growth_that_other_ranks_do_not_make_fails_the_communicator_before_any_collective_step() -> None:
    heap = FakeHeap(world_size=2)
    comm = FakeComm(heap)
    comm.pool.get(STAGING_MIN_BYTES, 2)
    heap.agree_bounded, heap.log[:] = _refuse, []
    with pytest.raises(CollectiveError, match="grew on some ranks only"):
        comm.pool.get(4 * STAGING_MIN_BYTES, 2)
    assert not heap.log  # no agree_any, barrier, free or allocation was entered
    with pytest.raises(CollectiveError, match="grew on some ranks only"):
        comm.errors.check()  # lost: a rank that did not grow launched a kernel waiting for this one


def _second_context(ctx, rank: int, out: list[str]) -> None:
    """A context closed and another opened over the same ranks (as the GPU fixtures do): the
    second one's first agreement must not meet the first one's keys, and those are gone."""
    import torch.distributed as dist

    ctx.agree_bounded("first", [1, 2], 10.0)
    ctx.close()
    dist.barrier()  # both ranks have read the first call's keys
    store = dist.distributed_c10d._get_default_store()
    left = [k for k in [f"collectives/agree/[0, 1]/0/0/{r}" for r in range(2)] + ["collectives/agree/[0, 1]/0/0/read"]
            if store.check([k])]
    out.append(f"left:{left}")
    again = Context(heap=HostHeap(rank), group=None, rank=rank, world_size=2, device=0, caps=caps(False, 2),
                    backend="peer")
    if rank == 0:  # rank 1 never makes this agreement
        start = time.monotonic()
        try:
            again.agree_bounded("second", [1, 2], 2.0)
            out.append(f"agreed alone in {time.monotonic() - start:.2f}s")
        except SymmetricMemoryError as e:
            out.append("missing:" + str(e))
    out.append(f"ok:{again.empty(64, torch.float32).shape[0]}")  # still paired
    again.close()


def test_a_second_context_over_the_same_ranks_does_not_meet_the_first_ones_keys(tmp_path) -> None:
    results = on_ranks(_second_context, 2, tmp_path)
    for rank in range(2):
        assert results[rank][0] == "left:[]", results[rank]
        assert results[rank][-1] == "ok:64", results[rank]
    assert results[0][1].startswith("missing:") and "ranks [1] did not arrive" in results[0][1], results[0]
