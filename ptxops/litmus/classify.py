"""Classify observed outcomes against the expected verdicts, and render results.

Pure Python.  A run of a test gives a histogram ``{outcome tuple: count}``; :func:`classify`
marks every outcome ``sc`` / ``weak`` / ``forbidden`` (from :meth:`LitmusTest.verdicts`) or
``unexpected`` (a value outside the test's outcome space: a harness or hardware fault, counted
as a violation too), and :class:`Result` holds the counts.  :func:`render_histogram` and
:func:`render_summary` print them as plain text or markdown; :meth:`Result.to_json` is what
``python -m ptxops.litmus --json`` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .shapes import FORBIDDEN, SC, WEAK, LitmusTest, parse

UNEXPECTED = "unexpected"
MARK = {SC: "ok", WEAK: "weak", FORBIDDEN: "FORBIDDEN", UNEXPECTED: "UNEXPECTED"}


def classify(test: LitmusTest, placement: str, histogram: Mapping[tuple[int, ...], int]) -> dict[str, int]:
    """Counts per verdict (``sc``, ``weak``, ``forbidden``, ``unexpected``) of ``histogram``."""
    verdicts = test.verdicts(placement)
    counts = {SC: 0, WEAK: 0, FORBIDDEN: 0, UNEXPECTED: 0}
    for outcome, n in histogram.items():
        counts[verdicts.get(tuple(outcome), UNEXPECTED)] += int(n)
    return counts


@dataclass
class Result:
    """One test at one placement: the observed histogram and how it was obtained."""

    test: LitmusTest
    placement: str
    histogram: dict[tuple[int, ...], int]
    iterations: int = 0  # instance-runs (each a complete execution of the test)
    seconds: float = 0.0
    timeouts: int = 0  # per-iteration start syncs that gave up (harness health, not a verdict)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        return classify(self.test, self.placement, self.histogram)

    @property
    def runs(self) -> int:
        return sum(self.histogram.values())

    @property
    def violations(self) -> int:
        """Forbidden plus unexpected outcomes observed."""
        c = self.counts
        return c[FORBIDDEN] + c[UNEXPECTED]

    @property
    def weak_observed(self) -> int:
        return self.counts[WEAK]

    @property
    def weak_allowed(self) -> bool:
        """Whether the model allows any weak outcome here (whether looking for one makes sense)."""
        return any(v == WEAK for v in self.test.verdicts(self.placement).values())

    @property
    def outcomes_seen(self) -> int:
        """Outcomes of the test's outcome space observed at least once."""
        space = self.test.verdicts(self.placement)
        return sum(1 for o, n in self.histogram.items() if n and tuple(o) in space)

    def verdict_of(self, outcome: tuple[int, ...]) -> str:
        return self.test.verdicts(self.placement).get(tuple(outcome), UNEXPECTED)

    def rows(self) -> list[tuple[tuple[int, ...], int, str]]:
        """(outcome, count, verdict) for every outcome of the space and every one observed."""
        keys = list(self.test.verdicts(self.placement))
        keys += sorted(o for o in self.histogram if o not in self.test.verdicts(self.placement))
        return [(o, int(self.histogram.get(o, 0)), self.verdict_of(o)) for o in keys]

    def to_json(self) -> dict[str, Any]:
        c = self.counts
        return {
            "test": self.test.name,
            "shape": self.test.shape,
            "style": self.test.style,
            "scope": self.test.scope,
            "placement": self.placement,
            "program": self.test.program(),
            "observables": list(self.test.observables),
            "iterations": self.iterations,
            "runs": self.runs,
            "seconds": round(self.seconds, 6),
            "timeouts": self.timeouts,
            "outcomes_seen": self.outcomes_seen,
            "counts": c,
            "weak_observed": c[WEAK],
            "violations": c[FORBIDDEN] + c[UNEXPECTED],
            "histogram": [
                {"outcome": list(o), "count": n, "verdict": v} for o, n, v in self.rows()
            ],
            "params": self.params,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Result:
        hist = {tuple(h["outcome"]): int(h["count"]) for h in d["histogram"] if h["count"]}
        return cls(parse(d["test"]), d["placement"], hist, int(d.get("iterations", 0)),
                   float(d.get("seconds", 0.0)), int(d.get("timeouts", 0)), dict(d.get("params", {})))


def histogram_from_rows(rows: Iterable[Sequence[int]]) -> dict[tuple[int, ...], int]:
    """Count identical rows (one row per instance-run: its observed values)."""
    out: dict[tuple[int, ...], int] = {}
    for r in rows:
        key = tuple(int(v) for v in r)
        out[key] = out.get(key, 0) + 1
    return out


def _fmt(outcome: tuple[int, ...], names: Sequence[str]) -> str:
    return " ".join(f"{n}={v}" for n, v in zip(names, outcome))


def render_histogram(result: Result) -> str:
    """One test's histogram, one line per outcome, with its verdict mark."""
    t = result.test
    head = f"{t.name} [{result.placement}]  " + " || ".join("; ".join(ops) for ops in t.program())
    lines = [head]
    total = max(result.runs, 1)
    for outcome, n, verdict in result.rows():
        star = "*" if n and verdict in (FORBIDDEN, UNEXPECTED) else " "
        lines.append(f"  {star} {_fmt(outcome, t.observables):<28} {n:>12}  {100.0 * n / total:7.3f}%  "
                     f"{MARK[verdict]}")
    c = result.counts
    lines.append(f"    runs {result.runs}, weak {c[WEAK]}, forbidden {c[FORBIDDEN]}, "
                 f"unexpected {c[UNEXPECTED]}, timeouts {result.timeouts}, {result.seconds:.3f} s")
    return "\n".join(lines)


SUMMARY_COLUMNS = ("test", "placement", "runs", "outcomes seen", "weak allowed", "weak observed",
                   "forbidden observed", "verdict")


def summary_rows(results: Sequence[Result]) -> list[list[str]]:
    rows = []
    for r in results:
        c = r.counts
        if r.violations:
            verdict = "VIOLATION"
        elif c[WEAK]:
            verdict = "weak seen"
        elif r.weak_allowed:
            verdict = "no weak seen"
        else:
            verdict = "ok"
        rows.append([
            r.test.name, r.placement, str(r.runs), f"{r.outcomes_seen}/{len(r.test.verdicts(r.placement))}",
            "yes" if r.weak_allowed else "no", str(c[WEAK]), str(c[FORBIDDEN] + c[UNEXPECTED]), verdict,
        ])
    return rows


def render_summary(results: Sequence[Result], markdown: bool = False) -> str:
    """The summary table: per test and placement the runs, outcomes seen (of the outcome
    space), whether the model allows a weak outcome, weak outcomes observed, forbidden (and
    unexpected) outcomes observed, and a verdict."""
    rows = summary_rows(results)
    if markdown:
        out = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
        out += ["| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(r)) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(SUMMARY_COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 or i == 7 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(SUMMARY_COLUMNS), line(["-" * w for w in widths])] + [line(r) for r in rows])


def render_verdicts(tests: Sequence[LitmusTest], placements: Sequence[str], markdown: bool = True) -> str:
    """The expected-verdicts table: per test its program and, per placement, the weak
    outcomes the model allows and the outcomes it forbids."""
    head = ["test", "T0", "T1", "T2", "T3"][: 1 + max(t.nthreads for t in tests)]
    cols = head + [f"{p}: forbidden" for p in placements]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for t in tests:
        prog = ["<br>".join(f"`{op}`" for op in ops) for ops in t.program()]
        prog += [""] * (len(head) - 1 - len(prog))
        cells = [f"`{t.name}`"] + prog
        for p in placements:
            forb = t.forbidden(p)
            cells.append(", ".join(_fmt(o, t.observables) for o in forb) if forb else "none")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


__all__ = [
    "MARK",
    "SUMMARY_COLUMNS",
    "UNEXPECTED",
    "Result",
    "classify",
    "histogram_from_rows",
    "render_histogram",
    "render_summary",
    "render_verdicts",
    "summary_rows",
]
