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


def test_spans_writes_runs() -> None:
    from collectives.tools.soak import spans

    assert spans([0, 1, 2, 3, 7, 9, 10, 11, 12]) == "0-3, 7, 9-12"
    assert spans([]) == ""


def test_a_wrong_lamport_result_names_its_unwritten_elements_parts_and_the_ranks_lamport_words() -> None:
    """A wrong all-reduce's note: how many elements are wrong, how many still hold the rank's input
    (never written), the Lamport parts they lie in and the rank's Lamport words (counts per part,
    dirty words, size entries), read from the pad at the world size's layout."""
    import argparse
    import random
    import types

    import numpy as np
    import torch

    from collectives.algorithms.lamport import THREADS
    from collectives.config import LAMPORT_BLOCKS
    from collectives.layouts import PadLayout
    from collectives.tools.soak import Soak, inputs

    world, rank, step, n = 3, 1, 62, 262144
    layout = PadLayout(world=world)
    pad = torch.zeros(PadLayout().words, dtype=torch.int32)
    pad[layout.calls] = 64 * 100
    pad[layout.lamport_step(1, 0):layout.lamport_step(1, 0) + LAMPORT_BLOCKS] = 12
    pad[layout.lamport_step(1, 0) + 1] = 13
    pad[layout.lamport_dirty(1, 2)] = 15
    pad[layout.lamport_size(1, 0, 2)], pad[layout.lamport_size(1, 0, 2) + 1] = n, 13
    soak = Soak.__new__(Soak)
    soak.rank, soak.comm = rank, types.SimpleNamespace(world=world, pad=pad)
    soak.args, soak.rng = argparse.Namespace(seed=1), random.Random(1)
    got = inputs(rank, step, n)  # every element written in part 1 left as this rank's input
    first, last = THREADS * 8, 2 * THREADS * 8 - 1  # part 1: vectors THREADS .. 2 THREADS - 1 of 8 f16
    bad = np.arange(first, last + 1)
    note = soak.wrong(("all_reduce", "lamport", "peer", "f16", n, False), step, got, bad, 2)
    assert note.startswith(f"{bad.size} of {n} elements wrong, the last {last}, {bad.size} of them this rank's input")
    assert "in Lamport parts 1;" in note
    assert "calls 6400, counts 12 in parts 0, 2-127; 13 in parts 1, dirty [0, 0, 15]" in note
    assert "['0:0', '0:0', '13:262144']" in note


def test_watch_prints_the_lamport_words_after_a_call_that_changed_them(capsys) -> None:
    """``--watch-lamport``: every width after the first call, then only a width whose words
    changed, nothing after a call that changed none."""
    import argparse
    import types

    import torch

    from collectives.layouts import PadLayout
    from collectives.tools.soak import Soak

    soak = Soak.__new__(Soak)
    soak.rank, soak.watched, soak.args = 0, None, argparse.Namespace(watch_lamport=True)
    soak.comm = types.SimpleNamespace(world=2, pad=torch.zeros(PadLayout().words, dtype=torch.int32))
    soak.watch(1, ("a",))
    soak.watch(2, ("b",))
    soak.comm.pad[PadLayout(world=2).lamport_dirty(1, 2)] = 5
    soak.watch(3, ("c",))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].count("width") == 3
    assert lines[1] == "rank 0 after call 3 ('c',): width 2 B: counts 0 in parts 0-127, dirty [0, 0, 5]"
