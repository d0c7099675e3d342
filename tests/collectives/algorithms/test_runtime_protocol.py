"""The seam between algorithms and host runtime: :class:`~collectives.algorithms.protocol.Runtime`
names what plans and algorithms use of a communicator, and the real
:class:`~collectives.runtime.communicator.Communicator` satisfies it structurally: every data
member is set in its constructor, every method and property is defined with the protocol's
parameters (a one-GPU world's communicator will be held to the same check)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

pytest.importorskip("torch")

from collectives.algorithms.protocol import Runtime  # noqa: E402
from collectives.runtime.communicator import Communicator  # noqa: E402


def members(proto: type) -> tuple[set[str], dict[str, object]]:
    """The protocol's data members (annotations) and its methods and properties by name."""
    data = set(proto.__annotations__)
    calls = {n: v for n, v in vars(proto).items() if callable(v) or isinstance(v, property)}
    return data, {n: v for n, v in calls.items() if not n.startswith("_")}


def constructor_attributes(cls: type) -> set[str]:
    """The names ``cls.__init__`` assigns as ``self.<name>``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def _shape(fn: object) -> list[tuple[str, object, object]]:
    """A method's parameters as (name, kind, default): what a caller relies on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def violations(proto: type, cls: type) -> list[str]:
    """What ``cls`` lacks of ``proto`` (empty: it satisfies it)."""
    data, calls = members(proto)
    have = constructor_attributes(cls) | set(dir(cls))
    out = [f"no attribute {n}" for n in sorted(data - have)]
    for name, want in sorted(calls.items()):
        got = inspect.getattr_static(cls, name, None)
        if isinstance(want, property):
            if not isinstance(got, property):
                out.append(f"{name} is not a property")
            continue
        if not callable(got):
            out.append(f"no method {name}")
        elif _shape(got) != _shape(want):
            out.append(f"{name}{inspect.signature(got)} is not {name}{inspect.signature(want)}")
    return out


def test_the_communicator_satisfies_the_runtime_protocol() -> None:
    assert violations(Runtime, Communicator) == []


def test_the_check_fails_on_a_communicator_missing_a_member() -> None:
    class Partial(Communicator):
        def __init__(self) -> None:  # sets nothing
            pass

        def staging(self, nbytes: int) -> None:  # another signature
            pass

    found = violations(Runtime, Partial)
    assert "no attribute sms" in found and "no attribute turn" in found
    assert any(v.startswith("staging(") for v in found)


def test_the_protocol_names_what_the_algorithms_use() -> None:
    """Every ``comm.<name>`` the algorithms and plans read is a protocol member, and every
    member is read somewhere (no more, no less)."""
    from pathlib import Path

    import collectives.algorithms as algorithms

    used = set()
    for path in Path(algorithms.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "comm":
                used.add(node.attr)
    data, calls = members(Runtime)
    assert used == data | set(calls)
