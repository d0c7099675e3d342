"""torch.compile of models calling the collectives (their custom operators, collectives.runtime.torch_ops)
on real GPUs (peer backend): compiled with Inductor and fullgraph=True, and with CUDA graph
trees (mode="reduce-overhead"), every result equals eager's, bit for bit.

Run under torchrun on 2 or 4 GPUs:
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_torch_compile.py
Inputs are small integers, so every sum is exact in every order.
"""

from __future__ import annotations

import pytest
from tests.collectives.gpu.ranks.collectives_cases import HASH, comm  # noqa: F401 (comm: the fixture)

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world(
    "torch.compile traces one thread at a time (dynamo is not thread-safe); the ranks here are threads")]
torch = pytest.importorskip("torch")


def small_ints(salt: int, *shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((i * HASH + salt * 97) % 5 - 2).to(dtype).view(*shape)


class Collectives(torch.nn.Module):
    """Elementwise work around every collective: in place on an intermediate and on an input,
    into ``out=``, reduce-scatter, all-gather and a barrier."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import collectives

        world = torch.distributed.get_world_size()
        y = x * 2 + 1
        collectives.all_reduce(y)
        z = collectives.all_reduce(y - 3, op="max", out=torch.empty_like(y))
        scattered = collectives.reduce_scatter(torch.empty(y.numel() // world, dtype=y.dtype, device=y.device), y)
        gathered = collectives.all_gather(torch.empty(world * y.numel(), dtype=y.dtype, device=y.device), z)
        collectives.barrier()
        collectives.all_reduce(x)
        return y + 0, z, scattered, gathered, x + 0


class Gemms(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import collectives

        rs = collectives.gemm_reduce_scatter(a, b)
        return rs * 1, collectives.all_gather_gemm(a[: a.shape[0] // 2], b)


def _eager_and_compiled(model: torch.nn.Module, inputs, mode: str | None, calls: int = 3):
    """Eager results and the compiled model's, over ``calls`` calls (CUDA graph trees warm up on
    the first and record on a later one), each on fresh copies of ``inputs`` (which the models
    reduce in place)."""
    import collectives

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    want = model(*[t.clone() for t in inputs])
    collectives.synchronize()
    want = [w.clone() for w in want]
    for _ in range(calls):
        got = compiled(*[t.clone() for t in inputs])
        collectives.synchronize()
        got = [g.clone() for g in got]
    return want, got


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("n", [1024, 4096 * 3 + 8])
def test_compiled_collectives_equal_eager(comm, mode: str | None, n: int) -> None:
    x = small_ints(comm.rank, comm.world * n)
    want, got = _eager_and_compiled(Collectives(), [x], mode)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_gemm_overlap_equals_eager(comm, mode: str | None) -> None:
    a = small_ints(comm.rank, comm.world * 64, 64)
    b = small_ints(100 + comm.rank, 64, 128)
    want, got = _eager_and_compiled(Gemms(), [a, b], mode)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
