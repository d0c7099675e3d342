"""No host synchronisation on the eager path (issue 50): after one warm-up call, plan hits and
calls on tensors the allocator placed elsewhere (the moved plan) of every collective, and MoE
layers on new routings, run under
``torch.cuda.set_sync_debug_mode("error")``: a synchronising CUDA call in them raises.  The
results are checked after the mode is off.

Run under torchrun on 2 or 4 GPUs (``bash .ci/gpu peer N`` runs it):
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_eager_sync.py
Never launches a multimem kernel: NVLink multicast stays off (the context's backend is peer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world(
    "torch's sync debug mode is the process's: in a one-GPU world one rank's would catch another's planning")]
torch = pytest.importorskip("torch")
from tests.collectives.gpu.ranks.collectives_cases import comm  # noqa: E402,F401  (the fixture)

#: Bytes per rank: the issue's eager range (4 KB: Lamport's, 64 KB: the barriered algorithms').
SIZES = [4 << 10, 64 << 10]
CALLS = 20


@contextmanager
def no_sync() -> Iterator[None]:
    """Every synchronising CUDA call raises (torch's sync debug mode), until the block ends."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def run(make: Callable[[], tuple], call: Callable[..., None], check: Callable[..., None],
        symmetric: bool = False) -> None:
    """Warm up on ``make()``'s tensors, then ``CALLS`` calls without a host sync: plan hits on
    them, and calls on new tensors (made before the mode is on), three on each (their first
    launches the warm-up's plan with their addresses, the second caches a plan of theirs, the
    third hits it); check every call's result.
    ``symmetric``: the new tensors are warmed up too (a symmetric tensor's first call plans:
    its peer table is made and copied to the GPU, once per allocation)."""
    import collectives

    warm = make()
    call(*warm)
    fresh = [make() for _ in range(CALLS)]
    for tensors in fresh if symmetric else ():
        call(*tensors)
    collectives.synchronize()
    with no_sync():
        for _ in range(CALLS):
            call(*warm)
        for _ in range(3):
            for tensors in fresh:
                call(*tensors)
    collectives.synchronize()
    for tensors in fresh:
        check(*tensors)


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_all_reduce(comm, nbytes: int, symmetric: bool) -> None:
    import collectives

    n, want = nbytes // 2, comm.world * (comm.world + 1) // 2

    def make() -> tuple:
        t = collectives.empty(n, torch.bfloat16) if symmetric else torch.empty(n, dtype=torch.bfloat16, device="cuda")
        return (t.fill_(comm.rank + 1),)

    def call(t: torch.Tensor) -> None:
        t.fill_(comm.rank + 1)
        collectives.all_reduce(t)

    run(make, call, lambda t: torch.testing.assert_close(t, torch.full_like(t, want)), symmetric)


@pytest.mark.parametrize("nbytes", SIZES)
def test_reduce_scatter(comm, nbytes: int) -> None:
    import collectives

    n, world, want = nbytes // 2, comm.world, comm.world * (comm.world + 1) // 2

    def make() -> tuple:
        return (torch.empty(n // world, dtype=torch.bfloat16, device="cuda"),
                torch.full((n,), comm.rank + 1, dtype=torch.bfloat16, device="cuda"))

    run(make, collectives.reduce_scatter, lambda out, inp: torch.testing.assert_close(out, torch.full_like(out, want)))


@pytest.mark.parametrize("nbytes", SIZES)
def test_all_gather(comm, nbytes: int) -> None:
    import collectives

    n, world = nbytes // 2, comm.world

    def make() -> tuple:
        return (torch.empty(n, dtype=torch.bfloat16, device="cuda"),
                torch.full((n // world,), comm.rank + 1, dtype=torch.bfloat16, device="cuda"))

    def check(out: torch.Tensor, inp: torch.Tensor) -> None:
        want = torch.arange(1, world + 1, dtype=torch.bfloat16, device="cuda").repeat_interleave(n // world)
        torch.testing.assert_close(out, want)

    run(make, collectives.all_gather, check)


def test_barrier(comm) -> None:
    import collectives

    run(lambda: (), collectives.barrier, lambda: None)


def test_all_to_all(comm) -> None:
    import collectives

    world, rows = comm.world, 4

    def make() -> tuple:
        return (torch.empty(world * rows, 64, dtype=torch.bfloat16, device="cuda"),
                torch.full((world * rows, 64), comm.rank, dtype=torch.bfloat16, device="cuda"))

    def check(out: torch.Tensor, inp: torch.Tensor) -> None:
        want = torch.arange(world, dtype=torch.bfloat16, device="cuda").repeat_interleave(rows)[:, None].expand(-1, 64)
        torch.testing.assert_close(out, want)

    run(make, collectives.all_to_all, check)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_moe_layer(comm, fp8: bool) -> None:
    """An MoE dispatch, its experts and combine (low latency, fused kernels, top-8 of 32 experts
    per rank, hidden 7168), each layer on a new routing: after a warm-up layer, ``CALLS`` layers
    without a host sync; each checked bit for bit against the reference layer afterwards (fp8:
    the dispatch alone, its rows' count)."""
    import collectives
    from collectives import moe
    from collectives.reference.moe import expert_fn, reference, routing

    world, rank, tokens, topk, hidden = comm.world, comm.rank, 4, 8, 7168
    experts = 32 * world
    local = experts // world
    cases = [routing(world, experts, topk, [tokens] * world, seed, hidden, torch.bfloat16) for seed in range(CALLS + 1)]
    inputs = [(xs[rank].cuda(), ids[rank].cuda(), ws[rank].cuda()) for xs, ids, ws in cases]

    def step(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> tuple:
        expert_x, counts, handle = moe.dispatch(x, ids, w, experts, max_tokens=tokens, fp8=fp8)
        if fp8:
            return expert_x, counts, None
        out_rows = torch.stack([expert_fn(expert_x[le], rank * local + le) for le in range(local)])
        return expert_x, counts, moe.combine(out_rows, handle)

    step(*inputs[0])
    collectives.synchronize()
    with no_sync():
        results = [step(*args) for args in inputs[1:]]
    collectives.synchronize()
    for (xs, ids, ws), (expert_x, counts, out) in zip(cases[1:], results):
        per_expert, outs = reference(world, experts, xs, ids, ws)
        for le in range(local):
            want = per_expert[rank * local + le]
            assert int(counts[le]) == want.shape[0]
            if not fp8:
                assert torch.equal(expert_x[le, :want.shape[0]].cpu().view(torch.uint8), want.view(torch.uint8))
        if out is not None:
            assert torch.equal(out.cpu().view(torch.uint8), outs[rank].view(torch.uint8))
