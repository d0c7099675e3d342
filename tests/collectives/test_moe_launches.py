"""How many kernels an eager MoE dispatch and combine launch besides ours: the host cost that
made the eager layer lose to NCCL's (docs/benchmarks.md).  Counted on the CPU with torch's
dispatcher (views and allocations aside; each all-to-all and each of our kernels counts one),
for the torch steps and for the fused kernels (``collectives.runtime.moe``, here with
a kernel that launches nothing: what is counted is the torch work around it).  A guard against
torch steps creeping back into the fused path:

    python -m pytest -q -s tests/collectives/test_moe_launches.py    # prints the counts
"""

from __future__ import annotations

import functools
import types

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.runtime import moe as runtime_moe  # noqa: E402

#: Operators that launch nothing on a GPU (``scalar_tensor``: a Python number, such as
#: ``torch.where``'s 0, wrapped in a 0-dim tensor on the host).
FREE = {"view", "slice", "detach", "unsqueeze", "select", "alias", "expand", "reshape", "as_strided", "empty",
        "empty_strided", "empty_like", "_reshape_alias", "scalar_tensor"}


class Launches(TorchDispatchMode):
    """Counts the operators that launch GPU work, and the calls of ``note``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def note(self, *args: object, **_: object) -> None:
        """One launch (an all-to-all: its output zeroed, uncounted, so that no step after it
        reads uninitialised counts)."""
        self.count += 1
        if args and isinstance(args[0], torch.Tensor):
            with _disable_current_modes():
                args[0].zero_()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in FREE:
            self.count += 1
        return func(*args, **(kwargs or {}))


def launches(fused: bool, monkeypatch, fp8: bool = False, sliced: bool = False) -> tuple[int, int]:
    """(dispatch, combine) kernel launches of a low-latency layer: hidden 7168, top-8 of 256
    experts, 8 tokens, 2 ranks (this rank's all-to-alls move nothing: only launches count);
    ``fp8``: the dispatch's rows in fp8 (no combine: 0); ``sliced``: the ids a slice of a wider
    tensor (an argsort's first k columns)."""
    counter = Launches()
    monkeypatch.setattr(runtime_moe, "FUSED", fused)
    monkeypatch.setattr(runtime_moe, "current_stream", lambda device: 0)
    monkeypatch.setattr(runtime_moe, "capturing", lambda: False)
    comm = types.SimpleNamespace(world=2, device_index=0, kernel_together=lambda key: counter.note)
    scratch = runtime_moe.Layer(comm, None, None).scratch  # the buffers a communicator's calls reuse
    tokens, topk, experts, hidden = 8, 8, 256, 7168
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((tokens, hidden), generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])[:, :topk]
    ids = ids if sliced else ids.contiguous()
    w = torch.rand((tokens, topk), generator=gen)
    _, _, handle = moe.dispatch_with(counter.note, 2, x, ids, w, experts, tokens,  # a real handle, uncounted
                                     pack_for=functools.partial(runtime_moe.pack, comm), scratch=scratch, fp8=fp8)
    weighted_sum = runtime_moe.weighted_sum(comm, torch.bfloat16, hidden, topk)
    counter.count = 0
    with counter:
        expert_x, _, _ = moe.dispatch_with(counter.note, 2, x, ids, w, experts, tokens, fp8=fp8,
                                           placement_for=functools.partial(runtime_moe.placement, comm),
                                           pack_for=functools.partial(runtime_moe.pack, comm), scratch=scratch,
                                           route_for=functools.partial(runtime_moe.route, comm))
    dispatch = counter.count
    if fp8:
        return dispatch, 0
    expert_out = torch.zeros_like(expert_x)
    counter.count = 0
    with counter:
        moe.combine_with(counter.note, expert_out, handle, scratch=scratch,
                         kernels=lambda: (weighted_sum, runtime_moe.gather(comm, hidden * expert_out.element_size()), None))
    return dispatch, counter.count


def test_the_fused_kernels_cut_the_launches_around_our_all_to_alls(monkeypatch) -> None:
    torch_steps = launches(False, monkeypatch)
    fused = launches(True, monkeypatch)
    print(f"\nlaunches per call (dispatch, combine): torch steps {torch_steps}, fused kernels {fused}")
    assert fused[0] <= 4 and fused[1] <= 3, fused  # routing, packing, the one all-to-all, placement
    assert 2 * fused[0] < torch_steps[0] and 3 * fused[1] < torch_steps[1], (torch_steps, fused)


def test_the_fp8_dispatch_launches_no_more_than_the_bf16_one(monkeypatch) -> None:
    """One kernel (collectives.algorithms.moe_pack) makes the rows sent, quantized, packed and
    gathered with fp8, gathered with bf16: the fp8 dispatch launches as many kernels as the bf16
    one, each moving half the bytes; with the torch steps, some fifteen more."""
    bf16 = launches(True, monkeypatch)[0]
    fp8 = launches(True, monkeypatch, fp8=True)[0]
    torch_steps = launches(False, monkeypatch, fp8=True)[0]
    print(f"\nfused dispatch launches: bf16 {bf16}, fp8 {fp8} (torch steps, fp8: {torch_steps})")
    assert fp8 <= bf16 < torch_steps - 15, (bf16, fp8, torch_steps)


def test_sliced_ids_are_read_where_they_lie(monkeypatch) -> None:
    """The routing kernel reads ids at their row stride: ids sliced from a wider tensor launch no
    copy first."""
    assert launches(True, monkeypatch, sliced=True)[0] == launches(True, monkeypatch)[0]


def test_the_kernels_small_outputs_lie_in_one_allocation_per_call_where_the_handle_reads_them(monkeypatch) -> None:
    """The routing and placement kernels write the handle's tensors and the counts into one
    allocation of the call (:class:`collectives.runtime.moe.Carve`): each field's address in their
    arguments is the one of the handle's view (made where read), the fields apart, and a second
    call's allocation another (a handle kept for a later combine is never rewritten); the combine's
    kernels read the same addresses."""
    from collectives.algorithms.moe_combine import MOE_COMBINE, MoeCombineKey
    from collectives.algorithms.moe_gather import MOE_GATHER, MoeGatherKey
    from collectives.algorithms.moe_place import MOE_PLACE, MoePlaceKey
    from collectives.algorithms.moe_route import MOE_ROUTE, MoeRouteKey

    monkeypatch.setattr(runtime_moe, "FUSED", True)
    monkeypatch.setattr(runtime_moe, "current_stream", lambda device: 0)
    seen: dict[type, tuple] = {}
    comm = types.SimpleNamespace(world=2, device_index=0,
                                 kernel_together=lambda key: lambda *args: seen.__setitem__(type(key), args))
    scratch = runtime_moe.Layer(comm, None, None).scratch
    layer = runtime_moe.Layer(comm, None, None)
    tokens, topk, experts, hidden = 4, 2, 8, 64
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((tokens, hidden), generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    w = torch.rand((tokens, topk), generator=gen)

    def dispatch(apart=False):
        return moe.dispatch_with(lambda *a, **k: None, 2, x, ids, w, experts, tokens, scratch=scratch,
                                 placement_for=layer.placement_for, pack_for=layer.pack_for,
                                 route_for=layer.route_for, plans=layer.plan, apart=apart)

    expert_x, counts, h = dispatch()
    route = dict(zip(MOE_ROUTE.index, seen[MoeRouteKey]))
    place = dict(zip(MOE_PLACE.index, seen[MoePlaceKey]))
    fields = {"order": route["order"], "valid": route["valid"], "send_splits": route["send_splits"],
              "slots": route["slots"], "place": place["place"], "kept": place["kept"],
              "dropped": place["lost"], "recv_splits": place["recv_splits"]}
    for name, address in fields.items():
        assert getattr(h, name).data_ptr() == address, name
    assert counts.data_ptr() == place["expert_counts"] and counts.shape == (experts // 2,)
    spans = sorted((getattr(h, n).data_ptr(), getattr(h, n).nbytes) for n in fields)
    spans.append((counts.data_ptr(), counts.nbytes))
    spans.sort()
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:])), spans  # apart
    assert h.order.shape == h.valid.shape == (tokens * topk,) and h.dropped.shape == ()
    assert h.place.shape == h.kept.shape and h.send_splits.shape == h.recv_splits.shape == (2,)
    moe.combine_with(lambda *a: None, torch.zeros_like(expert_x), h, moe.plain, scratch, layer.plan,
                     lambda: (layer.launch(runtime_moe.weighted_sum, torch.bfloat16, hidden, topk),
                              layer.launch(runtime_moe.gather, hidden * 2), None))
    gather = dict(zip(MOE_GATHER.index, seen[MoeGatherKey]))
    combine = dict(zip(MOE_COMBINE.index, seen[MoeCombineKey]))
    assert (gather["place"], gather["kept"], gather["send_splits"], gather["splits"]) == (
        fields["place"], fields["kept"], fields["send_splits"], fields["recv_splits"])
    assert (combine["slots"], combine["valid"]) == (fields["slots"], fields["valid"])
    _, _, again = dispatch()
    assert dict(zip(MOE_ROUTE.index, seen[MoeRouteKey]))["order"] != fields["order"]
    assert again.carved.blob.data_ptr() != h.carved.blob.data_ptr()
    # apart (the torch operator's outputs, which must not alias): each its own allocation, the same wiring
    _, counts, h = dispatch(apart=True)
    tensors = [counts, *moe.handle_tensors(h)]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)
    route = dict(zip(MOE_ROUTE.index, seen[MoeRouteKey]))
    place = dict(zip(MOE_PLACE.index, seen[MoePlaceKey]))
    assert (h.order.data_ptr(), h.valid.data_ptr(), h.place.data_ptr(), counts.data_ptr()) == (
        route["order"], route["valid"], place["place"], place["expert_counts"])


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_the_one_exchange_is_wired_to_the_routing_and_the_placement(monkeypatch, fp8: bool) -> None:
    """The kernels' arguments around a low-latency dispatch's one all-to-all (what only GPUs run):
    the routing writes the counts' rows (header_rows of the rows' layout) into the rows the
    exchange sends and the chunks' rows into its in_splits; the exchange is bounded, into a region
    of max_tokens + header rows per source; the placement reads the counts and rows there."""
    from collectives.algorithms.moe_place import MOE_PLACE, MoePlaceKey
    from collectives.algorithms.moe_route import MOE_ROUTE, MoeRouteKey

    monkeypatch.setattr(runtime_moe, "FUSED", True)
    monkeypatch.setattr(runtime_moe, "current_stream", lambda device: 0)
    seen: dict[type, tuple] = {}
    comm = types.SimpleNamespace(world=2, device_index=0,
                                 kernel_together=lambda key: lambda *args: seen.__setitem__(type(key), args))
    layer = runtime_moe.Layer(comm, None, None)
    tokens, topk, experts, hidden, max_tokens = 4, 2, 8, 64, 6
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((tokens, hidden), generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    exchanges: list = []

    def exchange(out, inp, out_splits, in_splits, **kw):
        exchanges.append((out, inp, out_splits, in_splits, kw))

    moe.dispatch_with(exchange, 2, x, ids, torch.rand((tokens, topk), generator=gen), experts, max_tokens, fp8=fp8,
                      scratch=layer.scratch, placement_for=layer.placement_for, pack_for=layer.pack_for,
                      route_for=layer.route_for, plans=layer.plan)
    (out, inp, out_splits, in_splits, kw), = exchanges
    layout = moe.wire(hidden, 2, fp8, topk)
    head = moe.header_rows(experts // 2, layout)
    route = dict(zip(MOE_ROUTE.index, seen[MoeRouteKey]))
    place = dict(zip(MOE_PLACE.index, seen[MoePlaceKey]))
    assert kw == {"bounded": True} and head >= 1
    assert out.view(torch.uint8).shape == (2 * (max_tokens + head), layout.bytes)
    assert (route["head_rows"], route["row_bytes"]) == (head, layout.bytes)
    assert (route["sent"], route["row_splits"]) == (inp.data_ptr(), in_splits.data_ptr())
    assert inp.view(torch.uint8).shape[0] >= tokens * min(topk, 2) + 2 * head  # every rank's head and rows
    assert place["counts"] == place["received"] == out.data_ptr() and place["rows"] == out.shape[0]
    assert out_splits.dtype == in_splits.dtype == torch.int64 and out_splits.data_ptr() != in_splits.data_ptr()
