"""Benchmark GEMM + communication: ours (overlapped) vs torch.matmul and NCCL back to back vs
``torch.ops.symm_mem``'s fused ops (where this torch has them).

    torchrun --nproc-per-node 2 -m collectives.tools.gemm_overlap_bench [--shapes 4096x4096,16384x8192]
        [--chunks 4,8] [--comm-blocks 0,8,16] [--no-graph]

Shapes are ``MxN`` with K = N, bf16 (tensor-parallel layers).  gemm_reduce_scatter: each rank's
``a`` is M x K, the output M/W x N; all_gather_gemm: each rank's shard is M/W x K, the output
M x N.  Ours is timed for every ``--chunks`` x ``--comm-blocks`` setting
(:data:`collectives.overlap.CHUNKS` and :data:`~collectives.overlap.COMM_BLOCKS`; 0: the
collective's own grid); eager calls and CUDA-graph replays, slowest rank's time, best of 3
(``collectives.tools.bench.time_op``); rank 0 prints microseconds and ours / baseline.  NVLink
multicast stays off.
"""

from __future__ import annotations

import argparse

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .. import overlap  # noqa: E402
from .bench import time_op  # noqa: E402

SHAPES = "4096x4096,4096x8192,16384x4096,16384x8192"


def fused(name: str):
    """``torch.ops.symm_mem.<name>``, or None where this torch lacks it."""
    return getattr(getattr(torch.ops, "symm_mem", None), name, None)


def _time_or_nan(fn, iters: int, graph: bool, label: str, rank: int) -> float:
    """``time_op(fn)``, or NaN (reported) where ``fn`` is None or fails (torch's fused ops may
    refuse a shape or a graph capture)."""
    if fn is None:
        return float("nan")
    try:
        return time_op(fn, iters, graph)
    except Exception as e:  # noqa: BLE001 (report, keep benchmarking)
        if rank == 0:
            print(f"  {label} failed: {type(e).__name__}: {str(e)[:200]}")
        return float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.gemm_overlap_bench", description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--chunks", default=str(overlap.CHUNKS), help="comma-separated chunk counts")
    parser.add_argument("--comm-blocks", default="0", help="comma-separated caps on the communication grid (0: none)")
    parser.add_argument("--no-graph", action="store_true")
    args = parser.parse_args(argv)

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world = comm.world
    group = dist.group.WORLD.group_name
    try:  # older torch needs the group registered for symmetric memory
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(group)
    except Exception:  # noqa: BLE001 (absent or not needed in this torch)
        pass
    settings = [(int(c), int(b)) for c in args.chunks.split(",") for b in args.comm_blocks.split(",")]
    modes = ["eager"] if args.no_graph else ["eager", "graph"]
    if comm.rank == 0:
        print(f"bf16, {world} GPUs, {comm.sms} SMs; us per call; ratio = ours / that")
        print(f"{'op':20} {'mode':5} {'M':>6} {'N=K':>6} {'chunks':>6} {'blocks':>6} {'ours':>9} "
              f"{'mm+nccl':>9} {'ratio':>6} {'symm_mem':>9} {'ratio':>6}")
    for shape in args.shapes.split(","):
        m, n = (int(x) for x in shape.split("x"))
        k = n
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda").to(torch.bfloat16) / 64
        rs_out = torch.empty(m // world, n, dtype=torch.bfloat16, device="cuda")
        shard = a[: m // world]
        gathered = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
        ag_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

        def mm_nccl_rs() -> None:
            dist.reduce_scatter_tensor(rs_out, torch.mm(a, b))

        def nccl_ag_mm() -> None:
            dist.all_gather_into_tensor(gathered, shard)
            torch.mm(gathered, b, out=ag_out)

        rs_fused, ag_fused = fused("fused_matmul_reduce_scatter"), fused("fused_all_gather_matmul")
        rows = [
            ("gemm_reduce_scatter", lambda: collectives.gemm_reduce_scatter(a, b, out=rs_out), mm_nccl_rs,
             rs_fused and (lambda: rs_fused(a, b, "sum", 0, group))),
            ("all_gather_gemm", lambda: collectives.all_gather_gemm(shard, b, out=ag_out), nccl_ag_mm,
             ag_fused and (lambda: ag_fused(shard, [b], 0, group))),
        ]
        for name, ours, baseline, theirs in rows:
            for mode in modes:
                graph = mode == "graph"
                t_base = time_op(baseline, args.iters, graph)
                t_theirs = _time_or_nan(theirs, args.iters, graph, f"symm_mem {name} ({mode})", comm.rank)
                for chunks, blocks in settings:
                    overlap.CHUNKS, overlap.COMM_BLOCKS = chunks, blocks or None
                    t_ours = time_op(ours, args.iters, graph)
                    collectives.synchronize()
                    if comm.rank == 0:
                        print(f"{name:20} {mode:5} {m:6} {n:6} {chunks:6} {blocks or '-':>6} {t_ours:9.1f} "
                              f"{t_base:9.1f} {t_ours / t_base:6.2f} {t_theirs:9.1f} {t_ours / t_theirs:6.2f}",
                              flush=True)
    torch.cuda.synchronize()
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
