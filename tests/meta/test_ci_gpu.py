"""``.ci/gpu`` where no GPU is visible: it says so once and exits non-zero, instead of starting
every file's run (each ``rc=1`` with an empty summary); a world group that names no files is
refused (pytest given no files runs the whole suite: it did, for 8 minutes of a device call)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu"


def test_no_gpu_visible_is_said_once(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), "peer"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert said.count("no GPU visible") == 1, said
    assert "rc=" not in said and not any(tmp_path.iterdir()), said


def test_a_world_group_without_files_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "LIST": "1", "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), "world_gather,world_emulated", "4"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no ranks files in group gather,world_emulated" in proc.stderr
    listed = subprocess.run(["bash", str(SCRIPT), "world_gather", "4"], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300)
    assert listed.returncode == 0 and "test_gemm_overlap.py" in listed.stdout


def test_an_unknown_group_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "LIST": "1", "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), "bogus"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2 and not proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.startswith("ci/gpu: unknown group bogus (groups: all one_gpu peer "), proc.stderr


def test_the_list_says_which_lines_are_the_seeded_re_runs(tmp_path: Path) -> None:
    env = {**os.environ, "LIST": "1", "OUT": str(tmp_path)}
    lines = subprocess.run(["bash", str(SCRIPT), "peer"], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=300).stdout.splitlines()
    seeded = [line.split()[1] for line in lines if "(seeded re-run: COLLECTIVES_TEST_SEED_EPOCH=" in line]
    assert sorted(seeded) == ["tests/collectives/gpu/ranks/test_all_to_all.py",
                              "tests/collectives/gpu/ranks/test_barrier.py",
                              "tests/collectives/gpu/ranks/test_lamport_mismatch.py"]
    assert all(len(line.split()) == 2 for line in lines if "seeded" not in line)
