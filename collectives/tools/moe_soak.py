"""Soak of the MoE layer (:mod:`collectives.moe`): many dispatches and combines, each checked
bit for bit against :mod:`collectives.reference.moe`.

    torchrun --nproc-per-node 2 -m collectives.tools.moe_soak [--calls 2000] [--seconds 3600]
    python -m collectives.tools.moe_soak --world 4

Every rank draws the same sequence of cases from ``--seed``: the mode, dtype, top-k, experts
per rank, hidden size, ``max_tokens`` and each rank's tokens (none included), fp8 rows, entries
of rank 0 out of range (dropped and counted), and eager or a CUDA-graph replay (low latency: one
graph per shape of :data:`GRAPH_SHAPES`, captured after an eager warm-up and replayed on new
routings copied into its inputs).  Each call's counts and rows of this rank's experts (fp8:
the quantized bytes and scales), its count of dropped entries and its combine output (not with
fp8) are compared with the reference.  The fused kernels run unless ``COLLECTIVES_MOE_FUSED=0``
(``COLLECTIVES_MOE_REGIONS=1``: every low-latency combine in two kernels, the regions' exchange);
``COLLECTIVES_TEST_SEED_EPOCH`` starts the all-to-all's call count near its 2^32 wrap.
``--world W`` runs the ranks as W threads on one GPU (:func:`collectives.testing.run_world`).
Exits non-zero on any wrong result or unexpected error, or when ``--seconds`` runs out first.

Between its launches a rank allocates on the GPU only blocks whose sizes a case's shape fixes
(its inputs for ``max_tokens`` tokens, the throughput experts' rows for a power of two of them),
as the layer does (``tests/collectives/test_moe_allocations.py``): a ``cudaMalloc`` for a size
torch's cache lacks may wait for the GPU, where the other ranks' all-to-alls spin for this
rank's next launch (the W = 8 world's failure: every rank timed out at once, the ranks' kernels
waiting for one rank that launched 30 s late).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402

from .. import moe  # noqa: E402
from ..moe import _capacity as moe_capacity  # noqa: E402
from ..reference.moe import bits, combined, expert_fn, expert_rows, routing  # noqa: E402
from .soak import Progress, run_ranks  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOPK = (1, 2, 4, 8)
LOCAL = (1, 2, 4)
#: Hidden sizes and their odds (the largest is DeepSeek-V3's, and the slowest to check).
HIDDEN = ((128, 4), (256, 3), (1024, 2), (7168, 1))
MAX_TOKENS = (1, 8, 64, 128)
#: Low-latency shapes a graph is captured for: (dtype, top-k, local experts, hidden, max_tokens);
#: every rank dispatches max_tokens tokens.
GRAPH_SHAPES = ((torch.bfloat16, 8, 2, 256, 16), (torch.bfloat16, 1, 1, 128, 1), (torch.float16, 2, 4, 128, 64),
                (torch.float32, 4, 1, 1024, 8))


@dataclass(frozen=True)
class Case:
    """One dispatch and combine, the same on every rank (``tokens``: every rank's count)."""

    mode: str
    dtype: torch.dtype
    topk: int
    local: int
    hidden: int
    max_tokens: int
    tokens: tuple[int, ...]
    fp8: bool = False
    bad: int = 0
    graph: bool = False

    @property
    def shape(self) -> tuple:
        """What a graph of this case fixes (its routing aside)."""
        return self.dtype, self.topk, self.local, self.hidden, self.max_tokens


def draw(rng: random.Random, world: int, graph_fraction: float) -> Case:
    """The next case of ``rng`` (the same on every rank)."""
    if rng.random() < graph_fraction:
        dtype, topk, local, hidden, max_tokens = rng.choice(GRAPH_SHAPES)
        topk = min(topk, local * world)
        bad = min(rng.choice((0, 0, 0, 1, 3)), max_tokens * topk)
        return Case("low_latency", dtype, topk, local, hidden, max_tokens, (max_tokens,) * world, bad=bad, graph=True)
    mode = "throughput" if rng.random() < 0.2 else "low_latency"
    local = rng.choice(LOCAL)
    topk = min(rng.choice(TOPK), local * world)
    hidden = rng.choices([h for h, _ in HIDDEN], [odds for _, odds in HIDDEN])[0]
    max_tokens = rng.choice(MAX_TOKENS[:3] if hidden > 1024 else MAX_TOKENS)
    tokens = tuple(rng.randint(0, max_tokens) for _ in range(world))
    fp8 = rng.random() < 0.1
    bad = rng.randint(1, min(4, tokens[0] * topk)) if tokens[0] and rng.random() < 0.1 else 0
    return Case(mode, rng.choice(DTYPES), topk, local, hidden, max_tokens, tokens, fp8, bad)


class Layer:
    """The MoE layer under test on one rank: :func:`collectives.moe.dispatch` and
    :func:`~collectives.moe.combine` on the GPU (a test passes another, e.g. over a simulated
    world on the CPU)."""

    device = torch.device("cuda")

    def dispatch(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: int, case: Case) -> tuple:
        return moe.dispatch(x, ids, weights, experts, mode=case.mode, max_tokens=case.max_tokens, fp8=case.fp8)

    def combine(self, rows: torch.Tensor, handle: moe.Handle) -> torch.Tensor:
        return moe.combine(rows, handle)

    def synchronize(self) -> None:
        """Wait for this rank's calls; raise what a kernel recorded (a timeout, a mismatch)."""
        import collectives

        collectives.synchronize()

    def allocator_calls(self) -> dict[str, int]:
        """torch's caching allocator's calls into CUDA on this GPU so far (every rank sharing it
        counts): ``cudaMalloc``, ``cudaFree``, and frees of every cached block after a failed
        ``cudaMalloc`` (each of these may wait for the whole GPU)."""
        stats = torch.cuda.memory_stats()
        return {name: int(stats.get(key, 0)) for name, key in (("cudaMalloc", "num_device_alloc"),
                                                               ("cudaFree", "num_device_free"),
                                                               ("retries", "num_alloc_retries"))}

    @contextlib.contextmanager
    def capture(self, graph: Any) -> Iterator[None]:
        from ..testing import capture

        with capture(graph):
            yield


@dataclass
class Graph:
    """A captured case: its inputs (filled before each replay) and outputs."""

    graph: Any
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    outputs: tuple


class Soak:
    """Rank ``rank`` of ``world`` running the cases of ``args.seed`` on ``layer``."""

    def __init__(self, rank: int, world: int, args: argparse.Namespace, layer: Layer | None = None) -> None:
        self.rank, self.world, self.args = rank, world, args
        self.layer = layer or Layer()
        self.rng = random.Random(args.seed)
        self.graphs: dict[tuple, Graph] = {}
        self.stats = {"eager": 0, "graph": 0, "throughput": 0, "fp8": 0, "dropped": 0}

    def layer_call(self, case: Case, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> tuple:
        """Dispatch, this rank's experts (:func:`~collectives.reference.moe.expert_fn`), combine
        (none with fp8): ``(expert_x, counts, handle, out)``."""
        experts = case.local * self.world
        ex, counts, handle = self.layer.dispatch(x, ids, weights, experts, case)
        if case.fp8:
            return ex, counts, handle, None
        first = self.rank * case.local
        if case.mode == "throughput":
            # (the stream waited for first: in a one-GPU world a thread waiting inside a copy to the host
            # holds the other ranks' copies to the GPU and cudaMalloc, which a slower rank may need
            # before its launch: tests/collectives/gpu/one_gpu/test_host_copies.py)
            self.layer.synchronize()
            ends = torch.cumsum(counts, 0).tolist()
            starts = [0] + ends[:-1]
            rows = torch.empty((moe_capacity(ex.shape[0]), ex.shape[1]), dtype=ex.dtype, device=ex.device)[:ex.shape[0]]
            for le, (s, e) in enumerate(zip(starts, ends)):
                expert_fn(ex[s:e], first + le, out=rows[s:e])
        else:
            rows = torch.stack([expert_fn(ex[le], first + le) for le in range(case.local)])
        return ex, counts, handle, self.layer.combine(rows, handle)

    def run_case(self, step: int, case: Case) -> None:
        """Run ``case`` with the routing of ``step`` and check this rank's results."""
        experts = case.local * self.world
        xs, ids, ws = routing(self.world, experts, case.topk, list(case.tokens), step, case.hidden, case.dtype,
                              case.bad)
        device = self.layer.device
        # on the GPU for max_tokens tokens, cut to this rank's (a size the shape fixes: see the module)
        mine = [torch.empty((case.max_tokens, *t[self.rank].shape[1:]), dtype=t[self.rank].dtype,
                            device=device)[:t[self.rank].shape[0]].copy_(t[self.rank]) for t in (xs, ids, ws)]
        if case.graph:
            captured = self.graphs.get(case.shape)
            if captured is None:
                captured = self.capture(case, mine)
            for buffer, value in zip(captured.inputs, mine):
                buffer.copy_(value)
            captured.graph.replay()
            results = captured.outputs
        else:
            results = self.layer_call(case, *mine)
        self.layer.synchronize()
        self.check(step, case, xs, ids, ws, results)
        self.stats["graph" if case.graph else "eager"] += 1
        self.stats["throughput"] += case.mode == "throughput"
        self.stats["fp8"] += case.fp8
        self.stats["dropped"] += case.bad if self.rank == 0 else 0

    def capture(self, case: Case, mine: list[torch.Tensor]) -> Graph:
        """A graph of ``case``'s shape, after an eager warm-up of it (which plans, compiles and
        allocates outside the capture), kept for the run (one per shape of :data:`GRAPH_SHAPES`)."""
        inputs = tuple(torch.empty_like(t) for t in mine)
        for buffer, value in zip(inputs, mine):
            buffer.copy_(value)
        self.layer_call(case, *inputs)
        self.layer.synchronize()
        graph = torch.cuda.CUDAGraph()
        with self.layer.capture(graph):
            outputs = self.layer_call(case, *inputs)
        captured = self.graphs[case.shape] = Graph(graph, inputs, outputs)
        return captured

    def check(self, step: int, case: Case, xs: list, ids: list, ws: list, results: tuple) -> None:
        """This rank's counts, expert rows, dropped entries and output against the reference."""
        ex, counts, handle, out = results
        experts, first, where = case.local * self.world, self.rank * case.local, f"call {step} {case}"
        if case.fp8:  # the rows as sent: the quantized bytes and the scales
            quantized = [moe.quantize(x) for x in xs]
            sent_rows, sent_scales = [q.view(torch.uint8) for q, _ in quantized], [s[:, None] for _, s in quantized]
        counts = counts.cpu().tolist()
        packed = ex.reshape(-1, ex.shape[-1]).cpu() if case.mode == "throughput" else None
        at = 0
        for le in range(case.local):
            want = expert_rows(first + le, sent_rows if case.fp8 else xs, ids)
            n = want.shape[0]
            if counts[le] != n:
                raise AssertionError(f"{where}: rank {self.rank}'s expert {le} got {counts[le]} rows, not {n}")
            got = packed[at:at + n] if packed is not None else ex[le, :n].cpu()
            at += n
            if not torch.equal(bits(got.contiguous()).view(torch.uint8), bits(want).view(torch.uint8)):
                raise AssertionError(f"{where}: rank {self.rank}'s expert {le}: rows differ from the reference")
            if case.fp8:
                scales = handle.scales[at - n:at] if packed is not None else handle.scales[le, :n]
                if not torch.equal(scales.cpu(), expert_rows(first + le, sent_scales, ids)[:, 0]):
                    raise AssertionError(f"{where}: rank {self.rank}'s expert {le}: fp8 scales differ")
        dropped = int(handle.dropped)
        want_dropped = case.bad if self.rank == 0 else 0
        if dropped != want_dropped:
            raise AssertionError(f"{where}: rank {self.rank} dropped {dropped} entries, not {want_dropped}")
        if out is not None:
            want = combined(experts, xs[self.rank], ids[self.rank], ws[self.rank])
            if not torch.equal(bits(out.cpu()), bits(want)):
                bad = int(torch.nonzero(bits(out.cpu()) != bits(want))[0, 0])
                raise AssertionError(f"{where}: rank {self.rank}'s combine output differs first at token {bad}")

    def run(self) -> int:
        args, start = self.args, time.monotonic()
        progress = Progress("moe soak", args.calls, self.rank)
        for step in range(1, args.calls + 1):
            progress.tick(step - 1)
            if time.monotonic() - start > args.seconds:
                print(f"rank {self.rank}: out of time after {step - 1} calls", file=sys.stderr)
                return 2
            case = draw(self.rng, self.world, args.graph_fraction)
            before = self.layer.allocator_calls()
            try:
                self.run_case(step, case)
            except BaseException as e:
                e.add_note(f"[moe soak] rank {self.rank} at call {step}: {case}")
                after = self.layer.allocator_calls()
                e.add_note(f"[moe soak] rank {self.rank}: the GPU's allocator calls during call {step} (every "
                           f"rank's): " + ", ".join(f"{k} {after[k] - v}" for k, v in before.items()))
                if args.trace_allocations:
                    for line in new_segments(after["cudaMalloc"] - before["cudaMalloc"]):
                        e.add_note(f"[moe soak] rank {self.rank}: {line}")
                raise
        if self.rank == 0:
            print(f"moe soak: {args.calls} calls on {self.world} ranks in {time.monotonic() - start:.0f}s, every "
                  f"result exact: {self.stats}")
        return 0


def new_segments(count: int) -> list[str]:
    """The last ``count`` ``cudaMalloc`` calls of torch's allocator on this GPU (every rank's), each
    with its size, stream and the Python frames that asked for it (``--trace-allocations``: torch's
    memory history, recorded since the start)."""
    if count <= 0:
        return []
    traces = torch.cuda.memory._snapshot()["device_traces"]
    mallocs = [t for trace in traces for t in trace if t["action"] == "segment_alloc"][-count:]
    return [f"cudaMalloc {t['size']} bytes on stream {t['stream']:#x} from "
            + " < ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in t["frames"][:10])
            for t in mallocs]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m collectives.tools.moe_soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=3600.0, help="bound of the whole run")
    p.add_argument("--seed", type=int, default=0, help="the same on every rank")
    p.add_argument("--graph-fraction", type=float, default=0.3)
    p.add_argument("--world", type=int, default=0, help="W rank threads on one GPU instead of torchrun")
    p.add_argument("--timeout", type=float, default=30.0, help="GPU-side bound of every wait (--world)")
    p.add_argument("--trace-allocations", action="store_true",
                   help="record torch's allocator history; a failing call's notes name its cudaMalloc calls' callers")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.trace_allocations:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    return run_ranks("moe soak", args, lambda rank, world: Soak(rank, world, args).run())


if __name__ == "__main__":
    sys.exit(main())
