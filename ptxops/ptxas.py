"""Run ptxas over many rendered statements at once and report, per statement, its verdict.

ptxas reports every bad line of a module and keeps going, so thousands of forms are checked by
one ptxas call: each statement gets a line, and each error names its line.

A family introduced by a PTX ISA newer than the system ptxas reads (``multimem.cp.async.bulk``:
9.1) needs a newer assembler: :func:`ptxas_path` with ``version`` picks the first of ``$PTXAS``,
``ptxas`` on PATH, the paths in ``$PTXOPS_PTXAS`` (``os.pathsep``-separated) and the ptxas of an
installed ``nvidia-cuda-nvcc`` wheel that reads that ``.version``.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from .render import FIRST_BODY_LINE, module
from .spec.targets import PTX_VERSION

_LINE = re.compile(r"line (\d+); (error|fatal|warning)\s*:\s*(.*)")
_VERSION = re.compile(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USAGE = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_CHUNK = 4000


class PtxasUnavailable(RuntimeError):
    """No ptxas on PATH (set PTXAS to its path)."""


_CURRENT = re.compile(r"current version is '(\d+)\.(\d+)'")


def candidates() -> list[str]:
    """Every ptxas ptxops may use, in order of preference (see the module docstring)."""
    extra = os.environ.get("PTXOPS_PTXAS", "").split(os.pathsep)
    wheels = [p for d in sys.path for p in sorted(glob.glob(os.path.join(d, "nvidia", "cu*", "bin", "ptxas")))]
    found = [os.environ.get("PTXAS"), shutil.which("ptxas"), *extra, *wheels]
    return list(dict.fromkeys(p for p in found if p and os.access(p, os.X_OK)))


@functools.cache
def isa_version(path: str) -> tuple[int, int]:
    """The newest PTX ISA ``.version`` the ptxas at ``path`` reads (it names it when refusing
    a module of a version it does not know)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "v.ptx")
        with open(src, "w") as f:
            f.write(".version 99.9\n.target sm_90\n.address_size 64\n")
        err = subprocess.run([path, "-arch=sm_90", src, "-o", os.path.join(tmp, "v.cubin")],
                             capture_output=True, text=True).stderr
    m = _CURRENT.search(err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _parse(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


def ptxas_path(version: str = PTX_VERSION) -> str:
    """The first ptxas that reads PTX ISA ``version``; :class:`PtxasUnavailable` naming the
    ones found if none does."""
    found = candidates()
    if not found:
        raise PtxasUnavailable("ptxas not found: put CUDA's bin on PATH or set PTXAS")
    if version == PTX_VERSION:
        return found[0]
    for path in found:
        if isa_version(path) >= _parse(version):
            return path
    have = ", ".join(f"{p} (PTX ISA {'.'.join(map(str, isa_version(p)))})" for p in found)
    raise PtxasUnavailable(
        f"no ptxas reads PTX ISA {version}: found {have}; install a newer one "
        "(pip install --target DIR nvidia-cuda-nvcc) and list it in PTXOPS_PTXAS"
    )


def ptxas_version(version: str = PTX_VERSION) -> str:
    out = subprocess.run([ptxas_path(version), "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def assemble(statements: Sequence[str], target: str, version: str = PTX_VERSION) -> list[str | None]:
    """ptxas's verdict on each statement for ``target``: None if accepted, else its error text.
    The module says ``.version version``, and the assembler is the first that reads it.

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
            verdicts_chunk = _assemble_chunk([statements[i] for i in chunk], target, version)
            for i, verdict in zip(chunk, verdicts_chunk):
                if verdict:
                    verdicts[i] = verdict
                    found = True
        if not found:
            break
        pending = [i for i in pending if verdicts[i] is None]
    return verdicts


def _assemble_chunk(statements: Sequence[str], target: str, version: str) -> list[str | None]:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "forms.ptx")
        with open(src, "w") as f:
            f.write(module(statements, target, version=version))
        proc = subprocess.run(
            [ptxas_path(version), f"-arch={target}", src, "-o", os.path.join(tmp, "forms.cubin")],
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


@dataclass(frozen=True)
class Usage:
    """What ``ptxas -v`` reports for one kernel: registers per thread, stack frame and spill bytes."""

    kernel: str
    registers: int
    stack: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


def resource_usage(ptx: str, target: str) -> list[Usage]:
    """``ptxas -v``'s register and spill report for every entry of a whole PTX module (such as
    one CuTeDSL compiled).  A module whose ``.version`` is newer than this ptxas reads (CuTeDSL
    may bundle a newer compiler) is assembled as the newest version it reads: an instruction
    that version lacks is still an error."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "module.ptx"), os.path.join(tmp, "module.cubin")
        for _ in range(2):
            with open(src, "w") as f:
                f.write(ptx)
            proc = subprocess.run([ptxas_path(), "-v", f"-arch={target}", src, "-o", out],
                                  capture_output=True, text=True)
            newer = _VERSION.search(proc.stderr)
            if proc.returncode == 0 or not newer:
                break
            ptx = re.sub(rf"^\.version {re.escape(newer.group(1))}\b", f".version {newer.group(2)}", ptx,
                         count=1, flags=re.M)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed for {target}:\n{proc.stderr}")
    return parse_usage(proc.stderr)


def parse_usage(report: str) -> list[Usage]:
    """The entries of a ``ptxas -v`` report, in its order."""
    found: list[Usage] = []
    parts = _ENTRY.split(report)
    for name, text in zip(parts[1::2], parts[2::2]):
        regs, spill = _USAGE.search(text), _SPILL.search(text)
        found.append(Usage(name, int(regs.group(1)), int(spill.group(1)), int(spill.group(2)), int(spill.group(3))))
    return found
