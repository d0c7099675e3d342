"""Where an MoE layer's GPU time goes, kernel by kernel, on one GPU: a one-GPU world of ``--world``
ranks (:mod:`collectives.testing`) runs low-latency dispatches (bf16 and fp8 rows) and combines
of the bench's decode shape (hidden 7168, top-8 of 256 experts), and torch's profiler times every
kernel they launch::

    python -m collectives.tools.moe_kernels [--world 2] [--tokens 1,128,512] [--out DIR]

Rank 0 prints, per dtype and tokens per rank, each kernel's mean and shortest GPU time over
``--calls`` layers of every rank: the routing (``route``), the rows sent (``pack``), the exchange
(``all_to_all``), the placement (``place``), and for bf16 the combine's rows sent back
(``gather``) and weighted sum (``combine``).  The local kernels' times are theirs (the ranks'
grids share the GPU, so a kernel may run beside another rank's); an all-to-all's time includes
its wait for the other ranks (its shortest is the one to read).  ``--out DIR`` writes
``moe-kernels-<device>-w<W>.json`` (records: part, dtype, tokens, us, us_min).  It names no NVLink
figure: the kernels that do not communicate are what it measures, the ones a 2- or 4-GPU
timeline (``collectives.tools.all_to_all_bench``) cannot take apart from their waits.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections import defaultdict

#: Kernel name (its argument layout's) -> the part of the layer it is.
PARTS = {"MoeRouteArgs": "route", "MoePackArgs": "pack", "AllToAllArgs": "all_to_all", "MoePlaceArgs": "place",
         "MoeGatherArgs": "gather", "MoeCombineArgs": "combine"}


def part_of(kernel: str) -> str:
    """The layer's part that a profiled kernel's name names (else the name itself)."""
    return next((part for layout, part in PARTS.items() if layout in kernel), kernel)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.moe_kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tokens", default="1,128,512")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import collectives
    from collectives import moe
    from collectives.testing import run_world

    from .records import device_tag

    meet = threading.Barrier(args.world)
    records: list[dict] = []

    def timed(rank: int, step, dtype: str, tokens: int) -> None:
        """``args.calls`` calls of ``step`` on every rank, rank 0 profiling the GPU."""
        collectives.synchronize()
        meet.wait()
        prof = profile(activities=[ProfilerActivity.CUDA]) if rank == 0 else None
        if prof is not None:
            prof.__enter__()
        meet.wait()
        for _ in range(args.calls):
            step()
        collectives.synchronize()
        meet.wait()
        if prof is None:
            meet.wait()
            return
        prof.__exit__(None, None, None)
        meet.wait()  # (the other ranks' next inputs are made after the profile)
        times = defaultdict(list)
        for e in prof.events():
            if e.device_type == DeviceType.CUDA and part_of(e.name) in PARTS.values():
                times[part_of(e.name)].append(e.time_range.elapsed_us())
        for part, us in times.items():
            records.append(dict(part=part, dtype=dtype, tokens=tokens, us=sum(us) / len(us), us_min=min(us)))

    def body(rank: int) -> None:
        for tokens in [int(t) for t in args.tokens.split(",")]:
            gen = torch.Generator(device="cuda").manual_seed(1000 * rank + tokens)
            x = torch.randn((tokens, args.hidden), device="cuda", generator=gen).to(torch.bfloat16)
            ids = torch.argsort(torch.rand((tokens, args.experts), device="cuda", generator=gen), 1)[:, :args.topk]
            w = torch.rand((tokens, args.topk), device="cuda", generator=gen)
            for fp8 in (False, True):
                def dispatch():
                    return moe.dispatch(x, ids, w, args.experts, max_tokens=tokens, fp8=fp8)

                if fp8:
                    step = dispatch
                else:
                    def step():
                        expert_x, _, handle = dispatch()
                        moe.combine(expert_x, handle)
                for _ in range(3):
                    step()
                timed(rank, step, "fp8" if fp8 else "bf16", tokens)

    run_world(args.world, body, timeout_s=120)
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, a one-GPU world of {args.world} ranks, hidden {args.hidden}, top-{args.topk} of {args.experts}; "
          f"us per kernel over {args.calls} layers of every rank (mean / shortest)")
    print(f"{'part':12s} {'dtype':5s} {'tokens':>6s} {'mean':>8s} {'min':>8s}")
    for r in records:
        print(f"{r['part']:12s} {r['dtype']:5s} {r['tokens']:6d} {r['us']:8.2f} {r['us_min']:8.2f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"moe-kernels-{device_tag(1, gpu)}-w{args.world}.json")
        with open(path, "w") as f:
            json.dump(dict(bench="moe-kernels", gpu=gpu, world=args.world, hidden=args.hidden, topk=args.topk,
                           experts=args.experts, calls=args.calls, results=records), f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
