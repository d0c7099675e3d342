"""Bandwidth of every algorithm in a one-GPU world, against a device copy timed in the same
process: a regression guard for the kernels' memory paths, not an NVLink figure.

    python -m collectives.tools.bench --world 2 [--sizes 1048576,67108864] [--dtype bf16]

Each rank of a :class:`~collectives.testing.World` times ``--iters`` back-to-back calls of one
collective and algorithm on its own stream (CUDA events, after a warm-up; the slowest rank's
time), on a symmetric tensor and on a plain one (staged by the kernel).  The all-to-all
(even splits) writes into a symmetric output (``direct``) or a plain one (``staged``, through
its staging buffer: sizes past :data:`~collectives.runtime.all_to_all.STAGING_BYTES` are
skipped).  A call's bytes are what every rank must at least read and write: its input and its
output, summed over the ranks (all-reduce and all-to-all ``2 W N``, reduce-scatter ``(W + 1) N``,
all-gather ``(W + 1) N`` for ``N`` bytes of the larger tensor per rank); the copy moves ``W N``
bytes in and out (``2 W N``) with one ``copy_`` on one stream.  ``ratio`` is the algorithm's bytes per second over the copy's.  On one
GPU the ranks' reads of each other's buffers are local and L2 serves reuse (every rank reads the
same inputs), so ratios above 1 occur; a drop between runs on the same GPU is what it guards.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..symmetric.capability import cuda_missing

#: (collective, algorithm, placement) measured; placement "plain": a tensor from torch's allocator.
CASES = [
    *(("all_reduce", a, p) for a in ("one_shot", "two_shot", "tma", "push") for p in ("symmetric", "plain")),
    *(("reduce_scatter", a, p) for a in ("one_shot", "tma", "push") for p in ("symmetric", "plain")),
    *(("all_gather", a, p) for a in ("one_shot", "tma", "push") for p in ("symmetric", "plain")),
    ("all_to_all", "direct", "symmetric"), ("all_to_all", "staged", "plain"),
]


def moved_bytes(collective: str, world: int, nbytes: int) -> int:
    """Bytes every rank together must read and write in a call with ``nbytes`` of the larger
    tensor per rank (see the module docstring)."""
    return 2 * world * nbytes if collective in ("all_reduce", "all_to_all") else (world + 1) * nbytes


def time_us(fn: Any, iters: int, meet: Any) -> float:
    """Microseconds per call of ``fn`` on this rank's current stream, all ranks starting
    together (``meet()``), the best of 3 runs."""
    import functools

    import torch

    from .timing import event_us, repeat_calls

    for _ in range(3):
        fn()
    stream = torch.cuda.current_stream()
    best = float("inf")
    for _ in range(3):
        stream.synchronize()
        meet()
        best = min(best, event_us(functools.partial(repeat_calls, fn, iters), iters))
    return best


def copy_gbps(nbytes: int, iters: int) -> float:
    """GB/s (read + write) of ``copy_`` of ``nbytes`` on the current stream."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), iters, lambda: None)
    return 2 * nbytes / (us * 1e-6) / 1e9


def rank_body(rank: int, sizes: list[int], dtype: str, iters: int) -> list[dict]:
    """In one rank: every case of :data:`CASES` at every size; rows of (case, size, us)."""
    import torch

    import collectives
    from collectives.dtypes import DTYPES
    from collectives.errors import CollectiveError
    from collectives.runtime.all_to_all import STAGING_BYTES
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, kind = comm.world, DTYPES[dtype].torch
    rows = []
    for nbytes in sizes:
        n = nbytes // torch.empty((), dtype=kind).element_size() // world * world
        symmetric = collectives.empty(n, kind)
        symmetric.fill_(1)
        plain = torch.ones(n, dtype=kind, device="cuda")
        block = torch.empty(n // world, dtype=kind, device="cuda")
        received = torch.empty_like(plain)
        for collective, algorithm, placement in CASES:
            whole = symmetric if placement == "symmetric" else plain
            if collective == "all_to_all" and placement == "plain" and received.nbytes > STAGING_BYTES:
                continue  # a plain output larger than the staging buffer fails its pairs
            calls = {
                "all_reduce": lambda: collectives.all_reduce(whole, algorithm=algorithm, backend="peer"),
                "reduce_scatter": lambda: collectives.reduce_scatter(block, whole, algorithm=algorithm, backend="peer"),
                "all_gather": lambda: collectives.all_gather(whole, block, algorithm=algorithm, backend="peer"),
                "all_to_all": lambda: collectives.all_to_all(symmetric if placement == "symmetric" else received, plain),
            }
            try:
                us = time_us(calls[collective], iters, comm.ctx.host_barrier)
            except CollectiveError as e:  # refused the same way on every rank
                rows.append(dict(collective=collective, algorithm=algorithm, placement=placement, bytes=nbytes,
                                 us=None, refused=str(e)))
                continue
            rows.append(dict(collective=collective, algorithm=algorithm, placement=placement, bytes=nbytes, us=us))
        collectives.synchronize()
    return rows


def main(world: int, argv: list[str]) -> int:
    """``python -m collectives.tools.bench --world W ...``: the table above, printed; exit
    status 2 without a CUDA GPU (one line says why)."""
    from collectives.testing import World

    parser = argparse.ArgumentParser(prog=f"python -m collectives.tools.bench --world {world}", description=__doc__)
    parser.add_argument("--sizes", default=f"{1 << 20},{16 << 20},{64 << 20}", help="bytes per rank")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    missing = cuda_missing()
    if missing is not None:
        print(f"{parser.prog}: needs a CUDA GPU: {missing}", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    with World(world) as w:
        per_rank = w.run(lambda rank: rank_body(rank, sizes, args.dtype, args.iters))
        copies = {nbytes: w.run(lambda rank, b=nbytes: copy_gbps(world * b, args.iters) if rank == 0 else None)[0]
                  for nbytes in sizes}
    import torch

    print(f"{world} ranks on one {torch.cuda.get_device_name()}, {args.dtype}, peer backend; bytes per call = "
          "every rank's input and output; ratio = GB/s over a device copy's (read + write) in this process")
    print("collective | algorithm | tensor | bytes/rank | us (slowest rank) | GB/s | copy GB/s | ratio")
    for i, row in enumerate(per_rank[0]):
        nbytes = row["bytes"]
        if row["us"] is None:
            print(f"{row['collective']} | {row['algorithm']} | {row['placement']} | {nbytes} | refused: {row['refused']}")
            continue
        us = max(rows[i]["us"] for rows in per_rank)
        gbps = moved_bytes(row["collective"], world, nbytes) / (us * 1e-6) / 1e9
        print(f"{row['collective']} | {row['algorithm']} | {row['placement']} | {nbytes} | {us:.1f} | {gbps:.0f} | "
              f"{copies[nbytes]:.0f} | {gbps / copies[nbytes]:.2f}")
