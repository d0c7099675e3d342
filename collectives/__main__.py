"""``python -m collectives ptx ...``: print (or write) the PTX of a kernel of any kernel family
(:data:`collectives.algorithms.FAMILIES`), no GPU needed: a collective's from its options, any
family's from its key id (``--id``; ``--family F --list`` lists the ids the gates compile)."""

from __future__ import annotations

import argparse
import sys

from .config import BACKENDS, BARRIER_THREADS, COLLECTIVES, OPS
from .dtypes import DTYPES
from .errors import MissingDependency


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for an illegal kernel, or without CuTeDSL (the message names the extra)."""
    try:
        from .algorithms import ALGORITHMS, FAMILIES, REGISTRY, KernelKey, key_of  # (with CuTeDSL: the kernels' blocks)
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in MissingDependency.EXTRAS:
            raise
        print(f"error: {MissingDependency('python -m collectives ptx', missing)}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m collectives", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ptx = sub.add_parser("ptx", help="compile a kernel and print its PTX")
    ptx.add_argument("--family", choices=tuple(FAMILIES), default="collective",
                     help="the kernel family (default: collective, from the options below)")
    ptx.add_argument("--id", help="the key id of the kernel (any family; e.g. moe_place/w4/l4/x0/b16/t256)")
    ptx.add_argument("--list", action="store_true", help="print the ids of the family's keys the PTX gates compile")
    ptx.add_argument("--collective", choices=COLLECTIVES)
    ptx.add_argument("--algorithm", default="one_shot",
                     choices=sorted({a for algs in ALGORITHMS.values() for a in algs}))
    ptx.add_argument("--backend", choices=BACKENDS)
    ptx.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ptx.add_argument("--op", choices=OPS, default="sum")
    ptx.add_argument("--world-size", type=int, default=8)
    ptx.add_argument("--arch", default="sm_90a", help="compile target, e.g. sm_90a or sm_100a")
    ptx.add_argument("--unaligned", action="store_true", help="the one-element-at-a-time variant")
    ptx.add_argument("-o", "--output", help="write the PTX here instead of printing it")
    args = parser.parse_args(argv)
    family = FAMILIES[args.family]
    if args.list:
        print("\n".join(family.snapshot()))
        return 0
    try:
        if args.id is not None:
            key = key_of(args.id)
        elif args.family != "collective":
            parser.error(f"--family {args.family} needs --id (its key ids: --family {args.family} --list)")
        elif args.collective is None or args.backend is None:
            parser.error("a collective kernel needs --collective and --backend (or --id)")
        else:
            impl = REGISTRY.get((args.collective, args.algorithm))
            staged = impl is not None and impl.stages_in == "always"  # push sends a non-symmetric input
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
