"""Benchmark all_gather: ours (one-shot, TMA, Lamport, auto) vs NCCL's ``all_gather_into_tensor``.

    torchrun --nproc-per-node 4 -m collectives.tools.all_gather_bench [--dtype bf16] [--no-graph] [--out DIR]

Sizes are the gathered output's bytes per rank (W x the input).  Times are the slowest rank's,
best of 3 (``collectives.tools.bench.time_op``), eager launches and CUDA-graph replays; rank 0 prints
one row per size with each NCCL column's time (:mod:`collectives.tools.nccl_baselines`: plain
tensors, symmetric windows, copy engines on symmetric windows, where this torch and NCCL have
them), the fastest, and each of ours with ours / that fastest NCCL (Lamport ``-`` where the
input exceeds half its slot, :data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`; the issue's targets:
<= 0.5 at 4-64 KB in graphs, <= 1/1.10 at 16-256 MB).  Symmetric input and output (zero-copy) and plain ones (the
output copied out of the internal buffer) are timed separately.  The records are those of
:mod:`collectives.tools.bench` (which times the same rows,
:func:`collectives.tools.bench.gather_rows`, in its own run); ``--out DIR`` writes them as
``DIR/all_gather-<device>.json``.  A NCCL column that raises is skipped with its reason, never
the run.  NVLink multicast stays off.
"""

from __future__ import annotations

import argparse

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ..dtypes import DTYPES  # noqa: E402
from .bench import ALGORITHMS_ALL_GATHER, BENCH_DTYPES, FIELDS, SIZES, gather_rows, strongest_nccl  # noqa: E402
from .records import Recorder  # noqa: E402

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.all_gather_bench", description=__doc__)
    parser.add_argument("--dtype", default="bf16", choices=BENCH_DTYPES)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="output bytes per rank")
    parser.add_argument("--no-graph", action="store_true")
    parser.add_argument("--out", help="write DIR/all_gather-<device>.json")
    args = parser.parse_args(argv)

    import collectives
    from collectives.runtime.communicator import communicator

    from .nccl_baselines import baselines
    from .records import all_ranks_agree

    comm = communicator()
    world = comm.world
    modes = ["eager"] if args.no_graph else ["eager", "graph"]
    sizes = [int(s) for s in args.sizes.split(",")]
    nccl = baselines(max(sizes))
    rec = Recorder("all_gather", FIELDS, all_ranks_agree(), comm.rank)
    columns = nccl.columns("all_gather")
    impls = [f"ours_{a}{s}" for s in ("", "_plain") for a in ALGORITHMS_ALL_GATHER]
    if comm.rank == 0:
        print("\n".join(nccl.lines()))
        print(f"all_gather, {args.dtype}, {world} GPUs; us per call; ratio = ours / the fastest NCCL column")
        print(f"{'mode':6} {'out bytes':>10} " + " ".join(f"{c:>9}" for c in columns)
              + f" {'best':>9} " + " ".join(f"{i.removeprefix('ours_'):>14} {'ratio':>6}" for i in impls))
    try:
        for mode in modes:
            for nbytes in sizes:
                iters = max(10, min(200, (1 << 30) // (nbytes * 8)))
                us = gather_rows(rec, nccl, args.dtype, nbytes, mode, iters)
                if comm.rank == 0 and us:
                    best, best_us = strongest_nccl(us) or ("-", float("nan"))
                    print(f"{mode:6} {rec.results[-1]['bytes']:>10} "
                          + " ".join(f"{us[c]:9.1f}" if c in us else f"{'-':>9}" for c in columns)
                          + f" {best:>9} " + " ".join(f"{us[i]:14.1f} {us[i] / best_us:6.2f}" if i in us
                                                    else f"{'-':>14} {'-':>6}" for i in impls),
                          flush=True)
    finally:
        if comm.rank == 0 and args.out:
            path = rec.write(args.out, world, torch.cuda.get_device_name(), nccl_version=nccl.version,
                             nccl_skipped=nccl.skipped)
            print(f"wrote {path}")
    torch.cuda.synchronize()
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
