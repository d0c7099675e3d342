"""A communicator without a GPU, for models of the host runtime: the real
:class:`~collectives.runtime.communicator.Communicator` logic (plans, staging pool, errors, the API's plan
functions) over a fake symmetric heap that records every allocation and free, tensors that
are only addresses, and kernels that record their launches (no CuTeDSL compile)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from collectives.layouts import PadLayout
from collectives.symmetric.capability import Capabilities
from collectives.runtime.error_record import ErrorRecord
from collectives.runtime.communicator import Communicator
from collectives.runtime.staging import PlanCache, StagingPool
from collectives.runtime.views import Buffer, BufferViews


class FakeTensor:
    """What the API reads of a contiguous CUDA tensor: its address, size and dtype (an empty
    one's ``data_ptr()`` is 0, as torch's; its storage keeps the address)."""

    is_cuda = True

    def __init__(self, ptr: int, numel: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self._ptr, self._numel, self.dtype = ptr, numel, dtype
        self.shape = (numel,)
        self.device = SimpleNamespace(index=0, type="cuda")

    def data_ptr(self) -> int:
        return self._ptr if self._numel else 0

    def untyped_storage(self) -> SimpleNamespace:
        return SimpleNamespace(data_ptr=lambda: self._ptr)

    def storage_offset(self) -> int:
        return 0

    def get_device(self) -> int:
        return self.device.index

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def is_contiguous(self) -> bool:
        return True


@dataclass
class FakeHeap:
    """Symmetric allocations as CPU byte tensors, never released (so no address is reused and a
    freed one stays recognisable); ``agree_any`` answers for this rank alone."""

    world_size: int = 2
    rank: int = 0
    device: int = 0
    backend: str = "peer"
    generation: int = 0
    live: dict[int, torch.Tensor] = field(default_factory=dict)
    on_free: list = field(default_factory=list)  # as the context's (Context.on_free)
    freed: dict[int, torch.Tensor] = field(default_factory=dict)
    log: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.caps = Capabilities(device=0, world_size=self.world_size, multicast=False,
                                 multicast_reason="NVSHMEM_DISABLE_NVLS=1", peer_access=True,
                                 peer_reason=None, nvlink_mesh=True)

    def empty(self, shape: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        self.live[t.data_ptr()] = t
        self.log.append(("empty", t.nbytes))
        return t

    def signal_pad(self, nbytes: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        t = torch.zeros(nbytes // 4, dtype=dtype)
        self.live[t.data_ptr()] = t
        self.log.append(("signal_pad", nbytes))
        return t

    def free(self, t: torch.Tensor) -> None:
        self.freed[t.data_ptr()] = self.live.pop(t.data_ptr())
        for forget in self.on_free:
            forget(t.data_ptr(), t.nbytes)
        self.log.append(("free", t.nbytes))

    def host_barrier(self) -> None:
        self.log.append(("host_barrier",))

    def agree_any(self, flag: bool) -> bool:
        self.log.append(("agree_any", flag))
        return flag

    def agree_bounded(self, what: str, values: list[int], timeout_s: float) -> None:
        self.log.append(("agree_bounded", *values))

    def is_symmetric(self, t) -> bool:
        return self.find(t.data_ptr(), self.live) is not None

    @staticmethod
    def find(ptr: int, allocations: dict[int, torch.Tensor]) -> torch.Tensor | None:
        for base, t in allocations.items():
            if base <= ptr < base + t.nbytes:
                return t
        return None


class FakeViews(BufferViews):
    """Buffer views whose tables are CPU tensors of the buffer's own address; ``tables`` maps a
    table's address back to its buffer's."""

    def __init__(self, world: int) -> None:
        super().__init__(None)
        self.world = world
        self.tables: dict[int, int] = {}

    def get(self, t) -> Buffer:
        key = t.data_ptr()
        if key not in self._buffers:
            table = torch.full((self.world,), key, dtype=torch.int64)
            self.tables[table.data_ptr()] = key
            self._buffers[key] = Buffer(table, 0, table, (key, 0, []), table, table, key)
        return self._buffers[key]


class FakeComm(Communicator):
    """The communicator's host logic on a :class:`FakeHeap`; ``launches`` lists each launch as
    ``(key, addresses)``: the data addresses its kernel would touch (the data and result
    buffers, ``out`` and ``src``); ``grids`` each launch's ``(key, blocks)``.  ``views``: the
    buffer views (default :class:`FakeViews`; a real context's :class:`BufferViews` where the
    peer tables matter)."""

    def __init__(self, heap: FakeHeap, views: BufferViews | None = None) -> None:  # (no GPU state)
        self.ctx, self.world, self.rank = heap, heap.world_size, heap.rank
        self.layout = PadLayout()
        self.errors = ErrorRecord(30.0, lambda: None, pin_memory=False, bound_changed=lambda: self.plans.clear())
        self.plans = PlanCache()
        self.views = FakeViews(self.world) if views is None else views
        self.follow_frees()
        self.pool = StagingPool(heap, self.plans, self.agree_growth)
        self.lamport_buffers = {}
        self.receive_buffers, self._exchange = {}, None
        self.turn = 0
        self.stream, self.stream_captured = None, False
        self.sms = 132
        self.launches: list[tuple] = []
        self.grids: list[tuple] = []  # (key, blocks) of every launch
        self.pad = heap.empty(self.layout.words * 4, torch.int32)
        self.pad_buffer = self.buffer(self.pad)

    def kernel(self, key):
        tables = self.views.tables

        def launch(data_table, data_mc, out, src, *rest):
            used = [tables[data_table], out, src] + ([tables[data_mc]] if data_mc in tables else [])
            self.launches.append((key, [a for a in used if a]))
            self.grids.append((key, rest[-2]))  # (the launch's last two: blocks, stream)
        return launch


def install(monkeypatch, comm: FakeComm, capturing: list[bool]) -> None:
    """Make the API use ``comm``, and CUDA-graph capture be on while ``capturing[0]``."""
    from collectives import api, overlap
    from collectives.algorithms import plan

    monkeypatch.setattr(api, "communicator", lambda group=None: comm)
    monkeypatch.setattr(overlap, "communicator", lambda group=None: comm)

    def capturing_now() -> bool:
        """The stand-in of :func:`collectives.algorithms.plan.capturing` wherever a call asks it
        (plan.py too, which asks nothing today: an ask put back there is counted by the
        host-path guard, ``tests/collectives/runtime/test_host_path.py``)."""
        return capturing[0]

    monkeypatch.setattr(api, "_capturing", capturing_now)
    monkeypatch.setattr(plan, "capturing", capturing_now)
    monkeypatch.setattr(plan, "current_stream", lambda device: 0)
