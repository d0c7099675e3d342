"""collectives.tools.line_time: a function's host time line by line (the eager host path's profile)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

from collectives.tools import line_time

SOURCE = '''
import time


def slow(n):
    total = 0
    if n:
        time.sleep(0.004)
    else:
        total += 1
    for i in range(3):
        total += i
    return helper(total)


def helper(total):
    time.sleep(0.002)
    return total


class Box:
    def add(self, x):
        y = x + 1
        return y
'''


def _toy(tmp_path):
    path = tmp_path / "line_time_toy.py"
    path.write_text(textwrap.dedent(SOURCE))
    spec = importlib.util.spec_from_file_location("line_time_toy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_line_gets_the_time_to_the_next_and_a_return_its_callees(tmp_path) -> None:
    toy = _toy(tmp_path)
    lines = line_time.instrument(toy, "slow", "helper", "Box.add")
    calls = 5
    for _ in range(calls):
        assert toy.slow(1) == 3 and toy.Box().add(2) == 3
    ns = {(name.rsplit(".", 1)[-1], lines.text[(name, line)]): t for (name, line), t in lines.ns.items()}
    hits = {(name.rsplit(".", 1)[-1], lines.text[(name, line)]): h for (name, line), h in lines.hits.items()}
    assert ns[("slow", "time.sleep(0.004)")] >= calls * 4e6
    assert ns[("slow", "return helper(total)")] >= calls * 2e6  # the callee's time is its caller's line's
    assert ns[("helper", "time.sleep(0.002)")] >= calls * 2e6
    assert ns[("slow", "total = 0")] < calls * 1e6
    assert hits[("slow", "total += i")] == 3 * calls  # a loop's body, once a round
    assert ("slow", "total += 1") not in hits  # a branch not taken
    assert hits[("add", "y = x + 1")] == calls  # a method, through its class
    assert lines.total["line_time_toy.slow"] >= ns[("slow", "time.sleep(0.004)")] + ns[("slow", "return helper(total)")]
    table = lines.table(calls)
    assert any("time.sleep(0.004)" in row for row in table) and table[0].startswith("(one timer call")
    line_time.restore(toy, "slow", "helper", "Box.add")
    assert not hasattr(toy.slow, "__wrapped__") and not hasattr(toy.Box.add, "__wrapped__")
    assert toy.slow(0) == 4
