"""Soak: many mixed collective calls, each checked against :mod:`collectives.reference`.

    torchrun --nproc-per-node 2 -m collectives.tools.soak [--calls 100000] [--seconds 3600]
    python -m collectives.tools.soak --world 4 --graph-calls 50

Every rank draws the same sequence from ``--seed``: a collective, an algorithm (or ``auto``), a
backend (``peer`` or ``multicast_emulated``: NVLink multicast stays off), a dtype, a size, and
eager or CUDA-graph (a graph per call shape, captured after an eager warm-up and replayed).
Inputs are small integers (exact in every dtype and sum); each result is compared with the
reference.  A graph holds ``--graph-calls`` copies of its call (each copying the input in
first), so a replay makes that many calls and the last result is checked.  Every
``--mismatch-every`` calls one rank brings another size (within one thread block and one
staging capacity): every rank must raise CollectiveError at the synchronize, and the next calls
must be right again.  ``--world W`` runs the ranks as W threads on one GPU
(:func:`collectives.testing.run_world`) instead of torchrun processes.  Exits non-zero on any wrong result, unexpected error
or missed mismatch, or when ``--seconds`` runs out before the calls are done.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from .. import reference  # noqa: E402
from ..algorithms import ALGORITHMS, REGISTRY, lamport  # noqa: E402
from ..config import (LAMPORT_BLOCKS, LAMPORT_BUFFERS, LAMPORT_GATHER_MAX_BYTES, LAMPORT_MAX_BYTES,  # noqa: E402
                      LAMPORT_WIDTHS, VECTOR_BYTES)
from ..dtypes import DTYPES  # noqa: E402
from ..layouts import PadLayout  # noqa: E402
from ..testing import capture  # noqa: E402

#: Set to 1: every rank prints its Lamport words after each call that changed them (``--watch-lamport``).
WATCH_ENV = "COLLECTIVES_SOAK_WATCH_LAMPORT"
#: The dtypes the soak draws from (registry names).
SOAK_DTYPES = ("bf16", "f16", "f32")
BACKENDS = ("peer", "multicast_emulated")
#: Elements per rank (all-gather input, reduce-scatter output): unaligned, aligned, small and large.
SIZES = (1, 7, 64, 1000, 4096, 3 * 4096 + 5, 65536, 1 << 18)
GRAPHS = 64  # graphs kept (oldest dropped)


def inputs(rank: int, salt: int, n: int) -> np.ndarray:
    """Rank ``rank``'s input for call ``salt``: integers in [-4, 4] (exact in every dtype, and any
    sum of 8 of them too)."""
    i = np.arange(n, dtype=np.int64)
    return ((i * 2654435761 + rank * 97 + salt * 31) % 9 - 4).astype(np.float32)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        import collectives
        from collectives.runtime.communicator import communicator

        self.collectives, self.comm = collectives, communicator()
        self.world, self.rank = self.comm.world, self.comm.rank
        self.args, self.rng = args, random.Random(args.seed)
        self.graphs: dict[tuple, tuple] = {}
        self.stats = {"eager": 0, "graph": 0, "mismatch": 0, "refused": 0}
        #: ``--trace``: rank -> (call, CUDA event recorded on the rank's stream just before the
        #: call's launches), shared by the ranks of a world.
        self.trace: dict | None = getattr(args, "trace_events", None)
        #: ``--watch-lamport``: the Lamport words of each width after the last call.
        self.watched: list[str] | None = None

    def started(self, step: int) -> None:
        """With ``--trace``: mark on this rank's stream where call ``step``'s work begins."""
        if self.trace is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.trace[self.rank] = (step, event)

    def draw(self) -> tuple:
        rng = self.rng
        collective = rng.choice(("all_reduce", "reduce_scatter", "all_gather"))
        algorithm = rng.choice(ALGORITHMS[collective] + ("auto",))
        dtype, backend, n = rng.choice(SOAK_DTYPES), rng.choice(BACKENDS), rng.choice(SIZES)
        if algorithm == "tma":
            n = -(-n // 16) * 16  # TMA moves whole 16-byte tiles
        if algorithm == "lamport":
            n = min(n, (LAMPORT_GATHER_MAX_BYTES if collective == "all_gather" else LAMPORT_MAX_BYTES) // 4)
        impl = REGISTRY.get((collective, algorithm))
        if impl is not None and backend not in impl.backends:  # (the push all-gather's: drawn there, not refused)
            backend = next(b for b in BACKENDS if b in impl.backends)
        return collective, algorithm, backend, dtype, n, rng.random() < self.args.graph_fraction

    def tensors(self, collective: str, dtype: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, output) of a call; an all-reduce works in place."""
        kind = DTYPES[dtype].torch
        count = self.world * n if collective == "reduce_scatter" else n
        t = torch.empty(count, dtype=kind, device="cuda")
        if collective == "all_reduce":
            return t, t
        return t, torch.empty(self.world * n if collective == "all_gather" else n, dtype=kind, device="cuda")

    def launch(self, collective, algorithm, backend, t, out) -> None:
        c = self.collectives
        if collective == "all_reduce":
            c.all_reduce(t, algorithm=algorithm, backend=backend)
        elif collective == "reduce_scatter":
            c.reduce_scatter(out, t, algorithm=algorithm, backend=backend)
        else:
            c.all_gather(out, t, algorithm=algorithm, backend=backend)

    def want(self, collective: str, dtype: str, count: int, salt: int) -> np.ndarray:
        ins = [reference.round_to(inputs(r, salt, count), dtype) for r in range(self.world)]
        if collective == "all_reduce":
            return reference.all_reduce(ins, dtype)
        if collective == "reduce_scatter":
            return reference.reduce_scatter(ins, dtype)[self.rank]
        return reference.all_gather(ins)

    def call(self, step: int, shape: tuple) -> None:
        """Run and check one call; a refusal (the same on every rank: every rank drew the same
        call) is counted and skipped."""
        try:
            self._call(step, shape)
        except self.collectives.CollectiveError as e:
            if isinstance(e, self.collectives.CollectiveTimeout) or "different sizes" in str(e):
                raise
            self.stats["refused"] += 1

    def _call(self, step: int, shape: tuple) -> None:
        collective, algorithm, backend, dtype, n, graph = shape
        key = shape[:5]
        if graph and key in self.graphs:
            g, source, t, out = self.graphs[key]
        else:
            t, out = self.tensors(collective, dtype, n)
            source = torch.empty_like(t)
        source.copy_(torch.from_numpy(inputs(self.rank, step, t.numel())).to(t.dtype))
        if not graph:
            t.copy_(source)
            self.started(step)
            self.launch(collective, algorithm, backend, t, out)
        else:
            if key not in self.graphs:
                def fn() -> None:
                    t.copy_(source)
                    self.launch(collective, algorithm, backend, t, out)
                self.started(step)
                fn()  # the warm-up: plans, grows and compiles outside the capture
                self.collectives.synchronize()
                g = torch.cuda.CUDAGraph()
                with capture(g):
                    for _ in range(self.args.graph_calls):
                        fn()
                if len(self.graphs) >= GRAPHS:
                    del self.graphs[next(iter(self.graphs))]
                self.graphs[key] = (g, source, t, out)
            self.started(step)
            g.replay()
        self.collectives.synchronize()
        self.watch(step, shape)
        self.stats["graph" if graph else "eager"] += self.args.graph_calls if graph else 1
        got = out.float().cpu().numpy()
        want = self.want(collective, dtype, t.numel(), step)
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            first = int(bad[0])
            raise AssertionError(f"call {step} {shape}: element {first} is {got[first]}, not {want[first]} "
                                 f"({self.wrong(shape, step, got, bad, t.element_size())})")

    def watch(self, step: int, shape: tuple) -> None:
        """With ``--watch-lamport`` (or :data:`WATCH_ENV` set to 1): print this rank's Lamport
        words of every width after each call that changed them (the call and what changed)."""
        if not (getattr(self.args, "watch_lamport", False) or os.environ.get(WATCH_ENV) == "1"):
            return
        pad, layout = pad_words(self.comm), PadLayout(world=self.comm.world)
        state = [lamport_words(pad, layout, width) for width in range(LAMPORT_WIDTHS)]
        last, self.watched = self.watched, state
        if state != last:
            changed = [f"width {1 << w} B: {words}" for w, words in enumerate(state) if last is None or words != last[w]]
            print(f"rank {self.rank} after call {step} {shape}: " + "; ".join(changed), flush=True)

    def wrong(self, shape: tuple, step: int, got: np.ndarray, bad: np.ndarray, element_bytes: int) -> str:
        """What a wrong result's note says besides its first element: how many are wrong, how
        many of them still hold this rank's input (never written: an all-reduce is in place),
        and, for a Lamport call, the parts they lie in and the rank's Lamport state."""
        collective, algorithm = shape[:2]
        own = reference.round_to(inputs(self.rank, step, got.size), shape[3]) if collective == "all_reduce" else None
        unwritten = int(np.count_nonzero(got[bad] == own[bad])) if own is not None else 0
        note = f"{bad.size} of {got.size} elements wrong, the last {int(bad[-1])}, {unwritten} of them this rank's input"
        if algorithm == "lamport":
            if collective == "all_reduce":  # (vector v of a slot: part v // THREADS % LAMPORT_BLOCKS)
                parts = np.unique(bad * element_bytes // VECTOR_BYTES // lamport.THREADS % LAMPORT_BLOCKS)
                note += f"; in Lamport parts {spans(parts)}"
            note += f"; {lamport_state(self.comm, element_bytes)}"
        return note

    def mismatch(self, step: int) -> None:
        """Rank 1 brings 8 more elements (one block and one staging capacity either way)."""
        n = 512 + 8 * (self.rank == 1)
        algorithm = self.rng.choice(("one_shot", "two_shot", "lamport", "push"))
        t = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        try:
            self.collectives.all_reduce(t, algorithm=algorithm, backend="peer")
            self.collectives.synchronize()
        except self.collectives.CollectiveError as e:
            if "different sizes" not in str(e):
                raise
            self.stats["mismatch"] += 1
            return
        raise AssertionError(f"call {step}: a {algorithm} size mismatch raised nothing")

    def run(self) -> int:
        args, start = self.args, time.monotonic()
        step, progress = 0, Progress("soak", args.calls, self.rank)
        while (done := sum(self.stats.values())) < args.calls:
            step += 1
            progress.tick(done)
            if time.monotonic() - start > args.seconds:
                print(f"rank {self.rank}: out of time after {done} calls", file=sys.stderr)
                return 2
            if args.mismatch_every and step % args.mismatch_every == args.mismatch_every - 1:
                self.mismatch(step)
            else:
                self.call(step, self.draw())
        if self.rank == 0:
            print(f"soak: {sum(self.stats.values())} calls on {self.world} ranks in {time.monotonic() - start:.0f}s: "
                  f"{self.stats}")
        return 0


class Progress:
    """Rank 0's line at each tenth of ``total`` calls done (``name: N of TOTAL calls in Ts``,
    flushed): a run cut short by a bound outside it shows how far it got."""

    def __init__(self, name: str, total: int, rank: int) -> None:
        self.name, self.total, self.on = name, total, rank == 0
        self.start, self.tenths = time.monotonic(), 0

    def tick(self, done: int) -> None:
        tenths = done * 10 // max(self.total, 1)
        if self.on and self.tenths < tenths < 10:
            self.tenths = tenths
            print(f"{self.name}: {done} of {self.total} calls in {time.monotonic() - self.start:.0f}s", flush=True)


def spans(values) -> str:
    """Sorted integers as runs: ``0-3, 7, 9-12``."""
    runs: list[list[int]] = []
    for v in map(int, values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def pad_words(comm) -> np.ndarray:
    """This rank's signal pad as the host reads it after the rank's stream: uint32 words."""
    if comm.pad.is_cuda:
        torch.cuda.current_stream().synchronize()
    return comm.pad.cpu().numpy().view(np.uint32)


def lamport_words(pad: np.ndarray, layout: PadLayout, width: int) -> str:
    """The dirty words and the parts' call counts (runs of equal counts) of one Lamport width
    in ``pad`` (:func:`pad_words`; ``layout``: the kernels', of the world size)."""
    steps = pad[layout.lamport_step(width, 0):layout.lamport_step(width, 0) + LAMPORT_BLOCKS]
    counts = "; ".join(f"{int(c)} in parts {spans(np.flatnonzero(steps == c))}" for c in np.unique(steps))
    dirty = [int(pad[layout.lamport_dirty(width, b)]) for b in range(LAMPORT_BUFFERS)]
    return f"counts {counts}, dirty {dirty}"


def lamport_state(comm, element_bytes: int) -> str:
    """This rank's Lamport words of an element width, as its kernels left them
    (:class:`~collectives.layouts.PadLayout` of the world size): the count of collective calls,
    :func:`lamport_words` and every rank's size entry in each buffer (``tag:count``)."""
    layout, width, pad = PadLayout(world=comm.world), lamport.width_index(element_bytes), pad_words(comm)
    sizes = [[f"{int(pad[layout.lamport_size(width, b, q) + 1])}:{int(pad[layout.lamport_size(width, b, q)])}"
              for q in range(comm.world)] for b in range(LAMPORT_BUFFERS)]
    return (f"Lamport state of width {element_bytes} B: calls {int(pad[layout.calls])}, "
            f"{lamport_words(pad, layout, width)}, size entries per buffer {sizes}")


def trace_report(trace: dict) -> str:
    """Each rank's last traced call and when its stream reached it, in milliseconds after the
    first rank's (events of one device compare across streams)."""
    marks = sorted(trace.items())
    for _, (_, event) in marks:
        event.synchronize()
    first = min((event for _, (_, event) in marks), key=lambda e: marks[0][1][1].elapsed_time(e))
    return "trace: " + "; ".join(f"rank {rank}: call {step} at +{first.elapsed_time(event):.1f} ms"
                                 for rank, (step, event) in marks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=3600.0, help="bound of the whole run")
    parser.add_argument("--seed", type=int, default=0, help="the same on every rank")
    parser.add_argument("--mismatch-every", type=int, default=97, help="0: none")
    parser.add_argument("--graph-fraction", type=float, default=0.3)
    parser.add_argument("--graph-calls", type=int, default=1, help="calls per graph (each replay makes them all)")
    parser.add_argument("--world", type=int, default=0, help="W rank threads on one GPU instead of torchrun")
    parser.add_argument("--timeout", type=float, default=30.0, help="GPU-side bound of every wait (--world)")
    parser.add_argument("--watch-lamport", action="store_true",
                        help="print each rank's Lamport words (call counts, dirty words) after every call that changed them")
    parser.add_argument("--trace", action="store_true",
                        help="(--world) on a failure, print when each rank's stream reached the last call's launches, "
                             "from CUDA events: ranks whose kernels could not run together start a deadline apart")
    args = parser.parse_args(argv)
    args.trace_events = {} if args.world and args.trace else None

    def report() -> None:
        if args.trace_events:
            print(trace_report(args.trace_events), file=sys.stderr)

    return run_ranks("soak", args, lambda rank, world: Soak(args).run(), report)


def run_ranks(name: str, args: argparse.Namespace, body: Callable[[int, int], int],
              report: Callable[[], None] = lambda: None) -> int:
    """``body(rank, world_size)`` in every rank: ``args.world`` threads on one GPU
    (:func:`collectives.testing.run_world`, every GPU-side wait bounded by ``args.timeout``), or
    else this torchrun process (its context closed afterwards).  Returns the largest exit
    status, or 1 where a rank raised: the error printed as ``<name> failed: ...`` with its notes
    (in a world, the one naming the rank), then ``report()``."""
    if args.world:
        from ..testing import run_world

        try:
            return max(run_world(args.world, lambda rank: body(rank, args.world), collective_timeout_s=args.timeout))
        except Exception as e:  # noqa: BLE001 (the failing rank is in the note)
            return _failed(name, e, report)
    from ..runtime.communicator import communicator

    try:
        comm = communicator()
        return body(comm.rank, comm.world)
    except Exception as e:  # any wrong result or unexpected error fails the run
        return _failed(name, e, report)
    finally:
        import collectives

        if collectives.current() is not None:
            torch.cuda.current_stream().synchronize()
            collectives.current().close()


def _failed(name: str, error: Exception, report: Callable[[], None]) -> int:
    """Print ``<name> failed: <error>`` and its notes (the failing rank, the call and case it
    was at, a hung rank's stack), a line each, then ``report()``; the exit status 1."""
    print(f"{name} failed: {error!r}", *getattr(error, "__notes__", []), sep="\n", file=sys.stderr)
    report()
    return 1


if __name__ == "__main__":
    sys.exit(main())
