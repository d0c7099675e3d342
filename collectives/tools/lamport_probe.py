"""Probe: an empty rank against ranks running Lamport (issue 48 item 4), call by call.

    torchrun --nproc-per-node 2 -m collectives.tools.lamport_probe [--timeout 5] [--limit 85]
    python -m collectives.tools.lamport_probe --world 2

Every rank makes the same all-reduces of bf16 (:data:`CALLS`: ``auto`` picks Lamport for 4096
elements), twice: once with rank 0 empty at the second call, once with the last rank empty (an
empty rank launches the barrier of size 0, :func:`collectives.api._launch`).  After each call
every rank synchronizes and reads its signal pad (the kernels' layout, ``PadLayout(world=W)``):
its call count ``C``, its Lamport counts of the bf16 width (every part's: ``step`` is one number
where all parts agree, ``lo..hi`` where they do not), the dirty word of each of its buffers
(:data:`~collectives.config.LAMPORT_BUFFERS`), the size entries the ranks left in its pad (``tag:n`` per buffer and rank) and the block-0 arrival
words of both parities (``epoch:size`` per rank, the epoch relative to ``C`` before the call).
Rank 0 prints every rank's line per call, then whether the ranks' ``C`` and Lamport counts
agreed.  Exit 0 only where every empty call raised the size mismatch on every rank, every other
call was exact and the counts agreed after every call; a hang is bounded by ``--timeout`` (each
GPU wait) and ``--limit`` (the whole run: a traceback of every thread, then exit 1).
"""

from __future__ import annotations

import argparse
import faulthandler
import sys

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402

from ..config import KIND_SHIFT, LAMPORT_BLOCKS, LAMPORT_BUFFERS  # noqa: E402
from ..layouts import PadLayout  # noqa: E402
from .soak import run_ranks  # noqa: E402

#: (elements, algorithm) of each call; the one at :data:`EMPTY_AT` is empty on one rank.  Three
#: kernels (Lamport, one-shot, the barrier): their compiles fit the bound.  The Lamport call after
#: the one-shot reuses the buffer the empty call left dirty (emptied by the 512-element call).
CALLS = ((4096, "auto"), (4096, "auto"), (4096, "lamport"), (512, "lamport"), (4096, "one_shot"),
         (4096, "lamport"), (4096, "auto"))
EMPTY_AT = 1
WIDTH = 1  # bf16: the Lamport buffers of 2-byte elements
U32 = (1 << 32) - 1


def pad_state(comm, before: int) -> list[int]:
    """This rank's pad words the probe reports, as uint32 (``before``: ``C`` before the call)."""
    layout = PadLayout(world=comm.world)
    pad = comm.pad.cpu().tolist()
    word = lambda i: pad[i] & U32  # noqa: E731
    steps = [word(layout.lamport_step(WIDTH, p)) for p in range(LAMPORT_BLOCKS)]
    buffers = range(LAMPORT_BUFFERS)
    sizes = [word(layout.lamport_size(WIDTH, b, s) + h) for b in buffers for s in range(comm.world) for h in (0, 1)]
    arrivals = [word(layout.arrival(p, 0, s) + h) for p in (0, 1) for s in range(comm.world) for h in (0, 1)]
    return ([word(layout.calls), min(steps), max(steps)] + [word(layout.lamport_dirty(WIDTH, b)) for b in buffers]
            + sizes + arrivals + [before])


def describe(rank: int, outcome: str, state: list[int], world: int) -> str:
    """One rank's line: what its call did and its pad words, decoded."""
    calls, lo, hi, *rest = state
    dirty, rest = rest[:LAMPORT_BUFFERS], rest[LAMPORT_BUFFERS:]
    sizes, rest = rest[:2 * LAMPORT_BUFFERS * world], rest[2 * LAMPORT_BUFFERS * world:]
    arrivals, before = rest[:4 * world], rest[4 * world]
    step = f"{lo}" if lo == hi else f"{lo}..{hi} (PARTS DIFFER)"
    entry = lambda lo_, hi_: f"{hi_}:{lo_ & ((1 << KIND_SHIFT) - 1)}"  # noqa: E731  (tag:n)
    entries = " | ".join(",".join(entry(sizes[2 * (b * world + s)], sizes[2 * (b * world + s) + 1])
                                  for s in range(world)) for b in range(LAMPORT_BUFFERS))
    parity = [",".join(f"C{(arrivals[2 * (p * world + s)] - before + (1 << 31)) % (1 << 32) - (1 << 31):+d}:"
                       f"{arrivals[2 * (p * world + s) + 1]:#x}" for s in range(world)) for p in (0, 1)]
    buffers = "|".join(map(str, range(LAMPORT_BUFFERS)))
    return (f"  rank {rank}: {outcome:<14} C={calls} step={step} dirty={dirty} entries[buffer {buffers}]={entries} "
            f"arrivals[parity 0]={parity[0]} [parity 1]={parity[1]}")


#: What a call did on a rank, by code (agreed as an integer).
OUTCOMES = ("ok", "size mismatch", "TIMEOUT", "OTHER ERROR", "WRONG RESULT")


def run_call(comm, index: int, empty: int, n: int, algorithm: str) -> int:
    """This rank's part of call ``index`` (empty where ``index`` is :data:`EMPTY_AT` and this is
    rank ``empty``), synchronized; its :data:`OUTCOMES` code (an error printed with the rank)."""
    import collectives

    world, rank = comm.world, comm.rank
    size = 0 if index == EMPTY_AT and rank == empty else n
    t = torch.full((size,), rank + 1.0, dtype=torch.bfloat16, device="cuda")
    try:
        collectives.all_reduce(t, algorithm=algorithm)
        collectives.synchronize()
    except collectives.CollectiveError as e:
        code = 2 if isinstance(e, collectives.CollectiveTimeout) else 1 if "different sizes" in str(e) else 3
        if code > 1:
            print(f"rank {rank}, call {index}: {e}", file=sys.stderr, flush=True)
        return code
    return 0 if not size or bool(torch.all(t == world * (world + 1) // 2)) else 4


def probe(comm, timeout: float) -> int:
    """Run the calls on this rank; rank 0 prints the table.  The exit status."""
    comm.errors.timeout_s = timeout
    world, failures = comm.world, 0
    for empty in dict.fromkeys((0, world - 1)):
        for index, (n, algorithm) in enumerate(CALLS):
            before = int(comm.pad[PadLayout(world=world).calls]) & U32
            code = run_call(comm, index, empty, n, algorithm)
            rows = comm.ctx.agreement.all_gather(f"lamport_probe {empty} {index}", [code, *pad_state(comm, before)])
            agree = len({tuple(row[1:4]) for row in rows}) == 1 and all(row[2] == row[3] for row in rows)
            good = agree and all(row[0] == (1 if index == EMPTY_AT else 0) for row in rows)
            failures += not good
            if comm.rank == 0:
                what = f"rank {empty} empty" if index == EMPTY_AT else f"{n} x bf16, {algorithm}"
                print(f"call {index} ({what}): {'as expected' if good else 'FAILED'}, counts "
                      f"{'agree' if agree else 'DIVERGED'}", flush=True)
                for r, row in enumerate(rows):
                    print(describe(r, OUTCOMES[row[0]], row[1:], world), flush=True)
            if any(row[0] == 2 for row in rows):
                return 1  # the communicator is lost
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.lamport_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=5.0, help="GPU-side bound of every wait, seconds")
    parser.add_argument("--limit", type=float, default=85.0, help="bound of the whole run, seconds")
    parser.add_argument("--world", type=int, default=0, help="W rank threads on one GPU instead of torchrun")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.limit, exit=True)
    from ..runtime.communicator import communicator

    return run_ranks("lamport_probe", argparse.Namespace(world=args.world, timeout=args.timeout),
                     lambda rank, world: probe(communicator(), args.timeout))


if __name__ == "__main__":
    sys.exit(main())
