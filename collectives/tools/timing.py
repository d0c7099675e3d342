"""The benches' CUDA-event timing of back-to-back calls (:mod:`collectives.tools.bench`, its
one-GPU world :mod:`collectives.tools.world_bench`)."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
