"""The benches' CUDA-event timing of back-to-back calls (:mod:`collectives.tools.bench`, its
one-GPU world :mod:`collectives.tools.world_bench`) and the slowest rank's figure
(:mod:`collectives.tools.bench`, :mod:`collectives.tools.host_time`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


def repeat_calls(fn: Callable[[], object], times: int) -> None:
    """``fn()`` ``times`` times."""
    for _ in range(times):
        fn()


def event_us(run: Callable[[], object], calls: int) -> float:
    """Microseconds per call of ``run()`` (which makes ``calls`` calls) between two CUDA events
    on the current stream, waited for."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def slowest_rank(us: float) -> float:
    """The largest of every rank's ``us`` (a collective of the default group; infinite where a
    rank failed)."""
    mine = torch.tensor([us], device="cuda")
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)
