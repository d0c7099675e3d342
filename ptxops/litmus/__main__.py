"""``python -m ptxops.litmus``: run litmus tests on this machine's GPU(s), or list them.

Examples::

    python -m ptxops.litmus --list                          # tests and expected verdicts (no GPU)
    python -m ptxops.litmus --verdicts-markdown             # the docs' verdict table (no GPU)
    python -m ptxops.litmus --tests MP,SB --placement cta --iterations 1000000 --json out.json
    python -m ptxops.litmus --tests MP+rel_acq@gpu,SB+relaxed@gpu --placement warp
    torchrun --nproc-per-node 2 -m collectives.tools.litmus --placement gpu --tests MP --scopes sys,gpu

Placement ``gpu`` needs symmetric memory across GPUs, which the upper layer opens:
``collectives.tools.litmus`` is this command with it (ptxops imports nothing from collectives).

``--tests`` takes shape names (every style of the shape, at ``--scopes``) and full test names
(``MP+rel_acq@gpu``, ``SB+weak``).  Exit status: 0, or 1 if any forbidden outcome was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..nvls import force_multicast_off
from .classify import Result, render_histogram, render_summary, render_verdicts
from .shapes import PLACEMENTS, SCOPES, SHAPES, LitmusTest, catalogue, parse


def select(spec: str | None, scopes: Sequence[str], styles: Sequence[str] | None = None) -> list[LitmusTest]:
    """Tests named by ``spec`` (comma-separated shapes or test names; None: all shapes)."""
    out: list[LitmusTest] = []
    for item in (spec.split(",") if spec else list(SHAPES)):
        item = item.strip()
        if not item:
            continue
        if item in SHAPES:
            out += [t for t in catalogue([item], scopes) if styles is None or t.style in styles]
        else:
            out.append(parse(item))
    return list(dict.fromkeys(out))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ptxops.litmus", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tests", help="comma-separated shapes (MP,SB,LB,2+2W,IRIW,WRC) or test names "
                                   "(MP+rel_acq@gpu); default: every shape")
    p.add_argument("--styles", help="with shape names: only these styles (comma-separated)")
    p.add_argument("--scopes", default="gpu,sys", help="with shape names: scopes (default gpu,sys)")
    p.add_argument("--placement", default="cta", choices=PLACEMENTS,
                   help="cta: two CTAs of one GPU; warp: warps of one CTA; gpu: two GPUs (torchrun)")
    p.add_argument("--iterations", type=int, default=1_000_000, help="instance-runs per test")
    p.add_argument("--groups", type=int, default=32, help="instance groups (CTAs per role), power of 2")
    p.add_argument("--warp-ctas", type=int, default=128, help="CTAs in warp placement, power of 2")
    p.add_argument("--stride", type=int, default=1, help="words between neighbouring instances")
    p.add_argument("--no-shuffle", action="store_true", help="keep instance slots in order")
    p.add_argument("--delay-mask", type=int, default=255, help="largest random delay, 2**k - 1")
    p.add_argument("--stress-ctas", type=int, default=None, help="memory-stress CTAs (default SMs/4)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--budget-s", type=float, default=10.0, help="every launch stops waiting after this")
    p.add_argument("--json", dest="json_path", help="write the results as JSON here")
    p.add_argument("--markdown", action="store_true", help="print the summary table as markdown")
    p.add_argument("--quiet", action="store_true", help="no per-test histograms, only the summary")
    p.add_argument("--list", action="store_true", help="list the selected tests and their expected "
                                                       "verdicts at --placement, run nothing")
    p.add_argument("--verdicts-markdown", action="store_true",
                   help="print the expected-verdicts table of the selected tests (all placements)")
    return p


def _list(tests: Sequence[LitmusTest], placement: str) -> str:
    lines = []
    for t in tests:
        lines.append(f"{t.name}: " + " || ".join("; ".join(ops) for ops in t.program()))
        for o, v in t.verdicts(placement).items():
            lines.append(f"    {' '.join(f'{n}={x}' for n, x in zip(t.observables, o)):<28} {v}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, open_context: Callable[[int], Any] | None = None) -> int:
    """Run the command; ``open_context(device)`` opens the symmetric-memory context (peer
    backend) that placement ``gpu`` runs on, e.g. ``collectives.init``."""
    args = parser().parse_args(argv)
    scopes = [s for s in args.scopes.split(",") if s]
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        print(f"unknown scope(s) {bad}; scopes: {SCOPES}", file=sys.stderr)
        return 2
    styles = args.styles.split(",") if args.styles else None
    try:
        tests = select(args.tests, scopes, styles)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.list:
        print(_list(tests, args.placement))
        return 0
    if args.verdicts_markdown:
        print(render_verdicts(tests, PLACEMENTS))
        return 0

    import torch

    from .runner import Runner

    ctx = None
    if args.placement == "gpu":
        if "WORLD_SIZE" not in os.environ:
            print("--placement gpu runs under torchrun --nproc-per-node 2", file=sys.stderr)
            return 2
        if open_context is None:
            print("--placement gpu needs symmetric memory across GPUs: run it as "
                  "torchrun --nproc-per-node 2 -m collectives.tools.litmus (same options)", file=sys.stderr)
            return 2
        force_multicast_off()  # peer memory only: set before nvshmem and NCCL start
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        ctx = open_context(local)
    elif not torch.cuda.is_available():
        print("no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    speak = ctx is None or ctx.rank == 0
    runner = Runner(args.placement, ctx=ctx, groups=args.groups, warp_ctas=args.warp_ctas,
                    stride=args.stride, shuffle=not args.no_shuffle, delay_mask=args.delay_mask,
                    stress_ctas=args.stress_ctas, seed=args.seed, budget_s=args.budget_s)
    results: list[Result] = []
    try:
        for t in tests:
            r = runner.run(t, args.iterations)
            results.append(r)
            if speak and not args.quiet:
                print(render_histogram(r), flush=True)
    finally:
        if ctx is not None:
            ctx.close()
    if speak:
        print()
        print(render_summary(results, markdown=args.markdown))
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump({"placement": args.placement, "results": [r.to_json() for r in results]}, f, indent=1)
            print(f"wrote {args.json_path}")
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
