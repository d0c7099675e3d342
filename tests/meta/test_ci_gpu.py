"""``.ci/gpu`` where no GPU is visible: it says so once and exits non-zero, instead of starting
every file's run (each ``rc=1`` with an empty summary)."""

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
