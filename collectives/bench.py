"""Benchmark: ours vs NCCL vs ``torch.ops.symm_mem`` in one run on the same GPUs.

    torchrun --nproc-per-node 4 -m collectives.bench [--dtypes bf16,f32] [--out DIR]

Times back-to-back operations with CUDA events, eager launches from Python and CUDA-graph
replays separately; prints a table with times, bus bandwidth and ratios (rank 0), writes
``bench.json`` and, where matplotlib is installed, ``bench.png``.  NVLink multicast stays off:
our backend is peer, torch's symm_mem runs without multicast, NCCL without NVLS.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _value

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def time_op(fn: Callable[[], object], iters: int, graph: bool) -> float:
    """Microseconds per call of ``fn`` run ``iters`` times back to back (after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(iters):
                    fn()
        run = g.replay
    else:
        def run() -> None:
            for _ in range(iters):
                fn()
    run()
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    mine = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device="cuda")
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's time
    return float(mine)


def bus_bandwidth(collective: str, nbytes: int, world: int, us: float) -> float:
    """GB/s in nccl-tests' convention (nbytes: per-rank input)."""
    factor = 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world
    return nbytes * factor / (us * 1e-6) / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.bench", description=__doc__)
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes per rank")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-graph", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.runtime import communicator

    comm = communicator()
    rank, world = comm.rank, comm.world
    group_name = dist.group.WORLD.group_name
    results: list[dict] = []
    modes = [False] if args.no_graph else [False, True]

    def record(collective: str, impl: str, dtype: str, nbytes: int, graph: bool, us: float) -> None:
        results.append(dict(collective=collective, impl=impl, dtype=dtype, bytes=nbytes,
                            mode="graph" if graph else "eager", us=us,
                            busbw=bus_bandwidth(collective, nbytes, world, us) if nbytes else 0.0))

    for graph in modes:
        iters = 200
        record("barrier", "ours", "-", 0, graph, time_op(collectives.barrier, iters, graph))
        handle_buf = symm_mem.empty(1024, device="cuda")
        handle = symm_mem.rendezvous(handle_buf, group_name)
        record("barrier", "torch_symm_mem", "-", 0, graph, time_op(lambda: handle.barrier(channel=0), iters, graph))

    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        for nbytes in (int(s) for s in args.sizes.split(",")):
            n = nbytes // torch.empty((), dtype=dtype).element_size()
            iters = max(5, min(200, (512 << 20) // (nbytes * 8)))
            ours = collectives.empty(n, dtype)
            ours.fill_(1)
            plain = torch.ones(n, dtype=dtype, device="cuda")
            theirs = symm_mem.empty(n, dtype=dtype, device="cuda")
            symm_mem.rendezvous(theirs, group_name)
            theirs.fill_(1)
            rs_out = torch.empty(n // world, dtype=dtype, device="cuda")
            for graph in modes:
                for algorithm in ("one_shot", "two_shot"):
                    us = time_op(lambda a=algorithm: collectives.all_reduce(ours, algorithm=a, backend="peer"), iters, graph)
                    record("all_reduce", f"ours_{algorithm}", name, nbytes, graph, us)
                us = time_op(lambda: collectives.all_reduce(ours, backend="peer"), iters, graph)
                record("all_reduce", "ours_auto", name, nbytes, graph, us)
                us = time_op(lambda: collectives.all_reduce(plain, backend="peer"), iters, graph)
                record("all_reduce", "ours_auto_plain_tensor", name, nbytes, graph, us)
                record("all_reduce", "nccl", name, nbytes, graph, time_op(lambda: dist.all_reduce(plain), iters, graph))
                record("all_reduce", "torch_one_shot", name, nbytes, graph, time_op(
                    lambda: torch.ops.symm_mem.one_shot_all_reduce(theirs, "sum", group_name), iters, graph))
                record("all_reduce", "torch_two_shot", name, nbytes, graph, time_op(
                    lambda: torch.ops.symm_mem.two_shot_all_reduce_(theirs, "sum", group_name), iters, graph))
                record("reduce_scatter", "ours", name, nbytes, graph, time_op(
                    lambda: collectives.reduce_scatter(rs_out, ours, backend="peer"), iters, graph))
                record("reduce_scatter", "nccl", name, nbytes, graph, time_op(
                    lambda: dist.reduce_scatter_tensor(rs_out, plain), iters, graph))
            collectives.synchronize()
            comm.ctx.free(ours)

    if rank == 0:
        report(results, world, args.out)
    dist.barrier()
    collectives.current().close()


def report(results: list[dict], world: int, out_dir: str) -> None:
    """Print the comparison table and write bench.json (and bench.png with matplotlib)."""
    gpu = torch.cuda.get_device_name()
    print(f"\n{world} x {gpu}, NVLink multicast off (our backend: peer); microseconds per call, "
          "back-to-back; bus GB/s; ratio = theirs / ours (>1: ours faster)")
    index = {(r["collective"], r["impl"], r["dtype"], r["bytes"], r["mode"]): r for r in results}
    for mode in ("eager", "graph"):
        rows = [r for r in results if r["mode"] == mode and r["collective"] == "barrier"]
        if rows:
            ours = index.get(("barrier", "ours", "-", 0, mode))
            theirs = index.get(("barrier", "torch_symm_mem", "-", 0, mode))
            print(f"[{mode}] barrier: ours {ours['us']:.2f} us, torch symm_mem {theirs['us']:.2f} us, "
                  f"ours/torch {ours['us'] / theirs['us']:.2f}")
        for collective, impls, baselines in (
            ("all_reduce", ("ours_one_shot", "ours_two_shot", "ours_auto", "ours_auto_plain_tensor"),
             ("nccl", "torch_one_shot", "torch_two_shot")),
            ("reduce_scatter", ("ours",), ("nccl",)),
        ):
            keys = sorted({(r["dtype"], r["bytes"]) for r in results if r["collective"] == collective and r["mode"] == mode})
            if not keys:
                continue
            head = ["dtype", "size"] + [f"{i} us" for i in impls + baselines] + ["best ours GB/s", "nccl GB/s"] + [f"{b}/ours" for b in baselines]
            print(f"\n[{mode}] {collective}")
            print(" | ".join(head))
            for dtype, nbytes in keys:
                cells = [index.get((collective, i, dtype, nbytes, mode)) for i in impls + baselines]
                best = min((c for c in cells[: len(impls)] if c), key=lambda c: c["us"])
                ratios = [f"{index[(collective, b, dtype, nbytes, mode)]['us'] / best['us']:.2f}" for b in baselines]
                nccl = index[(collective, "nccl", dtype, nbytes, mode)]
                print(" | ".join([dtype, _size(nbytes)] + [f"{c['us']:.1f}" if c else "-" for c in cells]
                                 + [f"{best['busbw']:.0f}", f"{nccl['busbw']:.0f}"] + ratios))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"gpu": gpu, "world": world, "results": results}, f, indent=1)
    try:
        plot(results, world, gpu, os.path.join(out_dir, "bench.png"))
    except ImportError:
        print("matplotlib not installed: no bench.png (python -m collectives.plot bench.json makes one)")


def plot(results: list[dict], world: int, gpu: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, collective in zip(axes, ("all_reduce", "reduce_scatter")):
        for impl in sorted({r["impl"] for r in results if r["collective"] == collective}):
            rows = sorted((r for r in results if r["collective"] == collective and r["impl"] == impl
                           and r["mode"] == "eager" and r["dtype"] == "bf16"), key=lambda r: r["bytes"])
            if rows:
                ax.plot([r["bytes"] for r in rows], [r["busbw"] for r in rows], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective}, bf16, eager, {world} x {gpu}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _size(nbytes: int) -> str:
    for unit, shift in (("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


if __name__ == "__main__":
    main()
