"""The tests' own layout: test modules are packages under ``tests`` (mirroring the code's wings;
``tests.ptxops`` never hides the library ``ptxops``; shared helpers in the package
``tests.support``), and ``.ci/gpu`` runs every GPU test file: ``tests/<package>/gpu/<folder>/``
names what a file needs (``one_gpu``, ``ranks``, ``four_ranks``, ``procs``, ``world``), the
script globs those folders, and every file runs in its folder's group (``ranks``: one of the
device-call-sized groups, and the one-GPU world's); every GPU test file is marked ``gpu`` or
``multigpu`` (so it skips cleanly without a GPU)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu"
GPU_DIRS = [ROOT / "tests" / "ptxops" / "gpu", ROOT / "tests" / "collectives" / "gpu"]
#: The groups each GPU folder's files may run in.
FOLDER_GROUPS = {"one_gpu": {"one_gpu"}, "ranks": {"peer", "collectives", "emulated", "gather", "world"},
                 "four_ranks": {"four_ranks"}, "procs": {"procs"}, "world": {"world"}}


def listed() -> dict[str, set[str]]:
    """Each test file ``.ci/gpu all`` and ``.ci/gpu world`` run (repository-relative) -> the
    groups it runs in."""
    text = "".join(subprocess.run(["bash", str(SCRIPT), group, size], capture_output=True, text=True, check=True,
                                  env={**os.environ, "LIST": "1"}).stdout for group, size in (("all", "2"), ("world", "2")))
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        group, path = line.split()
        out.setdefault(path, set()).add(group)
    return out


def gpu_files() -> set[Path]:
    return {p for d in GPU_DIRS for p in d.rglob("test_*.py")}


def test_test_packages_do_not_hide_the_libraries() -> None:
    import collectives
    import ptxops

    assert __name__ == "tests.meta.test_layout"
    for lib in (ptxops, collectives):
        assert (ROOT / "tests") not in Path(lib.__file__).resolve().parents, lib.__file__


def test_support_is_a_package_not_a_path_entry() -> None:
    assert (ROOT / "tests" / "support" / "__init__.py").is_file()
    assert "sys.path" not in (ROOT / "tests" / "conftest.py").read_text()


def test_gpu_tests_live_in_folders_named_by_what_they_need() -> None:
    assert {p.parent.name for p in gpu_files()} <= set(FOLDER_GROUPS)


def test_every_gpu_file_runs_in_its_folders_group() -> None:
    runs = listed()
    misplaced = {(p.relative_to(ROOT).as_posix(), tuple(sorted(runs.get(p.relative_to(ROOT).as_posix(), ()))))
                 for p in gpu_files()
                 if not runs.get(p.relative_to(ROOT).as_posix()) or not runs[p.relative_to(ROOT).as_posix()]
                 <= FOLDER_GROUPS.get(p.parent.name, set())}
    assert misplaced == set()
    assert {f for f in runs if not (ROOT / f).is_file()} == set()


def test_gpu_files_are_marked() -> None:
    unmarked = {p.relative_to(ROOT).as_posix() for p in gpu_files()
                if not re.search(r"pytest\.mark\.(multi)?gpu\b", p.read_text())}
    assert unmarked == set()


def _names(path: Path) -> set[str]:
    """The test functions ``path`` defines or imports."""
    tree = ast.parse(path.read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return {n for n in defined | imported if n.startswith("test_")}


def test_the_collectives_cases_run_once_per_backend() -> None:
    """The multi-rank collectives module is split by backend: the peer module runs every case,
    the emulated one every case that takes a backend."""
    ranks = ROOT / "tests" / "collectives" / "gpu" / "ranks"
    tree = ast.parse((ranks / "collectives_cases.py").read_text())
    cases = {n.name: any(a.arg == "backend" for a in n.args.args) for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    assert _names(ranks / "test_collectives_peer.py") == set(cases)
    assert _names(ranks / "test_collectives_emulated.py") == {n for n, per_backend in cases.items() if per_backend}


def test_collectives_has_at_most_twelve_top_level_modules() -> None:
    """A face per feature at the top (issue 47); the rest lives in the wings and packages
    (``reference/``: the tests' models)."""
    modules = sorted(p.name for p in (ROOT / "collectives").glob("*.py"))
    assert len(modules) <= 12, modules


def test_the_device_package_lists_every_block_module() -> None:
    """``collectives.device`` imports each block module's public names (its ``__all__``), one
    group per file; the launchers and argument layouts (launch, kernel_args) stay apart."""
    device = ROOT / "collectives" / "device"

    def public(path: Path) -> set[str]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                return set(ast.literal_eval(node.value))
        return set()

    listed: dict[str, set[str]] = {}
    for node in ast.parse((device / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            listed[node.module] = {a.name for a in node.names}
    blocks = {p.stem for p in device.glob("*.py")} - {"__init__", "launch", "kernel_args"}
    assert {m: public(device / f"{m}.py") for m in sorted(blocks)} == {m: listed.get(m, set()) for m in sorted(blocks)}
