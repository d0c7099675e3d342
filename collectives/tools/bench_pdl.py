"""Benchmark programmatic dependent launch: compute -> collective -> compute in a CUDA graph,
our kernels launched with and without PDL (:data:`collectives.config.PDL`), and the barrier
in the same chain against torch symm_mem's.

    torchrun --nproc-per-node 4 -m collectives.tools.bench_pdl [--sizes 4096,65536,1048576] [--dtype bf16]

The compute steps are elementwise kernels over a buffer of ``--compute-bytes``; with PDL our
kernel may be scheduled while the kernel before it drains (it waits, ``griddepcontrol.wait``,
before its first global access) and lets a PDL-launched kernel after it start early
(``griddepcontrol.launch_dependents``).  Rank 0 prints microseconds per chain (slowest rank,
best of 3, :func:`collectives.tools.bench.time_op`), the chain without the collective, and
PDL over no PDL (< 1: PDL gains); the barrier row gives ours / torch (target <= 0.8).  NVLink
multicast stays off: our backend is peer.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ..dtypes import DTYPES  # noqa: E402
from .bench import BENCH_DTYPES, time_op  # noqa: E402


def chain(compute: torch.Tensor, step: Callable[[], object] | None) -> Callable[[], None]:
    """compute -> ``step`` -> compute on the current stream (``step`` None: compute twice)."""
    def run() -> None:
        compute.mul_(1.0001)
        if step is not None:
            step()
        compute.add_(1.0)
    return run


def timed(fn: Callable[[], None], pdl: bool, iters: int) -> float:
    """Microseconds per call of ``fn`` replayed in a CUDA graph, our kernels launched with or
    without PDL (captured anew: the launch attribute is part of each graph node)."""
    from .. import config

    before = config.PDL
    config.PDL = pdl
    try:
        return time_op(fn, iters, graph=True)
    finally:
        config.PDL = before


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.bench_pdl", description=__doc__)
    parser.add_argument("--sizes", default="4096,65536,1048576", help="all-reduce bytes per rank")
    parser.add_argument("--dtype", default="bf16", choices=BENCH_DTYPES)
    parser.add_argument("--compute-bytes", type=int, default=64 << 20)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args(argv)

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    dtype = DTYPES[args.dtype].torch
    compute = torch.ones(args.compute_bytes // 4, dtype=torch.float32, device="cuda")
    handle = symm_mem.rendezvous(symm_mem.empty(1024, device="cuda"), dist.group.WORLD.group_name)
    base = timed(chain(compute, None), False, args.iters)
    rows = [("compute only", base, base)]
    rows.append(("barrier (ours)", timed(chain(compute, collectives.barrier), False, args.iters),
                 timed(chain(compute, collectives.barrier), True, args.iters)))
    torch_barrier = timed(chain(compute, lambda: handle.barrier(channel=0)), False, args.iters)
    for nbytes in (int(s) for s in args.sizes.split(",")):
        t = collectives.empty(nbytes // torch.empty((), dtype=dtype).element_size(), dtype)
        t.fill_(1)
        step = chain(compute, lambda t=t: collectives.all_reduce(t, backend="peer"))
        rows.append((f"all_reduce {nbytes} B", timed(step, False, args.iters), timed(step, True, args.iters)))
        collectives.synchronize()
        comm.ctx.free(t)
    if comm.rank == 0:
        print(f"{comm.world} GPUs; graph replays, us per compute -> step -> compute chain "
              f"(compute: {args.compute_bytes >> 20} MB elementwise twice)")
        print(f"{'step':24} {'no pdl':>9} {'pdl':>9} {'pdl/no':>7} {'pdl-compute':>12}")
        for name, off, on in rows:
            print(f"{name:24} {off:9.2f} {on:9.2f} {on / off:7.2f} {on - base:12.2f}")
        ours = min(rows[1][1], rows[1][2]) - base
        print(f"barrier in the chain: ours {ours:.2f} us, torch symm_mem {torch_barrier - base:.2f} us "
              f"(over the compute alone); ours/torch {ours / (torch_barrier - base):.2f}")
    collectives.synchronize()
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
