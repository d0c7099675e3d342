"""Run ptxas over many rendered statements at once and report, per statement, its verdict.

ptxas reports every bad line of a module and keeps going, so thousands of forms are checked by
one ptxas call: each statement gets a line, and each error names its line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from .render import FIRST_BODY_LINE, module

_LINE = re.compile(r"line (\d+); (error|fatal|warning)\s*:\s*(.*)")
_CHUNK = 4000


class PtxasUnavailable(RuntimeError):
    """No ptxas on PATH (set PTXAS to its path)."""


def ptxas_path() -> str:
    path = os.environ.get("PTXAS") or shutil.which("ptxas")
    if not path:
        raise PtxasUnavailable("ptxas not found: put CUDA's bin on PATH or set PTXAS")
    return path


def ptxas_version() -> str:
    out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def assemble(statements: Sequence[str], target: str) -> list[str | None]:
    """ptxas's verdict on each statement for ``target``: None if accepted, else its error text.

    Some errors surface only once a module has no others, so the statements that passed are
    assembled again on their own until a module of them assembles cleanly.  Warnings count
    as rejection only when they say a qualifier is ignored.
    """
    verdicts: list[str | None] = [None] * len(statements)
    pending = list(range(len(statements)))
    while pending:
        found = False
        for start in range(0, len(pending), _CHUNK):
            chunk = pending[start : start + _CHUNK]
            for i, verdict in zip(chunk, _assemble_chunk([statements[i] for i in chunk], target)):
                if verdict:
                    verdicts[i] = verdict
                    found = True
        if not found:
            break
        pending = [i for i in pending if verdicts[i] is None]
    return verdicts


def _assemble_chunk(statements: Sequence[str], target: str) -> list[str | None]:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "forms.ptx")
        with open(src, "w") as f:
            f.write(module(statements, target))
        proc = subprocess.run(
            [ptxas_path(), f"-arch={target}", src, "-o", os.path.join(tmp, "forms.cubin")],
            capture_output=True,
            text=True,
        )
    verdicts: list[str | None] = [None] * len(statements)
    seen = False
    for line in proc.stderr.splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        index = int(m.group(1)) - FIRST_BODY_LINE
        kind, text = m.group(2), m.group(3).strip()
        if kind == "warning" and "ignored" not in text.lower():
            continue
        if 0 <= index < len(statements):
            seen = True
            verdicts[index] = verdicts[index] or text
    if proc.returncode != 0 and not seen:
        raise RuntimeError(f"ptxas failed outside any statement for {target}:\n{proc.stderr}")
    return verdicts
