"""Litmus tests on one GPU: forbidden outcomes never appear when the orderings are right, and
the harness sees weak outcomes where Hopper is known to show them.

Run: ``python -m pytest -q -m gpu tests/ptxops/gpu/one_gpu/test_litmus.py -s`` (skipped without a GPU; ``-s``
shows the histograms and the summary).  Every test runs RUNS instance-runs (10**6).

* Right orderings (release/acquire, fences, release atomics at a scope holding both threads;
  fence.sc for SB, IRIW, 2+2W), two CTAs and two warps of one CTA: zero forbidden outcomes,
  zero unexpected values, zero timed-out rendezvous.
* Relaxed and weak variants: a weak outcome is allowed; seeing none is reported (a pytest
  warning and a printed line), not a failure.  SB with relaxed or weak accesses is the one
  the issue expects Hopper to show.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

RUNS = 1_000_000

MUST_HOLD = [  # (test, placement): the model forbids an outcome; it must never appear
    ("MP+rel_acq@gpu", "cta"),
    ("MP+rel_acq@sys", "cta"),
    ("MP+fence_acq_rel@gpu", "cta"),
    ("MP+fence_sc@gpu", "cta"),
    ("MP+red_rel_acq@gpu", "cta"),
    ("MP+atom_rel_acq@gpu", "cta"),
    ("MP+rel_atom_acq@gpu", "cta"),
    ("SB+fence_sc@gpu", "cta"),
    ("SB+fence_sc@sys", "cta"),
    ("LB+acq_rel@gpu", "cta"),
    ("2+2W+fence_sc@gpu", "cta"),
    ("IRIW+fence_sc@gpu", "cta"),
    ("WRC+rel_acq@gpu", "cta"),
    ("MP+rel_acq@cta", "warp"),
    ("SB+fence_sc@cta", "warp"),
]
OBSERVE = [  # (test, placement): weak outcomes allowed; report whether the GPU shows them
    ("SB+relaxed@gpu", "cta"),
    ("SB+weak", "cta"),
    ("MP+relaxed@gpu", "cta"),
    ("MP+weak", "cta"),
    ("MP+rel_acq@cta", "cta"),  # cta scope across CTAs: too narrow
    ("LB+relaxed@gpu", "cta"),
    ("IRIW+relaxed@gpu", "cta"),
    ("SB+relaxed@cta", "warp"),
]

_RESULTS: list[Any] = []


@pytest.fixture(scope="module")
def runners() -> Any:
    torch = pytest.importorskip("torch")
    pytest.importorskip("cutlass")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU visible to torch")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the litmus kernels compile for sm_90+")
    from ptxops.litmus import Runner

    made: dict[str, Any] = {}

    def get(placement: str) -> Any:
        if placement not in made:
            made[placement] = Runner(placement)
        return made[placement]

    yield get
    if _RESULTS:
        from ptxops.litmus import render_summary

        print("\n" + render_summary(_RESULTS))


def _run(runners: Any, name: str, placement: str) -> Any:
    from ptxops.litmus import parse, render_histogram

    r = runners(placement).run(parse(name), RUNS)
    _RESULTS.append(r)
    print("\n" + render_histogram(r))
    assert r.runs >= RUNS, (r.runs, RUNS)
    assert r.counts["unexpected"] == 0, f"{name}: values outside the outcome space: {r.histogram}"
    assert r.timeouts == 0, f"{name}: {r.timeouts} rendezvous timed out"
    return r


@pytest.mark.parametrize("name,placement", MUST_HOLD, ids=[f"{n}-{p}" for n, p in MUST_HOLD])
def test_forbidden_outcomes_never_appear(runners: Any, name: str, placement: str) -> None:
    r = _run(runners, name, placement)
    assert r.test.forbidden(placement), "a MUST_HOLD test must forbid something"
    assert r.violations == 0, f"{name} [{placement}]: forbidden outcomes observed:\n" + "\n".join(
        f"  {o}: {n}" for o, n, v in r.rows() if n and v == "forbidden")


@pytest.mark.parametrize("name,placement", OBSERVE, ids=[f"{n}-{p}" for n, p in OBSERVE])
def test_weak_outcomes_observed_or_reported(runners: Any, name: str, placement: str) -> None:
    r = _run(runners, name, placement)
    assert r.weak_allowed and r.violations == 0
    if r.weak_observed == 0:
        msg = (f"{name} [{placement}]: no weak outcome in {r.runs} runs (allowed by the PTX model; "
               f"an observation, not a failure)")
        print(msg)
        warnings.warn(msg, stacklevel=1)
    else:
        print(f"{name} [{placement}]: {r.weak_observed} weak outcomes in {r.runs} runs")
