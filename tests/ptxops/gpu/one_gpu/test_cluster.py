"""GPU tests of the bulk reduction and the cluster device functions, on one GPU.

Run: ``python -m pytest -q -m gpu tests/ptxops/gpu/one_gpu/test_cluster.py`` (skipped without a GPU); the
kernels also compile on CPU here (the tests without the ``gpu`` mark).

* ``cp_reduce_async_bulk``: BLOCKS CTAs each add their own 64 Int32 from shared memory into one
  global array (``.add.s32``, ``.bulk_group``): every element ends at its initial value plus the
  sum of all CTAs' elements, so no element's reduction was lost to another's.
* ``mapa`` / ``st_async`` / ``red_async`` / ``nanosleep``: clusters of two CTAs.  Each CTA
  stores four Int32 into the other's shared buffer (one ``st.async.v4.b32``) and adds twice into
  the other's counter (``red.async.add.s32``), all completing on the receiver's mbarrier; the
  receiver waits for its phase (bounded by a globaltimer deadline, with nanosleep backoff)
  and writes what it received, and whether it timed out, to global memory.
"""

from __future__ import annotations

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

from cutlass import Int32, Int64  # noqa: E402
from cutlass.memory import SmemAllocator  # noqa: E402
from tests.support.cute_support import compile_ptx, global_tensor, opcodes  # noqa: E402
from tests.support.gpu_support import compile_for_device, current_stream  # noqa: E402

import ptxops  # noqa: E402

BLOCKS = 16
#: Int32 per CTA in the bulk reduction (256 bytes).
N = 64
CLUSTERS = 8
#: Int32 slots per CTA in the exchange output: 4 stored, 1 counter, 1 status.
SLOTS = 8
#: Per-launch budget of the mbarrier wait (ns of %globaltimer).
BUDGET_NS = 2_000_000_000
#: What the receiver's mbarrier phase waits for: one 16-byte st.async and two 4-byte red.async.
EXPECTED_TX = 16 + 4 + 4


def make_reduce_launcher():
    @cute.kernel
    def kernel(dst: cute.Tensor):
        smem = SmemAllocator()
        buf = smem.allocate_array(Int32, num_elems=N, byte_alignment=16)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        ptxops.st(buf + tidx, bidx + tidx)
        ptxops.fence(proxy="async.shared::cta")  # the bulk reduction reads buf in the async proxy
        cute.arch.sync_threads()
        if tidx == 0:
            ptxops.cp_reduce_async_bulk(dst.iterator, buf, N * 4)
            ptxops.cp_async_bulk_commit_group()
            ptxops.cp_async_bulk_wait_group(0)

    @cute.jit
    def launch(dst: cute.Tensor, stream):
        kernel(dst).launch(grid=[BLOCKS, 1, 1], block=[N, 1, 1], stream=stream)

    return launch


def make_exchange_launcher():
    @cute.kernel
    def kernel(out: cute.Tensor):
        smem = SmemAllocator()
        bar = smem.allocate_array(Int64, num_elems=1, byte_alignment=8)
        buf = smem.allocate_array(Int32, num_elems=8, byte_alignment=16)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster()
        if tidx == 0:
            ptxops.st(buf + 4, Int32(0))
            ptxops.mbarrier_init(bar, 1)
            ptxops.fence(op_restrict="mbarrier_init", sem="release", scope="cluster")
            ptxops.mbarrier_arrive(bar, EXPECTED_TX)
        cute.arch.cluster_arrive()  # the peer's mbarrier and counter are ready before we write
        cute.arch.cluster_wait()
        if tidx == 0:
            peer = 1 - rank
            remote, remote_bar = ptxops.mapa(buf, peer), ptxops.mapa(bar, peer)
            ptxops.st_async(remote, [rank * 100 + k for k in range(4)], remote_bar, dtype=Int32)
            ptxops.red_async(remote + 4, rank + 5, remote_bar, dtype=Int32)
            ptxops.red_async(remote + 4, Int32(10), remote_bar)
            deadline = cute.arch.globaltimer() + BUDGET_NS
            state = Int32(0)  # 0 waiting, 1 phase complete, 2 timed out
            delay = Int32(32)
            while state == 0:
                if ptxops.mbarrier_try_wait(bar, phase=0, sem="acquire", scope="cluster"):
                    state = Int32(1)
                else:
                    ptxops.nanosleep(delay)
                    if delay < 1024:
                        delay = delay * 2
                    if cute.arch.globaltimer() > deadline:
                        state = Int32(2)
            row = out.iterator + bidx * SLOTS
            for k in range(5):
                ptxops.st(row + k, ptxops.ld(buf + k))
            ptxops.st(row + 5, state)
        cute.arch.cluster_arrive()  # neither CTA exits while its peer may still write into it
        cute.arch.cluster_wait()

    @cute.jit
    def launch(out: cute.Tensor, stream):
        kernel(out).launch(grid=[2 * CLUSTERS, 1, 1], block=[32, 1, 1], cluster=[2, 1, 1], stream=stream)

    return launch


def _stream_arg():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(0)


def test_kernels_compile_for_hopper() -> None:
    reduce_ptx = compile_ptx(make_reduce_launcher(), global_tensor(n=N), _stream_arg())
    exchange_ptx = compile_ptx(make_exchange_launcher(), global_tensor(n=2 * CLUSTERS * SLOTS), _stream_arg())
    assert opcodes(reduce_ptx)["cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32"] == 1
    found = opcodes(exchange_ptx)
    assert found["st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32"] == 1
    assert found["red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.s32"] == 2
    assert found["mapa.shared::cluster.u32"] == 2
    assert found["nanosleep.u32"] == 1


@pytest.mark.gpu
def test_bulk_reductions_of_many_ctas_add_up() -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    dst = torch.arange(N, dtype=torch.int32, device="cuda")
    arg = from_dlpack(dst, assumed_align=16)
    compile_for_device(make_reduce_launcher(), arg, current_stream())(arg, current_stream())
    torch.cuda.synchronize()
    i = torch.arange(N, dtype=torch.int32)
    expected = i + BLOCKS * i + sum(range(BLOCKS))
    assert torch.equal(dst.cpu(), expected)


@pytest.mark.gpu
def test_cluster_peers_exchange_through_st_async_and_red_async() -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    out = torch.full((2 * CLUSTERS * SLOTS,), -1, dtype=torch.int32, device="cuda")
    arg = from_dlpack(out, assumed_align=16)
    compile_for_device(make_exchange_launcher(), arg, current_stream())(arg, current_stream())
    torch.cuda.synchronize()
    rows = out.view(2 * CLUSTERS, SLOTS).cpu()
    for block in range(2 * CLUSTERS):
        peer = 1 - block % 2
        assert rows[block, 5] == 1, f"CTA {block} timed out waiting for its mbarrier"
        assert rows[block, :4].tolist() == [peer * 100 + k for k in range(4)], block
        assert rows[block, 4] == peer + 5 + 10, block
