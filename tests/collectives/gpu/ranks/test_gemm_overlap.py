"""gemm_reduce_scatter and all_gather_gemm on real GPUs (peer backend), against torch.matmul
and the reference reduction.

Run under torchrun on 2 or 4 GPUs:
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_gemm_overlap.py
Small-integer inputs make every product and partial sum exact, so those results are compared
bit for bit; random inputs are compared with a bf16/f16 tolerance.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from tests.collectives.gpu.ranks.collectives_cases import HASH, comm  # noqa: F401 (comm: the fixture)
from collectives.testing import capture  # noqa: E402
from tests.support.world_support import warmup_stream  # noqa: E402

from collectives import reference

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from collectives.overlap import EAGER_PATHS  # noqa: E402

KINDS = {"bf16": torch.bfloat16, "f16": torch.float16}
#: (rows of a per rank / per shard, K, N): aligned (TMA) and unaligned (one element at a time).
SHAPES = [(64, 64, 128), (7, 60, 100), (256, 64, 512)]




def small_ints(salt: int, rows: int, cols: int, dtype: str) -> torch.Tensor:
    """Integers in [-2, 2] (exact in every dtype; with K <= 64 every dot product is <= 256)."""
    i = torch.arange(rows * cols, dtype=torch.int64, device="cuda")
    return ((i * HASH + salt * 97) % 5 - 2).to(KINDS[dtype]).view(rows, cols)


def flags_balanced(comm) -> bool:
    """Every slot's posts were taken by its waits (read after a synchronize)."""
    return torch.equal(comm.stream_flags.flags[0], comm.stream_flags.flags[1])


def want_reduce_scatter(world: int, rank: int, salts: list[int], shape: tuple[int, int, int], dtype: str,
                        b_salt: int = 100) -> np.ndarray:
    """This rank's rows of sum_r small_ints(salts[r], W*m, k) @ small_ints(b_salt + r, k, n)."""
    m, k, n = shape
    partials = [torch.mm(small_ints(salts[r], world * m, k, dtype), small_ints(b_salt + r, k, n, dtype))
                .float().cpu().numpy().ravel() for r in range(world)]
    return reference.reduce_scatter(partials, dtype)[rank].reshape(m, n)


@pytest.mark.parametrize("path, schedule", [("blocks", "comm"), ("one", "comm"), ("blocks", "alternate")])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(KINDS))
def test_gemm_reduce_scatter_is_exact(comm, monkeypatch, dtype: str, shape: tuple[int, int, int], path: str,
                                      schedule: str) -> None:
    import collectives
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)  # (collectives.config.OVERLAP_SCHEDULE)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS[path])
    m, k, n = shape
    world, rank = comm.world, comm.rank
    out = collectives.gemm_reduce_scatter(small_ints(rank, world * m, k, dtype), small_ints(100 + rank, k, n, dtype))
    collectives.synchronize()
    assert out.shape == (m, n)
    assert np.array_equal(out.float().cpu().numpy(), want_reduce_scatter(world, rank, list(range(world)), shape, dtype))


@pytest.mark.parametrize("path, start, schedule", [("blocks", "side", "comm"), ("blocks", "first", "comm"),
                                                   ("one", "first", "comm"), ("blocks", "side", "alternate"),
                                                   ("blocks", "first", "alternate")])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(KINDS))
def test_all_gather_gemm_is_exact(comm, monkeypatch, dtype: str, shape: tuple[int, int, int], start: str,
                                  path: str, schedule: str) -> None:
    import collectives
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)
    monkeypatch.setattr(config, "OVERLAP_START", start)  # (collectives.config.OVERLAP_START)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS[path])
    m, k, n = shape
    shards = [small_ints(r, m, k, dtype) for r in range(comm.world)]
    b = small_ints(100, k, n, dtype)
    out = torch.full((comm.world * m, n), -7, dtype=KINDS[dtype], device="cuda")
    assert collectives.all_gather_gemm(shards[comm.rank], b, out=out) is out
    collectives.synchronize()
    assert torch.equal(out, torch.mm(torch.cat(shards), b))


@pytest.mark.parametrize("dtype", list(KINDS))
def test_random_inputs_match_matmul(comm, dtype: str) -> None:
    import collectives

    world, m, k, n = comm.world, 512, 1024, 1024
    gen = torch.Generator(device="cuda")
    a = [torch.randn(world * m, k, device="cuda", generator=gen.manual_seed(r)).to(KINDS[dtype]) for r in range(world)]
    b = [torch.randn(k, n, device="cuda", generator=gen.manual_seed(50 + r)).to(KINDS[dtype]) / 32 for r in range(world)]
    got = collectives.gemm_reduce_scatter(a[comm.rank], b[comm.rank])
    gathered = collectives.all_gather_gemm(a[comm.rank][:m], b[0])
    collectives.synchronize()
    partials = [torch.mm(a[r], b[r]).float().cpu().numpy().ravel() for r in range(world)]
    want = reference.reduce_scatter(partials, dtype)[comm.rank].reshape(m, n)
    assert np.allclose(got.float().cpu().numpy(), want, rtol=2**-5, atol=2**-4)
    full = torch.mm(torch.cat([a[r][:m] for r in range(world)]), b[0])
    assert torch.allclose(gathered.float(), full.float(), rtol=2**-5, atol=2**-4)


@pytest.mark.parametrize("schedule", ["comm", "alternate"])
@pytest.mark.parametrize("start", ["side", "first"])
def test_cuda_graph_replay(comm, monkeypatch, start: str, schedule: str) -> None:
    """Graph replays and eager calls of the same calls, interleaved: exact every round (the
    events between the streams and the barriers were captured); either all-gather start.  (At
    these sizes the eager calls, the warm-up included, run one GEMM and one collective, and the
    captured ones the blocks: the warm-up made what the capture needs.)"""
    import collectives
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_START", start)
    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)
    world, m, k, n = comm.world, 64, 64, 256
    a = torch.empty(world * m, k, dtype=torch.bfloat16, device="cuda")
    b = small_ints(7 + comm.rank, k, n, "bf16")
    shard = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
    rs_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ag_out = torch.empty(world * m, n, dtype=torch.bfloat16, device="cuda")
    b0 = small_ints(7, k, n, "bf16")
    stream = warmup_stream()
    with torch.cuda.stream(stream):  # the same calls eagerly first: workspace and kernels
        collectives.gemm_reduce_scatter(a.zero_(), b, out=rs_out)
        collectives.all_gather_gemm(shard.zero_(), b0, out=ag_out)
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        collectives.gemm_reduce_scatter(a, b, out=rs_out)
        collectives.all_gather_gemm(shard, b0, out=ag_out)
    for round_ in range(6):
        a.copy_(small_ints(comm.rank + round_, world * m, k, "bf16"))
        shard.copy_(small_ints(comm.rank + round_, m, k, "bf16"))
        if round_ % 2:
            collectives.gemm_reduce_scatter(a, b, out=rs_out)
            collectives.all_gather_gemm(shard, b0, out=ag_out)
        else:
            graph.replay()
        collectives.synchronize()
        want = want_reduce_scatter(world, comm.rank, [r + round_ for r in range(world)], (m, k, n), "bf16", 7)
        assert np.array_equal(rs_out.float().cpu().numpy(), want), round_
        shards = torch.cat([small_ints(r + round_, m, k, "bf16") for r in range(world)])
        assert torch.equal(ag_out, torch.mm(shards, b0)), round_


@pytest.mark.parametrize("path", ["blocks", "one", "mixed"])
def test_back_to_back_calls_with_changing_shapes_stay_exact(comm, monkeypatch, path: str) -> None:
    """50 calls queued without a host sync between them, both functions, shapes changing every
    call (aligned and not), as blocks, as one GEMM and one collective, or each call the other
    way from the one before: every result exact."""
    import collectives
    from collectives import config

    world, rank = comm.world, comm.rank
    if path != "mixed":
        monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS[path])
    shapes = [(64, 64, 128), (1, 8, 8), (7, 60, 100), (256, 64, 512), (3, 16, 24), (33, 40, 64)]
    for m, k, n in shapes:  # grow the workspaces first: growing one synchronises
        collectives.gemm_reduce_scatter(small_ints(rank, world * m, k, "bf16"), small_ints(100 + rank, k, n, "bf16"))
        collectives.all_gather_gemm(small_ints(rank, m, k, "bf16"), small_ints(100, k, n, "bf16"))
    collectives.synchronize()
    calls = []
    for i in range(50):
        shape = m, k, n = shapes[i % len(shapes)]
        if path == "mixed":
            monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", list(EAGER_PATHS.values())[i // 2 % 2])
        if i % 2:
            a = small_ints(i + rank, world * m, k, "bf16")
            calls.append(("rs", i, shape, collectives.gemm_reduce_scatter(a, small_ints(100 + rank, k, n, "bf16"))))
        else:
            shard = small_ints(i + rank, m, k, "bf16")
            calls.append(("ag", i, shape, collectives.all_gather_gemm(shard, small_ints(100, k, n, "bf16"))))
    collectives.synchronize()
    for kind, i, (m, k, n), got in calls:
        salts = [i + r for r in range(world)]
        if kind == "rs":
            assert np.array_equal(got.float().cpu().numpy(), want_reduce_scatter(world, rank, salts, (m, k, n), "bf16")), i
        else:
            want = torch.mm(torch.cat([small_ints(s, m, k, "bf16") for s in salts]), small_ints(100, k, n, "bf16"))
            assert torch.equal(got, want), i


def test_unposted_flag_wait_times_out_and_the_communicator_stays_usable(comm, monkeypatch) -> None:
    """A wait whose flag is never posted raises CollectiveTimeout within the (shortened) bound
    instead of hanging; so does one whose post comes only after the bound, after which the
    counts are matched again; then the overlap calls are exact again."""
    import collectives
    from collectives.config import FLAG_SLOTS

    slot = FLAG_SLOTS - 1  # not one of the overlap functions' slots
    comm.stream_flags.post(slot)  # compiled, and a matched pair passes
    comm.stream_flags.wait(slot)
    collectives.synchronize()
    saved, comm.errors.timeout_s = comm.timeout_s, 1.0
    try:
        start = time.monotonic()
        with pytest.raises(collectives.CollectiveTimeout, match="flag wait"):
            comm.stream_flags.wait(slot)
            collectives.synchronize()
        assert time.monotonic() - start < comm.timeout_s + 5
        assert flags_balanced(comm)
        with pytest.raises(collectives.CollectiveTimeout, match="flag wait"):
            comm.stream_flags.wait(slot)
            comm.stream_flags.post(slot)  # too late: the wait took nothing
            collectives.synchronize()
        assert flags_balanced(comm)
    finally:
        comm.errors.timeout_s = saved
    comm.ctx.host_barrier()
    test_gemm_reduce_scatter_is_exact(comm, monkeypatch, "bf16", SHAPES[0], "blocks", "comm")
    test_all_gather_gemm_is_exact(comm, monkeypatch, "bf16", SHAPES[0], "side", "blocks", "comm")


def test_bad_shapes_and_dtypes_are_refused(comm) -> None:
    import collectives

    b = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(collectives.CollectiveError, match="multiple of world_size"):
        collectives.gemm_reduce_scatter(torch.ones(comm.world * 4 + 1, 16, dtype=torch.bfloat16, device="cuda"), b)
    with pytest.raises(collectives.CollectiveError, match="bf16 or f16"):
        collectives.all_gather_gemm(torch.ones(4, 16, device="cuda"), b.float())
    with pytest.raises(collectives.CollectiveError, match="inner sizes"):
        collectives.all_gather_gemm(torch.ones(4, 8, dtype=torch.bfloat16, device="cuda"), b)
    with pytest.raises(collectives.CollectiveError, match="out must be"):
        collectives.gemm_reduce_scatter(torch.ones(comm.world * 4, 16, dtype=torch.bfloat16, device="cuda"), b,
                                        out=torch.empty(5, 16, dtype=torch.bfloat16, device="cuda"))
