"""Benchmark all_gather: ours (one-shot, TMA, Lamport, auto) vs NCCL's ``all_gather_into_tensor``.

    torchrun --nproc-per-node 4 -m collectives.tools.all_gather_bench [--dtype bf16] [--no-graph]

Sizes are the gathered output's bytes per rank (W x the input).  Times are the slowest rank's,
best of 3 (``collectives.tools.bench.time_op``), eager launches and CUDA-graph replays; rank 0 prints
one row per size with each NCCL column's time (:mod:`collectives.tools.nccl_baselines`: plain
tensors, symmetric windows, copy engines on symmetric windows, where this torch and NCCL have
them), the fastest, and each of ours with ours / that fastest NCCL (Lamport ``-`` where the
input exceeds its slot, :data:`~collectives.config.LAMPORT_MAX_BYTES`; the issue's targets:
<= 0.5 at 4-64 KB in graphs, <= 1/1.10 at 16-256 MB).  Symmetric input and output (zero-copy) and plain ones (the
output copied out of the internal buffer) are timed separately.  NVLink multicast stays off.
"""

from __future__ import annotations

import argparse

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ..config import LAMPORT_MAX_BYTES  # noqa: E402
from ..dtypes import DTYPES  # noqa: E402
from .bench import BENCH_DTYPES, SIZES, time_op  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.all_gather_bench", description=__doc__)
    parser.add_argument("--dtype", default="bf16", choices=BENCH_DTYPES)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="output bytes per rank")
    parser.add_argument("--no-graph", action="store_true")
    args = parser.parse_args(argv)

    import collectives
    from collectives.runtime.communicator import communicator

    from .bench import strongest_nccl
    from .nccl_baselines import baselines

    comm = communicator()
    world, dtype = comm.world, DTYPES[args.dtype].torch
    size = torch.empty((), dtype=dtype).element_size()
    modes = ["eager"] if args.no_graph else ["eager", "graph"]
    algorithms = ["one_shot", "tma", "lamport", "auto"]
    sizes = [int(s) for s in args.sizes.split(",")]
    nccl = baselines(max(sizes))
    columns = nccl.columns("all_gather")
    if comm.rank == 0:
        print("\n".join(nccl.lines()))
        print(f"all_gather, {args.dtype}, {world} GPUs; us per call; ratio = ours / the fastest NCCL column")
        print(f"{'mode':6} {'out bytes':>10} {'tensors':9} " + " ".join(f"{c:>9}" for c in columns)
              + f" {'best':>9} " + " ".join(f"{a:>9} {'ratio':>6}" for a in algorithms))
    for mode in modes:
        for nbytes in sizes:
            n = nbytes // size // world // 16 * 16  # whole 16-element blocks: every algorithm applies
            if n == 0:
                continue
            iters = max(10, min(200, (1 << 30) // (nbytes * 8)))
            plain_in = torch.ones(n, dtype=dtype, device="cuda")
            plain_out = torch.empty(world * n, dtype=dtype, device="cuda")
            us = {"nccl": time_op(lambda: dist.all_gather_into_tensor(plain_out, plain_in), iters, mode == "graph")}
            for column in columns[1:]:
                out, inp = nccl.windows[column].views(world * n, n, dtype)
                inp.fill_(1)
                us[column] = time_op(lambda o=out, i=inp, g=nccl.group(column): dist.all_gather_into_tensor(o, i, group=g),
                                     iters, mode == "graph")
            best, best_us = strongest_nccl(us)
            sym_in, sym_out = collectives.empty(n, dtype), collectives.empty(world * n, dtype)
            sym_in.fill_(1)
            for label, out, inp in (("symmetric", sym_out, sym_in), ("plain", plain_out, plain_in)):
                row = []
                for algorithm in algorithms:
                    if algorithm == "lamport" and n * size > LAMPORT_MAX_BYTES:
                        row.append(f"{'-':>9} {'-':>6}")
                        continue
                    ours = time_op(lambda: collectives.all_gather(out, inp, algorithm=algorithm, backend="peer"),
                                   iters, mode == "graph")
                    row.append(f"{ours:9.1f} {ours / best_us:6.2f}")
                collectives.synchronize()
                if comm.rank == 0:
                    print(f"{mode:6} {world * n * size:>10} {label:9} " + " ".join(f"{us[c]:9.1f}" for c in columns)
                          + f" {best:>9} " + " ".join(row), flush=True)
            comm.ctx.free(sym_in)
            comm.ctx.free(sym_out)
    torch.cuda.synchronize()
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
