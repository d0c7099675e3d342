"""A failed test is named the moment it fails (tests/conftest.py), not only in pytest's summary,
which a run stopped by a time bound never prints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import conftest


def _report(outcome: str, when: str = "call", message: str | None = None) -> pytest.TestReport:
    longrepr = None if message is None else SimpleNamespace(reprcrash=SimpleNamespace(message=message))
    return pytest.TestReport("tests/x.py::test_y[f16]", ("tests/x.py", 3, "test_y"), {}, outcome, longrepr, when)


def test_a_failure_is_named_with_its_phase_and_the_first_line_of_its_error() -> None:
    report = _report("failed", message="CollectiveTimeout: timed out after 20s\nmore")
    want = "FAILED tests/x.py::test_y[f16] (call): CollectiveTimeout: timed out after 20s"
    assert conftest.failure_line(report) == want
    assert conftest.failure_line(_report("failed", "setup", "")) == "FAILED tests/x.py::test_y[f16] (setup)"
    assert conftest.failure_line(_report("passed")) is None
    assert conftest.failure_line(_report("skipped", message="needs a GPU")) is None


def test_the_line_goes_to_the_terminal_as_the_report_arrives(monkeypatch) -> None:
    lines: list[str] = []
    reporter = SimpleNamespace(write=lambda text: None, write_line=lambda line, **_: lines.append(line))
    monkeypatch.setattr(conftest, "_reporter", lambda: reporter)
    conftest.pytest_runtest_logreport(_report("passed"))
    conftest.pytest_runtest_logreport(_report("failed", message="AssertionError"))
    assert lines == ["FAILED tests/x.py::test_y[f16] (call): AssertionError"]
