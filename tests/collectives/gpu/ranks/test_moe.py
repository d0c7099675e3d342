"""MoE dispatch and combine (collectives.moe, both modes) on real GPUs, bit for bit against the
reference layer (collectives.reference.moe).

Each check is a function of ``(rank, world, group)``, so it runs under torchrun and in a
one-GPU world of threads alike; every rank builds every rank's routing from the same seed.
    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_moe.py
"""

from __future__ import annotations

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from tests.collectives.gpu.ranks.collectives_cases import comm  # noqa: E402,F401  (the communicator fixture)
from collectives.reference.moe import expert_fn, reference, routing  # noqa: E402


def layer(rank, world, group, experts, topk, tokens, max_tokens, hidden, seed, dtype=torch.bfloat16, sliced=False):
    """One dispatch, the experts, one combine, checked on this rank (``sliced``: the ids the first
    columns of a wider tensor, as a router's argsort gives them)."""
    from collectives import moe

    xs, ids, ws = routing(world, experts, topk, tokens, seed, hidden, dtype)
    local = experts // world
    x, i, w = xs[rank].cuda(), ids[rank].cuda(), ws[rank].cuda()
    if sliced:
        i = torch.cat([i, torch.full_like(i, -1)], 1)[:, :topk]  # (the other columns: ids out of range)
    expert_x, counts, handle = moe.dispatch(x, i, w, experts, max_tokens=max_tokens, group=group)
    out_rows = torch.stack([expert_fn(expert_x[le], rank * local + le) for le in range(local)])
    out = moe.combine(out_rows, handle, group=group)
    per_expert, outs = reference(world, experts, xs, ids, ws)
    for le in range(local):
        want = per_expert[rank * local + le]
        assert int(counts[le]) == want.shape[0]
        assert torch.equal(expert_x[le, :want.shape[0]].cpu().view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(out.cpu().view(torch.uint8), outs[rank].view(torch.uint8))


def check_routings(rank: int, world: int, group) -> None:
    """Random routings, top-1 and top-8, hidden 128 and 7168, 1 token, a rank with none; ids
    sliced from a wider tensor (read at their stride)."""
    for case, (topk, hidden, tokens) in enumerate([(1, 128, 7), (8, 128, 16), (8, 7168, 3), (2, 7168, 1)]):
        counts = [tokens if r != world - 1 else (0 if case == 3 else tokens // 2) for r in range(world)]
        layer(rank, world, group, 8 * world, topk, counts, max(tokens, 1), hidden, case)
    layer(rank, world, group, 8 * world, 4, [5] * world, 5, 128, 9, sliced=True)


def capture(graph):
    """A capture that several ranks of a one-GPU world may make at once (collectives.testing's,
    where it exists; it works under torchrun too), else torch's."""
    try:
        from collectives.testing import capture as world_capture
    except ImportError:
        return torch.cuda.graph(graph)
    return world_capture(graph)


def check_graph_replays_with_new_routings(rank: int, world: int, group, replays: int = 20) -> None:
    """Dispatch, experts and combine captured once, replayed on routings copied into the inputs."""
    from collectives import moe

    experts, topk, tokens, hidden = 4 * world, 2, 8, 256
    local = experts // world
    x = torch.zeros((tokens, hidden), dtype=torch.bfloat16, device="cuda")
    ids = torch.zeros((tokens, topk), dtype=torch.int64, device="cuda")
    w = torch.zeros((tokens, topk), device="cuda")

    def step():
        ex, counts, handle = moe.dispatch(x, ids, w, experts, max_tokens=tokens, group=group)
        y = torch.stack([expert_fn(ex[le], rank * local + le) for le in range(local)])
        return ex, counts, moe.combine(y, handle, group=group)

    def load(seed):
        xs, i, ws = routing(world, experts, topk, [tokens] * world, seed, hidden, torch.bfloat16)
        x.copy_(xs[rank])
        ids.copy_(i[rank])
        w.copy_(ws[rank])
        return xs, i, ws

    load(0)
    step()  # warm: compiles, plans, caches
    torch.cuda.current_stream().synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        ex, counts, out = step()
    import collectives

    for seed in range(1, replays + 1):
        xs, i, ws = load(seed)
        graph.replay()
        collectives.synchronize(group)  # a call that failed (a timeout) raises here, not as wrong rows below
        per_expert, outs = reference(world, experts, xs, i, ws)
        assert torch.equal(out.cpu().view(torch.uint8), outs[rank].view(torch.uint8)), seed
        for le in range(local):
            assert int(counts[le]) == per_expert[rank * local + le].shape[0], seed


def check_fp8(rank: int, world: int, group) -> None:
    """fp8 dispatch: each expert row is its token's e4m3 quantization, bit for bit, with its scale."""
    from collectives import moe

    experts, topk = 4 * world, 2
    xs, ids, ws = routing(world, experts, topk, [6] * world, 5, 7168, torch.bfloat16)
    ex, counts, handle = moe.dispatch(xs[rank].cuda(), ids[rank].cuda(), ws[rank].cuda(), experts, max_tokens=6,
                                      fp8=True, group=group)
    qs = [moe.quantize(x) for x in xs]  # on the CPU: the same bits as on the GPU (one rounding of one f32 value)
    rows, _ = reference(world, experts, [q.view(torch.uint8) for q, _ in qs], ids, ws)
    scales, _ = reference(world, experts, [s[:, None] for _, s in qs], ids, ws)
    local = experts // world
    for le in range(local):
        n = int(counts[le])
        assert torch.equal(ex[le, :n].cpu().view(torch.uint8), rows[rank * local + le])
        assert torch.equal(handle.scales[le, :n].cpu(), scales[rank * local + le][:, 0])


def check_throughput(rank: int, world: int, group) -> None:
    """Throughput mode: uneven token counts (one rank with none), packed exact expert rows and
    the combine, bit for bit; hidden 7168 at a few hundred tokens."""
    import collectives
    from collectives import moe

    for case, (topk, hidden, tokens) in enumerate([(2, 128, [40, 0, 17, 9]), (8, 7168, [300, 120, 64, 257])]):
        experts = 8 * world
        counts_in = [tokens[r % len(tokens)] for r in range(world)]
        xs, ids, ws = routing(world, experts, topk, counts_in, 100 + case, hidden, torch.bfloat16)
        local = experts // world
        ex, counts, handle = moe.dispatch(xs[rank].cuda(), ids[rank].cuda(), ws[rank].cuda(), experts,
                                          mode="throughput", group=group)
        # (its stream waited for before the counts are read: in a one-GPU world a thread waiting in a copy
        # to the host holds the other ranks' copies to the GPU, a slower rank's inputs among them)
        collectives.synchronize(group)
        starts = [int(v) for v in torch.cumsum(counts, 0) - counts]
        out_rows = torch.cat([expert_fn(ex[starts[le]:starts[le] + int(counts[le])], rank * local + le)
                              for le in range(local)])
        out = moe.combine(out_rows, handle, group=group)
        collectives.synchronize(group)
        per_expert, outs = reference(world, experts, xs, ids, ws)
        want = torch.cat([per_expert[rank * local + le] for le in range(local)])
        assert torch.equal(ex.cpu().view(torch.uint8), want.view(torch.uint8)), case
        assert torch.equal(out.cpu().view(torch.uint8), outs[rank].view(torch.uint8)), case


CHECKS = [check_routings, check_graph_replays_with_new_routings, check_fp8, check_throughput]
#: The checks again with the dispatch's placement and the combine's weighted sum as kernels.
FUSED_CHECKS = [check_routings, check_graph_replays_with_new_routings, check_fp8, check_throughput]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_moe(comm, check, monkeypatch) -> None:  # noqa: F811  (the fixture)
    """The checks with the local steps in torch (``COLLECTIVES_MOE_FUSED=0``)."""
    from collectives.runtime import moe as runtime_moe

    monkeypatch.setattr(runtime_moe, "FUSED", False)
    check(comm.rank, comm.world, None)


@pytest.mark.parametrize("check", FUSED_CHECKS, ids=lambda c: c.__name__)
def test_moe_with_fused_kernels(comm, check, monkeypatch) -> None:  # noqa: F811  (the fixture)
    """The same checks with the dispatch's placement and the combine's weighted sum in one
    kernel each (the default: collectives.runtime.moe): the same bits."""
    from collectives.runtime import moe as runtime_moe

    monkeypatch.setattr(runtime_moe, "FUSED", True)
    check(comm.rank, comm.world, None)


@pytest.mark.parametrize("check", [check_routings, check_graph_replays_with_new_routings], ids=lambda c: c.__name__)
def test_moe_with_the_two_kernel_combine(comm, check, monkeypatch) -> None:  # noqa: F811  (the fixture)
    """The low-latency checks with the combine's two kernels (``COLLECTIVES_MOE_REGIONS=1``:
    the rows sent back stored straight into their sources' regions, then the weighted sum
    behind the waits; collectives.runtime.moe.regions_combine): the same bits."""
    from collectives.runtime import moe as runtime_moe

    monkeypatch.setattr(runtime_moe, "FUSED", True)
    monkeypatch.setattr(runtime_moe, "REGIONS", True)
    check(comm.rank, comm.world, None)
