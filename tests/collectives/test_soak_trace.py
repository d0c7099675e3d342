"""The soaks' reports: ``--trace`` (collectives.tools.soak.trace_report), with stand-in events:
each rank's last call and when its stream reached it, after the earliest rank's; and the
progress lines of rank 0 (collectives.tools.soak.Progress)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from collectives.tools.soak import trace_report  # noqa: E402


class Event:
    """A CUDA event's two methods the report uses; ``at``: when it completed (ms)."""

    def __init__(self, at: float) -> None:
        self.at, self.synchronized = at, False

    def synchronize(self) -> None:
        self.synchronized = True

    def elapsed_time(self, end: "Event") -> float:
        return end.at - self.at


def test_the_report_measures_from_the_earliest_rank() -> None:
    trace = {0: (70, Event(5.0)), 1: (70, Event(10005.0)), 2: (69, Event(1.5))}
    report = trace_report(trace)
    assert report == "trace: rank 0: call 70 at +3.5 ms; rank 1: call 70 at +10003.5 ms; rank 2: call 69 at +0.0 ms"
    assert all(event.synchronized for _, event in trace.values())


def test_progress_prints_each_tenth_once_on_rank_0(capsys) -> None:
    from collectives.tools.soak import Progress

    progress, quiet = Progress("soak", 100, 0), Progress("soak", 100, 1)
    for done in [0, 5, 10, 10, 11, 35, 99, 100]:
        progress.tick(done)
        quiet.tick(done)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" calls")[0] for line in lines] == ["soak: 10 of 100", "soak: 35 of 100", "soak: 99 of 100"]


def test_a_failed_torchrun_rank_prints_its_error_notes_and_report(monkeypatch, capsys) -> None:
    """The notes (the MoE soak's call and case, a hung rank's stack) reach the log under torchrun
    as in a world."""
    import argparse
    from types import SimpleNamespace

    from collectives.runtime import communicator
    from collectives.tools.soak import run_ranks

    monkeypatch.setattr(communicator, "communicator", lambda: SimpleNamespace(rank=0, world=2))

    def body(rank: int, world: int) -> int:
        error = ValueError("wrong rows")
        error.add_note("[moe soak] rank 0 at call 7: Case(...)")
        raise error

    reported = []
    status = run_ranks("moe soak", argparse.Namespace(world=0), body, lambda: reported.append(True))
    err = capsys.readouterr().err.splitlines()
    assert status == 1 and reported == [True]
    assert err == ["moe soak failed: ValueError('wrong rows')", "[moe soak] rank 0 at call 7: Case(...)"]
