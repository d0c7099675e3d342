"""A communicator's collectives on two streams run one at a time (pure Python, no GPU): the real
API and plans on the fake communicator (:mod:`fake_comm`), the current stream and the CUDA
stream wait stood in for.  Two collectives running at once would share the call count and
tickets of the signal pad and pair different calls across ranks
(:func:`collectives.algorithms.plan.follow`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from collectives import api  # noqa: E402
from collectives.algorithms import plan  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402


def _watch_streams(monkeypatch, first: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The current stream (a one-item list the test sets; ``first`` to begin with) and the
    stream waits :func:`~collectives.algorithms.plan.follow` orders, recorded in turn."""
    stream, waits = [first], []
    monkeypatch.setattr(plan, "current_stream", lambda device: stream[0])
    monkeypatch.setattr(plan, "order", lambda device, before, after: waits.append((before, after)))
    return stream, waits


def test_a_collective_on_another_stream_waits_for_the_last_one_eager_only(monkeypatch) -> None:
    comm = FakeComm(FakeHeap(world_size=2))
    capturing = [False]
    install(monkeypatch, comm, capturing)
    stream, waits = _watch_streams(monkeypatch, 7)
    t = FakeTensor(0x7F00_0000_0000, 1 << 16)

    api.all_reduce(t)
    api.all_reduce(t)
    assert waits == []  # the first call, then the same stream
    stream[0] = 9
    api.all_reduce(t)
    assert waits == [(7, 9)]
    stream[0] = 7
    api.barrier()
    assert waits == [(7, 9), (9, 7)]
    capturing[0], stream[0] = True, 11  # a capture on its own stream: nothing runs now
    api.all_reduce(t)
    capturing[0], stream[0] = False, 7  # eager again, after a captured launch
    api.all_reduce(t)
    assert waits == [(7, 9), (9, 7)]
    assert (comm.stream, comm.stream_captured) == (7, False)


def _all_to_all_plans(monkeypatch, comm: FakeComm) -> list[int]:
    """Make ``comm``'s all-to-all plans record the stream each launch runs on (no kernel, no
    slot region: the real call path and :class:`~collectives.runtime.all_to_all.AllToAllPlan`)."""
    from collectives.runtime import all_to_all as a2a

    streams: list[int] = []
    comm._exchange = object.__new__(a2a.Exchange)  # its plan(call): a2a.prepare, below
    comm._exchange.comm = comm
    monkeypatch.setattr(a2a, "prepare", lambda comm, state, *call: a2a.AllToAllPlan(
        lambda *args: streams.append(args[-1]), (), comm, (), {}))
    return streams


def test_an_all_to_all_on_another_stream_waits_for_the_last_collective(monkeypatch) -> None:
    """Issue 48: the all-to-all (every MoE dispatch and combine) shares the communicator's
    call count with its other collectives, so it follows the same stream order."""
    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    stream, waits = _watch_streams(monkeypatch, 7)
    launched = _all_to_all_plans(monkeypatch, comm)
    t = FakeTensor(0x7F00_0000_0000, 1 << 16)
    rows, back = torch.empty(8, 4), torch.empty(8, 4)

    api.all_reduce(t)
    stream[0] = 9
    api.all_to_all(rows, back)
    assert waits == [(7, 9)] and launched == [9]
    stream[0] = 7
    api.all_reduce(t)
    assert waits == [(7, 9), (9, 7)]


def test_a_dispatch_and_a_combine_on_two_streams_run_one_at_a_time(monkeypatch) -> None:
    """Micro-batch overlap: batch 1's dispatch (two all-to-alls: counts, then rows) on stream
    A while batch 0's combine (one all-to-all) runs on stream B; each switch of stream waits
    for the other's last all-to-all, so they never share the call count at once."""
    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    stream, waits = _watch_streams(monkeypatch, 0)
    launched = _all_to_all_plans(monkeypatch, comm)
    counts, received, expert_out, combined = (torch.empty(n, 4) for n in (2, 8, 8, 6))
    A, B = 7, 9

    stream[0] = A  # batch 0's dispatch
    api.all_to_all(counts, counts.clone())
    api.all_to_all(received, received.clone())
    stream[0] = B  # batch 0's combine
    api.all_to_all(combined, expert_out)
    stream[0] = A  # batch 1's dispatch
    api.all_to_all(counts, counts.clone())
    api.all_to_all(received, received.clone())
    stream[0] = B  # batch 1's combine
    api.all_to_all(combined, expert_out)
    assert launched == [A, A, B, A, A, B]
    assert waits == [(A, B), (B, A), (A, B)]
