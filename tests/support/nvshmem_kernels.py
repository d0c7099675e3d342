"""The ``ptxops.nvshmem`` kernel the GPU tests run (:func:`run_ring`: tests/ptxops/gpu/ranks/
test_nvshmem_peer.py, a PE per GPU, and tests/ptxops/gpu/procs/test_nvshmem_procs.py, 2 PEs on
one GPU) and the CPU test compiles (tests/ptxops/test_nvshmem_compile.py): one source, so what
CI links is what the GPUs run.

A ring: thread 0 of rank ``r`` puts its ``src`` (``N`` Float32, local) into rank ``next``'s
``inbox`` (symmetric) with a put-with-signal that adds 1 to ``next``'s ``signal`` (symmetric
Uint64), puts the first ``HALF`` elements again with ``put_nbi`` into the second half of
``next``'s ``inbox2`` and completes it with ``quiet``, ``get``s that half back into ``back``
(local), ``fetch_add``s 1 to the counter on PE 0 and adds 1 to ``next``'s signal again with
``signal_op`` (completed with ``quiet``); then waits (bounded) for its own signal to reach ``epoch``.  After a CTA barrier
every thread copies the inbox to ``out`` (local).  ``result``: [0] 1 if the wait saw the
signal, [1] the counter's value before the add.
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint64
from cutlass.cute.runtime import make_fake_stream

import ptxops
from ptxops import nvshmem as nv

BUDGET_NS = 10_000_000_000  # the signal wait gives up after 10 s
N = 4096
HALF = N // 2
THREADS = 128


def _sym(dtype, addr: Int64, n: int, align: int) -> cute.Tensor:
    """A symmetric tensor of ``n`` elements at address ``addr``."""
    ptr = cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=align)
    return cute.make_tensor(ptxops.reach(ptr, "symmetric"), cute.make_layout(n))


def _local(dtype, addr: Int64, n: int, align: int) -> cute.Tensor:
    return cute.make_tensor(cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=align),
                            cute.make_layout(n))


@cute.kernel
def ring_kernel(src: Int64, inbox: Int64, inbox2: Int64, signal: Int64, counter: Int64, out: Int64,
                back: Int64, result: Int64, next_pe: Int32, epoch: Int64, budget_ns: Int64):
    tidx, _, _ = cute.arch.thread_idx()
    box = _sym(Float32, inbox, N, 4)
    sig = _sym(Uint64, signal, 1, 8)
    res = _local(Int64, result, 2, 8)
    if tidx == 0:
        nv.put_signal(box, _local(Float32, src, N, 4), sig, 1, next_pe, op="add")
        box2 = _sym(Float32, inbox2 + HALF * 4, HALF, 4)
        nv.put(box2, _local(Float32, src, HALF, 4), next_pe, nbi=True)
        nv.quiet()
        nv.get(_local(Float32, back, HALF, 4), box2, next_pe)
        res[1] = Int64(nv.fetch_add(_sym(Uint64, counter, 1, 8), 1, 0))
        nv.signal_op(sig, 1, next_pe, op="add")
        nv.quiet()  # the signal update delivered before the kernel ends
        ok = nv.signal_wait(sig, epoch, cute.arch.globaltimer() + budget_ns, cmp="ge")
        res[0] = Int64(ok)
    cute.arch.sync_threads()
    dst = _local(Float32, out, N, 4)
    for i in range(tidx, N, THREADS):
        dst[i] = box[i]


@cute.jit
def ring(src: Int64, inbox: Int64, inbox2: Int64, signal: Int64, counter: Int64, out: Int64, back: Int64,
         result: Int64, next_pe: Int32, epoch: Int64, budget_ns: Int64, stream: cuda.CUstream):
    ring_kernel(src, inbox, inbox2, signal, counter, out, back, result, next_pe, epoch, budget_ns).launch(
        grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)


def example_args() -> tuple:
    """Arguments to compile :func:`ring` with, without a GPU."""
    return (*(Int64(0) for _ in range(8)), Int32(1), Int64(1), Int64(1 << 30), make_fake_stream())


def run_ring(ctx: Any) -> None:
    """Run :func:`ring` once on every rank of the open ``collectives`` context ``ctx`` (its
    heap NVSHMEM's: PE = rank) and check it: each inbox holds exactly the previous rank's
    source (put_signal), the second half of the second inbox the first half of it and its first
    half is untouched (``put(nbi=True)`` of a stated count), ``get`` read back what this rank
    put, the bounded wait saw the signal, each signal is 2 (put_signal and signal_op added 1
    each), and the fetch-adds on PE 0's counter returned 0 .. W-1 once each and left W."""
    import pytest
    import torch
    import torch.distributed as dist

    if type(ctx.heap).__name__ != "NvshmemHeap":
        pytest.skip(f"the context's heap is {type(ctx.heap).__name__}, not NVSHMEM's")
    from nvshmem.core import library_finalize
    from nvshmem.core.interop.cute import cute_compile_helper

    from tests.support.gpu_support import current_stream

    world, rank = ctx.world_size, ctx.rank
    inbox, inbox2 = ctx.empty(N, torch.float32), ctx.empty(N, torch.float32)
    signal, counter = ctx.empty(1, torch.int64), ctx.empty(1, torch.int64)  # Uint64 words
    for t, v in ((inbox, -1), (inbox2, -1), (signal, 0), (counter, 0)):
        t.fill_(v)
    src = torch.arange(N, dtype=torch.float32, device="cuda") + rank * N
    out = torch.full((N,), -2.0, device="cuda")
    back = torch.full((HALF,), -3.0, device="cuda")
    result = torch.full((2,), -1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    ctx.host_barrier()

    args = (*(Int64(t.data_ptr()) for t in (src, inbox, inbox2, signal, counter, out, back, result)),
            Int32((rank + 1) % world), Int64(1), Int64(BUDGET_NS), current_stream())
    compiled, module = cute_compile_helper(ring, *args)
    try:
        compiled(*args)
        torch.cuda.synchronize()
        ctx.host_barrier()
    finally:
        library_finalize(module)

    prev = (rank - 1) % world
    expected = torch.arange(N, dtype=torch.float32, device="cuda") + prev * N
    assert result[0].item() == 1, "the signal wait timed out"
    assert torch.equal(out, expected) and torch.equal(inbox, expected)
    assert torch.equal(inbox2[HALF:], expected[:HALF])
    assert torch.all(inbox2[:HALF] == -1), "put(count=) wrote past its count"
    assert torch.equal(back, src[:HALF]), "get did not read back what this rank put"
    olds: list[Any] = [None] * world
    dist.all_gather_object(olds, result[1].item(), group=ctx.group)
    assert sorted(olds) == list(range(world))
    if rank == 0:
        assert counter.item() == world
    assert signal.item() == 2
