"""A symmetric buffer's device tables (collectives.runtime.views.device_table): eagerly made
without a pinned allocation (cudaHostAlloc waits for every kernel on the GPU, and in a one-GPU
world another rank's spinning all-to-all waited for this rank's launch), inside a CUDA-graph
capture from pinned memory that the caller keeps for the graph's replays."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from collectives.runtime import views  # noqa: E402


def test_an_eager_table_pins_no_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned eagerly"))
    table, host = views.device_table([5, 1 << 62, -3], device="cpu")
    assert table.tolist() == host.tolist() == [5, 1 << 62, -3] and table.dtype == torch.int64


def test_a_captured_table_is_copied_from_the_pinned_host_copy_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "capturing", lambda: True)
    pinned: list = []

    def pin(self):
        pinned.append(self)
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    table, host = views.device_table([7, 8], device="cpu")
    assert len(pinned) == 1 and host is pinned[0] and table.tolist() == [7, 8]
