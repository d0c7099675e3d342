"""The fenced code blocks of the documentation's pages (``docs/*.md`` and the README), as
``tests/meta/test_docs.py`` checks them and :mod:`tests.support.doc_programs` runs their GPU
programs: a block marked ``<!-- gpu -->`` needs GPUs and is a whole program whose first line says
how to launch it (:data:`LAUNCH`); a CPU block headed ``# NAME.py`` is a file such a program
imports (:data:`MODULE`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [*sorted(p for p in DOCS.glob("*.md")), README]
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")
GPU_MARKER = "<!-- gpu -->"


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    gpu: bool

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (MyST directives such as ``{toctree}`` are
    not code)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        lang = info.split()[0] if info else ""
        found.append(Block(page, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n", prev == GPU_MARKER))
        i = end + 1
    return found


def python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang in ("python", "py", "python3")]


#: A GPU block's first line: how to launch it, as ``# NAME.py: torchrun [--option value ...] NAME.py`` (one
#: process per GPU, ``--nproc-per-node`` among the options) or ``# NAME.py: python NAME.py`` (one process).
LAUNCH = re.compile(r"# (?P<name>\w+\.py): (?:torchrun(?= .*--nproc-per-node \d+ )(?: --[\w-]+ \S+)+|python) (?P=name)$")
#: A CPU block's first line when it is a file of its own that a GPU program imports: ``# NAME.py``,
#: optionally followed by a note in parentheses.
MODULE = re.compile(r"# (?P<module>\w+)\.py(?: \(.*\))?$")


def page_modules(page: Path) -> dict[str, Block]:
    """The CPU blocks of ``page`` that are files of their own, by module name."""
    if not page.exists():
        return {}
    return {m["module"]: b for b in python_blocks(page) if not b.gpu
            and (m := MODULE.match(b.code.splitlines()[0] if b.code.strip() else ""))}
