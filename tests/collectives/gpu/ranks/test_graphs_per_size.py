"""One CUDA graph per size, captured smallest first and largest first (as inference servers do),
then every graph replayed and checked against the reference: no graph may lose its staging,
result or workspace memory to a later, larger warm-up (tests/collectives/runtime/test_plan_pinning.py is the model).

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_graphs_per_size.py
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.collectives.gpu.ranks.collectives_cases import comm, device_values, values  # noqa: F401 (comm: the fixture)
from tests.collectives.gpu.ranks.test_gemm_overlap import small_ints, want_reduce_scatter
from collectives.testing import capture  # noqa: E402
from tests.support.world_support import warmup_stream  # noqa: E402

from collectives import reference

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")

#: 16 sizes (bf16 elements per rank, multiples of 64) from 2 KB to 6 MB: past several staging capacities.
SIZES = [round(2 ** (10 + 0.8 * i)) // 64 * 64 for i in range(16)]
CASES = [("all_reduce", a) for a in ("one_shot", "two_shot", "tma", "push", "lamport")] + \
        [("reduce_scatter", a) for a in ("one_shot", "tma", "push", "lamport")] + \
        [("all_gather", a) for a in ("one_shot", "tma", "push", "lamport")]


def _capture(fn) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up eagerly on a side stream, then capture it."""
    stream = warmup_stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.current_stream().synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        fn()
    return graph


def _collective_graph(comm, collective: str, algorithm: str, n: int):
    """A graph of ``collective`` on ``n`` elements per rank, reading ``source``; and its check."""
    import collectives

    world, rank = comm.world, comm.rank
    count = world * n if collective == "reduce_scatter" else n
    source = torch.empty(count, dtype=torch.bfloat16, device="cuda")
    t = torch.empty_like(source)
    out = torch.empty(world * n if collective == "all_gather" else n, dtype=torch.bfloat16, device="cuda")

    def fn() -> None:
        t.copy_(source)
        if collective == "all_reduce":
            collectives.all_reduce(t, algorithm=algorithm, backend="peer")
        elif collective == "reduce_scatter":
            collectives.reduce_scatter(out, t, algorithm=algorithm, backend="peer")
        else:
            collectives.all_gather(out, t, algorithm=algorithm, backend="peer")

    def check(salt: int) -> None:
        inputs = [reference.round_to(values(r + salt, count), "bf16") for r in range(world)]
        if collective == "all_reduce":
            want, got = reference.all_reduce(inputs, "bf16"), t
        elif collective == "reduce_scatter":
            want, got = reference.reduce_scatter(inputs, "bf16")[rank], out
        else:
            want, got = reference.all_gather(inputs), out
        assert np.array_equal(got.float().cpu().numpy(), want), (collective, algorithm, n, salt)

    source.copy_(device_values(rank, count, "bf16"))
    return _capture(fn), lambda salt: source.copy_(device_values(rank + salt, count, "bf16")), check


@pytest.mark.parametrize("order", ["increasing", "decreasing"])
@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_graphs_per_size_replay_correctly(comm, collective: str, algorithm: str, order: str) -> None:
    import collectives
    from collectives.config import LAMPORT_GATHER_MAX_BYTES, LAMPORT_MAX_BYTES

    most = LAMPORT_GATHER_MAX_BYTES if collective == "all_gather" else LAMPORT_MAX_BYTES
    sizes = [n for n in SIZES if algorithm != "lamport" or 2 * n <= most]  # a block per Lamport slot
    sizes = sizes if order == "increasing" else sizes[::-1]
    graphs = [_collective_graph(comm, collective, algorithm, n) for n in sizes]
    for salt in (1, 2):
        for graph, feed, check in graphs:
            feed(salt)
            graph.replay()
            collectives.synchronize()
            check(salt)


@pytest.mark.parametrize("order", ["increasing", "decreasing"])
@pytest.mark.parametrize("function", ["gemm_reduce_scatter", "all_gather_gemm"])
def test_overlap_graphs_per_batch_size_replay_correctly(comm, function: str, order: str) -> None:
    """A graph per batch size (rows), captured smallest first and largest first, all sharing
    the overlap's workspace slot and side stream, each replays exactly.  (The inputs are the
    test's to keep alive, as for any CUDA graph: without that, on 2 x H100, the caching
    allocator gave a later batch's tensors their memory and every replay read those.)"""
    import collectives

    world, rank = comm.world, comm.rank
    k, n = 64, 128
    rows = [8 * world * (i + 1) for i in range(16)]
    rows = rows if order == "increasing" else rows[::-1]
    graphs = []
    for m in rows:
        if function == "gemm_reduce_scatter":
            a, b = small_ints(rank, world * m, k, "bf16"), small_ints(100 + rank, k, n, "bf16")
            out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
            graph = _capture(lambda a=a, b=b, out=out: collectives.gemm_reduce_scatter(a, b, out))
            want = want_reduce_scatter(world, rank, list(range(world)), (m, k, n), "bf16")
        else:
            a, b = small_ints(rank, m, k, "bf16"), small_ints(100, k, n, "bf16")
            out = torch.empty((world * m, n), dtype=torch.bfloat16, device="cuda")
            graph = _capture(lambda a=a, b=b, out=out: collectives.all_gather_gemm(a, b, out))
            whole = torch.cat([small_ints(r, m, k, "bf16") for r in range(world)])
            want = torch.mm(whole, b).float().cpu().numpy()
        graphs.append((graph, out, want, (a, b)))  # a graph reads a and b where they were: keep them
    for graph, out, want, _ in graphs:
        out.zero_()
        graph.replay()
        collectives.synchronize()
        assert np.array_equal(out.float().cpu().numpy(), want)
