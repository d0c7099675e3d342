"""What the API checks on every call (pure Python, no GPU): the real API, plans and staging on
the fake communicator (:mod:`tests.support.fake_comm`), whose kernels record their launches.

A plan is cached by a key holding every caller tensor's address, dtype, shape, contiguity and
device, so a later call hits it only with tensors that passed the same checks; a rank with
nothing to move launches a barrier of size 0 and closes its call; unknown options are refused
at the API with CollectiveError."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from collectives import api  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

N = 1 << 16
_addresses = itertools.count(0x7F00_0000_0000, 1 << 32)


@pytest.fixture
def comm(monkeypatch) -> FakeComm:
    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    return comm


def on_device(t: FakeTensor, index: int) -> FakeTensor:
    t.device = type(t.device)(index=index, type="cuda")
    return t


def test_an_out_at_a_planned_address_is_checked_again(comm: FakeComm) -> None:
    """The issue's case: after ``del o`` the allocator hands a smaller (or other-dtype) tensor
    the same address; the planned kernel would write ``t.numel()`` elements into it."""
    t, at = FakeTensor(next(_addresses), N), next(_addresses)
    api.all_reduce(t, out=FakeTensor(at, N))
    launched = len(comm.launches)
    for other in (FakeTensor(at, 16), FakeTensor(at, N, torch.float32), on_device(FakeTensor(at, N), 1)):
        with pytest.raises(CollectiveError, match="out must be|tensor on"):
            api.all_reduce(t, out=other)
    assert [key.collective for key, _ in comm.launches[launched:]] == ["barrier"] * 3  # refused: its peers' meet
    api.all_reduce(t, out=FakeTensor(at, N))  # the same description: the plan again
    assert comm.launches[-1][0].collective == "all_reduce" and len(comm.launches) == launched + 4


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_a_block_collectives_tensors_are_checked_again(comm: FakeComm, collective: str) -> None:
    """A tensor on another GPU at a planned address is refused (the device is in the key)."""
    out_n, inp_n = (N, 2 * N) if collective == "reduce_scatter" else (2 * N, N)
    out_at, inp_at = next(_addresses), next(_addresses)
    fn = getattr(api, collective)
    fn(FakeTensor(out_at, out_n), FakeTensor(inp_at, inp_n))
    launched = len(comm.launches)
    with pytest.raises(CollectiveError, match="tensor on"):
        fn(FakeTensor(out_at, out_n), on_device(FakeTensor(inp_at, inp_n), 1))
    assert [key.collective for key, _ in comm.launches[launched:]] == ["barrier"]  # only the refusal's


def test_an_empty_call_launches_a_barrier_and_closes_the_call(comm: FakeComm, monkeypatch) -> None:
    """A rank whose tensor is empty keeps in step with its peers (a barrier of size 0, which
    meets their kernels' start barriers and names the different sizes) and raises what the
    call deferred."""
    finished = []
    monkeypatch.setattr(comm.errors, "finish", lambda: finished.append(True))
    api.all_reduce(FakeTensor(next(_addresses), 0))
    api.reduce_scatter(FakeTensor(next(_addresses), 0), FakeTensor(next(_addresses), 0))
    api.all_gather(FakeTensor(next(_addresses), 0), FakeTensor(next(_addresses), 0))
    assert [key.collective for key, _ in comm.launches] == ["barrier"] * 3
    assert finished == [True] * 3


@pytest.mark.parametrize("call", [
    lambda: api.all_reduce(FakeTensor(next(_addresses), N), algorithm="bogus"),
    lambda: api.all_reduce(FakeTensor(next(_addresses), 0), algorithm="bogus"),  # an empty rank checks it too
    lambda: api.all_reduce(FakeTensor(next(_addresses), N), out=FakeTensor(next(_addresses), 16)),
    lambda: api.all_gather(FakeTensor(next(_addresses), 3 * N), FakeTensor(next(_addresses), N)),
    lambda: api.all_reduce(FakeTensor(next(_addresses), N), op="prod"),
], ids=["algorithm", "empty-algorithm", "out", "all_gather-sizes", "op"])
def test_a_call_refused_on_one_rank_launches_a_barrier_its_peers_meet_then_raises(comm: FakeComm, call) -> None:
    """Issue 48 (low): a rank that refuses its call before launching still launches a barrier
    of size 0 (as an empty rank does), so its peers' kernels record a size mismatch instead of
    timing out (the communicator lost); then it raises."""
    launched = len(comm.launches)
    with pytest.raises(CollectiveError):
        call()
    assert [key.collective for key, _ in comm.launches[launched:]] == ["barrier"]


@pytest.mark.parametrize("call", [
    lambda: api.all_reduce(FakeTensor(next(_addresses), N), op="prod"),
    lambda: api.all_reduce(FakeTensor(next(_addresses), N), backend="bogus"),
    lambda: api.reduce_scatter(FakeTensor(next(_addresses), N), FakeTensor(next(_addresses), 2 * N), op="prod"),
    lambda: api.all_gather(FakeTensor(next(_addresses), 2 * N), FakeTensor(next(_addresses), N), backend="bogus"),
    lambda: api.barrier(backend="bogus"),
], ids=["all_reduce-op", "all_reduce-backend", "reduce_scatter-op", "all_gather-backend", "barrier-backend"])
def test_unknown_options_are_collective_errors(comm: FakeComm, call) -> None:
    with pytest.raises(CollectiveError, match="must be one of"):
        call()


def test_max_blocks_true_is_refused_even_where_a_plan_for_1_exists(comm: FakeComm) -> None:
    out, inp = FakeTensor(next(_addresses), N), FakeTensor(next(_addresses), 2 * N)
    api.reduce_scatter(out, inp, max_blocks=1)
    with pytest.raises(CollectiveError, match="max_blocks must be a positive int"):
        api.reduce_scatter(out, inp, max_blocks=True)


def _turn_after(monkeypatch, calls) -> int:
    """The turn of a fresh rank's communicator after ``calls(comm)`` (each rank of a world: its own)."""
    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    calls(comm)
    return comm.turn


def test_ranks_that_launched_different_kernels_in_a_call_stay_in_turn(monkeypatch) -> None:
    """The GPU failure of test_different_dtypes_or_collectives_...: rank 0 all-gathers (no
    staging) where rank 1 reduce-scatters (staged, no end barrier: it took a turn), or rank 0
    is empty (its barrier) where rank 1 all-reduces staged: every launch passes the turn on, so
    the next staged call uses the same slot on both ranks (it read the other's other slot: wrong
    values on every rank); so does rank 0's barrier where rank 1 runs Lamport."""
    n = 2048

    def symmetric(comm, numel):
        return FakeTensor(comm.ctx.empty(4 * numel).data_ptr(), numel, torch.float32)

    def gather(comm):
        api.all_gather(symmetric(comm, 2 * n), symmetric(comm, n), algorithm="one_shot")

    def scatter(comm):
        api.reduce_scatter(symmetric(comm, n), symmetric(comm, 2 * n), algorithm="one_shot")

    def empty(comm):
        api.all_reduce(FakeTensor(next(_addresses), 0, torch.float32), algorithm="one_shot")

    def staged(comm):
        api.all_reduce(symmetric(comm, n), algorithm="one_shot")

    def lamport(comm):
        api.all_reduce(symmetric(comm, n), algorithm="lamport")

    assert _turn_after(monkeypatch, gather) == _turn_after(monkeypatch, scatter)
    assert _turn_after(monkeypatch, empty) == _turn_after(monkeypatch, staged)
    # issue 48 item 4: an empty rank's barrier meets its peers' Lamport kernels (the buffers
    # made first, with their own barrier, on every rank alike)
    assert _turn_after(monkeypatch, lambda comm: (lamport(comm), empty(comm))) == _turn_after(
        monkeypatch, lambda comm: (lamport(comm), lamport(comm)))
