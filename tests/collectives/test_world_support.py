"""The test runner's side of the one-GPU world (tests/support/world_support.py), on a CPU world
of the same parts (rank threads, meeting, contexts on the loopback heap): per-rank fixture
values made in each rank's thread once per context, a test run in every rank, the session's
world opened anew after a test closed a rank's context or broke it, and kept after a skip in
every rank."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from tests.support import world_support  # noqa: E402

from collectives import testing  # noqa: E402
from collectives.symmetric import context  # noqa: E402
from collectives.symmetric.loopback import Meeting  # noqa: E402
from tests.collectives.symmetric.test_world_host import cpu_context  # noqa: E402


class CpuWorld:
    """:class:`collectives.testing.World`'s face over CPU contexts."""

    opened = 0

    def __init__(self, size: int, timeout_s: float, collective_timeout_s: float) -> None:
        CpuWorld.opened += 1
        self.meeting, table = Meeting(size, 5), {}
        self.contexts: list = [None] * size
        self.threads = testing.RankThreads(size, 5, self.meeting)

        def open_rank(rank: int) -> None:
            self.contexts[rank] = cpu_context(self.meeting, table, rank)
            context.bind_thread(self.contexts[rank])

        self.threads.run(open_rank)

    @property
    def broken(self):
        return self.threads.broken

    def run(self, fn):
        return self.threads.run(fn)

    def close(self) -> None:
        self.threads.stop()


@pytest.fixture
def cpu_world(monkeypatch):
    monkeypatch.setattr(world_support, "WORLD", 3)
    monkeypatch.setattr(testing, "World", CpuWorld)
    CpuWorld.opened = 0
    yield
    world_support.close_session_world()


def test_per_rank_values_are_made_in_each_rank_once_per_context(cpu_world) -> None:
    made: list[tuple[int, str]] = []

    def make():
        made.append((context.current().rank, threading.current_thread().name))
        return context.current().rank

    value = world_support.rank_value(make)
    assert isinstance(value, world_support.PerRank)
    seen: list[int] = []
    lock = threading.Lock()

    def test_body(rank_value: int) -> None:
        assert rank_value == context.current().rank
        with lock:
            seen.append(rank_value)

    for _ in range(2):
        world_support.run_test(test_body, {"rank_value": value})
    assert sorted(seen) == [0, 0, 1, 1, 2, 2]
    assert sorted(made) == [(r, f"collectives-rank-{r}") for r in range(3)]  # made once per rank
    assert CpuWorld.opened == 1


def test_a_test_that_closes_its_contexts_gets_the_next_test_a_new_world(cpu_world) -> None:
    world_support.run_test(lambda: context.current().close(), {})
    first = world_support.session_world()
    assert CpuWorld.opened == 2 and all(not c.closed for c in first.contexts)


def test_a_skip_in_every_rank_keeps_the_world_and_a_failure_replaces_it(cpu_world) -> None:
    with pytest.raises(pytest.skip.Exception, match="not on this GPU"):
        world_support.run_test(lambda: pytest.skip("not on this GPU"), {})
    world_support.run_test(lambda: None, {})
    assert CpuWorld.opened == 1

    def fails_on_rank_1() -> None:
        if context.current().rank == 1:
            raise AssertionError("wrong sum")
        context.current().host_barrier()

    with pytest.raises(AssertionError, match="wrong sum") as info:
        world_support.run_test(fails_on_rank_1, {})
    assert "raised in rank 1 of a world of 3" in "\n".join(info.value.__notes__)
    world_support.run_test(lambda: None, {})
    assert CpuWorld.opened == 2
