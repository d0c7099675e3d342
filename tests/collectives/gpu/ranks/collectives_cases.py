"""The cases of the collectives on real GPUs, against the reference model, and their helpers:
``test_collectives_peer.py`` runs them with the peer backend (and the cases that take no
backend), ``test_collectives_emulated.py`` with the multicast kernels in emulation
(``multicast_emulated``: every multimem access is unicast).  The ``backend`` fixture here
gives both (other GPU tests use it); each of those modules fixes its own.

Never launches a multimem kernel: NVLink multicast stays off (the context's backend is peer,
and the runtime refuses any kernel whose PTX holds multimem).
"""

from __future__ import annotations


import numpy as np
import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")

from collectives import reference  # noqa: E402
from collectives.testing import capture  # noqa: E402
from tests.support.world_support import warmup_stream  # noqa: E402

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
         "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SIZES = [1, 7, 1000, 3 * 4096 + 5, (1 << 20) + 3]
HASH = 2654435761


@pytest.fixture(params=["peer", "multicast_emulated"])
def backend(request) -> str:
    return request.param


def fp8_refused(backend: str, dtype: str) -> bool:
    """Emulation validates the multimem forms: fp8 ones need sm_100a, so on Hopper the
    emulated backend refuses fp8 as the multicast backend does."""
    from collectives.dtypes import DTYPES
    from collectives.runtime.kernels import compile_target

    return backend == "multicast_emulated" and DTYPES[dtype].fp8 and not compile_target().startswith("sm_10")


def op_refused(backend: str, dtype: str, op: str) -> bool:
    """multimem.ld_reduce has no min/max of f32: the multicast paths refuse it by name."""
    from collectives.algorithms.rules import multimem_reduces

    return backend == "multicast_emulated" and not multimem_reduces(dtype, op)


@pytest.fixture(scope="module")
def comm():
    """This rank's communicator (tests/support/world_support.py: per rank thread in the world)."""
    from tests.support.world_support import close_rank_context, rank_value

    from collectives.runtime.communicator import communicator

    def make():
        c = communicator()
        assert c.ctx.backend == "peer", "multicast must stay off on these machines"
        return c

    yield rank_value(make)
    torch.cuda.current_stream().synchronize()
    close_rank_context()


def values_at(rank: int, i: np.ndarray) -> np.ndarray:
    """Rank ``rank``'s input at indices ``i`` (float32, before rounding to a dtype)."""
    return (((i.astype(np.int64) * HASH + rank * 97) % 1024) - 512).astype(np.float32) / 64


def values(rank: int, n: int) -> np.ndarray:
    return values_at(rank, np.arange(n))


def device_values(rank: int, n: int, dtype: str) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((((i * HASH + rank * 97) % 1024) - 512).to(torch.float32) / 64).to(TORCH[dtype])


def expected(world: int, n: int, dtype: str, op: str) -> np.ndarray:
    inputs = [reference.round_to(values(r, n), dtype) for r in range(world)]
    return reference.all_reduce(inputs, dtype, op)


def place(comm, x: torch.Tensor, placement: str) -> torch.Tensor:
    """``x`` copied into a symmetric tensor, a plain tensor, or a plain tensor at an
    element offset (not 16-byte aligned)."""
    import collectives

    if placement == "symmetric":
        t = collectives.empty(x.numel(), x.dtype)
    elif placement == "offset":
        t = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:]
    else:
        t = torch.empty_like(x)
    t.copy_(x)
    return t


CASES = [(d, "sum") for d in TORCH] + [("bf16", "max"), ("f32", "min"), ("f16", "max")]


# The memory tests come first: the staging slots are still small, so growing them is cheap.
# Host-bound: in a world of W rank threads it takes about 40 s x W (204 s at W = 5 on an H200),
# about the time of 100 of the file's other tests.
@pytest.mark.shard_weight(100)
def test_100000_calls_over_changing_sizes_and_addresses_keep_memory_bounded(comm) -> None:
    import collectives
    from collectives.config import PLAN_CACHE_SIZE
    from collectives.runtime.staging import capacity

    base = torch.empty(1 << 16, dtype=torch.bfloat16, device="cuda")
    growing = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for n in (3 << 20, 5 << 20, 9 << 20, 17 << 20)]
    allocations = len(comm.ctx._allocs)
    want = comm.world * (comm.world + 1) / 2
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    largest = 0
    for i in range(100_000):
        if i % 25_000 == 24_999:  # a new largest size: every staging slot grows, frees the old
            t = growing[i // 25_000]
        else:  # 8 of every 9 offsets 16-byte aligned; ~2000 sizes x offsets: every call plans anew
            offset = (i * 8 + (i % 9 == 0)) % 4096
            t = base[offset:offset + 64 + (i * 37) % 2000]
        largest = max(largest, t.numel() * 2)
        t.fill_(comm.rank + 1)
        collectives.all_reduce(t, backend="peer")
        bad += (t != want).sum()
    collectives.synchronize()
    assert int(bad) == 0
    assert len(comm.plans) <= PLAN_CACHE_SIZE
    assert len(comm.ctx._allocs) <= allocations + 6  # five staging slots, bf16 Lamport buffers
    unpinned = comm.pool.live_bytes - sum(t.numel() for t in comm.pool.pinned)
    assert unpinned <= 4 * capacity(largest)


def test_graph_replay_after_its_staging_buffer_was_superseded(comm) -> None:
    """A plan made under capture pins its staging buffer: growing the slot later keeps it."""
    import collectives

    n = 3000
    t = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    source = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    stream = warmup_stream()
    with torch.cuda.stream(stream):
        collectives.all_reduce(t, algorithm="one_shot", backend="peer")
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        t.copy_(source)
        collectives.all_reduce(t, algorithm="one_shot", backend="peer")
    captured = comm.pool.current[2]
    bigger = torch.ones(captured.numel(), dtype=torch.bfloat16, device="cuda")  # 2x the bytes: grows
    collectives.all_reduce(bigger, algorithm="two_shot", backend="peer")
    assert comm.pool.current[2] is not captured and any(p is captured for p in comm.pool.pinned)
    for round_ in range(3):
        source.copy_(device_values(comm.rank + round_, n, "bf16"))
        graph.replay()
        collectives.synchronize()
        inputs = [reference.round_to(values(r + round_, n), "bf16") for r in range(comm.world)]
        assert np.array_equal(t.float().cpu().numpy(), reference.all_reduce(inputs, "bf16")), round_
    assert torch.all(bigger == comm.world)


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot", "lamport", "tma", "push"])
def test_plain_tensor_at_a_reused_address(comm, algorithm: str) -> None:
    """Allocate, reduce, free, allocate another tensor at the same address, reduce again."""
    import collectives

    n = 4096 * 5
    sources = [device_values(comm.rank + round_, n, "bf16") for round_ in range(3)]
    for round_ in range(3):
        t = torch.empty(n, dtype=torch.bfloat16, device="cuda")  # the block just freed
        if round_:
            assert t.data_ptr() == address, "the caching allocator did not reuse the address"
        address = t.data_ptr()
        t.copy_(sources[round_])
        collectives.all_reduce(t, algorithm=algorithm, backend="peer")
        collectives.synchronize()
        inputs = [reference.round_to(values(r + round_, n), "bf16") for r in range(comm.world)]
        assert np.array_equal(t.float().cpu().numpy(), reference.all_reduce(inputs, "bf16")), round_
        del t


@pytest.mark.parametrize("placement", ["symmetric", "staged", "offset", "out"])
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot", "lamport", "tma", "push"])
@pytest.mark.parametrize(("dtype", "op"), CASES)
def test_all_reduce_matches_reference(comm, backend: str, dtype: str, op: str, algorithm: str, placement: str) -> None:
    import collectives
    from collectives.config import LAMPORT_MAX_BYTES

    if fp8_refused(backend, dtype):
        with pytest.raises(collectives.MulticastUnavailable, match="sm_100a"):
            collectives.all_reduce(place(comm, device_values(comm.rank, 64, dtype), placement), backend=backend)
        return
    if op_refused(backend, dtype, op):
        with pytest.raises(collectives.CollectiveError, match=f"no {op} of {dtype}"):
            collectives.all_reduce(place(comm, device_values(comm.rank, 64, dtype), placement), op=op,
                                   algorithm=algorithm, backend=backend)
        x = device_values(comm.rank, 64, dtype)
        got = collectives.all_reduce(place(comm, x, placement), op=op)  # auto: the peer backend
        collectives.synchronize()
        assert np.array_equal(got.float().cpu().numpy(), expected(comm.world, 64, dtype, op))
        return
    if placement == "offset" and (algorithm == "tma" or backend == "multicast_emulated"):
        with pytest.raises(collectives.CollectiveError, match="16-byte"):
            collectives.all_reduce(place(comm, device_values(comm.rank, 64, dtype), placement), algorithm=algorithm,
                                   backend=backend)
        return
    for n in SIZES:
        if algorithm == "lamport" and n * TORCH[dtype].itemsize > LAMPORT_MAX_BYTES:
            continue
        x = device_values(comm.rank, n, dtype)
        t = place(comm, x, "staged" if placement == "out" else placement)
        out = torch.empty_like(t) if placement == "out" else None
        result = collectives.all_reduce(t, op=op, algorithm=algorithm, backend=backend, out=out)
        collectives.synchronize()
        got = result.float().cpu().numpy()
        want = expected(comm.world, n, dtype, op)
        assert np.array_equal(got, want), (n, np.flatnonzero(got != want)[:5])
        if placement == "out":
            assert torch.equal(t, x), "out-of-place all_reduce changed its input"


@pytest.mark.parametrize("placement", ["symmetric", "staged"])
@pytest.mark.parametrize("algorithm", ["one_shot", "tma", "push", "lamport", "auto"])
@pytest.mark.parametrize(("dtype", "op"), CASES)
def test_reduce_scatter_matches_reference(comm, backend: str, dtype: str, op: str, algorithm: str, placement: str) -> None:
    import collectives
    from collectives.config import LAMPORT_MAX_BYTES

    if fp8_refused(backend, dtype):
        return  # as in test_all_reduce_matches_reference
    if op_refused(backend, dtype, op):
        with pytest.raises(collectives.CollectiveError, match=f"no {op} of {dtype}"):
            collectives.reduce_scatter(torch.empty(8, dtype=TORCH[dtype], device="cuda"),
                                       place(comm, device_values(comm.rank, 8 * comm.world, dtype), placement),
                                       op=op, algorithm=algorithm, backend=backend)
        return

    sizes = (16, 4096, 65536 + 16, (1 << 21) + 48) if algorithm == "tma" else (1, 5, 8, 1000, 65536 + 3, (1 << 21) + 48)
    for m in sizes:
        if algorithm == "lamport" and m * TORCH[dtype].itemsize > LAMPORT_MAX_BYTES:
            continue
        x = device_values(comm.rank, m * comm.world, dtype)
        inp = place(comm, x, placement)
        out = torch.empty(m, dtype=x.dtype, device="cuda")
        collectives.reduce_scatter(out, inp, op=op, algorithm=algorithm, backend=backend)
        collectives.synchronize()
        want = expected(comm.world, m * comm.world, dtype, op).reshape(comm.world, m)[comm.rank]
        assert np.array_equal(out.float().cpu().numpy(), want), m


@pytest.mark.parametrize("placement", ["staged", "offset"])
def test_push_pipeline_over_many_rounds_and_changing_sizes(comm, placement: str) -> None:
    """Peer push all-reduces and reduce-scatters large enough for several rounds of the
    pipeline (collectives.algorithms.push.push_rounds; 16-byte vectors or, at an offset, single
    elements), with elements past the last vector, back to back with a size that changes
    every call (a call's pushes then overlap where the last call's results lay)."""
    import collectives
    from collectives.algorithms import KernelKey
    from collectives.algorithms.push import push_rounds, push_slice_elements

    world = comm.world
    sizes = [3 * (1 << 22) + 5, (1 << 23) + 24, 5 * (1 << 21) + 3]
    vec = 1 if placement == "offset" else 8
    key = KernelKey("all_reduce", "push", "peer", "bf16", world, vector=vec, stage_in=True)
    vectors = -(-push_slice_elements(sizes[0], world, vec) // vec)  # a slice's, and so the grid's, work
    step = key.impl.blocks(comm, key, vectors) * key.threads  # the grid the plan launches (the share's, in a world)
    assert push_rounds(-(-vectors // step)) > 1
    calls = []
    for i in range(6):
        n = sizes[i % 3]
        t = place(comm, device_values(comm.rank + i, n, "bf16"), placement)
        collectives.all_reduce(t, algorithm="push", backend="peer")
        m = n // world
        inp = place(comm, device_values(comm.rank + i, m * world, "bf16"), placement)
        out = torch.empty(m, dtype=torch.bfloat16, device="cuda")
        collectives.reduce_scatter(out, inp, algorithm="push", backend="peer")
        calls.append((i, n, t, m, out))
    collectives.synchronize()
    for i, n, t, m, out in calls:
        inputs = [reference.round_to(values(r + i, n), "bf16") for r in range(world)]
        assert np.array_equal(t.float().cpu().numpy(), reference.all_reduce(inputs, "bf16")), (i, n)
        scattered = reference.reduce_scatter([x[:m * world] for x in inputs], "bf16")[comm.rank]
        assert np.array_equal(out.float().cpu().numpy(), scattered), (i, m)


def test_different_sizes_of_a_push_all_reduce_raise_and_the_communicator_recovers(comm) -> None:
    """Every rank's first wait of the pipeline sees another rank's size (or that it left the
    call), so every rank raises, and the epochs stay equal."""
    import collectives

    base = torch.empty(1024, dtype=torch.float32, device="cuda")
    n = 512 + 8 * comm.rank
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(base[:n], algorithm="push", backend="peer")
        collectives.synchronize()
    base.fill_(1)
    collectives.all_reduce(base, algorithm="push", backend="peer")
    collectives.synchronize()
    assert torch.all(base == comm.world)


def test_push_reduce_scatter_in_graphs_at_offsets_and_reused_addresses(comm) -> None:
    """Push from a plain input: eager calls alternating receive buffers, a captured call
    replayed with new inputs, an input not 16-byte aligned, and a new input at a freed one's
    address."""
    import collectives

    m = 4096 * 3 + 8
    world = comm.world

    def check(out, round_):
        want = expected(world, m * world, "bf16", "sum") if round_ == 0 else reference.all_reduce(
            [reference.round_to(values(r + round_, m * world), "bf16") for r in range(world)], "bf16")
        assert np.array_equal(out.float().cpu().numpy(), want.reshape(world, m)[comm.rank]), round_

    source = torch.empty(m * world, dtype=torch.bfloat16, device="cuda")
    inp = torch.empty(m * world, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(m, dtype=torch.bfloat16, device="cuda")
    stream = warmup_stream()
    with torch.cuda.stream(stream):
        collectives.reduce_scatter(out, inp, algorithm="push", backend="peer")
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        inp.copy_(source)
        collectives.reduce_scatter(out, inp, algorithm="push", backend="peer")
    assert comm.pool.current[3] is not None, "a captured push takes its own staging slot"
    for round_ in range(4):
        source.copy_(device_values(comm.rank + round_, m * world, "bf16"))
        graph.replay()
        collectives.synchronize()
        check(out, round_)
        for _ in range(round_ + 1):  # eager calls between replays move the buffer turn
            eager_out = torch.empty(m, dtype=torch.bfloat16, device="cuda")
            collectives.reduce_scatter(eager_out, source, algorithm="push", backend="peer")
        collectives.synchronize()
        check(eager_out, round_)
    shifted = torch.empty(m * world + 1, dtype=torch.bfloat16, device="cuda")[1:]
    shifted.copy_(device_values(comm.rank, m * world, "bf16"))
    collectives.reduce_scatter(out, shifted, algorithm="push", backend="peer")
    collectives.synchronize()
    check(out, 0)
    sources = [device_values(comm.rank + round_, m * world, "bf16") for round_ in range(3)]
    for round_ in range(3):
        x = torch.empty(m * world, dtype=torch.bfloat16, device="cuda")  # the block just freed
        if round_:
            assert x.data_ptr() == address, "the caching allocator did not reuse the address"
        address = x.data_ptr()
        x.copy_(sources[round_])
        collectives.reduce_scatter(out, x, backend="peer")  # auto: push for a plain input
        collectives.synchronize()
        check(out, round_)
        del x


def test_unaligned_tma_reduce_scatter_is_refused(comm, backend: str) -> None:
    import collectives

    inp = torch.ones(5 * comm.world, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(collectives.CollectiveError, match="16-byte"):
        collectives.reduce_scatter(torch.empty(5, dtype=torch.bfloat16, device="cuda"), inp, algorithm="tma",
                                   backend=backend)


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot", "tma", "push"])
def test_256_mb(comm, backend: str, algorithm: str) -> None:
    import collectives

    n = 128 << 20  # bf16: 256 MB per rank
    t = device_values(comm.rank, n, "bf16")
    collectives.all_reduce(t, algorithm=algorithm, backend=backend)
    collectives.synchronize()
    sample = np.random.default_rng(1).choice(n, 4096, replace=False)
    got = t.float()[torch.from_numpy(sample).cuda()].cpu().numpy()
    rows = [reference.round_to(values_at(r, sample), "bf16") for r in range(comm.world)]
    assert np.array_equal(got, reference.all_reduce(rows, "bf16"))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "e4m3", "e5m2"])
def test_lamport_reduces_negative_zero_and_subnormals(comm, backend: str, dtype: str) -> None:
    """-0.0 is Lamport's empty-slot mark: a tensor full of it, and one of -0.0 and (negative)
    subnormals, still reduce as the reference does (a sum of zeros may come out +0.0)."""
    import collectives

    if fp8_refused(backend, dtype):
        return
    info = torch.finfo(TORCH[dtype])
    tiny = info.smallest_normal * info.eps  # the smallest subnormal of the dtype
    n = 3 * 4096 + 5
    i = np.arange(n)

    def mixed(rank: int) -> np.ndarray:
        """-0.0; negative subnormals from every rank; small subnormals from rank 0 alone (their
        sums stay subnormal on any number of ranks)."""
        alone = tiny * (i % 5) if rank == 0 else np.zeros(n)
        return np.select([i % 3 == 0, i % 3 == 1], [-0.0, -tiny * (1 + rank)], alone).astype(np.float32)

    for inputs in ([np.full(n, -0.0, dtype=np.float32)] * comm.world, [mixed(r) for r in range(comm.world)]):
        t = torch.from_numpy(inputs[comm.rank]).to("cuda").to(TORCH[dtype])
        collectives.all_reduce(t, algorithm="lamport", backend=backend)
        collectives.synchronize()
        want = reference.all_reduce([reference.round_to(x, dtype) for x in inputs], dtype)
        got = t.float().cpu().numpy()
        assert np.array_equal(got, want), (dtype, np.flatnonzero(got != want)[:5])
    assert np.any((want != 0) & (np.abs(want) < info.smallest_normal)), "no subnormal result tested"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])  # (sums of up to 8 ranks' subnormals stay subnormal)
def test_lamport_blocks_move_negative_zero_and_subnormals(comm, backend: str, dtype: str) -> None:
    """The Lamport reduce-scatter and all-gather on -0.0 (the empty-slot mark) and negative
    subnormals: the reduce-scatter reduces as the reference does, the all-gather delivers every
    bit (a -0.0 as -0.0: the tagged words of collectives.algorithms.lamport_blocks.GatherKernel)."""
    import collectives

    if fp8_refused(backend, dtype):
        return
    info = torch.finfo(TORCH[dtype])
    tiny = info.smallest_normal * info.eps
    world, m = comm.world, 4096 + 5
    i = np.arange(world * m)
    inputs = [np.select([i % 3 == 0, i % 3 == 1], [-0.0, -tiny * (1 + r)], 0.25).astype(np.float32)
              for r in range(world)]
    inp = torch.from_numpy(inputs[comm.rank]).to("cuda").to(TORCH[dtype])
    out = torch.empty(m, dtype=inp.dtype, device="cuda")
    collectives.reduce_scatter(out, inp, algorithm="lamport", backend=backend)
    gathered = torch.empty(world * world * m, dtype=inp.dtype, device="cuda")
    collectives.all_gather(gathered, inp, algorithm="lamport", backend=backend)
    collectives.synchronize()
    rounded = [reference.round_to(x, dtype) for x in inputs]
    want = reference.reduce_scatter(rounded, dtype)[comm.rank]
    assert np.array_equal(out.float().cpu().numpy(), want), dtype
    assert np.array_equal(gathered.float().cpu().numpy(), reference.all_gather(rounded)), dtype
    sent = torch.cat([torch.from_numpy(x).to("cuda").to(TORCH[dtype]).view(torch.uint8) for x in inputs])
    assert torch.equal(gathered.view(torch.uint8), sent), dtype  # bit for bit: the -0.0s too
    assert np.any((want != 0) & (np.abs(want) < info.smallest_normal)), "no subnormal result tested"


def test_lamport_collectives_back_to_back(comm, backend: str) -> None:
    """60 Lamport all-reduces, reduce-scatters and all-gathers in turn, sizes changing, with no
    synchronisation between them (they share the receive buffers and call counts of a width:
    a fast rank must not overwrite what a slow one has not read); every result checked at the end."""
    import collectives

    world, calls = comm.world, []
    for c in range(60):
        collective, m = ("all_reduce", "reduce_scatter", "all_gather")[c % 3], (8, 4096 + 3, 40_000)[c % 4 % 3]
        count = world * m if collective == "reduce_scatter" else m
        x = device_values(comm.rank + c, count, "bf16")
        if collective == "all_reduce":
            collectives.all_reduce(x, algorithm="lamport", backend=backend)
            got = x
        elif collective == "reduce_scatter":
            got = torch.empty(m, dtype=x.dtype, device="cuda")
            collectives.reduce_scatter(got, x, algorithm="lamport", backend=backend)
        else:
            got = torch.empty(world * m, dtype=x.dtype, device="cuda")
            collectives.all_gather(got, x, algorithm="lamport", backend=backend)
        calls.append((c, collective, count, got))
    collectives.synchronize()
    for c, collective, count, got in calls:
        inputs = [reference.round_to(values(r + c, count), "bf16") for r in range(world)]
        want = {"all_reduce": lambda: reference.all_reduce(inputs, "bf16"),
                "reduce_scatter": lambda: reference.reduce_scatter(inputs, "bf16")[comm.rank],
                "all_gather": lambda: reference.all_gather(inputs)}[collective]()
        assert np.array_equal(got.float().cpu().numpy(), want), (c, collective, count)


@pytest.mark.parametrize("algorithm", ["auto", "lamport", "push"])
def test_10000_back_to_back_calls_of_mixed_sizes(comm, backend: str, algorithm: str) -> None:
    import collectives

    sizes = [64, 4096 + 1, 65536, 300_007, 8]
    tensors = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for n in sizes]
    symmetric = collectives.empty(65536, torch.float32)
    want = comm.world * (comm.world + 1) / 2
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    for i in range(10_000):
        t = symmetric if i % 7 == 3 else tensors[i % len(tensors)]
        t.fill_(comm.rank + 1)
        collectives.all_reduce(t, algorithm=algorithm, backend=backend)
        bad += (t != want).sum()
    collectives.synchronize()
    assert int(bad) == 0


def test_cuda_graph_replay_matches_eager(comm, backend: str) -> None:
    import collectives

    n = 3 * 4096 + 5
    staged = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    sym = collectives.empty(4096, torch.float32)
    source = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    stream = warmup_stream()
    lamport = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    big = collectives.empty(1 << 20, torch.bfloat16)
    pushed = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    with torch.cuda.stream(stream):  # warm up the same calls: compile and plan outside the capture
        collectives.all_reduce(pushed, algorithm="push", backend=backend)
        collectives.all_reduce(staged, algorithm="one_shot", backend=backend)
        collectives.all_reduce(sym, algorithm="two_shot", backend=backend)
        collectives.all_reduce(lamport, algorithm="lamport", backend=backend)
        collectives.all_reduce(big, algorithm="tma", backend=backend)
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        staged.copy_(source)
        lamport.copy_(source)
        pushed.copy_(source)
        collectives.all_reduce(pushed, algorithm="push", backend=backend)
        collectives.all_reduce(staged, algorithm="one_shot", backend=backend)
        collectives.all_reduce(sym, algorithm="two_shot", backend=backend)
        # Two Lamport calls per replay: the device-side step rotates the three buffers
        # through every phase across replays and the eager calls between them.
        collectives.all_reduce(lamport, algorithm="lamport", backend=backend)
        collectives.all_reduce(lamport, algorithm="lamport", backend=backend)
        collectives.all_reduce(big, algorithm="tma", backend=backend)
    for round_ in range(5):
        source.copy_(device_values(comm.rank + round_, n, "bf16"))
        sym.fill_(comm.rank + round_)
        big.fill_(1)
        graph.replay()
        collectives.synchronize()
        inputs = [reference.round_to(values(r + round_, n), "bf16") for r in range(comm.world)]
        once = reference.all_reduce(inputs, "bf16")
        assert np.array_equal(staged.float().cpu().numpy(), once)
        assert np.array_equal(pushed.float().cpu().numpy(), once)
        twice = reference.all_reduce([once] * comm.world, "bf16")
        assert np.array_equal(lamport.float().cpu().numpy(), twice), round_
        assert torch.all(sym == sum(r + round_ for r in range(comm.world)))
        assert torch.all(big == comm.world)
        if round_ % 2:  # an eager Lamport call between replays shifts the rotation by one
            eager = torch.ones(100, dtype=torch.float16, device="cuda")
            collectives.all_reduce(eager, algorithm="lamport", backend=backend)
            collectives.all_reduce(lamport[:7], algorithm="lamport", backend=backend)
            collectives.all_reduce(eager, algorithm="push", backend=backend)  # the graph's push buffer
            collectives.synchronize()
            assert torch.all(eager == comm.world * comm.world)


def test_different_sizes_across_ranks_raise_and_the_communicator_recovers(comm, backend: str) -> None:
    import collectives

    base = collectives.empty(1024, torch.float32)
    n = 512 + 8 * comm.rank
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(base[:n], backend=backend)
        collectives.synchronize()
    base.fill_(1)
    collectives.all_reduce(base, backend=backend)
    collectives.synchronize()
    assert torch.all(base == comm.world)


def test_different_dtypes_or_collectives_across_ranks_raise_and_the_communicator_recovers(comm, backend: str) -> None:
    """Issue 48 item 3: equal element counts, but rank 0 all-reduces f32 where the others
    all-reduce bf16 (rank 0 would move twice the bytes), then rank 0 all-gathers where the
    others reduce-scatter: every rank raises the recorded size mismatch (no timeout), and the
    communicator stays usable.  One-shot, named: ``auto`` may pick Lamport for these sizes, whose
    buffers are per element width (a Lamport f32 rank and bf16 rank never meet).

    Every kernel the mismatched calls take is loaded first, by the same calls on every rank: in a
    one-GPU world a rank that loads a kernel (a CUDA module load waits for every kernel on the
    GPU: :func:`collectives.runtime.kernels.load`) while another rank's mismatched kernel already
    spins waits for that kernel's timeout, so the calls would time out (as they did at W = 2, 3
    and 4 on an H200, 2026-11-29) instead of meeting on the device, which is what this tests."""
    import collectives

    n, world = 2048, comm.world
    big, small = collectives.empty(world * n, torch.float32), collectives.empty(n, torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        collectives.all_reduce(collectives.empty(4 * n, torch.uint8).view(dtype)[:n], algorithm="one_shot",
                               backend=backend)
    collectives.all_gather(big, small, algorithm="one_shot", backend=backend)
    collectives.reduce_scatter(small, big, algorithm="one_shot", backend=backend)
    collectives.synchronize()
    dtype = torch.float32 if comm.rank == 0 else torch.bfloat16
    t = collectives.empty(4 * n, torch.uint8).view(dtype)[:n]  # one allocation's shape on every rank
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_reduce(t, algorithm="one_shot", backend=backend)
        collectives.synchronize()
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        if comm.rank == 0:
            collectives.all_gather(big, small, algorithm="one_shot", backend=backend)
        else:
            collectives.reduce_scatter(small, big, algorithm="one_shot", backend=backend)
        collectives.synchronize()
    small.fill_(1)
    collectives.all_reduce(small, algorithm="one_shot", backend=backend)
    collectives.synchronize()
    assert torch.all(small == world)


def test_barrier_back_to_back(comm, backend: str) -> None:
    import collectives

    for _ in range(1000):
        collectives.barrier(backend)
    collectives.synchronize()
