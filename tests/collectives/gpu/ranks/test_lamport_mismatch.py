"""Ranks that pass a Lamport all-reduce different sizes, an empty tensor where the others run
Lamport, tensors of different dtypes (Lamport kernels of different element widths), or a
barriered all-reduce on one rank where the others run Lamport, get a clear error at once (not a
hang, not a timeout), and the next calls empty the Lamport buffers and work.

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_lamport_mismatch.py
"""

from __future__ import annotations

import time

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")


def _sums_exactly(comm, size: int, dtype, algorithm: str = "lamport", *what) -> None:
    """An all-reduce of ``size`` elements (``rank + 1`` on each rank) by ``algorithm`` sums
    exactly on this rank (``what``: the assertion's context)."""
    import collectives

    ok = torch.full((size,), comm.rank + 1.0, dtype=dtype, device="cuda")
    collectives.all_reduce(ok, algorithm=algorithm)
    collectives.synchronize()
    assert torch.all(ok == comm.world * (comm.world + 1) // 2), (*what, dtype, size, algorithm)


def _lamport_buffers_of_both_widths(comm) -> None:
    """A Lamport all-reduce of bf16 and of f32 on every rank: both widths' buffers made."""
    import collectives

    for dtype in (torch.bfloat16, torch.float32):
        ok = torch.ones(4096, dtype=dtype, device="cuda")
        collectives.all_reduce(ok, algorithm="lamport")
        collectives.synchronize()
        assert torch.all(ok == comm.world)


def _raises_the_mismatch_at_once(comm, call) -> None:
    """``call()`` raises the recorded size mismatch, within half the timeout (not by one)."""
    import collectives

    start = time.monotonic()
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        call()
        collectives.synchronize()
    assert time.monotonic() - start < comm.timeout_s / 2, "the mismatch was found by a timeout"


def test_lamport_size_mismatch_raises_and_the_communicator_recovers() -> None:
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    ok = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    collectives.all_reduce(ok, algorithm="lamport")
    collectives.synchronize()
    assert torch.all(ok == comm.world)
    t = torch.ones(512 + 8 * comm.rank, dtype=torch.bfloat16, device="cuda")
    _raises_the_mismatch_at_once(comm, lambda: collectives.all_reduce(t, algorithm="lamport"))
    for size in (4096, 512, 100_003):  # every buffer phase, sizes the mismatch left data past
        _sums_exactly(comm, size, torch.bfloat16)
    comm.ctx.host_barrier()
    collectives.current().close()


def test_an_empty_rank_against_lamport_ranks_raises_on_every_rank_and_the_communicator_recovers() -> None:
    """Issue 48 item 4: one rank's tensor is empty where the others' ``auto`` picks Lamport (4096
    bf16 elements): the empty rank launches the barrier of size 0, and every rank raises the
    recorded size mismatch at once (not a fatal timeout); the call counts and the Lamport counts
    stayed in step, so the Lamport and one-shot calls after are exact."""
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    ok = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    collectives.all_reduce(ok)  # auto: Lamport (its buffers made on every rank)
    collectives.synchronize()
    for empty in (0, comm.world - 1):
        t = torch.ones(0 if comm.rank == empty else 4096, dtype=torch.bfloat16, device="cuda")
        _raises_the_mismatch_at_once(comm, lambda t=t: collectives.all_reduce(t))
        for size, algorithm in ((4096, "lamport"), (512, "lamport"), (4096, "one_shot"), (100_003, "lamport")):
            _sums_exactly(comm, size, torch.bfloat16, algorithm, empty)
    comm.ctx.host_barrier()
    collectives.current().close()


def test_lamport_kernels_of_different_widths_raise_on_every_rank_and_the_communicator_recovers() -> None:
    """Ranks of different dtypes (bf16 on rank 0, f32 on the others), each running Lamport: kernels
    of different element widths meet in one call, every rank raises the size mismatch at once (not
    a timeout), and each rank moved its count of the other width on as its peers' kernels did, so
    the Lamport calls of both widths after are exact."""
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    _lamport_buffers_of_both_widths(comm)
    t = torch.ones(4096, dtype=torch.bfloat16 if comm.rank == 0 else torch.float32, device="cuda")
    _raises_the_mismatch_at_once(comm, lambda: collectives.all_reduce(t, algorithm="lamport"))
    for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):
        for size in (4096, 512):
            _sums_exactly(comm, size, dtype)
    comm.ctx.host_barrier()
    collectives.current().close()


@pytest.mark.parametrize("barriered", ["one_shot", "two_shot", "push"])
def test_a_barriered_rank_against_lamport_ranks_raises_on_every_rank_and_the_lamport_counts_stay_equal(
        barriered: str) -> None:
    """Issue 48 item 4's gap: one rank runs a barriered all-reduce (``barriered``, on a tensor 16
    times larger: several blocks) where the others run Lamport (bf16, 4096 elements), first on rank
    0 and then on the last rank: every rank raises the recorded size mismatch at once (not a
    timeout), and the barriered rank's kernel moved its bf16 Lamport count on as its peers' Lamport
    kernels did (:func:`collectives.device.signals.lamport_missed_start`), so the Lamport calls of
    both widths after, and a one-shot call, are exact.

    Every buffer the calls use is made first on every rank: a buffer that one rank alone grows
    (the larger tensor's, where its peers run Lamport) is a collective allocation its peers never
    join, found on the host by the allocation agreement's timeout (a different error: not this
    device protocol's case)."""
    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    _lamport_buffers_of_both_widths(comm)
    big = torch.ones(16 * 4096, dtype=torch.bfloat16, device="cuda")  # the barriered kernel's buffers, every rank
    collectives.all_reduce(big, algorithm=barriered)
    collectives.synchronize()
    assert torch.all(big == comm.world)
    for odd in (0, comm.world - 1):
        mine = comm.rank == odd
        t = torch.ones(16 * 4096 if mine else 4096, dtype=torch.bfloat16, device="cuda")
        _raises_the_mismatch_at_once(
            comm, lambda t=t, mine=mine: collectives.all_reduce(t, algorithm=barriered if mine else "lamport"))
        for dtype, size, algorithm in ((torch.bfloat16, 4096, "lamport"), (torch.float32, 4096, "lamport"),
                                       (torch.bfloat16, 512, "lamport"), (torch.float32, 512, "lamport"),
                                       (torch.bfloat16, 4096, "one_shot"), (torch.bfloat16, 100_003, "lamport")):
            _sums_exactly(comm, size, dtype, algorithm, barriered, odd)
    comm.ctx.host_barrier()
    collectives.current().close()
