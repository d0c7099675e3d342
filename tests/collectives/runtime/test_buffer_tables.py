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


def test_ranks_sharing_the_gpu_fill_their_tables_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pageable copy waits behind every other rank's pageable copy on the GPU (CUDA stages
    them one at a time), and one of those may wait behind an all-to-all that spins for this
    rank's launch (the MoE soak at W = 6 to 8): where ranks share the GPU, fill kernels only."""
    monkeypatch.setattr(views, "capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned eagerly"))
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: pytest.fail("copied where ranks share the GPU"))
    table, host = views.device_table([5, 1 << 62, -3], device="cpu", shared=True)
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


@pytest.mark.parametrize("ranks_on_device", [1, 3])
def test_a_buffer_view_fills_its_tables_where_ranks_share_the_gpu(monkeypatch: pytest.MonkeyPatch,
                                                                  ranks_on_device: int) -> None:
    """A symmetric buffer's view (its peer table and translation table) is made with fills
    where its context's ranks share the GPU, with one pageable copy each where they do not."""
    from types import SimpleNamespace

    monkeypatch.setattr(views, "capturing", lambda: False)
    copies: list = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(self) or to(self, *a, **k))
    peers = [0x10000, 0x20000, 0x30000]
    ctx = SimpleNamespace(rank=1, backend="peer", ranks_on_device=ranks_on_device, is_adopted=lambda t: False,
                          peer_pointers=lambda t, align: peers)
    real = views.device_table  # (on the CPU here)
    monkeypatch.setattr(views, "device_table", lambda values, device="cuda", shared=False: real(values, "cpu", shared))
    buffer = views.BufferViews(ctx).get(torch.zeros(4))
    assert buffer.table.tolist() == peers
    assert len(copies) == (0 if ranks_on_device > 1 else 2)
