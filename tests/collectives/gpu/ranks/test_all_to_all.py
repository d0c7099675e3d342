"""The uneven all-to-all on real GPUs, bit for bit against the reference
(:mod:`collectives.reference.all_to_all`).

Each check is a function of ``(rank, world, group)`` (``group``: what every collectives call
takes), so it runs under torchrun and in a one-GPU world of threads alike.  Every rank builds
every rank's input and splits from the same seed, so the reference needs no communication.
Run under torchrun on 2 or 4 GPUs (the NVSHMEM transport's tests need the communicator on
NVSHMEM's heap and NVSHMEM's device bitcode, collectives/tools/devbitcode.sh):
    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_all_to_all.py
Never launches a multimem kernel: the all-to-all is point to point on every backend.
"""

from __future__ import annotations

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")
from tests.collectives.gpu.ranks.collectives_cases import TORCH, comm  # noqa: E402,F401  (the communicator fixture)

from collectives.reference.all_to_all import all_to_all as reference  # noqa: E402


def inputs(world: int, m: list, hidden: int, dtype: torch.dtype, seed: int) -> list:
    """Every rank's input: ``sum(m[s])`` rows of ``hidden`` random bytes' worth of ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    return [torch.randint(0, 256, (sum(m[s]), hidden * size), generator=gen, dtype=torch.uint8).view(dtype)
            for s in range(world)]


def splits(world: int, seed: int, most: int) -> list:
    """A matrix of rows ``m[s][r]`` rank s sends to rank r (zeros and odd sizes among them)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, most + 1, (world, world), generator=gen).tolist()


def one_call(rank: int, world: int, group, m: list, hidden: int, dtype: str, seed: int, *, symmetric_out: bool,
             device_splits: bool, transport: str = "nvlink") -> None:
    """One all-to-all of the routing ``m`` over ``transport`` checked bit for bit on this rank."""
    import collectives

    x = inputs(world, m, hidden, TORCH[dtype], seed)
    want = reference(x, m, [[m[s][r] for s in range(world)] for r in range(world)])[rank]
    inp = x[rank].cuda()
    rows = sum(m[s][rank] for s in range(world))
    if symmetric_out:  # a collective allocation: the same shape on every rank
        most = max(sum(m[s][r] for s in range(world)) for r in range(world))
        start = (most - rows) // 2  # at different places on different ranks (and inside it when empty)
        out = collectives.empty((max(most, 1), hidden), TORCH[dtype], group=group)[start:start + rows]
    else:
        out = torch.full((rows, hidden), float("nan"), dtype=torch.float32, device="cuda").to(TORCH[dtype])
    in_splits, out_splits = m[rank], [m[s][rank] for s in range(world)]
    if device_splits:
        in_splits = torch.tensor(in_splits, dtype=torch.int64, device="cuda")
        out_splits = torch.tensor(out_splits, dtype=torch.int64, device="cuda")
    collectives.all_to_all(out, inp, out_splits, in_splits, group=group, transport=transport)
    collectives.synchronize(group)
    assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), (m, hidden, dtype, symmetric_out)


def check_routings(rank: int, world: int, group, transport: str = "nvlink") -> None:
    """Random routings in every dtype, hidden sizes 1 (unaligned chunks) to 7168, staged and
    symmetric outputs, host and device splits; a rank that gets nothing; everything to one rank."""
    case = 0
    for dtype in TORCH:
        for hidden in (1, 3, 128, 7168):
            for symmetric_out in (False, True):
                for device_splits in (False, True):
                    case += 1
                    m = splits(world, case, 9 if hidden < 1000 else 3)
                    one_call(rank, world, group, m, hidden, dtype, case, symmetric_out=symmetric_out,
                             device_splits=device_splits, transport=transport)
    nothing_to_last = [[0 if r == world - 1 else 2 for r in range(world)] for _ in range(world)]
    all_to_first = [[5 if r == 0 else 0 for r in range(world)] for _ in range(world)]
    for m in (nothing_to_last, all_to_first):
        one_call(rank, world, group, m, 64, "bf16", 7, symmetric_out=False, device_splits=False, transport=transport)


def check_equal_splits(rank: int, world: int, group) -> None:
    """``splits=None``: dimension 0 in equal chunks, as all_to_all_single."""
    import collectives

    x = inputs(world, [[3] * world] * world, 16, torch.bfloat16, 11)
    out = torch.empty_like(x[rank]).cuda()
    collectives.all_to_all(out, x[rank].cuda(), group=group)
    collectives.synchronize(group)
    assert torch.equal(out.cpu().view(torch.uint8), reference(x)[rank].view(torch.uint8))


def check_mismatch_then_correct_calls(rank: int, world: int, group, calls: int = 200,
                                      transport: str = "nvlink") -> None:
    """Rank 0 sends rank 1 one row more than rank 1 expects: both raise a size mismatch (no
    timeout), every other rank completes; then ``calls`` correct calls in a row."""
    import collectives

    m = splits(world, 99, 4)
    out_splits = [m[s][rank] for s in range(world)]
    in_splits = list(m[rank])
    if rank == 0:
        in_splits[1] += 1
    inp = torch.zeros((sum(in_splits), 8), dtype=torch.float32, device="cuda")
    out = torch.zeros((sum(out_splits), 8), dtype=torch.float32, device="cuda")
    if rank in (0, 1):
        with pytest.raises(collectives.CollectiveError, match="size"):
            collectives.all_to_all(out, inp, out_splits, in_splits, group=group, transport=transport)
            collectives.synchronize(group)
    else:
        collectives.all_to_all(out, inp, out_splits, in_splits, group=group, transport=transport)
        collectives.synchronize(group)
    for i in range(calls):
        one_call(rank, world, group, splits(world, 1000 + i, 5), 32, "f32", i, symmetric_out=bool(i % 2),
                 device_splits=bool(i % 3 == 0), transport=transport)


def check_dtype_mismatch_then_correct_calls(rank: int, world: int, group, calls: int = 20) -> None:
    """Issue 48 item 3: rank 0 sends and receives f32 where every other rank has bf16, equal
    element counts (rank 0's chunks are twice the bytes its peers' buffers take): every pair
    with rank 0 fails on both ends (every rank raises the recorded mismatch, no timeout, no
    byte past a bf16 output), then ``calls`` correct calls in a row."""
    import collectives

    dtype = torch.float32 if rank == 0 else torch.bfloat16
    rows = [2] * world
    inp = torch.ones((sum(rows), 8), dtype=dtype, device="cuda")
    guard = torch.full((sum(rows) + 4, 8), 7, dtype=dtype, device="cuda")
    out = guard[:sum(rows)]
    with pytest.raises(collectives.CollectiveError, match="different sizes"):  # a timeout would not say so
        collectives.all_to_all(out, inp, rows, rows, group=group)
        collectives.synchronize(group)
    assert torch.all(guard[sum(rows):] == 7), "a wider sender's bytes landed past this rank's output"
    for i in range(calls):
        one_call(rank, world, group, splits(world, 2000 + i, 5), 32, "bf16", i, symmetric_out=bool(i % 2),
                 device_splits=False)


def check_two_streams(rank: int, world: int, group, rounds: int = 3) -> None:
    """Issue 48: micro-batch overlap, a dispatch's all-to-all on stream A behind a long kernel
    and a combine's on stream B, enqueued with no wait between the streams: each follows the
    communicator's last collective (they share its call count and slots), both bit for bit.

    The streams are the rank's current one and its communicator's side stream, and only they
    are synchronised: in a one-GPU world a stream of torch's pool may share a hardware queue with
    another rank's stream (a rank's all-to-all queued behind a peer's kernel that spins for it:
    the W = 2 world timed out here), and ``torch.cuda.synchronize()`` waits for the other ranks'
    kernels, which wait for this rank's launches."""
    import collectives
    from collectives.runtime.communicator import communicator

    a, b = torch.cuda.current_stream(), communicator(group).stream_flags.side()
    calls = []
    for seed, hidden, dtype in ((500, 256, torch.bfloat16), (501, 64, torch.float32)):
        m = splits(world, seed, 6)
        x = inputs(world, m, hidden, dtype, seed)
        want = reference(x, m, [[m[s][r] for s in range(world)] for r in range(world)])[rank]
        out = torch.empty((sum(m[s][rank] for s in range(world)), hidden), dtype=dtype, device="cuda")
        calls.append((out, x[rank].cuda(), [m[s][rank] for s in range(world)], list(m[rank]), want))
    b.wait_stream(a)  # the inputs and outputs made on the current stream
    for _ in range(rounds):
        for stream, (out, inp, out_splits, in_splits, _) in zip((a, b), calls):
            with torch.cuda.stream(stream):
                if stream is a:
                    torch.cuda._sleep(50_000_000)  # tens of ms: stream B's all-to-all would start first
                collectives.all_to_all(out, inp, out_splits, in_splits, group=group)
    a.wait_stream(b)
    collectives.synchronize(group)
    for out, _, _, _, want in calls:
        assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8))


def bounded_call(rank: int, world: int, group, m: list, slot: int, hidden: int, dtype: str, seed: int, *,
                 symmetric_out: bool) -> None:
    """One bounded all-to-all (``bounded=True``) of the routing ``m`` (every chunk at most
    ``slot`` rows) checked on this rank: source s's rows in slot s, bit for bit, the rows outside
    what arrived untouched, and the rows each source sent in out_splits."""
    import collectives

    x = inputs(world, m, hidden, TORCH[dtype], seed)
    got = reference(x, m, [[m[s][r] for s in range(world)] for r in range(world)])[rank]
    rows = [m[s][rank] for s in range(world)]
    if symmetric_out:
        out = collectives.empty((world * slot, hidden), TORCH[dtype], group=group)
    else:
        size = torch.empty((), dtype=TORCH[dtype]).element_size()
        out = torch.empty((world * slot, hidden * size), dtype=torch.uint8, device="cuda").view(TORCH[dtype])
    out.view(torch.uint8).fill_(0xEE)
    want = out.cpu().clone()
    at = 0
    for s in range(world):
        want[s * slot:s * slot + rows[s]] = got[at:at + rows[s]]
        at += rows[s]
    received = torch.full((world,), -1, dtype=torch.int64, device="cuda")
    in_splits = torch.tensor(m[rank], dtype=torch.int64, device="cuda")
    collectives.all_to_all(out, x[rank].cuda(), received, in_splits, group=group, bounded=True)
    collectives.synchronize(group)
    assert received.tolist() == rows, (received.tolist(), rows)
    assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), (m, slot, hidden, dtype, symmetric_out)


def check_bounded(rank: int, world: int, group, calls: int = 20) -> None:
    """``bounded=True``: random routings under and at the slot, symmetric and staged outputs,
    every dtype; then rank 0 sends rank 1 a row past its slot: both raise a size mismatch (no
    timeout), then correct calls in a row."""
    import collectives

    case = 0
    for dtype in TORCH:
        for hidden in (1, 7168):
            for symmetric_out in (False, True):
                case += 1
                slot = 3 if hidden > 1000 else 9
                bounded_call(rank, world, group, splits(world, 3000 + case, slot), slot, hidden, dtype, case,
                             symmetric_out=symmetric_out)
    slot = 4
    m = splits(world, 98, slot)
    m[0][1] = slot + 1
    received = torch.zeros(world, dtype=torch.int64, device="cuda")
    inp = torch.ones((sum(m[rank]), 8), dtype=torch.float32, device="cuda")
    out = torch.zeros((world * slot, 8), dtype=torch.float32, device="cuda")
    in_splits = torch.tensor(m[rank], dtype=torch.int64, device="cuda")
    if rank in (0, 1):
        with pytest.raises(collectives.CollectiveError, match="size"):
            collectives.all_to_all(out, inp, received, in_splits, group=group, bounded=True)
            collectives.synchronize(group)
        if rank == 1:
            assert received[0].item() == 0 and torch.all(out[:slot] == 0)  # nothing of rank 0's landed
    else:
        collectives.all_to_all(out, inp, received, in_splits, group=group, bounded=True)
        collectives.synchronize(group)
    for i in range(calls):
        bounded_call(rank, world, group, splits(world, 4000 + i, 5), 5, 32, "f32", i, symmetric_out=bool(i % 2))


CHECKS = [check_routings, check_equal_splits, check_mismatch_then_correct_calls,
          check_dtype_mismatch_then_correct_calls, check_two_streams, check_bounded]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_all_to_all(comm, check) -> None:  # noqa: F811  (the fixture)
    check(comm.rank, comm.world, None)


@pytest.mark.parametrize("check", [check_routings, check_mismatch_then_correct_calls], ids=lambda c: c.__name__)
def test_all_to_all_over_nvshmem(comm, check) -> None:  # noqa: F811  (the fixture)
    """``transport="nvshmem"`` (NVSHMEM put-with-signal), bit for bit against the reference with
    the same checks; then the NVLink transport again on the same slots (one protocol: the
    transports interleave).  Needs the communicator on NVSHMEM's heap (torchrun; not a world of
    threads) and NVSHMEM's device bitcode (bash collectives/tools/devbitcode.sh)."""
    if type(comm.ctx.heap).__name__ != "NvshmemHeap":
        pytest.skip(f"the context's heap is {type(comm.ctx.heap).__name__}, not NVSHMEM's")
    check(comm.rank, comm.world, None, transport="nvshmem")
    one_call(comm.rank, comm.world, None, splits(comm.world, 77, 6), 128, "bf16", 77, symmetric_out=True,
             device_splits=False)
