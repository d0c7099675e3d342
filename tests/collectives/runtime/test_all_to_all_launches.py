"""The all-to-all's launch cache (pure Python, CPU tensors, no GPU): a call like an earlier one
reuses that call's prepared launch, and whatever a launch holds (tensor places and sizes, list
split values, the symmetric allocations, the bound) changes the key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from collectives.runtime import all_to_all as a2a  # noqa: E402
from collectives.runtime.staging import PlanCache  # noqa: E402


class Fake:
    """A communicator with a plan cache and a context generation; ``prepare`` counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plans = PlanCache()
        self.ctx = SimpleNamespace(generation=0)
        self.prepared: list[tuple] = []
        self.launched = 0
        monkeypatch.setattr(a2a, "exchange", lambda comm: SimpleNamespace())
        monkeypatch.setattr(a2a, "prepare", self._prepare)

    def _prepare(self, comm, state, out, inp, out_splits, in_splits):
        self.prepared.append((out.data_ptr(), inp.data_ptr(), out_splits, in_splits))
        fake = self

        class Counted:
            holds = uses = alive = ()

            def run(self) -> None:
                fake.launched += 1

        return Counted()


def test_a_repeated_call_launches_its_prepared_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    for _ in range(3):
        a2a.all_to_all(comm, out, inp, [2, 6], [4, 4])
    assert len(comm.prepared) == 1 and comm.launched == 3
    a2a.all_to_all(comm, out, inp, [3, 5], [4, 4])  # new split values: a new launch
    a2a.all_to_all(comm, out, inp, (2, 6), (4, 4))  # the same values as a tuple: the first one's
    assert len(comm.prepared) == 2 and comm.launched == 5


def test_split_tensors_are_keyed_by_place_not_values(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    splits = torch.tensor([4, 4])
    a2a.all_to_all(comm, out, inp, splits, splits)
    splits.copy_(torch.tensor([1, 7]))  # the kernel reads the values: nothing to prepare
    a2a.all_to_all(comm, out, inp, splits, splits)
    assert len(comm.prepared) == 1
    a2a.all_to_all(comm, out, inp, torch.tensor([4, 4]), splits)  # another tensor
    assert len(comm.prepared) == 2


def test_tensors_allocations_and_the_bound_change_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    a2a.all_to_all(comm, out, inp)
    a2a.all_to_all(comm, out.view(8, 2, 2), inp.view(8, 2, 2))  # same places, other shapes
    a2a.all_to_all(comm, out.to(torch.float16), inp.to(torch.float16))
    assert len(comm.prepared) == 3
    comm.ctx.generation += 1  # a symmetric allocation made or freed: its numbers may have moved
    a2a.all_to_all(comm, out, inp)
    assert len(comm.prepared) == 4
    comm.plans.clear()  # what a new bound does (ErrorRecord.bound_changed)
    a2a.all_to_all(comm, out, inp)
    assert len(comm.prepared) == 5


def test_empty_views_of_different_buffers_are_different_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """0 rows of one receive buffer and 0 rows of another: ``data_ptr()`` is 0 for both, but a
    launch holds its buffer's allocation, so the second must not reuse the first's (the MoE
    soak's combine of 0 tokens on 4 H200s did, and every peer named the allocations different)."""
    comm = Fake(monkeypatch)
    first, second, inp = torch.empty(6, 4), torch.empty(6, 4), torch.ones(0, 4)
    a2a.all_to_all(comm, first[:0], inp, [0, 0], [0, 0])
    a2a.all_to_all(comm, second[:0], inp, [0, 0], [0, 0])
    assert len(comm.prepared) == 2
    a2a.all_to_all(comm, second[:0], inp, [0, 0], [0, 0])  # the same place again: a hit
    assert len(comm.prepared) == 2 and comm.launched == 3


def test_a_launch_holds_no_staging_buffer() -> None:
    """The staging pool drops the plans holding a superseded buffer (PlanCache.drop_holding)
    from the same cache: a launch answers that it holds none."""
    plans = PlanCache()
    plans["all_to_all"] = a2a.Launch(lambda *a: None, (), 0, (), {})
    plans.drop_holding(1234)
    assert len(plans) == 1


def test_a_captured_launch_pins_its_split_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph replays the launch's split addresses for good: under capture, the split tensors
    it made are kept past the split cache's evictions (once each, however often captured)."""
    monkeypatch.setattr(a2a, "current_stream", lambda device: 0)
    monkeypatch.setattr(a2a, "capturing", lambda: False)
    pinned: dict = {}
    splits = (torch.tensor([4, 4]), torch.tensor([2, 6]))
    launch = a2a.Launch(lambda *a: None, (), 0, splits, pinned)
    launch.run()
    assert pinned == {}  # eager: the launch's own reference is enough
    monkeypatch.setattr(a2a, "capturing", lambda: True)
    launch.run()
    launch.run()
    assert sorted(pinned) == sorted(t.data_ptr() for t in splits)


def test_splits_made_under_capture_are_filled_on_the_device_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy from host memory recorded in a graph would read a buffer the graph does not own
    at every replay: under capture the values go into fill kernels' arguments."""
    monkeypatch.setattr(a2a, "capturing", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("a host copy under capture"))
    t = a2a._upload((3, 0, 1 << 40), torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [3, 0, 1 << 40]


def test_ranks_sharing_a_gpu_copy_host_splits_without_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning may allocate, which waits for every kernel on the GPU: in a one-GPU world that
    includes another rank's all-to-all spinning for this rank's launch."""
    monkeypatch.setattr(a2a, "capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned where ranks share the GPU"))
    assert a2a._upload((4, 5), torch.device("cpu"), pin=False).tolist() == [4, 5]


@pytest.mark.parametrize("bad", [2.7, True, 2.0, torch.tensor(True)])
def test_split_lists_of_non_integers_are_refused_not_truncated(monkeypatch: pytest.MonkeyPatch, bad) -> None:
    """``int(2.7)`` is 2 and ``True`` is 1: a split list holding either would have moved another
    count of rows (and met the launch cached for it); refused, naming the value (issue 48)."""
    import numpy as np

    from collectives.errors import CollectiveError

    fake = Fake(monkeypatch)
    out, inp = torch.zeros(4), torch.zeros(4)
    with pytest.raises(CollectiveError, match=r"all_to_all: splits must be integers, not"):
        a2a.all_to_all(fake, out, inp, [2, bad], [2, 2])
    state = a2a.Exchange.__new__(a2a.Exchange)
    state.comm, state.splits = SimpleNamespace(world=2, residency=None), {}
    with pytest.raises(CollectiveError, match=r"all_to_all: in_splits must be integers, not"):
        state.device_splits([bad, 2], 4, "in_splits", torch.device("cpu"))
    assert fake.prepared == []
    a2a.all_to_all(fake, out, inp, [np.int64(2), torch.tensor(2)], [2, 2])  # integers of other types pass
    assert fake.prepared[0][2] == [np.int64(2), torch.tensor(2)]
