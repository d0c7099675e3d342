"""The MoE layer's host path allocates, per call, only blocks whose sizes its shape fixes.

Candidate cause of the world MoE soak's hangs at W = 7 and 8 (docs/guide-one-gpu-world.md): a
``cudaMalloc`` may wait for the device, where other ranks' all-to-alls spin for this rank's
next launch.  torch's caching allocator calls it when no cached block fits, and the layer used
to allocate blocks whose sizes followed the routing (the rows sent: tokens x top-k of them;
the combine's output: tokens rows), so a run of prefills or decodes with changing token counts
kept meeting sizes it had not cached.  Now every allocation above torch's small-block pool
(1 MB; smaller ones share its 2 MB segments) has a size its shape fixes (``max_tokens``, top-k,
the receive buffers), so each call finds the block the previous call freed.

Counted on the CPU with torch's dispatcher (a stand-in allocator: every operator's output whose
storage is none of its inputs' is a new block), the layer's kernels stand-ins that launch
nothing, one rank of two whose all-to-alls deliver zeros: for calls of one shape with 0 to
``max_tokens`` tokens, the sizes of the large blocks must be the same.
"""

from __future__ import annotations

import functools
import types

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.runtime import moe as runtime_moe  # noqa: E402

#: torch's caching allocator serves blocks up to this from its small pool (2 MB segments).
SMALL = 1 << 20


class Allocations(TorchDispatchMode):
    """Records the bytes of every new block an operator allocates (its output's storage, when no
    input holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs)) if t.device.type != "meta"}
        for t in _tensors(out):
            storage = t.untyped_storage()
            if storage.data_ptr() not in inputs and storage.nbytes():
                self.sizes.append(storage.nbytes())
        return out


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def exchange(out, *_: object, **__: object) -> None:
    """An all-to-all that delivers zeros (uncounted)."""
    with _disable_current_modes():
        out.zero_()


def large_blocks(tokens: int, fp8: bool, mode: str, monkeypatch) -> list[int]:
    """The sizes above :data:`SMALL` of a layer's new blocks at ``tokens`` tokens (of at most
    128), hidden 7168, top-8 of 16 experts, rank 0 of 2, the kernels' host code included."""
    monkeypatch.setattr(runtime_moe, "FUSED", True)
    monkeypatch.setattr(runtime_moe, "current_stream", lambda device: 0)
    comm = types.SimpleNamespace(world=2, device_index=0, kernel_together=lambda key: lambda *a: None)
    topk, experts, hidden, most = 8, 16, 7168, 128
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn((tokens, hidden), generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)]) if tokens else \
        torch.empty((0, topk), dtype=torch.int64)
    w = torch.rand((tokens, topk), generator=gen)
    buffers: dict = {}

    def empty(name, shape, dtype, device):  # the receive buffers: allocated once per shape, as _symmetric's
        with _disable_current_modes():
            return buffers.setdefault((name, shape, dtype), torch.empty(shape, dtype=dtype))

    counter = Allocations()
    with counter:
        expert_x, _, handle = moe.dispatch_with(exchange, 2, x, ids, w, experts, most, mode, empty=empty, fp8=fp8,
                                                placement_for=functools.partial(runtime_moe.placement, comm),
                                                pack_for=functools.partial(runtime_moe.pack, comm))
        if not fp8:
            with _disable_current_modes():  # what the placement kernel (a stand-in here) writes: nothing kept
                handle.place.fill_(expert_x.shape[0] * expert_x.shape[1])
                handle.kept.fill_(False)
            weighted_sum = runtime_moe.weighted_sum(comm, torch.bfloat16, hidden, topk)
            out = moe.combine_with(exchange, torch.zeros_like(expert_x), handle, empty,
                                   kernels=lambda: (weighted_sum, runtime_moe.gather(comm, hidden * 2), None))
            assert out.shape == (tokens, hidden)
    return sorted(s for s in counter.sizes if s > SMALL)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_large_blocks_do_not_follow_the_routing(fp8: bool, monkeypatch) -> None:
    """Low latency, 128, 77, 1 and 0 tokens: the same large blocks (the rows sent, expert_x,
    the combine's rows and output); before, the rows sent and the combine's output followed
    the tokens."""
    sizes = {tokens: large_blocks(tokens, fp8, "low_latency", monkeypatch) for tokens in (128, 77, 1, 0)}
    assert sizes[128], "the shape allocates large blocks: the check has something to compare"
    assert all(s == sizes[128] for s in sizes.values()), sizes
