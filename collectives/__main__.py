"""``python -m collectives ptx ...``: print (or write) a collective kernel's PTX, no GPU needed."""

from __future__ import annotations

import argparse
import sys

from .config import BACKENDS, BARRIER_THREADS, COLLECTIVES, OPS
from .dtypes import DTYPES
from .errors import MissingDependency


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for an illegal kernel, or without CuTeDSL (the message names the extra;
    ``--help`` works without it)."""
    try:
        from .algorithms import ALGORITHMS, REGISTRY, KernelKey  # (with CuTeDSL: the kernels' building blocks)
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in MissingDependency.EXTRAS:
            raise
        ALGORITHMS, unavailable = {}, MissingDependency("python -m collectives ptx", missing)
    else:
        unavailable = None
    parser = argparse.ArgumentParser(prog="python -m collectives", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ptx = sub.add_parser("ptx", help="compile a collective kernel and print its PTX")
    ptx.add_argument("--collective", choices=COLLECTIVES, required=True)
    ptx.add_argument("--algorithm", default="one_shot",
                     choices=sorted({a for algs in ALGORITHMS.values() for a in algs}) or None,
                     help="the algorithms are listed where CuTeDSL is installed" if unavailable else None)
    ptx.add_argument("--backend", choices=BACKENDS, required=True)
    ptx.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ptx.add_argument("--op", choices=OPS, default="sum")
    ptx.add_argument("--world-size", type=int, default=8)
    ptx.add_argument("--arch", default="sm_90a", help="compile target, e.g. sm_90a or sm_100a")
    ptx.add_argument("--unaligned", action="store_true", help="the one-element-at-a-time variant")
    ptx.add_argument("-o", "--output", help="write the PTX here instead of printing it")
    args = parser.parse_args(argv)
    if unavailable is not None:
        print(f"error: {unavailable}", file=sys.stderr)
        return 2
    impl = REGISTRY.get((args.collective, args.algorithm))
    staged = impl is not None and impl.stages_in == "always"  # push sends a non-symmetric input
    try:
        key = KernelKey(args.collective, args.algorithm, args.backend, args.dtype, args.world_size,
                        op=args.op, vector=1 if args.unaligned else 0,
                        stage_in=staged,
                        **({"threads": BARRIER_THREADS} if args.collective == "barrier" else {}))
    except ValueError as err:
        parser.error(str(err))
    from ptxops import QualifierError

    from .runtime.kernels import kernel_ptx

    try:
        text = kernel_ptx(key, args.arch)
    except QualifierError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {len(text.splitlines())} lines of PTX to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
