"""What the barrier kernel's time is made of, measured on one GPU.

    python -m collectives.tools.barrier_costs        # one GPU

Runs the peer barrier kernel of 2 ranks as rank 1 with both ranks' signal words in this GPU's
pad: the pad table's entry for rank 0 lies 8 bytes before the pad, so the store meant for rank
0's copy of our word lands on rank 0's word, and every wait passes once our own signals land.
Beside it, variants
that drop one part of it, each launched 200 times in a CUDA graph and eagerly.  The difference
to a real 2-GPU barrier is the NVLink trip of the signal.  Variants:

* ``barrier``: the collective's kernel (call-count and pad-table loads, ``st.release.sys``,
  ``ld.acquire.sys`` poll, call-count store);
* ``relaxed signal``: the same with ``st.relaxed.sys`` (not a barrier that orders memory: it
  shows what the sys-scope release costs);
* ``no loads``: a ``red.release.sys`` to an address the launch passes, then the poll (no
  epoch, no pad table: what those loads cost);
* ``relaxed poll``: the barrier with its poll made of ``ld.relaxed.sys`` and, once the epoch is
  seen, one ``ld.acquire.sys`` of the same word (it reads that value or a later one, so it
  synchronises with the signal's release): what the acquire costs in every round of the poll;
* ``fenced poll``: the same, ending with one ``fence.acq_rel.sys`` instead of the acquire load
  (a relaxed read of the release then a fence is an acquire pattern too);
* ``fence only``: one ``fence.acq_rel.sys`` per signalling thread;
* ``empty``: the launch alone.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Int64, Uint32, Uint64

import ptxops

from .. import algorithms
from ..algorithms import KernelKey
from ..config import BARRIER_THREADS
from ..device import signals
from ..device.kernel_args import KernelArgs
from ..device.launch import example_arguments, launcher
from ..layouts import TIMEOUT, PadLayout

WORLD = 2
LAYOUT = PadLayout(world=WORLD)
LAUNCHES = 200


@cute.jit
def _missed(err: Int64) -> None:
    """A wait ran out: a plain store of TIMEOUT into the error words, which the host reads
    after a sync (no release: the variants' only ordering is the one they measure)."""
    ptxops.st(signals.gmem(Int32, err, 4, signals.HOST, "collectives.tools.barrier_costs._missed"), Int32(TIMEOUT))


def _variant(part: str):
    """A kernel body of the launch contract doing ``part`` of a barrier (see the module)."""

    @cute.jit
    def body(args: KernelArgs):
        pad_table, pad_mc, pad, err, rank, timeout_ns = (args.pad_table, args.pad_mc, args.pad, args.err, args.rank,
                                                         args.timeout_ns)
        tidx = cute.arch.thread_idx()[0]
        block = cute.arch.block_idx()[0]
        if cutlass.const_expr(part == "fence only"):
            if tidx < WORLD:
                ptxops.fence(sem="acq_rel", scope="sys")
        elif cutlass.const_expr(part == "no loads"):
            deadline = cute.arch.globaltimer() + timeout_ns
            if tidx < WORLD:
                words_mc = signals.gmem(Uint32, pad_mc, 4, signals.MULTICAST, "collectives.tools.barrier_costs._variant")
                ptxops.red(words_mc + LAYOUT.arrival(0, block, tidx), Uint32(1),
                           sem="release", scope="sys")
                words = signals.gmem(Uint32, pad, 4, signals.PEER, "collectives.tools.barrier_costs._variant")
                if not signals.wait_until(words + LAYOUT.arrival(0, block, 1), Uint32(1), deadline):
                    _missed(err)
        elif cutlass.const_expr(part in ("relaxed poll", "fenced poll")):
            calls, last = signals.enter_call(pad, WORLD)
            deadline = cute.arch.globaltimer() + timeout_ns
            if tidx < WORLD:
                want = calls + Uint32(1)
                peer = signals.peer_address(pad_table, tidx)
                ptxops.st_release(signals.arrival_word(peer, calls, block, rank, WORLD), Uint64(want), scope="sys")
                own = cute.recast_ptr(signals.arrival_word(pad, calls, block, tidx, WORLD), dtype=Uint32)
                seen = signals.spin(lambda: ptxops.ld(own, sem="relaxed", scope="sys", dtype=Uint32),
                                    lambda x: signals.reached(x, want), deadline)
                if cutlass.const_expr(part == "relaxed poll"):
                    seen = ptxops.ld_acquire(own, scope="sys", dtype=Uint32)
                else:
                    ptxops.fence(sem="acq_rel", scope="sys")
                if not signals.reached(seen, want):
                    _missed(err)
            signals.leave_call(pad, calls, last, WORLD)
        elif cutlass.const_expr(part == "relaxed signal"):
            calls, last = signals.enter_call(pad, WORLD)
            deadline = cute.arch.globaltimer() + timeout_ns
            if tidx < WORLD:
                peer = signals.peer_address(pad_table, tidx)
                ptxops.st(signals.arrival_word(peer, calls, block, rank, WORLD), Uint64(calls + Uint32(1)),
                          sem="relaxed", scope="sys")
                own = signals.arrival_word(pad, calls, block, tidx, WORLD)
                if not signals.wait_until(cute.recast_ptr(own, dtype=Uint32), calls + Uint32(1), deadline):
                    _missed(err)
            signals.leave_call(pad, calls, last, WORLD)

    return body


def kernels() -> dict[str, object]:
    """Each variant's ``@cute.jit`` launcher."""
    real = algorithms.build(KernelKey("barrier", "one_shot", "peer", "bf16", WORLD, threads=BARRIER_THREADS))
    parts = ("relaxed poll", "fenced poll", "relaxed signal", "no loads", "fence only", "empty")
    made = {part: launcher(_variant(part), BARRIER_THREADS) for part in parts}
    return {"barrier": real, **made}


def _time(fn, args: tuple, graph: bool) -> float:
    """Best of 5: microseconds per launch of ``fn`` on a side stream, in a graph or eagerly."""
    stream = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        for _ in range(20):
            fn(*args, stream.cuda_stream)
        run = lambda: [fn(*args, stream.cuda_stream) for _ in range(LAUNCHES)]  # noqa: E731
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                run()
            run = g.replay
        best = float("inf")
        for _ in range(5):
            start.record(stream)
            run()
            end.record(stream)
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1e3 / LAUNCHES)
    return best


def main() -> None:
    torch.cuda.set_device(0)
    print(f"{torch.cuda.get_device_name()}: microseconds per barrier kernel, 2 ranks looped back to one GPU")
    print(f"{'variant':16s} {'graph':>7s} {'eager':>7s}")
    for name, launch in kernels().items():
        fn = cute.compile(launch, *example_arguments(), options="--enable-tvm-ffi").__tvm_ffi_object__()
        pad = torch.zeros(LAYOUT.words, dtype=torch.int32, device="cuda")
        # We are rank 1; rank 0's entry is 8 bytes (one arrival word) early: see the module.
        table = torch.tensor([pad.data_ptr() - 8, pad.data_ptr()], dtype=torch.int64, device="cuda")
        err = torch.zeros(16, dtype=torch.int32, device="cuda")
        args = (0, 0, 0, 0, 1, table.data_ptr(), pad.data_ptr(), pad.data_ptr(), err.data_ptr(), 1, 10**9, 1)
        for timed in (False, True):  # one launch first: a loopback that never passes fails in a second
            if timed:
                graph, eager = _time(fn, args, True), _time(fn, args, False)
            else:
                fn(*args, torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
            if int(err.abs().sum()):
                raise RuntimeError(f"{name}: the kernel recorded an error {err.tolist()}")
        print(f"{name:16s} {graph:7.2f} {eager:7.2f}")


if __name__ == "__main__":
    main()
