"""Dependencies go one way: ptxops never imports collectives, and no module of either package
imports (at top level or inside a function) a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ptxops", "collectives")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports anywhere in its body (absolute names)."""
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
    return {m for m in found if m.split(".")[0] in PACKAGES}


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

