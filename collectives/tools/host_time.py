"""Host time per eager call on GPUs: what the host spends enqueueing a collective, ours and torch
symm_mem's (issue 50's targets are eager times, which the host sets for small tensors).

    torchrun --nproc-per-node 4 -m collectives.tools.host_time [--bytes 4096,65536] [--calls 2000] [--profile]

Per collective and size: microseconds of host time per call (``time.perf_counter`` around
``--calls`` back-to-back eager calls, the GPU synchronised before and after, never inside; the
slowest rank's, best of 3), for a plan hit (the same tensors again) and for tensors made anew at
each call (the allocator's other addresses; made before the timing).  ``--profile``: rank 0
also prints cProfile's top functions of the plan hits.  bf16; NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def host_us(calls: Callable[[], list[Callable[[], object]]], repeats: int = 3) -> float:
    """Microseconds of host time per call of the functions ``calls()`` returns (made anew for
    each of ``repeats`` runs, outside the timing; each called once, in order): the slowest
    rank's, best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        fns = calls()
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for fn in fns:
            fn()
        mine = (time.perf_counter() - start) / len(fns) * 1e6
        torch.cuda.synchronize()
        slowest = torch.tensor([mine], device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        best = min(best, float(slowest))
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.host_time", description=__doc__)
    parser.add_argument("--bytes", default="4096,65536", help="bytes per rank")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed._symmetric_memory as symm_mem

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, calls = comm.world, args.calls
    group = dist.group.WORLD.group_name
    rows: list[tuple[str, float]] = []

    def measure(name: str, make: Callable[[], Callable[[], object]], moved: bool = True) -> None:
        hit = make()
        hit()
        rows.append((f"{name}, plan hit", host_us(lambda: [hit] * calls)))
        if moved:
            rows.append((f"{name}, new tensors", host_us(lambda: [make() for _ in range(calls)])))
        if args.profile and comm.rank == 0:
            profile = cProfile.Profile()
            profile.runcall(lambda: [hit() for _ in range(calls)])
            print(f"== {name}, plan hit: cProfile, {calls} calls")
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)

    measure("barrier", lambda: collectives.barrier, moved=False)
    handle_buffer = symm_mem.empty(1024, device="cuda")
    handle = symm_mem.rendezvous(handle_buffer, group)
    measure("torch symm_mem barrier", lambda: lambda: handle.barrier(channel=0), moved=False)
    for nbytes in (int(b) for b in args.bytes.split(",")):
        n = nbytes // 2

        def plain(m: int) -> torch.Tensor:
            return torch.ones(m, dtype=torch.bfloat16, device="cuda")

        measure(f"all_reduce {nbytes} B", lambda: (lambda t=plain(n): collectives.all_reduce(t)))
        measure(f"reduce_scatter {nbytes} B",
                lambda: (lambda o=plain(n // world), i=plain(n): collectives.reduce_scatter(o, i)))
        measure(f"all_gather {nbytes} B",
                lambda: (lambda o=plain(n), i=plain(n // world): collectives.all_gather(o, i)))
        theirs = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(theirs, group)
        measure(f"torch two_shot_all_reduce_ {nbytes} B",
                lambda: lambda: torch.ops.symm_mem.two_shot_all_reduce_(theirs, "sum", group), moved=False)
        collectives.synchronize()
    if comm.rank == 0:
        print(f"host time per eager call, {world} ranks, bf16 ({torch.cuda.get_device_name()}):")
        for name, us in rows:
            print(f"  {name:45s} {us:8.2f} us")
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
