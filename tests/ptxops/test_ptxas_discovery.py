"""Which ptxas ptxops finds by itself: an installed nvidia-cuda-nvcc wheel, then ``$PTXOPS_PTXAS``
(a ptxas or a folder holding one), then PATH; and what ``check`` does with an assembler that reads
only some of the PTX ISA versions the spec uses.  The assemblers are fakes: shell scripts that
answer the version probe of :func:`ptxops.ptxas.isa_version` as a ptxas of that version does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptxops import cli, ptxas, spec

#: What ptxas says of a module whose ``.version`` is newer than it reads.
PROBE_ANSWER = "ptxas fatal   : Unsupported .version 99.9; current version is '{isa}'"


def fake_ptxas(path: Path, isa: str) -> str:
    """An executable at ``path`` that answers the version probe as a ptxas reading PTX ISA ``isa``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho \"{PROBE_ANSWER.format(isa=isa)}\" >&2\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def fake_wheel(site: Path, isa: str) -> str:
    """An installed ``nvidia-cuda-nvcc`` distribution under ``site`` whose RECORD lists its ptxas
    where the CUDA 13 wheel puts it (``nvidia/cu13/bin/ptxas``)."""
    exe = fake_ptxas(site / "nvidia" / "cu13" / "bin" / "ptxas", isa)
    info = site / "nvidia_cuda_nvcc-13.5.37.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cuda-nvcc\nVersion: 13.5.37\n")
    (info / "RECORD").write_text("nvidia/cu13/bin/ptxas,,\nnvidia_cuda_nvcc-13.5.37.dist-info/METADATA,,\n")
    return exe


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No wheel on sys.path, PTXOPS_PTXAS unset, an empty folder as PATH (returned)."""
    path = tmp_path / "path"
    path.mkdir()
    monkeypatch.setattr(ptxas.sys, "path", [])
    monkeypatch.delenv("PTXOPS_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(path))
    return path


def test_order_is_wheel_then_env_then_path(nowhere, monkeypatch, tmp_path):
    on_path = fake_ptxas(nowhere / "ptxas", "9.0")
    assert ptxas.candidates() == [on_path]
    site = tmp_path / "site"
    wheel = fake_wheel(site, "9.5")
    monkeypatch.setattr(ptxas.sys, "path", [str(site)])
    named = fake_ptxas(tmp_path / "named" / "ptxas", "9.1")
    monkeypatch.setenv("PTXOPS_PTXAS", named)
    assert ptxas.candidates() == [wheel, named, on_path]


def test_each_isa_gets_the_oldest_assembler_reading_it(nowhere, monkeypatch, tmp_path):
    """9.0 by the 9.0 assembler though a newer one comes first; 9.1 by the one reading 9.1
    rather than 9.5; between equals, the first in preference order."""
    on_path = fake_ptxas(nowhere / "ptxas", "9.0")
    site = tmp_path / "site"
    wheel = fake_wheel(site, "9.5")
    monkeypatch.setattr(ptxas.sys, "path", [str(site)])
    named = fake_ptxas(tmp_path / "named" / "ptxas", "9.1")
    monkeypatch.setenv("PTXOPS_PTXAS", named)
    assert (ptxas.ptxas_path(), ptxas.ptxas_path("9.1"), ptxas.ptxas_path("9.5")) == (on_path, named, wheel)
    also_90 = fake_ptxas(tmp_path / "also" / "ptxas", "9.0")
    monkeypatch.setenv("PTXOPS_PTXAS", also_90)
    assert ptxas.ptxas_path() == also_90


@pytest.mark.parametrize("layout", ["ptxas", "bin/ptxas", "nvidia/cu13/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas"])
def test_env_names_a_folder(nowhere, monkeypatch, tmp_path, layout):
    """A folder works as well as the ptxas in it: a CUDA bin/, a toolkit root, or the folder
    of ``pip install --target DIR nvidia-cuda-nvcc``."""
    exe = fake_ptxas(tmp_path / "dir" / layout, "9.1")
    monkeypatch.setenv("PTXOPS_PTXAS", os.pathsep.join([str(tmp_path / "dir"), ""]))
    assert ptxas.candidates() == [exe]
    assert ptxas.ptxas_path("9.1") == exe


def test_env_naming_no_ptxas_says_so(nowhere, monkeypatch, tmp_path, capsys):
    """A folder without a ptxas (once a PermissionError traceback: the folder was run) and a
    missing file each raise PtxasUnavailable naming the entry; check exits 3 with it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PTXOPS_PTXAS", str(empty))
    with pytest.raises(ptxas.PtxasUnavailable, match=f"folder {empty}, which holds no ptxas"):
        ptxas.candidates()
    assert cli.main(["check", "fence"]) == cli.EXIT_NO_PTXAS
    assert f"folder {empty}, which holds no ptxas" in capsys.readouterr().err
    monkeypatch.setenv("PTXOPS_PTXAS", str(tmp_path / "missing"))
    with pytest.raises(ptxas.PtxasUnavailable, match="neither an executable ptxas nor a folder"):
        ptxas.candidates()


def test_no_ptxas_names_the_extra(nowhere):
    with pytest.raises(ptxas.PtxasUnavailable, match=r"ptxops\[ptxas\]"):
        ptxas.ptxas_path()


def test_newer_isa_takes_the_first_assembler_reading_it(nowhere, monkeypatch, tmp_path):
    old = fake_ptxas(nowhere / "ptxas", "9.0")
    with pytest.raises(ptxas.PtxasUnavailable, match=rf"no ptxas reads PTX ISA 9.1: found {old} \(PTX ISA 9.0\)"):
        ptxas.ptxas_path("9.1")
    new = fake_ptxas(tmp_path / "new" / "bin" / "ptxas", "9.1")
    monkeypatch.setenv("PTXOPS_PTXAS", str(tmp_path / "new"))
    assert ptxas.ptxas_path("9.1") == new


def test_check_with_an_older_ptxas_checks_what_it_reads(nowhere, monkeypatch, capsys):
    """With only a PTX ISA 9.0 assembler, check assembles the 9.0 families and reports the 9.1
    families as not checked (exit 3); it does not give up on all of them."""
    old = fake_ptxas(nowhere / "ptxas", "9.0")
    seen: list[str] = []

    def fake_assemble(lines, target, isa):
        seen.append(isa)
        return [None for _ in lines]

    monkeypatch.setattr(ptxas, "ptxas_version", lambda isa: "fake")
    monkeypatch.setattr(ptxas, "assemble", fake_assemble)
    code = cli.main(["check", "multimem", "--target", "sm_90a"])
    out, err = capsys.readouterr()
    newer = [f for f in spec.FAMILIES if f.startswith("multimem.") and spec.FAMILIES[f].ptx_version != "9.0"]
    assert newer, "the spec has no multimem family newer than PTX ISA 9.0"
    assert code == cli.EXIT_NO_PTXAS and set(seen) == {"9.0"}
    assert f"ptxas for PTX ISA 9.0: {old}" in out
    checked = [row[0] for row in map(str.split, out.splitlines()) if row and row[0] in spec.FAMILIES]
    assert "multimem.ld_reduce" in checked and not set(newer) & set(checked)
    assert f"not checked, PTX ISA 9.1: {', '.join(newer)}" in err
