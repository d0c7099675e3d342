"""The overlap timeline: when each block's GEMM and copy ran, from CUDA events.

    torchrun --nproc-per-node 4 -m collectives.tools.overlap_timeline [--shape 16384,8192,8192]
        [--comm-priority P] [--out DIR]

Runs ``gemm_reduce_scatter`` and ``all_gather_gemm`` (bf16) once each after a warm-up, with a
start and end event around every rank's block's GEMM (current stream) and copy (side stream;
of CUDA priority ``P``, lower is higher, with ``--comm-priority``), labelled with the rank the
block is for (``own``: this rank's).  Rank 0 prints the intervals (microseconds from the first event), writes
``overlap-timeline-<device>.json`` (``4xH200``: :func:`collectives.tools.records.device_tag`)
and, where matplotlib is installed, its plot (``.png``, one row per stream, one bar per block)
into ``--out``: the plot for ``docs/guide-gemm-overlap.md``.
"""

from __future__ import annotations

import argparse
import json
import os

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402


def run(fn, timeline: list) -> list[dict]:
    """Run ``fn(timeline)`` and return its intervals in microseconds from the earliest start."""
    fn(timeline)
    torch.cuda.synchronize()
    origin = timeline[0][2]  # (the first recorded, not always the first to run: shifted below)
    rows = [dict(kind=kind, chunk=chunk, start=origin.elapsed_time(start) * 1e3, end=origin.elapsed_time(end) * 1e3)
            for kind, chunk, start, end in timeline]
    first = min(row["start"] for row in rows)
    return [dict(row, start=row["start"] - first, end=row["end"] - first) for row in rows]


def plot(results: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 1.6 * len(results) + 0.6), squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], results.items()):
        for row in rows:
            y = 1 if row["kind"] == "gemm" else 0
            ax.broken_barh([(row["start"], row["end"] - row["start"])], (y - 0.4, 0.8),
                           color="tab:blue" if y else "tab:orange", edgecolor="black")
            ax.text((row["start"] + row["end"]) / 2, y, "own" if row["chunk"] < 0 else str(row["chunk"]),
                    ha="center", va="center", fontsize=8)
        ax.set_yticks([0, 1], ["comm (side stream)", "GEMM (cuBLAS)"])
        ax.set_title(name, fontsize=9)
    axes[-1, 0].set_xlabel("microseconds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.overlap_timeline", description=__doc__)
    # One option for the three sizes: under torchrun, "--m" or "--n" would be taken for an
    # abbreviation of torchrun's own options (--max-restarts, --nnodes, ...).
    parser.add_argument("--shape", default="16384,8192,8192", type=lambda text: tuple(int(v) for v in text.split(",")),
                        help="M,N,K: rows of a per rank (gemm_reduce_scatter), columns of b, inner size")
    parser.add_argument("--comm-priority", type=int, default=0, help="CUDA priority of the side stream (0: default)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)

    import collectives
    from collectives.overlap import eager_all_gather_gemm, eager_gemm_reduce_scatter
    from collectives.runtime.communicator import communicator

    from .records import device_tag

    comm = communicator()
    if args.comm_priority:
        comm.stream_flags.use_side(torch.cuda.Stream(priority=args.comm_priority))
    m, n, k = args.shape
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
    shard = a[: m // comm.world]
    calls = {
        f"gemm_reduce_scatter M={m} N={n} K={k}, {comm.world} GPUs":
            lambda t: eager_gemm_reduce_scatter(a, b, timeline=t),
        f"all_gather_gemm M={m} N={n} K={k}, {comm.world} GPUs":
            lambda t: eager_all_gather_gemm(shard, b, timeline=t),
    }
    results = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn(None)
        collectives.synchronize()
        results[name] = run(fn, [])
    collectives.synchronize()
    if comm.rank == 0:
        for name, rows in results.items():
            print(name)
            for row in rows:
                print(f"  {row['kind']:4} block {row['chunk']:2}: {row['start']:9.1f} .. {row['end']:9.1f} us")
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"overlap-timeline-{device_tag(comm.world, torch.cuda.get_device_name())}")
        with open(path + ".json", "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {path}.json")
        try:
            plot(results, path + ".png")
        except ImportError:
            print("matplotlib not installed: no plot")
    torch.cuda.synchronize()
    collectives.current().close()


if __name__ == "__main__":
    main()
