"""What one thread's host copy holds of another thread's host work on the same GPU, the facts the
one-GPU world's ranks (threads) rely on (:func:`collectives.runtime.views.filled`, the MoE
dispatch's sizes read back, :func:`collectives.moe.dispatch_with`).

Thread A waits in a copy behind a kernel of about a second on its own stream (as a rank waits
behind its all-to-all, which spins until the slowest rank launches); thread B meanwhile does
what a slower rank does before that launch.  Measured on one H200 (driver 580): while A is in a
copy into pageable memory (``.cpu()``), B's pageable copy to the GPU, its ``cudaMalloc`` and its
pinning each waited the whole second; B's fill kernels and copies from pinned memory did not.
While A copied into pinned memory and then waited for its stream, none of B's steps waited.
So a rank never waits inside a pageable copy for a collective (it copies into pinned memory
and synchronizes its stream), and where ranks share the GPU, values reach the GPU by fills.

Run: ``python -m pytest -q -m gpu tests/collectives/gpu/one_gpu/test_host_copies.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

SPIN_S = 1.0
#: A step shorter than this did not wait for A's copy.
QUICK_S = 0.25


@pytest.fixture(scope="module")
def cycles_per_s() -> float:
    """The GPU clock, measured with ``torch.cuda._sleep``."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(200_000_000)
    end.record()
    end.synchronize()
    return 200_000_000 / (start.elapsed_time(end) / 1000)


def b_waits(cycles_per_s: float, a_copy: Callable[[torch.cuda.Stream], None], b_step: Callable[[], None],
            warm: bool = False) -> float:
    """Seconds ``b_step`` took on a stream of its own while thread A ran ``a_copy`` behind a
    kernel of ``SPIN_S`` on A's stream.  ``warm``: B's stream ran the step once before, so
    torch's allocator holds a block of that stream for what the step allocates (as a rank's
    stream does after its first calls; a new stream's first block is a ``cudaMalloc``)."""
    a_stream, b_stream = torch.cuda.Stream(), torch.cuda.Stream()
    if warm:
        with torch.cuda.stream(b_stream):
            b_step()
        b_stream.synchronize()
    started = threading.Event()

    def a() -> None:
        with torch.cuda.stream(a_stream):
            torch.cuda._sleep(int(SPIN_S * cycles_per_s))
            started.set()
            a_copy(a_stream)

    thread = threading.Thread(target=a)
    thread.start()
    started.wait()
    time.sleep(0.1)  # (A inside its copy)
    with torch.cuda.stream(b_stream):
        t = time.perf_counter()
        b_step()
        b_stream.synchronize()
        took = time.perf_counter() - t
    thread.join()
    torch.cuda.synchronize()
    return took


def into_pageable(stream: torch.cuda.Stream) -> None:
    torch.arange(8, device="cuda").cpu()


def into_pinned(stream: torch.cuda.Stream) -> None:
    host = torch.empty(8, dtype=torch.int64, pin_memory=True)
    host.copy_(torch.arange(8, device="cuda"), non_blocking=True)
    stream.synchronize()


def test_a_copy_into_pageable_memory_holds_another_threads_pageable_copy_and_allocation(cycles_per_s) -> None:
    """Why no rank may wait in one: the steps it holds are a slower rank's before its launch."""
    held = {name: b_waits(cycles_per_s, into_pageable, step) for name, step in (
        ("pageable copy to the GPU", lambda: torch.tensor([1, 2, 3], device="cuda")),
        ("cudaMalloc", lambda: torch.empty((1 << 30) + (6 << 20), dtype=torch.uint8, device="cuda")),
    )}
    assert all(t > SPIN_S / 2 for t in held.values()), held


def test_fills_and_pinned_copies_pass_a_copy_into_pageable_memory(cycles_per_s) -> None:
    """What a rank sharing the GPU uses instead (device tables, split lists), on a stream whose
    allocator blocks exist (a fill allocates its tensor: on a new stream, a ``cudaMalloc``,
    which waits as the first test shows)."""
    dst = torch.zeros(8, dtype=torch.int64, device="cuda")
    pinned = torch.arange(8, dtype=torch.int64).pin_memory()
    from collectives.runtime.views import filled

    took = {name: b_waits(cycles_per_s, into_pageable, step, warm=True) for name, step in (
        ("fills", lambda: filled([1, 2, 3], "cuda")),
        ("a copy from pinned memory", lambda: dst.copy_(pinned, non_blocking=True)),
    )}
    assert all(t < QUICK_S for t in took.values()), took


def test_a_copy_into_pinned_memory_then_a_stream_wait_holds_nothing(cycles_per_s) -> None:
    """The MoE dispatch's read-back of every rank's sizes (collectives.moe._everyone)."""
    took = {name: b_waits(cycles_per_s, into_pinned, step) for name, step in (
        ("pageable copy to the GPU", lambda: torch.tensor([1, 2, 3], device="cuda")),
        ("cudaMalloc", lambda: torch.empty((1 << 30) + (10 << 20), dtype=torch.uint8, device="cuda")),
        ("pinning", lambda: torch.empty(4096 + 24, dtype=torch.int64).pin_memory()),
    )}
    assert all(t < QUICK_S for t in took.values()), took
