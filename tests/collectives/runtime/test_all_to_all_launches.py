"""The all-to-all's launch cache (pure Python, CPU tensors, no GPU): a call like an earlier one
reuses that call's prepared launch, and whatever a launch holds (tensor places and sizes, list
split values, the symmetric allocations, the bound) changes the key."""

from __future__ import annotations

import contextlib
import importlib.util
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from collectives import api  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402
from ptxops.errors import NvshmemMissing  # noqa: E402
from collectives.runtime import all_to_all as a2a  # noqa: E402
from collectives.runtime.staging import PlanCache  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, install  # noqa: E402


class Fake(FakeComm):
    """A fake communicator whose all-to-all plans count their launches; ``prepared`` lists
    what each plan was made of (the API's real call path: plan cache, skeleton, Plan.run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(FakeHeap(world_size=2))
        install(monkeypatch, self, [False])
        self.prepared: list[tuple] = []
        self.launched = 0
        self._exchange = object.__new__(a2a.Exchange)  # its plan(call): a2a.prepare, below
        self._exchange.comm = self
        monkeypatch.setattr(a2a, "prepare", self._prepare)

    def _prepare(self, comm, state, out, inp, out_splits, in_splits, transport, bounded=False):
        self.prepared.append((out.data_ptr(), inp.data_ptr(), out_splits, in_splits, bounded, transport))

        def launch(*args) -> None:
            self.launched += 1

        return a2a.AllToAllPlan(launch, (), comm, (), {})

    def all_to_all(self, out, inp, out_splits=None, in_splits=None, transport="nvlink", bounded=False) -> None:
        api.all_to_all(out, inp, out_splits, in_splits, transport=transport, bounded=bounded)


def test_a_repeated_call_launches_its_prepared_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    for _ in range(3):
        comm.all_to_all(out, inp, [2, 6], [4, 4])
    assert len(comm.prepared) == 1 and comm.launched == 3
    comm.all_to_all(out, inp, [3, 5], [4, 4])  # new split values: a new launch
    comm.all_to_all(out, inp, (2, 6), (4, 4))  # the same values as a tuple: the first one's
    assert len(comm.prepared) == 2 and comm.launched == 5


def test_split_tensors_are_keyed_by_place_not_values(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    splits = torch.tensor([4, 4])
    comm.all_to_all(out, inp, splits, splits)
    splits.copy_(torch.tensor([1, 7]))  # the kernel reads the values: nothing to prepare
    comm.all_to_all(out, inp, splits, splits)
    assert len(comm.prepared) == 1
    comm.all_to_all(out, inp, torch.tensor([4, 4]), splits)  # another tensor
    assert len(comm.prepared) == 2


def test_tensors_allocations_and_the_bound_change_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    comm.all_to_all(out, inp)
    comm.all_to_all(out.view(8, 2, 2), inp.view(8, 2, 2))  # same places, other shapes
    comm.all_to_all(out.to(torch.float16), inp.to(torch.float16))
    assert len(comm.prepared) == 3
    comm.ctx.generation += 1  # a symmetric allocation made or freed: its numbers may have moved
    comm.all_to_all(out, inp)
    assert len(comm.prepared) == 4
    comm.plans.clear()  # what a new bound does (ErrorRecord.bound_changed)
    comm.all_to_all(out, inp)
    assert len(comm.prepared) == 5


def test_empty_views_of_different_buffers_are_different_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """0 rows of one receive buffer and 0 rows of another: ``data_ptr()`` is 0 for both, but a
    launch holds its buffer's allocation, so the second must not reuse the first's (the MoE
    soak's combine of 0 tokens on 4 H200s did, and every peer named the allocations different)."""
    comm = Fake(monkeypatch)
    first, second, inp = torch.empty(6, 4), torch.empty(6, 4), torch.ones(0, 4)
    comm.all_to_all(first[:0], inp, [0, 0], [0, 0])
    comm.all_to_all(second[:0], inp, [0, 0], [0, 0])
    assert len(comm.prepared) == 2
    comm.all_to_all(second[:0], inp, [0, 0], [0, 0])  # the same place again: a hit
    assert len(comm.prepared) == 2 and comm.launched == 3


def test_a_launch_holds_no_staging_buffer() -> None:
    """The staging pool drops the plans holding a superseded buffer (PlanCache.drop_holding)
    from the same cache: a launch answers that it holds none."""
    plans = PlanCache()
    plans["all_to_all"] = a2a.AllToAllPlan(lambda *a: None, (), SimpleNamespace(device_index=0), (), {})
    plans.drop_holding(1234)
    assert len(plans) == 1


def test_an_all_to_all_plan_into_an_adopted_block_dies_with_its_storage() -> None:
    """A symmetric output adopted from torch (``symm_mem.empty``, freed by reference count with
    no call to the context): the plan holds a weak reference to its storage, and the cache
    drops the plan once the storage is gone (its peer table may be another allocation's)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    storage = torch.empty(4).untyped_storage()
    plans = PlanCache()
    plans["all_to_all"] = a2a.AllToAllPlan(lambda *a: None, (), SimpleNamespace(device_index=0), (), {},
                                           alive=(StorageWeakRef(storage),))
    assert plans.get("all_to_all") is not None and plans.get("all_to_all").uses == ()
    del storage
    assert plans.get("all_to_all") is None and len(plans) == 0


def test_a_captured_launch_pins_its_split_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph replays the launch's split addresses for good: under capture, the split tensors
    it made are kept past the split cache's evictions (once each, however often captured)."""
    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    pinned: dict = {}
    splits = (torch.tensor([4, 4]), torch.tensor([2, 6]))
    launch = a2a.AllToAllPlan(lambda *a: None, (), comm, splits, pinned)
    launch.run(False)
    assert pinned == {}  # eager: the launch's own reference is enough
    launch.run(True)
    launch.run(True)
    assert sorted(pinned) == sorted(t.data_ptr() for t in splits)


def test_splits_made_under_capture_are_filled_on_the_device_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy from host memory recorded in a graph would read a buffer the graph does not own
    at every replay: under capture the values go into fill kernels' arguments."""
    monkeypatch.setattr(a2a, "capturing", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("a host copy under capture"))
    t = a2a._upload((3, 0, 1 << 40), torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [3, 0, 1 << 40]


def test_ranks_sharing_a_gpu_fill_host_splits_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning may allocate, which waits for every kernel on the GPU, and a pageable copy waits
    behind the other ranks' pageable copies (one reading a result back behind an all-to-all that
    spins for this rank's launch): where ranks share the GPU the values go into fill kernels."""
    monkeypatch.setattr(a2a, "capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned where ranks share the GPU"))
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: pytest.fail("copied where ranks share the GPU"))
    assert a2a._upload((4, 5), torch.device("cpu"), shared=True).tolist() == [4, 5]


@pytest.mark.parametrize("bad", [2.7, True, 2.0, torch.tensor(True)])
def test_split_lists_of_non_integers_are_refused_not_truncated(monkeypatch: pytest.MonkeyPatch, bad) -> None:
    """``int(2.7)`` is 2 and ``True`` is 1: a split list holding either would have moved another
    count of rows (and met the launch cached for it); refused, naming the value (issue 48)."""
    import numpy as np

    from collectives.errors import CollectiveError

    fake = Fake(monkeypatch)
    out, inp = torch.zeros(4), torch.zeros(4)
    with pytest.raises(CollectiveError, match=r"all_to_all: splits must be integers, not"):
        fake.all_to_all(out, inp, [2, bad], [2, 2])
    state = a2a.Exchange.__new__(a2a.Exchange)
    state.comm, state.splits = SimpleNamespace(world=2, residency=None), {}
    with pytest.raises(CollectiveError, match=r"all_to_all: in_splits must be integers, not"):
        state.device_splits([bad, 2], 4, "in_splits", torch.device("cpu"))
    assert fake.prepared == []
    fake.all_to_all(out, inp, [np.int64(2), torch.tensor(2)], [2, 2])  # integers of other types pass
    assert fake.prepared[0][2] == [np.int64(2), torch.tensor(2)]


def test_the_exchange_and_receive_buffers_are_parts_of_their_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Made once per communicator at first use, and gone with it: no module cache keyed by
    ``id(comm)`` keeps a closed communicator's parts alive or hands them to a new one."""
    import gc
    import weakref

    from collectives.runtime import communicator as communicator_module

    class Part:
        def __init__(self, comm, seed: int) -> None:
            made.append(seed)

    made: list = []
    monkeypatch.setattr(communicator_module, "Exchange", Part)
    comm = FakeComm(FakeHeap(world_size=2))
    assert comm.exchange() is comm.exchange() and made == [0]
    rows = comm.receive_buffer("rows", (4, 2), torch.float32, -8)
    assert comm.receive_buffer("rows", (4, 2), torch.float32, -8) is rows
    assert comm.receive_buffer("rows", (8, 2), torch.float32, -8) is not rows
    other = FakeComm(FakeHeap(world_size=2))
    assert other.exchange() is not comm.exchange() and made == [0, 0]
    parts = weakref.ref(comm.exchange()), weakref.ref(rows)
    del comm, rows
    gc.collect()
    assert [p() for p in parts] == [None, None]


def test_the_transport_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    for transport in ("nvlink", "nvshmem", "nvlink", "nvshmem"):
        comm.all_to_all(out, inp, transport=transport)
    assert [p[-1] for p in comm.prepared] == ["nvlink", "nvshmem"] and comm.launched == 4


def test_bounded_is_part_of_the_key_and_of_the_bound_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bounded call and an exact one of the same tensors are two launches, each reused; a
    BoundAllToAll's bounded call takes the bounded plan."""
    comm = Fake(monkeypatch)
    out, inp = torch.empty(8, 4), torch.ones(8, 4)
    received, sent = torch.zeros(2, dtype=torch.int64), torch.tensor([4, 4])
    for bounded in (False, True, False, True):
        comm.all_to_all(out, inp, received, sent, bounded=bounded)
    assert [p[-2] for p in comm.prepared] == [False, True] and comm.launched == 4
    bound = api.BoundAllToAll(out, inp, received, sent, bounded=True)
    bound()
    bound()
    assert len(comm.prepared) == 2 and comm.launched == 6


class Refusing(FakeComm):
    """A fake communicator whose all-to-all plans are the real ones (:func:`a2a.prepare`), on a
    context whose heap is ``heap``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, heap: object) -> None:
        super().__init__(FakeHeap(world_size=2))
        install(monkeypatch, self, [False])
        self.ctx.heap = heap
        self._exchange = object.__new__(a2a.Exchange)
        self._exchange.comm = self


def refused(comm: FakeComm, transport: str) -> str:
    with pytest.raises(CollectiveError) as info:
        api.all_to_all(torch.empty(8, 4), torch.ones(8, 4), transport=transport)
    assert comm.launches == []
    return str(info.value)


def test_an_unknown_transport_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refused(Refusing(monkeypatch, object()), "rdma")
    assert "transport must be one of 'nvlink', 'nvshmem', not 'rdma'" in message


def test_nvshmem_needs_nvshmem4py(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise NvshmemMissing("nvshmem.bindings")

    monkeypatch.setattr(a2a.importlib, "import_module", missing)
    message = refused(Refusing(monkeypatch, object()), "nvshmem")
    assert "transport='nvshmem' needs nvshmem4py" in message and "pip install -e '.[nvshmem]'" in message


@pytest.mark.skipif(importlib.util.find_spec("nvshmem") is None, reason="nvshmem4py is not installed")
def test_nvshmem_needs_the_nvshmem_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A context on torch's symmetric memory (or a one-GPU world's, a sub-group's pool) is
    refused with the heap it has; the NVSHMEM heap passes the check."""
    from collectives.symmetric.nvshmem_heap import NvshmemHeap

    class TorchHeap:
        pass

    message = refused(Refusing(monkeypatch, TorchHeap()), "nvshmem")
    assert "heap is TorchHeap, not NVSHMEM's" in message and "use transport='nvlink'" in message
    a2a.check_transport(Refusing(monkeypatch, object.__new__(NvshmemHeap)), "nvshmem")


def test_bounded_needs_out_splits_as_a_tensor_and_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel writes the rows received into out_splits: a list (or none) is refused before any
    launch, as is a transport other than nvlink, and a bounded call under torch.compile."""
    comm = Refusing(monkeypatch, object())
    for out_splits, transport in (([4, 4], "nvlink"), (None, "nvlink"), (torch.zeros(2, dtype=torch.int64), "nvshmem")):
        with pytest.raises(CollectiveError, match="bounded=True writes the rows each rank sent into out_splits"):
            api.all_to_all(torch.empty(8, 4), torch.ones(8, 4), out_splits, [4, 4], transport=transport,
                           bounded=True)
    assert comm.launches == []
    monkeypatch.setattr(api, "_compiling", lambda: True)
    with pytest.raises(CollectiveError, match="bounded=True is not traceable by torch.compile"):
        api.all_to_all(torch.empty(8, 4), torch.ones(8, 4), bounded=True)


def test_nvshmem_is_refused_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_compiling", lambda: True)
    with pytest.raises(CollectiveError, match="transport='nvshmem' is not traceable by torch.compile"):
        api.all_to_all(torch.empty(8, 4), torch.ones(8, 4), transport="nvshmem")


def test_a_blocking_nvshmem_registration_becomes_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """NvshmemLaunch.bind waits for the library's load and NVSHMEM registration at most twice
    the communicator's timeout: a step that blocks is a CollectiveError naming it (not a hang); one that
    fails raises its own error; one that returns is bound once per device."""
    import threading

    from cuda.bindings import driver

    from collectives.runtime import nvshmem_launch as nl

    release = threading.Event()
    monkeypatch.setattr(driver, "cuCtxGetCurrent", lambda: (driver.CUresult.CUDA_SUCCESS, driver.CUcontext(1)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(nl, "register", lambda kernel, device, context: release.wait(10))  # unbounded: fails, not hangs
    launch = nl.NvshmemLaunch(object(), (1, 2), lambda: 0.1)  # the communicator's timeout: bound 0.2 s
    with pytest.raises(CollectiveError, match=r"registering it with NVSHMEM \(nvshmem.core.library_init\) did not "
                                              r"return in 0.2 s"):
        launch.bind(3)
    release.set()

    def refused(kernel, device, context):
        raise RuntimeError("Failed to initialize CULibrary for NVSHMEM")

    monkeypatch.setattr(nl, "register", refused)
    with pytest.raises(RuntimeError, match="Failed to initialize CULibrary"):
        launch.bind(3)
    monkeypatch.setattr(nl, "register", lambda kernel, device, context: (f"executor on {device}", "library"))
    assert launch.bind(3) == launch.bind(3) == "executor on 3" and launch.libraries == ["library"]
