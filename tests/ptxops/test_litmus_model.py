"""ptxops.litmus without a GPU: the PTX memory-model checker against the PTX ISA's own litmus
tests, the expected verdicts of the shipped tests, outcome classification, the summary
rendering, the parameter space, the command line's GPU-free modes and the docs' table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ptxops.litmus import (
    EXPECTED_FORBIDDEN,
    FORBIDDEN,
    PLACEMENTS,
    SC,
    SCOPES,
    SHAPES,
    WEAK,
    LitmusTest,
    Op,
    Result,
    Where,
    allowed_outcomes,
    catalogue,
    classify,
    histogram_from_rows,
    kernel_keys,
    parse,
    render_histogram,
    render_summary,
    render_verdicts,
    sc_outcomes,
)
from ptxops.litmus.__main__ import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_CTAS = (Where(0, 0), Where(0, 1))


def ld(loc, reg, sem="weak", scope=None):
    return Op("ld", loc, 0, sem, scope, reg)


def st(loc, v=1, sem="weak", scope=None):
    return Op("st", loc, v, sem, scope)


def fence(sem, scope):
    return Op("fence", None, 0, sem, scope)


# --- the checker against the PTX ISA's litmus tests (section 8.10) ---------------------
def test_isa_message_passing_with_fences() -> None:
    t1 = [st("data"), fence("acq_rel", "sys"), st("flag", 1, "relaxed", "sys")]
    t2 = [ld("flag", "r0", "relaxed", "sys"), fence("acq_rel", "sys"), ld("data", "r1")]
    assert allowed_outcomes([t1, t2], TWO_CTAS, ["r0", "r1"]) == {(0, 0), (0, 1), (1, 1)}


@pytest.mark.parametrize("sem,forbids", [("sc", True), ("acq_rel", False)])
def test_isa_store_buffering(sem: str, forbids: bool) -> None:
    t1 = [st("x"), fence(sem, "sys"), ld("y", "r0")]
    t2 = [st("y"), fence(sem, "sys"), ld("x", "r1")]
    allowed = allowed_outcomes([t1, t2], TWO_CTAS, ["r0", "r1"])
    assert ((0, 0) not in allowed) == forbids
    assert sc_outcomes([t1, t2], ["r0", "r1"]) == {(0, 1), (1, 0), (1, 1)}


def test_isa_load_buffering_without_dependencies_is_allowed() -> None:
    t1 = [ld("x", "r0"), st("y")]
    t2 = [ld("y", "r1"), st("x")]
    assert (1, 1) in allowed_outcomes([t1, t2], TWO_CTAS, ["r0", "r1"])


def test_isa_coherent_read_read() -> None:
    t1 = [st("x", 1, "relaxed", "sys")]
    t2 = [ld("x", "r0", "relaxed", "sys"), ld("x", "r1", "relaxed", "sys")]
    assert allowed_outcomes([t1, t2], TWO_CTAS, ["r0", "r1"]) == {(0, 0), (0, 1), (1, 1)}


@pytest.mark.parametrize("scope,finals", [("sys", {(2,)}), ("cta", {(1,), (2,)})])
def test_isa_atomicity_needs_morally_strong_atomics(scope: str, finals: set) -> None:
    a = [Op("atom", "x", 1, "relaxed", scope, None, "add")]
    b = [Op("atom", "x", 1, "relaxed", "gpu", None, "add")]
    assert allowed_outcomes([a, b], TWO_CTAS, [], ["x"]) == finals


@pytest.mark.parametrize("kind,weak_seen", [("red", True), ("atom", False)])
def test_isa_reductions_do_not_form_acquire_patterns(kind: str, weak_seen: bool) -> None:
    t1 = [st("x", 42), st("flag", 1, "release", "gpu")]
    t2 = [Op(kind, "flag", 1, "relaxed", "sys", None, "add"), fence("acquire", "gpu"), ld("x", "r1")]
    assert ((0, 2) in allowed_outcomes([t1, t2], TWO_CTAS, ["r1"], ["flag"])) == weak_seen


def test_op_validation() -> None:
    with pytest.raises(ValueError, match="needs a scope"):
        Op("ld", "x", sem="acquire", reg="r")
    with pytest.raises(ValueError, match="takes no scope"):
        Op("st", "x", 1, "weak", "gpu")
    with pytest.raises(ValueError, match="rmw"):
        Op("atom", "x", 1, "relaxed", "gpu")
    assert Op("ld", "y", 0, "acquire", "gpu", "r0").label() == "r0 = ld.acquire.gpu [y]"
    assert Op("ld", "y", 0, "volatile", None, "r0").label() == "r0 = ld.volatile [y]"


# --- the expected verdicts of the shipped tests ---------------------------------------
@pytest.mark.parametrize("name,placement,forbidden", EXPECTED_FORBIDDEN,
                         ids=[f"{n}-{p}" for n, p, _ in EXPECTED_FORBIDDEN])
def test_expected_verdicts(name: str, placement: str, forbidden: tuple) -> None:
    assert sorted(parse(name).forbidden(placement)) == sorted(forbidden)


def test_named_examples() -> None:
    mp = parse("MP+rel_acq@gpu")
    assert mp.verdicts("cta") == {(0, 0): SC, (0, 1): SC, (1, 0): FORBIDDEN, (1, 1): SC}
    assert parse("MP+relaxed@gpu").verdicts("cta")[(1, 0)] == WEAK
    assert parse("SB+relaxed@gpu").verdicts("cta")[(0, 0)] == WEAK
    assert parse("SB+weak").verdicts("cta")[(0, 0)] == WEAK
    # a scope that does not hold both threads orders nothing
    assert parse("MP+rel_acq@cta").verdicts("cta")[(1, 0)] == WEAK
    assert parse("MP+rel_acq@cta").verdicts("warp")[(1, 0)] == FORBIDDEN
    assert parse("MP+rel_acq@gpu").verdicts("gpu")[(1, 0)] == WEAK
    assert parse("MP+rel_acq@sys").verdicts("gpu")[(1, 0)] == FORBIDDEN


def test_every_test_is_about_its_shapes_outcome() -> None:
    """The shape's classic outcome is never SC, and is weak or forbidden as the model says;
    every outcome the model allows or forbids is in the outcome space."""
    for t in catalogue():
        for p in PLACEMENTS:
            v = t.verdicts(p)
            assert v[t.spec.interesting] in (WEAK, FORBIDDEN), (t.name, p)
            assert set(v.values()) <= {SC, WEAK, FORBIDDEN}
            assert any(x == SC for x in v.values())
            assert sum(x != SC for x in v.values()) >= 1


def test_wider_scope_and_closer_placement_never_forbid_less() -> None:
    for t in catalogue(scopes=("cta",)):
        if t.scope is None:
            continue
        wider = [LitmusTest(t.shape, t.style, s) for s in SCOPES]
        for p in PLACEMENTS:
            sets = [set(w.forbidden(p)) for w in wider]
            assert sets[0] <= sets[1] <= sets[2], (t.name, p)
        for w in wider:
            assert set(w.forbidden("gpu")) <= set(w.forbidden("cta")) <= set(w.forbidden("warp")), w.name


# --- the parameter space ---------------------------------------------------------------
def test_parameter_space() -> None:
    tests = catalogue()
    names = [t.name for t in tests]
    assert len(names) == len(set(names))
    assert all(parse(n) == t for n, t in zip(names, tests))
    assert set(SHAPES) == {"MP", "SB", "LB", "2+2W", "IRIW", "WRC"}
    unscoped = sum(len(s.unscoped) for s in SHAPES.values())
    styles = sum(len(s.styles) for s in SHAPES.values())
    assert len(tests) == unscoped + 3 * (styles - unscoped)
    assert len(kernel_keys()) == styles <= 30  # one kernel per shape x style
    assert {t.nthreads for t in tests} == {2, 3, 4}
    assert len(catalogue(["MP"], scopes=("gpu",))) == len(SHAPES["MP"].styles)
    with pytest.raises(ValueError, match="unknown style"):
        LitmusTest("MP", "nope", "gpu")
    with pytest.raises(ValueError, match="takes a scope"):
        LitmusTest("MP", "rel_acq", None)
    with pytest.raises(ValueError, match="takes no scope"):
        LitmusTest("MP", "weak", "gpu")
    with pytest.raises(ValueError, match="unknown shape"):
        parse("XX+weak")


def test_outcome_spaces() -> None:
    assert parse("IRIW+fence_sc@gpu").outcome_space() == [
        tuple((n >> (3 - b)) & 1 for b in range(4)) for n in range(16)]
    assert parse("2+2W+relaxed@gpu").outcome_space() == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert parse("MP+rel_atom_acq@gpu").observables == ("r0", "r1")
    assert parse("2+2W+relaxed@gpu").observables == ("[x]", "[y]")


# --- classification and rendering ------------------------------------------------------
def test_classify_counts() -> None:
    sb = parse("SB+relaxed@gpu")
    hist = histogram_from_rows([(0, 1)] * 5 + [(1, 0)] * 4 + [(0, 0)] * 2 + [(1, 1)] + [(3, 0)])
    assert hist == {(0, 1): 5, (1, 0): 4, (0, 0): 2, (1, 1): 1, (3, 0): 1}
    assert classify(sb, "cta", hist) == {"sc": 10, "weak": 2, "forbidden": 0, "unexpected": 1}
    sc = parse("SB+fence_sc@gpu")
    assert classify(sc, "cta", hist)["forbidden"] == 2
    assert classify(sc, "gpu", hist)["forbidden"] == 0  # gpu scope across GPUs: weak


def test_result_and_summary() -> None:
    ok = Result(parse("MP+rel_acq@gpu"), "cta", {(0, 0): 10, (1, 1): 90}, iterations=100, seconds=0.5)
    weak = Result(parse("SB+relaxed@gpu"), "cta", {(0, 0): 3, (0, 1): 50, (1, 0): 47}, iterations=100)
    none = Result(parse("LB+relaxed@gpu"), "cta", {(0, 0): 100}, iterations=100)
    bad = Result(parse("SB+fence_sc@gpu"), "cta", {(0, 0): 1, (1, 1): 99}, iterations=100)
    assert (ok.violations, ok.weak_observed, ok.outcomes_seen, ok.weak_allowed) == (0, 0, 2, False)
    assert (weak.violations, weak.weak_observed, weak.weak_allowed) == (0, 3, True)
    assert bad.violations == 1
    text = render_summary([ok, weak, none, bad])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["test", "placement", "runs"]
    assert "forbidden observed" in lines[0]
    verdicts = [ln.split()[-1] for ln in lines[2:]]
    assert verdicts == ["ok", "seen", "seen", "VIOLATION"]  # "weak seen", "no weak seen"
    assert "no weak seen" in lines[4]
    md = render_summary([ok, bad], markdown=True).splitlines()
    assert md[0].startswith("| test | placement | runs |") and md[1].startswith("|---|")
    assert md[3].startswith("| `SB+fence_sc@gpu` | cta | 100 |") and md[3].endswith("| VIOLATION |")
    hist = render_histogram(bad)
    assert "FORBIDDEN" in hist and "* r0=0 r1=0" in hist
    assert "st.relaxed.gpu [x], 1; fence.sc.gpu; r0 = ld.relaxed.gpu [y]" in hist


def test_json_round_trip() -> None:
    r = Result(parse("2+2W+fence_sc@sys"), "gpu", {(1, 2): 7, (2, 2): 3}, iterations=10, seconds=1.5,
               timeouts=0, params={"stride": 1})
    d = json.loads(json.dumps(r.to_json()))
    assert d["test"] == "2+2W+fence_sc@sys" and d["violations"] == 0 and d["runs"] == 10
    assert {tuple(h["outcome"]): h["verdict"] for h in d["histogram"]}[(1, 1)] == "forbidden"
    back = Result.from_json(d)
    assert back.histogram == r.histogram and back.test == r.test and back.placement == "gpu"


def test_verdict_table() -> None:
    table = render_verdicts(catalogue(["MP"], scopes=("gpu",)), PLACEMENTS).splitlines()
    assert table[0] == "| test | T0 | T1 | cta: forbidden | warp: forbidden | gpu: forbidden |"
    row = next(r for r in table if r.startswith("| `MP+rel_acq@gpu`"))
    assert row.endswith("| r0=1 r1=0 | r0=1 r1=0 | none |")


# --- the package stays pure Python; the command line's GPU-free modes -------------------
def test_import_needs_neither_cutedsl_nor_torch() -> None:
    code = ("import sys, ptxops.litmus as L; L.parse('MP+rel_acq@gpu').verdicts('cta'); "
            "assert 'cutlass' not in sys.modules and 'torch' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_cli_list(capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["--list", "--tests", "SB+fence_sc@gpu,MP", "--scopes", "sys"]) == 0
    out = capsys.readouterr().out
    assert "SB+fence_sc@gpu:" in out and "MP+rel_acq@sys:" in out and "MP+weak:" in out
    assert "r0=0 r1=0                    forbidden" in out
    assert cli_main(["--list", "--tests", "XX"]) == 2


def test_cli_gpu_placement_needs_the_upper_layer(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """ptxops opens no symmetric memory: placement gpu points to collectives.tools.litmus."""
    pytest.importorskip("torch")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["--placement", "gpu", "--tests", "MP"]) == 2
    assert "-m collectives.tools.litmus" in capsys.readouterr().err


def test_docs_verdict_table_is_current() -> None:
    """docs/litmus.md carries the table `--verdicts-markdown` prints (regenerate: see there)."""
    with open(os.path.join(ROOT, "docs", "litmus.md")) as f:
        doc = f.read()
    table = render_verdicts(catalogue(scopes=SCOPES), PLACEMENTS)
    assert table in doc, "docs/litmus.md's verdict table is stale: regenerate it"
