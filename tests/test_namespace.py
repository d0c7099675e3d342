"""``ptxops``'s public namespace holds exactly its public names; the device functions stay lazy
(``import ptxops`` and ``dir(ptxops)`` load no CuTeDSL)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

import ptxops

ROOT = Path(__file__).resolve().parent.parent


def test_dir_lists_exactly_the_public_names() -> None:
    assert dir(ptxops) == sorted(ptxops.__all__)
    assert not {"Any", "annotations", "importlib"} & set(dir(ptxops))


def test_no_stray_module_level_names() -> None:
    """Besides the public names only dunders, the lazy-load tables and submodules."""
    stray = {name for name, value in vars(ptxops).items()
             if name not in ptxops.__all__ and not name.startswith("__") and name not in ("DEVICE_FUNCTIONS", "EMULATION")
             and not (isinstance(value, types.ModuleType) and value.__name__.startswith("ptxops."))}
    assert stray == set()


def test_import_and_dir_load_no_cutlass() -> None:
    code = ("import sys, ptxops; dir(ptxops); ptxops.spec; ptxops.QualifierError; "
            "assert 'cutlass' not in sys.modules, 'CuTeDSL loaded eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_public_name_resolves() -> None:
    pytest.importorskip("cutlass")
    assert all(callable(getattr(ptxops, name)) or name == "spec" for name in ptxops.__all__)
