"""Benchmark: ours vs NCCL vs ``torch.ops.symm_mem`` in one run on the same GPUs.

    torchrun --nproc-per-node 4 -m collectives.tools.bench [--dtypes bf16,f32] [--out DIR]

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

from ..capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def time_op(fn: Callable[[], object], iters: int, graph: bool, repeats: int = 3) -> float:
    """Microseconds per call of ``fn`` run ``iters`` times back to back (after warm-up): the
    slowest rank's time, the best of ``repeats`` timed runs (shared hosts are noisy)."""
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
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        mine = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device="cuda")
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's time
        best = min(best, float(mine))
    return best


def bus_bandwidth(collective: str, nbytes: int, world: int, us: float) -> float:
    """GB/s in nccl-tests' convention (nbytes: per-rank input)."""
    factor = 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world
    return nbytes * factor / (us * 1e-6) / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.bench", description=__doc__)
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes per rank")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--markdown", metavar="BENCH_JSON",
                        help="print the tables of an earlier run's bench.json as Markdown, and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.config import LAMPORT_MAX_BYTES, KernelKey
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
            iters = max(10, min(200, (1 << 30) // (nbytes * 8)))
            ours = collectives.empty(n, dtype)
            ours.fill_(1)
            plain = torch.ones(n, dtype=dtype, device="cuda")
            theirs = symm_mem.empty(n, dtype=dtype, device="cuda")
            symm_mem.rendezvous(theirs, group_name)
            theirs.fill_(1)
            rs_out = torch.empty(n // world, dtype=dtype, device="cuda")
            algorithms = ["one_shot", "two_shot", "tma"] + (["lamport"] if nbytes <= LAMPORT_MAX_BYTES else [])
            for graph in modes:
                for algorithm in algorithms:
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
                for algorithm in ("one_shot", "tma", "auto"):
                    record("reduce_scatter", f"ours_{algorithm}", name, nbytes, graph, time_op(
                        lambda a=algorithm: collectives.reduce_scatter(rs_out, ours, algorithm=a, backend="peer"), iters, graph))
                for algorithm in ("one_shot", "push", "auto"):  # an input outside symmetric memory
                    record("reduce_scatter", f"ours_{algorithm}_plain_input", name, nbytes, graph, time_op(
                        lambda a=algorithm: collectives.reduce_scatter(rs_out, plain, algorithm=a, backend="peer"), iters, graph))
                record("reduce_scatter", "nccl", name, nbytes, graph, time_op(
                    lambda: dist.reduce_scatter_tensor(rs_out, plain), iters, graph))
            collectives.synchronize()
            comm.ctx.free(ours)

    tma_blocks = {nbytes: comm.blocks(KernelKey("all_reduce", "tma", "peer", "bf16", world), -(-nbytes // 16 // world))
                  for nbytes in (int(x) for x in args.sizes.split(","))}
    if rank == 0:
        report(results, world, args.out, {"sms": comm.sms, "tma_blocks_all_reduce_bf16": tma_blocks})
    dist.barrier()
    collectives.current().close()


def report(results: list[dict], world: int, out_dir: str, sms: dict) -> None:
    """Print the comparison table and write bench.json (and bench.png with matplotlib)."""
    gpu = torch.cuda.get_device_name()
    print(f"\n{world} x {gpu}, NVLink multicast off (our backend: peer); microseconds per call, "
          "back-to-back; bus GB/s; ratio = theirs / ours (>1: ours faster); auto/best: ours_auto "
          "over the best fixed algorithm (<= 1.05 wanted)")
    print(f"{sms['sms']} SMs per GPU; thread blocks (one per SM at most) of the tma all-reduce by "
          f"size: {', '.join(f'{_size(b)}: {n}' for b, n in sms['tma_blocks_all_reduce_bf16'].items())}")
    index = {(r["collective"], r["impl"], r["dtype"], r["bytes"], r["mode"]): r for r in results}
    for mode in ("eager", "graph"):
        rows = [r for r in results if r["mode"] == mode and r["collective"] == "barrier"]
        if rows:
            ours = index.get(("barrier", "ours", "-", 0, mode))
            theirs = index.get(("barrier", "torch_symm_mem", "-", 0, mode))
            print(f"[{mode}] barrier: ours {ours['us']:.2f} us, torch symm_mem {theirs['us']:.2f} us, "
                  f"ours/torch {ours['us'] / theirs['us']:.2f}")
        for collective, (impls, baselines) in IMPLS.items():
            keys = sorted({(r["dtype"], r["bytes"]) for r in results if r["collective"] == collective and r["mode"] == mode})
            if not keys:
                continue
            head = (["dtype", "size"] + [f"{i} us" for i in impls + baselines] + ["best ours GB/s", "nccl GB/s"]
                    + [f"{b}/ours" for b in baselines] + ["auto/best", "auto picks"])
            print(f"\n[{mode}] {collective}")
            print(" | ".join(head))
            for dtype, nbytes in keys:
                cells = [index.get((collective, i, dtype, nbytes, mode)) for i in impls + baselines]
                best = min((c for c in cells[: len(impls)] if c), key=lambda c: c["us"])
                fixed = min(c["us"] for c in cells[: len(impls)] if c and "auto" not in c["impl"])
                auto = index[(collective, "ours_auto", dtype, nbytes, mode)]["us"]
                ratios = [f"{index[(collective, b, dtype, nbytes, mode)]['us'] / best['us']:.2f}" for b in baselines]
                ratios += [f"{auto / fixed:.2f}", _auto_pick(collective, world, nbytes)]
                nccl = index[(collective, "nccl", dtype, nbytes, mode)]
                print(" | ".join([dtype, _size(nbytes)] + [f"{c['us']:.1f}" if c else "-" for c in cells]
                                 + [f"{best['busbw']:.0f}", f"{nccl['busbw']:.0f}"] + ratios))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"gpu": gpu, "world": world, **sms, "results": results}, f, indent=1)
    try:
        plot(results, world, gpu, os.path.join(out_dir, "bench.png"))
    except ImportError:
        print("matplotlib not installed: no bench.png")


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


IMPLS = {
    "all_reduce": (("ours_lamport", "ours_one_shot", "ours_two_shot", "ours_tma", "ours_auto", "ours_auto_plain_tensor"),
                   ("nccl", "torch_one_shot", "torch_two_shot")),
    "reduce_scatter": (("ours_one_shot", "ours_tma", "ours_auto", "ours_one_shot_plain_input",
                        "ours_push_plain_input", "ours_auto_plain_input"), ("nccl",)),
}


def markdown(run: dict) -> str:
    """A run's bench.json as Markdown: the barrier line and one table per collective, dtype and
    mode (microseconds; best ours and NCCL bus GB/s; theirs/ours; auto over the best fixed)."""
    results, world = run["results"], run["world"]
    index = {(r["collective"], r["impl"], r["dtype"], r["bytes"], r["mode"]): r for r in results}
    lines = [f"## {world} x {run['gpu']}", ""]
    if "tma_blocks_all_reduce_bf16" in run:
        blocks = ", ".join(f"{_size(int(b))}: {n}" for b, n in run["tma_blocks_all_reduce_bf16"].items())
        lines += [f"{run['sms']} SMs per GPU. Thread blocks of the TMA all-reduce by size: {blocks}.", ""]
    for mode in ("eager", "graph"):
        ours, theirs = index.get(("barrier", "ours", "-", 0, mode)), index.get(("barrier", "torch_symm_mem", "-", 0, mode))
        if ours and theirs:
            lines += [f"Barrier ({mode}): ours {ours['us']:.2f} us, torch symm_mem {theirs['us']:.2f} us "
                      f"(ours/torch {ours['us'] / theirs['us']:.2f}).", ""]
    for collective, (impls, baselines) in IMPLS.items():
        for dtype in sorted({r["dtype"] for r in results if r["collective"] == collective}):
            for mode in ("eager", "graph"):
                sizes = sorted({r["bytes"] for r in results if (r["collective"], r["dtype"], r["mode"]) == (collective, dtype, mode)})
                if not sizes:
                    continue
                shown = [i for i in impls + baselines if any((collective, i, dtype, b, mode) in index for b in sizes)]
                head = ["size"] + [i.replace("_", " ") for i in shown] + ["ours best GB/s", "NCCL GB/s"] + [
                    f"{b.replace('_', ' ')}/ours" for b in baselines] + ["auto/best fixed", "auto picks"]
                lines += [f"### {collective}, {dtype}, {mode}", "", "| " + " | ".join(head) + " |",
                          "|" + "---|" * len(head)]
                for nbytes in sizes:
                    cells = {i: index.get((collective, i, dtype, nbytes, mode)) for i in shown}
                    mine = [c for i, c in cells.items() if c and i.startswith("ours")]
                    best = min(c["us"] for c in mine)
                    fixed = min(c["us"] for i, c in cells.items() if c and i.startswith("ours") and "auto" not in i)
                    row = [_size(nbytes)] + [f"{c['us']:.1f}" if c else "-" for c in cells.values()]
                    row += [f"{max(c['busbw'] for c in mine):.0f}", f"{cells['nccl']['busbw']:.0f}"]
                    row += [f"{cells[b]['us'] / best:.2f}" for b in baselines]
                    row += [f"{cells['ours_auto']['us'] / fixed:.2f}", _auto_pick(collective, world, nbytes)]
                    lines.append("| " + " | ".join(row) + " |")
                lines.append("")
    return "\n".join(lines)


def _auto_pick(collective: str, world: int, nbytes: int) -> str:
    """The algorithm ``auto`` runs for a 16-byte aligned tensor of ``nbytes`` on the peer backend."""
    from .. import tuning

    if collective == "all_reduce":
        return tuning.all_reduce_algorithm(world, nbytes, "peer")
    return tuning.reduce_scatter_algorithm(world, nbytes, "peer")


def _size(nbytes: int) -> str:
    for unit, shift in (("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


if __name__ == "__main__":
    main()
