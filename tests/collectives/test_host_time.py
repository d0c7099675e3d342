"""``collectives.tools.host_time``'s rows on CPU (torch.distributed and the GPU's synchronisation
stood in for): a row whose measurement raises a Python error prints it and becomes that
error, the tool goes on, and the failing rank meets the same synchronisations as one that
measured (so that no rank waits for it)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest


@pytest.fixture
def host_time(monkeypatch):
    """The module, its ``dist`` and ``torch.cuda.synchronize`` stubbed; yields it and the list of
    synchronisations met (``barrier``, and ``slowest``: the all-reduce of the rank's time)."""
    from ptxops.nvls import MULTICAST_OFF

    for name, value in MULTICAST_OFF.items():
        monkeypatch.setenv(name, value)  # (the import sets them: undone after the test)
    from collectives.tools import host_time

    met: list[str] = []
    monkeypatch.setattr(host_time.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host_time, "dist", SimpleNamespace(barrier=lambda: met.append("barrier"), get_rank=lambda: 0))
    monkeypatch.setattr(host_time, "_slowest", lambda mine: met.append("slowest") or mine)
    return host_time, met


def boom() -> None:
    raise ValueError("boom")


@pytest.mark.parametrize("where", ["making the calls", "a call"])
def test_a_row_that_raises_prints_its_error_and_the_next_row_is_measured(host_time, capsys, where: str) -> None:
    module, met = host_time
    rows: list = []
    calls = (lambda: boom()) if where == "making the calls" else (lambda: [lambda: None, boom])
    module.add(rows, "  bad", lambda: module.host_us(calls))
    failing, met[:] = list(met), []
    module.add(rows, "good", lambda: module.host_us(lambda: [lambda: None] * 4))
    assert rows[0] == ("  bad", "failed: ValueError: boom")
    assert "rank 0: bad: ValueError: boom" in capsys.readouterr().out
    assert rows[1][0] == "good" and isinstance(rows[1][1], float) and math.isfinite(rows[1][1])
    assert failing == met == ["barrier", "slowest"] * 3


def test_a_row_another_rank_failed_says_so(host_time, monkeypatch) -> None:
    module, _ = host_time
    monkeypatch.setattr(module, "_slowest", lambda mine: math.inf)  # (what a failed rank sends)
    rows: list = []
    module.add(rows, "row", lambda: module.host_us(lambda: [lambda: None]))
    assert rows == [("row", "failed: RuntimeError: failed on another rank")]
