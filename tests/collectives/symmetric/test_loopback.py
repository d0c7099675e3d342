"""The one-GPU world's host side without a GPU: the bounded meeting of rank threads (agreement in
call order, a rank that fails or never arrives named to the others, never a hang) and the
loopback heap (collective alloc/free, ``peer()`` by allocation, per-stream synchronize), on CPU
tensors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import MulticastUnavailable  # noqa: E402
from collectives.symmetric.loopback import LoopbackHeap, Meeting, WorldError  # noqa: E402


def threads(world: int, body: Callable[[int], Any], bound: float = 10.0) -> list[Any]:
    """``body(rank)`` in ``world`` threads; each result or the exception it raised, by rank."""
    out: list[Any] = [None] * world

    def run(rank: int) -> None:
        try:
            out[rank] = body(rank)
        except BaseException as e:  # noqa: BLE001 (the test inspects it)
            out[rank] = e

    ts = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(bound)
        assert not t.is_alive(), "a rank thread hung"
    return out


@pytest.mark.parametrize("world", [2, 3, 8])
def test_the_kth_gather_of_every_rank_meets_the_kth_of_the_others(world: int) -> None:
    meeting = Meeting(world, timeout_s=5)
    got = threads(world, lambda r: [meeting.gather(r, f"step {k}", (r, k)) for k in range(20)])
    assert got == [[[(q, k) for q in range(world)] for k in range(20)]] * world
    assert meeting._rounds == {}  # every round dropped once every rank read it


def test_a_rank_that_never_arrives_is_named_within_the_bound() -> None:
    meeting = Meeting(3, timeout_s=0.3)
    start = time.monotonic()
    got = threads(3, lambda r: meeting.gather(r, "agree", r) if r != 2 else "absent")
    assert 0.3 <= time.monotonic() - start < 3
    for r in (0, 1):
        assert isinstance(got[r], WorldError) and got[r].ranks == (2,)
        assert "agree: ranks [2] did not arrive within 0.3s" in str(got[r])


def test_a_rank_that_fails_releases_the_waiting_ranks_with_its_name() -> None:
    meeting = Meeting(3, timeout_s=30)

    def body(rank: int) -> Any:
        if rank == 1:
            time.sleep(0.1)
            meeting.abort(1, ValueError("boom"))
            return "failed"
        return meeting.gather(rank, "agree", rank)

    start = time.monotonic()
    got = threads(3, body)
    assert time.monotonic() - start < 5  # not the 30 s bound
    for r in (0, 2):
        assert isinstance(got[r], WorldError) and got[r].ranks == (1,)
        assert "rank 1 failed: ValueError: boom" in str(got[r])
    with pytest.raises(WorldError, match="rank 1 failed"):  # and every later wait
        meeting.gather(0, "later", 0)


class Stream:
    def __init__(self) -> None:
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


def test_the_loopback_heap_allocates_collectively_and_maps_peers_by_allocation() -> None:
    world = 3
    meeting, table = Meeting(world, timeout_s=5), {}
    streams = [Stream() for _ in range(world)]
    heaps = [LoopbackHeap(meeting, table, r, "cpu", stream=lambda r=r: streams[r]) for r in range(world)]

    def body(rank: int) -> list[int]:
        heap = heaps[rank]
        a, b = heap.alloc(64), heap.alloc(128)
        a.fill_(rank)
        b.fill_(10 + rank)
        meeting.barrier(rank, "filled")
        seen = [int(heap.peer(a, q)[0]) for q in range(world)] + [int(heap.peer(b, q)[0]) for q in range(world)]
        assert heap.peer(a, rank) is a
        heap.synchronize()
        heap.free(a)
        return seen

    got = threads(world, body)
    assert got == [[0, 1, 2, 10, 11, 12]] * world
    assert list(table) == [1]  # allocation 0 freed by every rank, 1 still live
    assert [s.syncs for s in streams] == [1] * world  # each rank's own stream, nothing device-wide
    with pytest.raises(MulticastUnavailable, match="no NVLink multicast"):
        heaps[0].multicast(table[1][0])


def test_free_waits_for_every_rank_before_dropping() -> None:
    """A rank frees only when every rank reached the free: a slow rank still reads the others'."""
    meeting, table = Meeting(2, timeout_s=5), {}
    heaps = [LoopbackHeap(meeting, table, r, "cpu", stream=Stream) for r in range(2)]
    order: list[str] = []

    def body(rank: int) -> None:
        raw = heaps[rank].alloc(16)
        if rank == 1:
            time.sleep(0.2)
            order.append(f"read {heaps[1].peer(raw, 0).numel()}")
        heaps[rank].free(raw)
        order.append(f"freed {rank}")

    assert threads(2, body) == [None, None]
    assert order[0] == "read 16" and table == {}


# -- the rank threads of collectives.testing: results in rank order, errors with their rank -----

from collectives.testing import RankThreads  # noqa: E402


def test_rank_threads_persist_and_return_results_in_rank_order() -> None:
    meeting = Meeting(4, timeout_s=5)
    started: list[str] = []
    ranks = RankThreads(4, 5, meeting, start=lambda r: started.append(threading.current_thread().name))
    try:
        assert ranks.run(lambda r: r * r) == [0, 1, 4, 9]
        names = ranks.run(lambda r: threading.current_thread().name)  # the same thread per rank, every run
        assert names == [f"collectives-rank-{r}" for r in range(4)] and sorted(started) == names
        assert ranks.run(lambda r: meeting.gather(r, "sum", r)) == [[0, 1, 2, 3]] * 4
    finally:
        assert ranks.stop() == []


def test_a_raising_rank_is_re_raised_with_its_rank_and_releases_the_others() -> None:
    meeting = Meeting(3, timeout_s=30)
    ranks = RankThreads(3, 30, meeting)

    def body(rank: int) -> None:
        if rank == 2:
            raise KeyError("no such tensor")
        meeting.barrier(rank, "after the step")  # would wait for rank 2 for 30 s

    start = time.monotonic()
    with pytest.raises(KeyError, match="no such tensor") as info:
        ranks.run(body)
    assert time.monotonic() - start < 5
    note = "\n".join(info.value.__notes__)
    assert "raised in rank 2 of a world of 3" in note and "rank 0: WorldError: rank 2 failed" in note
    with pytest.raises(WorldError, match="broken"):
        ranks.run(lambda r: r)
    ranks.stop()


def test_a_hung_rank_is_named_within_the_bound() -> None:
    meeting = Meeting(2, timeout_s=0.3)
    ranks = RankThreads(2, 0.3, meeting)
    release = threading.Event()
    start = time.monotonic()
    def stuck_in_a_driver_call() -> None:
        release.wait(30)

    with pytest.raises(WorldError, match=r"ranks \[1\] did not finish within 0.3s") as info:
        ranks.run(lambda r: stuck_in_a_driver_call() if r == 1 else None)
    assert info.value.ranks == (1,) and time.monotonic() - start < 5
    note = "\n".join(info.value.__notes__)  # where the hung rank's thread is: its stack
    assert "rank 1's thread" in note and "in stuck_in_a_driver_call" in note and "release.wait(30)" in note
    release.set()
    ranks.stop()


def test_ranks_that_all_hang_in_waits_are_named_within_the_bound() -> None:
    """Issue 48 (low): every rank stuck in a host wait and none finished (no first rank starts
    the hung-rank bound): a WorldError naming them after a bound or two without a move, not a
    hang; ranks that keep computing longer than the bound are no hang."""
    meeting = Meeting(2, timeout_s=0.3)
    ranks = RankThreads(2, 0.3, meeting)
    release = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            ranks.run(lambda r: release.wait(30))
        except BaseException as e:  # noqa: BLE001 (checked below)
            outcome.append(e)

    start = time.monotonic()
    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(10)
    release.set()  # (the old code hung here until released)
    caller.join(30)
    assert outcome and isinstance(outcome[0], WorldError), outcome
    assert time.monotonic() - start < 5 and outcome[0].ranks == (0, 1)
    assert "ranks [0, 1] did not move for 0.3s and none finished" in str(outcome[0])
    assert "in <lambda>" in "\n".join(outcome[0].__notes__)
    ranks.stop()

    busy = RankThreads(2, 0.3, Meeting(2, timeout_s=0.3))
    def compute(rank: int) -> int:
        end, x = time.monotonic() + 1.2, 0
        while time.monotonic() < end:
            x += 1
        return rank

    assert busy.run(compute) == [0, 1]
    busy.stop()


def test_channels_count_their_own_rounds() -> None:
    """A bounded agreement that timed out (a rank never made it: a size mismatch grew a buffer on
    one rank only) leaves the host channel's rounds in step."""
    meeting = Meeting(2, timeout_s=5)

    def body(rank: int) -> list[Any]:
        if rank == 0:
            with pytest.raises(WorldError, match=r"grow: ranks \[1\] did not arrive within 0.2s"):
                meeting.gather(0, "grow", [0], timeout_s=0.2, channel="bounded")
        return meeting.gather(rank, "next step", rank)

    assert threads(2, body) == [[0, 1]] * 2


def test_every_rank_raising_alike_in_step_leaves_the_threads_usable() -> None:
    """A skip in every rank (the same exception at the same host step) is raised and the world
    goes on; ranks that failed at different steps break it."""
    meeting = Meeting(3, timeout_s=5)
    ranks = RankThreads(3, 5, meeting)
    with pytest.raises(LookupError, match="not here"):
        ranks.run(lambda r: (meeting.barrier(r, "before"), (_ for _ in ()).throw(LookupError("not here"))))
    assert ranks.broken is None and ranks.run(lambda r: meeting.gather(r, "after", r)) == [[0, 1, 2]] * 3

    def apart(rank: int) -> None:
        if rank == 0:
            raise LookupError("not here")
        meeting.barrier(rank, "only the others")

    with pytest.raises(LookupError):
        ranks.run(apart)
    assert ranks.broken is not None
    ranks.stop()
