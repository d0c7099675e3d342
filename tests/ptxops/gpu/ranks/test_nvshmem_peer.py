"""``ptxops.nvshmem`` on GPUs: the ring kernel of tests/support/nvshmem_kernels.py (the one the
CPU test links) between NVSHMEM PEs, one per torchrun rank, on the symmetric heap of
``collectives`` (NVSHMEM's, through nvshmem4py).

Run: ``torchrun --nproc-per-node 2 -m pytest -q tests/ptxops/gpu/ranks/test_nvshmem_peer.py`` (or
4; ``bash .ci/gpu peer``).  Skipped without torchrun, GPUs or nvshmem4py; NVLink multicast stays
off.  Checks: each rank's inbox holds exactly its previous rank's source (put_signal), the
second half of the second inbox the first half of that source and its first half untouched
(``put(nbi=True)`` of a stated count), the bounded signal wait saw the signal, and the
fetch-adds on PE 0's counter returned 0 .. W-1 once each and left W.
"""

from __future__ import annotations

import os

import pytest

cutlass = pytest.importorskip("cutlass")
pytest.importorskip("nvshmem.core", reason="nvshmem4py is not installed")

from cutlass import Int32, Int64  # noqa: E402
from tests.support.gpu_support import current_stream, peer_context  # noqa: E402

from collectives.symmetric.capability import force_multicast_off  # noqa: E402

pytestmark = [pytest.mark.multigpu, pytest.mark.no_world("NVSHMEM PEs are processes, not rank threads")]

if "WORLD_SIZE" in os.environ:
    force_multicast_off()

BUDGET_NS = 10_000_000_000  # the signal wait gives up after 10 s


def test_put_signal_ring_fetch_add_and_bounded_wait() -> None:
    torch = pytest.importorskip("torch")
    with peer_context() as ctx:
        if type(ctx.heap).__name__ != "NvshmemHeap":
            pytest.skip(f"the context's heap is {type(ctx.heap).__name__}, not NVSHMEM's")
        import torch.distributed as dist
        from nvshmem.core import library_finalize
        from nvshmem.core.interop.cute import cute_compile_helper

        from tests.support import nvshmem_kernels as k

        world, rank = ctx.world_size, ctx.rank
        inbox, inbox2 = ctx.empty(k.N, torch.float32), ctx.empty(k.N, torch.float32)
        signal, counter = ctx.empty(1, torch.int64), ctx.empty(1, torch.int64)  # Uint64 words
        for t, v in ((inbox, -1), (inbox2, -1), (signal, 0), (counter, 0)):
            t.fill_(v)
        src = torch.arange(k.N, dtype=torch.float32, device="cuda") + rank * k.N
        out = torch.full((k.N,), -2.0, device="cuda")
        result = torch.full((2,), -1, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        ctx.host_barrier()

        args = (*(Int64(t.data_ptr()) for t in (src, inbox, inbox2, signal, counter, out, result)),
                Int32((rank + 1) % world), Int64(1), Int64(BUDGET_NS), current_stream())
        compiled, module = cute_compile_helper(k.ring, *args)
        try:
            compiled(*args)
            torch.cuda.synchronize()
            ctx.host_barrier()
        finally:
            library_finalize(module)

        prev = (rank - 1) % world
        expected = torch.arange(k.N, dtype=torch.float32, device="cuda") + prev * k.N
        assert result[0].item() == 1, "the signal wait timed out"
        assert torch.equal(out, expected) and torch.equal(inbox, expected)
        assert torch.equal(inbox2[k.HALF:], expected[:k.HALF])
        assert torch.all(inbox2[:k.HALF] == -1), "put(count=) wrote past its count"
        olds = [None] * world
        dist.all_gather_object(olds, result[1].item())
        assert sorted(olds) == list(range(world))
        if rank == 0:
            assert counter.item() == world
        assert signal.item() == 1
