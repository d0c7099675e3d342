"""The ``python -m ptxops`` command line, run in-process through ``ptxops.cli.main``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ptxops import cli, ptxas, spec

ROOT = Path(__file__).resolve().parents[2]
needs_ptxas = pytest.mark.skipif(not ptxas.candidates(), reason="no ptxas (pip install 'ptxops[ptxas]')")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows(out: str) -> list[list[str]]:
    """The table rows of ``list`` output (header and count line dropped)."""
    lines = out.strip().splitlines()
    return [line.split() for line in lines[1:-1]]


# -- list ------------------------------------------------------------------------------------


def test_list_family(capsys):
    code, out, err = run(capsys, "list", "multimem.ld_reduce", "--target", "sm_90a")
    assert code == 0 and err == ""
    header, *_, count = out.strip().splitlines()
    assert header.split() == ["sem", "scope", "space", "op", "acc", "vec", "type", "opcode"]
    expected = [i.opcode for i in spec.forms("multimem.ld_reduce", target="sm_90a")]
    assert [r[-1] for r in rows(out)] == expected
    assert count.startswith(f"{len(expected)} forms of multimem.ld_reduce on sm_90a")
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2" in expected
    assert not any("e4m3" in op for op in expected)  # fp8 needs sm_100a or newer


def test_list_target_changes_forms(capsys):
    _, out90, _ = run(capsys, "list", "multimem.st", "--target", "90a")
    _, out100, _ = run(capsys, "list", "multimem.st", "--target", "sm_100a")
    assert "e4m3" not in out90 and "multimem.st.v4.e4m3" in out100
    assert len(rows(out100)) > len(rows(out90))


def test_list_where(capsys):
    code, out, _ = run(
        capsys, "list", "multimem.ld_reduce", "--target", "sm_90a",
        "--where", "op=add", "--where", "type=bf16x2", "--where", "vec=v4",
    )
    assert code == 0
    table = rows(out)
    expected = list(spec.forms("multimem.ld_reduce", target="sm_90a", op="add", type="bf16x2", vec=4))
    assert len(table) == len(expected) > 0
    for row in table:
        op, vec, type_, opcode = row[3], row[5], row[6], row[7]
        assert (op, vec, type_) == ("add", "4", "bf16x2")
        assert opcode.endswith(".v4.bf16x2")
    assert out.strip().splitlines()[-1].startswith(f"{len(expected)} forms")


def test_list_where_absent(capsys):
    code, out, _ = run(capsys, "list", "fence", "--where", "sem=-")
    assert code == 0
    assert rows(out) and all(r[2] == "-" for r in rows(out))
    assert all(".acquire" not in r[-1] and ".release" not in r[-1] for r in rows(out))


def test_list_where_unknown_key(capsys):
    code, out, err = run(capsys, "list", "fence", "--where", "acc=f32")
    assert code == 2 and out == ""
    assert "unknown qualifier key" in err and "'acc'" in err


def test_list_bad_target(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["list", "fence", "--target", "sm_89"])
    assert e.value.code == 2
    assert "unknown target 'sm_89'" in capsys.readouterr().err


def test_list_families(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split() == ["family", *spec.TARGETS]
    table = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert list(table) == list(spec.FAMILIES)
    fence = sum(1 for _ in spec.forms("fence", target="sm_90a"))
    assert table["fence"][spec.TARGETS.index("sm_90a")] == str(fence)


def test_list_overview_honours_target(capsys):
    code, out, _ = run(capsys, "list", "--target", "sm_100a")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split() == ["family", "sm_100a"]
    table = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert table["multimem.st"] == [str(sum(1 for _ in spec.forms("multimem.st", target="sm_100a")))]
    assert lines[-1] == f"{len(spec.FAMILIES)} families, 1 target (legal forms per target)"


def test_list_prefix_counts_the_families_under_it(capsys):
    code, out, _ = run(capsys, "list", "multimem", "--target", "sm_90a")
    assert code == 0
    names = [line.split()[0] for line in out.strip().splitlines()[1:-1]]
    assert names == [f for f in spec.FAMILIES if f.startswith("multimem.")] and len(names) >= 3
    code, _, err = run(capsys, "list", "multi", "--target", "sm_90a")  # prefixes end at a dot
    assert code == 2 and "unknown instruction family 'multi'" in err and "multimem.st" in err
    code, _, err = run(capsys, "list", "multimem", "--where", "op=add")
    assert code == 2 and "--where needs one FAMILY" in err


# -- explain ---------------------------------------------------------------------------------

LEGAL = (
    "explain", "multimem.ld_reduce", "--sem", "relaxed", "--scope", "sys", "--space", "global",
    "--op", "add", "--acc", "f32", "--vec", "4", "--type", "bf16x2", "--target", "sm_90a",
)


def test_explain_legal(capsys):
    code, out, err = run(capsys, *LEGAL)
    assert code == 0 and err == ""
    inst = spec.instruction(
        "multimem.ld_reduce", sem="relaxed", scope="sys", space="global", op="add", acc="f32",
        vec=4, type="bf16x2", target="sm_90a",
    )
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2" in out
    for text in (inst.opcode, inst.statement, inst.template, inst.constraints):
        assert text in out
    assert "ptxops.multimem_ld_reduce" in out
    assert "[acc-add-only]" in out and "[acc-f32-types]" in out
    assert "[fp8-target]" not in out  # its `when` does not match a bf16x2 form
    operands = out.split("operands")[1].split("qualifiers")[0]
    assert "d     4          32    32,32,32,32" in operands
    assert "a     1          64    64" in operands


def test_explain_vec_spellings_agree(capsys):
    _, with_digit, _ = run(capsys, *LEGAL)
    argv = list(LEGAL)
    argv[argv.index("--vec") + 1] = "v4"
    _, with_v, _ = run(capsys, *argv)
    assert with_v == with_digit


def test_explain_fills_ptx_defaults(capsys):
    code, out, _ = run(capsys, "explain", "multimem.red", "--op", "add", "--type", "f32")
    assert code == 0
    quals = {
        line.split()[0]: line.split()[1:]
        for line in out.split("qualifiers")[1].split("rules that apply")[0].strip().splitlines()[2:]
    }
    assert quals["sem"] == ["relaxed", "PTX", "default"]
    assert quals["scope"] == ["sys", "PTX", "default"]
    assert quals["op"] == ["add", "given"]
    assert quals["target"] == [spec.DEFAULT_TARGET, "ptxops", "default"]
    assert "multimem.red.add.f32 [a], b;" in out


def test_explain_illegal(capsys):
    code, out, err = run(
        capsys, "explain", "multimem.ld_reduce", "--op", "min", "--acc", "f32",
        "--type", "bf16x2", "--vec", "4", "--target", "sm_90a",
    )
    assert code == 2 and out == ""
    assert "acc-add-only" in err and "sm_90a" in err
    assert "legal here" in err


def test_explain_key_foreign_to_family(capsys):
    code, _, err = run(capsys, "explain", "atom", "--op", "add", "--type", "f32", "--acc", "f32")
    assert code == 2 and "unknown qualifier key" in err


def test_explain_unknown_family(capsys):
    code, _, err = run(capsys, "explain", "multimem.ld")
    assert code == 2 and "unknown instruction family" in err


def test_explain_fence(capsys):
    code, out, _ = run(
        capsys, "explain", "fence", "--proxy", "tensormap::generic", "--sem", "acquire",
        "--scope", "gpu",
    )
    assert code == 0
    assert "fence.proxy.tensormap::generic.acquire.gpu [a], 128;" in out
    code, out, err = run(capsys, "explain", "fence", "--op-restrict", "mbarrier_init", "--scope", "gpu")
    assert code == 2 and "mbarrier-init" in err


# -- rules -----------------------------------------------------------------------------------


def test_rules(capsys):
    code, out, _ = run(capsys, "rules", "ld")
    assert code == 0
    fam = spec.FAMILIES["ld"]
    for r in fam.rules:
        enforced = "yes" if r.ptxas_enforced else "no"
        assert f"[{r.name}]  ptxas enforces: {enforced}" in out
    assert "[v8-32bit-only]  ptxas enforces: no" in out
    assert out.strip().splitlines()[-1].startswith(f"{len(fam.rules)} rules of ld")


def test_rules_texts(capsys):
    _, out, _ = run(capsys, "rules", "multimem.ld_reduce")
    flat = " ".join(out.split())
    for r in spec.FAMILIES["multimem.ld_reduce"].rules:
        assert " ".join(r.text.split()) in flat


# -- check -----------------------------------------------------------------------------------


@needs_ptxas
def test_check_fence(capsys):
    code, out, _ = run(capsys, "check", "fence", "--target", "sm_90a")
    assert code == 0
    n = sum(1 for _ in spec.forms("fence", target="sm_90a"))
    assert ["fence", "sm_90a", str(n), str(n), "0"] in [line.split() for line in out.splitlines()]
    assert out.strip().splitlines()[-1] == f"{n} forms, {n} accepted, 0 rejected"


def test_check_reports_rejections(capsys, monkeypatch):
    seen: list[tuple[list[str], str]] = []

    def fake_assemble(lines, target, version):
        seen.append((list(lines), target))
        return ["bad" if ".sys" in line else None for line in lines]

    monkeypatch.setattr(ptxas, "ptxas_version", lambda version: "fake")
    monkeypatch.setattr(ptxas, "ptxas_path", lambda version: "/fake/ptxas")
    monkeypatch.setattr(ptxas, "assemble", fake_assemble)
    code, out, err = run(capsys, "check", "fence", "--target", "sm_90", "sm_100a")
    assert code == 1
    assert [t for _, t in seen] == ["sm_90", "sm_100a"]
    lines, _ = seen[0]
    assert "fence.sc.sys;" in lines and "fence.proxy.tensormap::generic.acquire.gpu [%rd1], 128;" in lines
    bad = sum(".sys" in line for line in lines)
    n = len(lines)
    assert ["fence", "sm_90", str(n), str(n - bad), str(bad)] in [l.split() for l in out.splitlines()]
    assert "fence.sc.sys;" in err and "bad" in err


def test_check_a_prefix_checks_every_family_under_it(capsys, monkeypatch):
    seen: list[str] = []

    def fake_assemble(lines, target, isa):
        seen.extend(lines)
        return [None for _ in lines]

    monkeypatch.setattr(ptxas, "ptxas_version", lambda version: "fake")
    monkeypatch.setattr(ptxas, "ptxas_path", lambda version: "/fake/ptxas")
    monkeypatch.setattr(ptxas, "assemble", fake_assemble)
    code, out, _ = run(capsys, "check", "multimem", "cp.async.bulk", "--target", "sm_90a")
    assert code == 0
    checked = [row[0] for row in map(str.split, out.splitlines()) if row and row[0] in spec.FAMILIES]
    expected = [f for f in spec.FAMILIES if f.startswith("multimem.")]
    expected += [f for f in spec.FAMILIES if f == "cp.async.bulk" or f.startswith("cp.async.bulk.")]
    assert checked == expected and "cp.async.bulk.wait_group" in checked
    assert len(seen) == sum(sum(1 for _ in spec.forms(f, target="sm_90a")) for f in expected)
    code, out, err = run(capsys, "check", "multimem.nope")
    assert code == 2 and out == ""
    assert "unknown instruction family 'multimem.nope'" in err and "multimem.ld_reduce" in err


def test_rules_of_a_prefix(capsys):
    code, out, _ = run(capsys, "rules", "mbarrier")
    assert code == 0
    footers = [line for line in out.splitlines() if " rules of " in line]
    assert [f.split(" rules of ")[1].split()[0] for f in footers] == [
        f for f in spec.FAMILIES if f.startswith("mbarrier.")
    ]
    code, out, _ = run(capsys, "rules", "cp.async.bulk")  # a family itself: only its rules
    assert code == 0 and out.count(" rules of ") == 1


def test_check_without_ptxas(capsys, monkeypatch):
    monkeypatch.delenv("PTXOPS_PTXAS", raising=False)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(ptxas.sys, "path", [])  # no nvidia-cuda-nvcc wheel either
    code, _, err = run(capsys, "check", "fence")
    assert code == 3 and "ptxas not found" in err


@needs_ptxas
def test_check_names_the_assembler_of_each_isa_version(capsys, monkeypatch):
    """A PTX ISA 9.1 family is checked by an assembler that reads 9.1, or not at all: with
    only an older ptxas, check exits 3 naming the version and the assemblers it found."""
    newest = max(ptxas.candidates(), key=ptxas.isa_version)
    if ptxas.isa_version(newest) >= (9, 1):
        code, out, _ = run(capsys, "check", "multimem.cp.async.bulk", "--target", "sm_90a")
        assert code == 0 and f"ptxas for PTX ISA 9.1: {ptxas.ptxas_path('9.1')}" in out
    oldest = min(ptxas.candidates(), key=ptxas.isa_version)
    monkeypatch.setattr(ptxas, "candidates", lambda: [oldest])
    if ptxas.isa_version(oldest) < (9, 1):
        code, _, err = run(capsys, "check", "multimem.cp.async.bulk", "--target", "sm_90a")
        assert code == 3 and "no ptxas reads PTX ISA 9.1" in err


# -- the module entry point ------------------------------------------------------------------


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("list", "explain", "rules", "check"):
        assert command in out


def test_python_m_ptxops_without_cutlass():
    """``python -m ptxops`` must work where CuTeDSL cannot be imported."""
    code = (
        "import runpy, sys; sys.modules['cutlass'] = None; "
        "sys.argv = ['ptxops', 'list', 'fence', '--target', 'sm_90a']; "
        "runpy.run_module('ptxops', run_name='__main__', alter_sys=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "fence.proxy.alias" in proc.stdout and "forms of fence on sm_90a" in proc.stdout


def test_ld_cache_hints_list_and_explain(capsys):
    code, out, _ = run(capsys, "list", "ld", "--target", "sm_90a", "--where", "nc=nc", "--where", "vec=4")
    assert code == 0 and "ld.global.cg.nc.L2::cache_hint.L2::256B.v4.b32" in out
    code, out, _ = run(
        capsys, "explain", "ld", "--space", "global", "--cache-hint", "cache_hint",
        "--prefetch", "128B", "--type", "b32", "--target", "sm_90a",
    )
    assert code == 0
    assert "ld.global.L2::cache_hint.L2::128B.b32 %r1, [%rd1], %rd2;" in out
    assert "policy" in out and "=r,l,l,~{memory}" in out


def test_explain_param_is_legal_ptx_not_wrapped(capsys):
    code, _, err = run(capsys, "explain", "ld", "--space", "param", "--type", "b32")
    assert code != 0 and "legal PTX that ptxops does not wrap" in err


# -- the control, prefetch and Blackwell families -----------------------------------------------

NEW = ("griddepcontrol.launch_dependents", "griddepcontrol.wait", "membar", "elect.sync",
       "prefetch", "prefetchu", "cp.async.bulk.prefetch", "st.bulk",
       "clusterlaunchcontrol.try_cancel", "clusterlaunchcontrol.query_cancel")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_list_new_families_per_target(capsys, target):
    for name in NEW:
        code, out, _ = run(capsys, "list", name, "--target", target)
        n = sum(1 for _ in spec.forms(name, target=target))
        assert code == 0 and out.strip().splitlines()[-1].startswith(f"{n} form")
        assert (n == 0) == (target == "sm_90a" and name.startswith(("st.bulk", "clusterlaunch")))


def test_explain_elect_and_query_cancel(capsys):
    code, out, _ = run(capsys, "explain", "elect.sync")
    assert code == 0 and "elect.sync %r1|%p1, %r2;" in out and "ptxops.elect_sync" in out
    code, out, _ = run(capsys, "explain", "clusterlaunchcontrol.query_cancel", "--query",
                       "get_first_ctaid::y", "--target", "sm_100a")
    assert code == 0 and "query_cancel.get_first_ctaid::y.b32.b128 %r1, %q1;" in out
    code, _, err = run(capsys, "explain", "st.bulk", "--target", "sm_90a")
    assert code == 2 and "[target]" in err and "sm_100a" in err
    code, out, _ = run(capsys, "explain", "prefetch", "--space", "global", "--level", "L2::evict_last")
    assert code == 0 and "prefetch.global.L2::evict_last [%rd1];" in out


@needs_ptxas
def test_check_new_families(capsys):
    code, out, _ = run(capsys, "check", *NEW, "--target", "sm_90a", "sm_100a")
    assert code == 0
    checked = dict.fromkeys(f for n in NEW for f in cli.families_under(n))  # a name covers its sub-families
    releases = {n: ptxas.release(ptxas.ptxas_path(spec.FAMILIES[n].ptx_version)) for n in checked}
    total = sum(spec.FAMILIES[n].ptxas_verdict(i.qualifiers, releases[n]) == "assembles"  # as the spec records it
                for n in checked for t in ("sm_90a", "sm_100a") for i in spec.forms(n, target=t))
    assert out.strip().splitlines()[-1] == f"{total} forms, {total} accepted, 0 rejected"
