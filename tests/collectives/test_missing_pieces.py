"""A machine missing a piece collectives needs gets one sentence saying what is missing and what
installs it: PyTorch or CuTeDSL (``collectives.<feature>``, ``python -m collectives ptx``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(("package", "feature", "extra"), [
    ("torch", "all_reduce", "ptxops[torch]"),
    ("torch", "init", "ptxops[torch]"),
    ("cutlass", "all_reduce", "ptxops[dsl]"),
    ("cutlass", "gemm_reduce_scatter", "ptxops[dsl]"),
])
def test_a_missing_package_names_its_extra(package: str, feature: str, extra: str) -> None:
    """``sys.modules[package] = None`` makes the package unimportable, as where it is not installed."""
    proc = python(f"import sys\nsys.modules[{package!r}] = None\nimport collectives\n"
                  "try:\n"
                  f"    collectives.{feature}\n"
                  "except ImportError as e:\n"
                  "    print(type(e).__name__, e.name, e)\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"MissingDependency {package} collectives.{feature} needs "), proc.stdout
    assert f"'{extra}'" in proc.stdout


def test_the_ptx_command_without_cutedsl_says_so() -> None:
    proc = python("import sys\nsys.modules['cutlass'] = None\nfrom collectives.__main__ import main\n"
                  "sys.exit(main(['ptx', '--collective', 'all_reduce', '--backend', 'peer']))")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: python -m collectives ptx needs CuTeDSL, and 'cutlass' cannot be "
                                   "imported: pip install 'ptxops[dsl]'")
