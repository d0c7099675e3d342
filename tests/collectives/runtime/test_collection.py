"""collectives.runtime.collection: no automatic garbage collection while any thread captures."""

from __future__ import annotations

import gc
import threading

from collectives.runtime.collection import no_collection


class _Cycle:
    """An unreachable cycle's member whose finalizer records the thread that ran it (as a
    ``torch.cuda.CUDAGraph``'s destructor would run in the collecting thread)."""

    finalized: list[str] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Cycle.finalized.append(threading.current_thread().name)


def _allocate(n: int = 200_000) -> None:
    """Allocations that pass generation 0's threshold many times (an automatic collection's trigger)."""
    keep = []
    for i in range(n):
        keep.append([i])
        if len(keep) > 1000:
            keep.clear()


def test_no_cycle_is_finalized_inside_the_block_and_collection_resumes_after() -> None:
    assert gc.isenabled()
    _Cycle.finalized.clear()
    with no_collection():
        _Cycle()
        _allocate()
        assert _Cycle.finalized == [] and not gc.isenabled()
    assert gc.isenabled()
    _allocate()
    gc.collect()
    assert len(_Cycle.finalized) == 1


def test_without_the_block_an_allocating_thread_finalizes_the_cycle() -> None:
    """The hazard itself: the same allocations outside the block collect the cycle in this thread."""
    _Cycle.finalized.clear()
    gc.collect()
    _Cycle()
    _allocate()
    assert _Cycle.finalized == [threading.current_thread().name]


def test_collection_stays_paused_until_the_last_of_several_threads_leaves() -> None:
    entered, leave_first, first_left = threading.Barrier(2), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with no_collection():
            entered.wait()
            leave_first.wait()
        first_left.set()

    thread = threading.Thread(target=first)
    thread.start()
    with no_collection():
        entered.wait()
        leave_first.set()
        first_left.wait()
        seen.append(gc.isenabled())  # the other thread left; this one is still inside
    thread.join()
    assert seen == [False] and gc.isenabled()


def test_collection_switched_off_before_stays_off() -> None:
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_exception_inside_leaves_collection_as_it_was() -> None:
    try:
        with no_collection():
            raise KeyError("inside")
    except KeyError:
        pass
    assert gc.isenabled()
