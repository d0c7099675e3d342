"""``ptxops``'s public namespace holds exactly its public names; the device functions stay lazy
(``import ptxops`` and ``dir(ptxops)`` load no CuTeDSL)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

import ptxops

ROOT = Path(__file__).resolve().parents[2]


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


def test_ops_exports_exactly_the_one_device_function_list() -> None:
    """``ptxops.DEVICE_FUNCTIONS`` is the one list: ``ptxops.ops`` exports it, and every device
    function ``ptxops.ops`` imports from its modules is on it."""
    pytest.importorskip("cutlass")
    import ptxops.ops as ops

    imported = {name for name, value in vars(ops).items() if callable(value) and not isinstance(value, type)
                and getattr(value, "__module__", "").startswith("ptxops.ops.") and not name.startswith("_")}
    assert ops.__all__ == list(ptxops.DEVICE_FUNCTIONS)
    assert imported == set(ptxops.DEVICE_FUNCTIONS)


_WITHOUT_CUTLASS = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):  # as if CuTeDSL were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] == 'cutlass':
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
from ptxops.errors import CuTeDSLMissing
for load in ("from ptxops import multimem_ld_reduce", "from ptxops import emulate_multicast",
             "import ptxops.ops.memory"):
    try:
        exec(load)
    except ModuleNotFoundError as e:
        assert isinstance(e, CuTeDSLMissing) and e.name == 'cutlass', repr(e)
        print(e)
    else:
        raise AssertionError(load + ' loaded without CuTeDSL')
"""


def test_device_functions_without_cutedsl_say_how_to_install_it() -> None:
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_CUTLASS], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all("pip install 'ptxops[dsl]'" in line for line in lines), proc.stdout
