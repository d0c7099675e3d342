"""The kernel and the host runner of the multicast-shaped litmus tests (:mod:`.multicast`),
traced under :func:`ptxops.emulate_multicast`: they run on any two GPUs with peer access, and
their PTX holds no multimem instruction.  The kernel needs CuTeDSL; :func:`run` torch and two
GPUs under torchrun (a 2-rank ``collectives`` context)."""

from __future__ import annotations

import tempfile
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.base_dsl.compiler import DumpDir

import ptxops

from .kernels import _gptr, _rendezvous
from .layout import THREADS
from .multicast import MulticastTest
from .shapes import FORBIDDEN


def make_launcher(test: MulticastTest) -> Any:
    """The ``@cute.jit`` launcher of ``test``: ``launch(table, mc, own, regs, sync, status, rank,
    iters, budget_ns, stream)``; one CTA of :data:`~.layout.THREADS` instances per iteration.
    ``table``: the translation table of one window (``mc`` -> both ranks' location buffers);
    ``own``: this rank's location buffer (words ``2 i`` = x, ``2 i + 1`` = y of instance i);
    ``regs``: (r0, r1) per instance (GPU 1); ``sync``: rank 0's rendezvous counter."""

    @cute.kernel
    def kernel(table: Int64, mc: Int64, own: Int64, regs: Int64, sync: Int64, status: Int64, rank: Int32,
               iters: Int32, budget_ns: Int64):
        with ptxops.emulate_multicast(table, world=2):
            tidx = cute.arch.thread_idx()[0]
            deadline = cute.arch.globaltimer() + budget_ns
            timeouts = Int32(0)
            for k in range(iters):
                if tidx == 0:
                    timeouts += _rendezvous(_gptr(sync), (k + 1) * 2, deadline)
                cute.arch.sync_threads()
                i = k * THREADS + tidx
                if rank == 0:
                    ptxops.multimem_st(_gptr(mc) + 2 * i, Int32(1))
                    if cutlass.const_expr(test.flag == "st"):
                        ptxops.multimem_st(_gptr(mc) + (2 * i + 1), Int32(1), sem=test.writer_sem, scope="sys")
                    else:
                        ptxops.multimem_red(_gptr(mc) + (2 * i + 1), Int32(1), sem=test.writer_sem, scope="sys")
                else:
                    r0 = ptxops.ld(_gptr(own) + (2 * i + 1), sem=test.reader_sem, scope="sys")
                    r1 = ptxops.ld(_gptr(own) + 2 * i)
                    ptxops.st(_gptr(regs) + 2 * i, r0)
                    ptxops.st(_gptr(regs) + (2 * i + 1), r1)
            if tidx == 0:
                ptxops.red(_gptr(status), timeouts)

    @cute.jit
    def launch(table: Int64, mc: Int64, own: Int64, regs: Int64, sync: Int64, status: Int64, rank: Int32,
               iters: Int32, budget_ns: Int64, stream: cuda.CUstream):
        kernel(table, mc, own, regs, sync, status, rank, iters, budget_ns).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


def example_arguments() -> tuple:
    """Placeholder arguments to compile a launcher without a GPU."""
    return (Int64(0),) * 6 + (Int32(0), Int32(1), Int64(1_000_000_000), cuda.CUstream(0))


def run(test: MulticastTest, ctx: Any, runs: int, *, iters: int = 4096, budget_s: float = 10.0) -> dict:
    """Run ``test`` on the two GPUs of ``ctx`` (a 2-rank ``collectives`` context) until ``runs``
    instance-runs are done; return ``{"histogram": {(r0, r1): count}, "violations": n,
    "timeouts": n}`` (rank 1 observes; both ranks get the same dict).  Collective."""
    import torch
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as dump:
        fn = cute.compile[cute.KeepPTX, DumpDir(dump)](make_launcher(test), *example_arguments())
        if "multimem" in (fn.__ptx__ or "multimem"):  # never launch a real multimem instruction
            raise RuntimeError(f"{test.name}: the kernel's PTX holds multimem (or none could be read)")
    words = 2 * THREADS * iters
    mem = ctx.empty(words, torch.int32)
    sync = ctx.empty(1, torch.int32)
    bases = ctx.peer_pointers(mem)
    fake = (1 << 62) + bases[ctx.rank]
    table = torch.tensor(ptxops.translation_table([(fake, words * 4, bases)]), dtype=torch.int64, device="cuda")
    regs = torch.zeros(words, dtype=torch.int32, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    done = 0
    while done < runs:
        mem.zero_()
        sync.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        fn(table.data_ptr(), fake, mem.data_ptr(), regs.data_ptr(), ctx.peer_pointers(sync)[0],
           status.data_ptr(), ctx.rank, iters, int(budget_s * 1e9),
           cuda.CUstream(torch.cuda.current_stream().cuda_stream))
        torch.cuda.synchronize()
        dist.barrier()
        if ctx.rank == 1:
            r = regs.view(-1, 2).long()
            counts += torch.bincount(r[:, 0] * 2 + r[:, 1], minlength=4)[:4]
        done += THREADS * iters
    dist.all_reduce(counts)
    dist.all_reduce(status)
    histogram = {(o >> 1, o & 1): int(c) for o, c in enumerate(counts.tolist()) if c}
    verdicts = test.verdicts()
    return {"histogram": histogram, "timeouts": int(status),
            "violations": sum(c for o, c in histogram.items() if verdicts[o] == FORBIDDEN)}


__all__ = ["example_arguments", "make_launcher", "run"]
