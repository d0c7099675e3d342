"""Dependencies go one way: ptxops never imports collectives, no module of either package
imports (at top level or inside a function) a module that imports it back, and the wings of
collectives keep their contracts: the device blocks import no torch and nothing above them, the
algorithms no host-runtime module (they reach the runtime through
:class:`collectives.algorithms.protocol.Runtime`), symmetric memory nothing of the collectives."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ptxops", "collectives")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """The modules of ``packages`` that ``path`` imports anywhere in its body (absolute names)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in packages}


def graph() -> dict[str, set[str]]:
    modules = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}


def test_ptxops_does_not_import_collectives() -> None:
    upward = {m: sorted(i for i in deps if i.startswith("collectives")) for m, deps in graph().items()
              if m.startswith("ptxops")}
    assert {m: deps for m, deps in upward.items() if deps} == {}


def test_no_import_cycles_between_modules() -> None:
    """No module imports one that (directly or through others) imports it back; a package's
    ``__init__`` re-exporting its own submodules is not a cycle."""
    deps = graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo += [d for d in deps.get(m, ()) if not goal.startswith(d + ".")]
        return False

    cycles = sorted((m, d) for m, ds in deps.items() for d in ds
                    if not m.startswith(d + ".") and not d.startswith(m + ".") and reaches(d, m))
    assert cycles == []



#: Each wing of collectives -> the modules outside it that it may import (a name covers its
#: submodules; ptxops is open to all).
WING_ALLOWS = {
    # collectives.layouts: every word host and device share (pad, error records, all-to-all slots, kernel
    # arguments), pure Python like config, which imports nothing of the package
    # collectives.errors: MissingDependency, where CuTeDSL is missing (errors is pure Python, shared by every wing)
    "collectives.config": (),
    "collectives.layouts": ("collectives.config", "collectives.dtypes"),
    "collectives.device": ("collectives.config", "collectives.errors", "collectives.layouts"),
    "collectives.algorithms": ("collectives", "collectives.config", "collectives.dtypes", "collectives.errors",
                               "collectives.layouts", "collectives.device"),
    "collectives.symmetric": ("collectives.errors",),
    "collectives.runtime": ("collectives", "collectives.config", "collectives.dtypes", "collectives.errors",
                            "collectives.layouts", "collectives.device", "collectives.algorithms",
                            "collectives.symmetric"),
}


def _allowed(dep: str, allows: tuple[str, ...]) -> bool:
    return dep.startswith("ptxops") or any(dep == a or (a != "collectives" and dep.startswith(a + ".")) for a in allows)


def wing_violations(deps: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module of a wing -> the modules it imports that its wing does not allow."""
    out = {}
    for wing, allows in WING_ALLOWS.items():
        for m, ds in deps.items():
            if m == wing or m.startswith(wing + "."):
                bad = sorted(d for d in ds if not d.startswith(wing) and not _allowed(d, allows))
                if bad:
                    out[m] = bad
    return out


def test_wings_import_only_what_their_contract_allows() -> None:
    assert wing_violations(graph()) == {}


def test_the_wing_rule_fails_on_an_algorithm_importing_the_runtime() -> None:
    deps = {"collectives.algorithms.base": {"collectives.runtime.communicator", "collectives.config"},
            "collectives.device.signals": {"collectives.algorithms.key"}}
    assert wing_violations(deps) == {"collectives.algorithms.base": ["collectives.runtime.communicator"],
                                     "collectives.device.signals": ["collectives.algorithms.key"]}


def test_device_imports_no_torch() -> None:
    torch_users = {_module(p): sorted(_imports(p, ("torch",))) for p in (ROOT / "collectives" / "device").rglob("*.py")}
    assert {m: t for m, t in torch_users.items() if t} == {}


def test_communicators_and_groups_are_typed() -> None:
    """Issue 47: a communicator is a ``Communicator`` (or the ``Runtime`` protocol), a group a
    ``Group``; never ``Any``, which hides which of them a function takes."""
    untyped = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "collectives").rglob("*.py"))
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if "comm: Any" in line or "group: Any" in line]
    assert not untyped, untyped
