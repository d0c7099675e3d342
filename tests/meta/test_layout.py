"""The tests' own layout: test modules are packages under ``tests`` (unique names; ``tests.ptxops``
never hides the library ``ptxops``), and ``.ci/gpu`` follows the GPU test folders: every
``tests/<package>/gpu/<group>/test_*.py`` runs in group ``<group>``, every file it names exists,
and every GPU test file is marked ``gpu`` or ``multigpu`` (so it skips cleanly without a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu"
GPU_DIRS = [ROOT / "tests" / "ptxops" / "gpu", ROOT / "tests" / "collectives" / "gpu"]


def groups(script: str) -> dict[str, set[str]]:
    """Each group's block of the script -> the test files it names (repository-relative)."""
    out: dict[str, set[str]] = {}
    for name, body in re.findall(r"^if \[\[ \$group == (\w+) .*?\n(.*?)^fi$", script, re.M | re.S):
        out[name] = set(re.findall(r"\btests/\S+\.py\b", body))
    return out


def gpu_files() -> set[Path]:
    return {p for d in GPU_DIRS for p in d.rglob("test_*.py")}


def test_test_packages_do_not_hide_the_libraries() -> None:
    import collectives
    import ptxops

    assert __name__ == "tests.meta.test_layout"
    for lib in (ptxops, collectives):
        assert (ROOT / "tests") not in Path(lib.__file__).resolve().parents, lib.__file__


def test_the_script_names_existing_files() -> None:
    named = set().union(*groups(SCRIPT.read_text()).values())
    assert named, "no group blocks found in .ci/gpu"
    assert {f for f in named if not (ROOT / f).is_file()} == set()


def test_every_gpu_file_runs_in_its_folders_group() -> None:
    blocks = groups(SCRIPT.read_text())
    misplaced = set()
    for path in gpu_files():
        rel = path.relative_to(ROOT).as_posix()
        group = path.parent.name
        ran_in = {g for g, files in blocks.items() if rel in files}
        if not ran_in or (group != "gpu" and ran_in != {group}):
            misplaced.add((rel, tuple(sorted(ran_in))))
    assert misplaced == set()


def test_gpu_files_are_marked() -> None:
    unmarked = {p.relative_to(ROOT).as_posix() for p in gpu_files()
                if not re.search(r"pytest\.mark\.(multi)?gpu\b", p.read_text())}
    assert unmarked == set()
