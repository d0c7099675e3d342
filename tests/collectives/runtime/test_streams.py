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


def test_a_collective_on_another_stream_waits_for_the_last_one_eager_only(monkeypatch) -> None:
    comm = FakeComm(FakeHeap(world_size=2))
    capturing = [False]
    install(monkeypatch, comm, capturing)
    stream = [7]
    waits: list[tuple[int, int]] = []
    monkeypatch.setattr(plan, "current_stream", lambda device: stream[0])
    monkeypatch.setattr(plan, "order", lambda device, before, after: waits.append((before, after)))
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
