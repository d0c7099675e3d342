"""What host and device share bit for bit lives in one pure-Python module,
:mod:`collectives.layouts`: it imports without CuTeDSL and torch (the host packs and reads its
words with no kernel in sight), and ``config`` keeps constants only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.layouts import COLLECTIVE, ERROR_FIELD, ERROR_FIELDS, FLAGS, Arg, Layout

ROOT = Path(__file__).resolve().parents[2]


def test_imports_without_cutlass_or_torch() -> None:
    code = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in ('cutlass', 'torch', 'numpy'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
from collectives import layouts
assert layouts.PadLayout(world=2).words > layouts.ExchangeLayout(2, 1).words > 0
assert layouts.COLLECTIVE.pack(**{a.name: 0 for a in layouts.COLLECTIVE.args}) == (0,) * len(layouts.COLLECTIVE.args)
assert [m for m in sys.modules if m.partition('.')[0] in ('cutlass', 'torch')] == []
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_argument_types_are_named_once() -> None:
    """An argument's type is kept as its CuTeDSL type's name (the device maps it back), given as
    either; anything else is refused where it is declared."""
    assert {a.type for a in COLLECTIVE.args + FLAGS.args} == {"Int32", "Int64"}
    pytest.importorskip("cutlass")
    from cutlass import Int64

    from collectives.device.kernel_args import dsl_type, examples

    assert Arg("x", Int64, "") == Arg("x", "Int64", "")
    assert [dsl_type(a) for a in FLAGS.args] == [type(v) for v in examples(FLAGS)]
    with pytest.raises(TypeError, match="Float32"):
        Layout("Bad", (Arg("x", "Float32", ""),))


def test_the_error_record_is_published_by_its_first_word() -> None:
    assert ERROR_FIELDS[0] == "status" and [ERROR_FIELD[f] for f in ERROR_FIELDS] == list(range(len(ERROR_FIELDS)))


def test_config_holds_constants_only() -> None:
    """No function and no class but enumerations of constants (formulas are their algorithms',
    layouts :mod:`collectives.layouts`')."""
    tree = ast.parse((ROOT / "collectives" / "config.py").read_text())
    defined = [(type(n).__name__, n.name) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
               and not (isinstance(n, ast.ClassDef) and [ast.unparse(b) for b in n.bases] == ["IntEnum"])]
    assert defined == []


def test_a_template_with_its_per_call_arguments_set_packs_the_arguments_and_refuses_a_wrong_naming() -> None:
    from collectives.algorithms.moe_combine import MOE_COMBINE
    from collectives.algorithms.moe_gather import MOE_GATHER
    from collectives.algorithms.moe_pack import MOE_PACK
    from collectives.algorithms.moe_place import MOE_PLACE
    from collectives.algorithms.moe_route import MOE_ROUTE

    for layout in (MOE_COMBINE, MOE_GATHER, MOE_PACK, MOE_PLACE, MOE_ROUTE):
        values = {name: 3 * i + 1 for i, name in enumerate(reversed(layout.names))}
        per_call = layout.names[1::2][::-1]  # (every other one, out of order)
        args, places = layout.template({n: v for n, v in values.items() if n not in per_call}, *per_call)
        for i, name in zip(places, per_call):
            args[i] = values[name]
        assert tuple(args) == layout.pack(**values)
        for wrong in (per_call[1:], per_call + per_call[:1], per_call + ("unknown",)):
            with pytest.raises(TypeError, match=layout.name):
                layout.template({n: v for n, v in values.items() if n not in per_call}, *wrong)
