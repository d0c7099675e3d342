"""Python's garbage collection around CUDA stream captures.

An automatic collection runs in whichever thread allocates when its threshold falls, and runs
the finalizers of every unreachable cycle in that thread: a cycle that holds a
``torch.cuda.CUDAGraph`` destroys the graph there, and CUDA refuses a graph's destruction inside
a capture of the same thread (``operation not permitted when stream is capturing``), which
invalidates the capture.  Seen in ``.ci/gpu world_soak 6`` (one H200, 2026-11-29): after 80,000
calls a rank's capture failed with six such warnings from ``CUDAGraph::reset`` in its thread,
and every other rank timed out in the next collective.  A capture of this package's (a world's
:func:`collectives.testing.capture`, a kernel's first-call load) runs inside
:func:`no_collection`."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No automatic garbage collection in the process while any thread is inside the block:
    a count of the threads inside it; collection is as it was before once the last one leaves
    (off stays off)."""
    with _State.lock:
        if _State.inside == 0:
            _State.was_enabled = gc.isenabled()
            gc.disable()
        _State.inside += 1
    try:
        yield
    finally:
        with _State.lock:
            _State.inside -= 1
            if _State.inside == 0 and _State.was_enabled:
                gc.enable()


class _State:
    """The process's state of :func:`no_collection`."""

    lock = threading.Lock()
    inside = 0  # threads inside the block
    was_enabled = True  # whether collection was on when the first of them entered
