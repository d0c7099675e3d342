"""Run ptxas over many rendered statements at once and report, per statement, its verdict.

ptxas reports every bad line of a module and keeps going, so thousands of forms are checked by
one ptxas call: each statement gets a line, and each error names its line.

Which ptxas (:func:`candidates`, in this order): the one of an installed ``nvidia-cuda-nvcc``
wheel (the ``ptxas`` extra, ``pip install 'ptxops[ptxas]'``, found through the wheel's own file
list), then each entry of ``$PTXOPS_PTXAS`` (``os.pathsep``-separated; a ptxas, or a folder
holding one as ``ptxas``, ``bin/ptxas`` or ``nvidia/*/bin/ptxas``, such as a
``pip install --target`` folder), then ``ptxas`` on PATH.  Each PTX ISA version is assembled
by the oldest of them that reads it (:func:`ptxas_path`): a CUDA 13.0 ptxas for the 9.0
families where one is found, a newer one (the extra's) for ``multimem.cp.async.bulk`` (9.1).
Where releases differ on a form, the spec records each one's verdict
(:data:`ptxops.spec.targets.PTXAS_RELEASES`, :func:`release`).
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
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
#: Statements per ptxas module: ptxas's time grows faster than the count of statements that
#: assemble (20,000 legal forms: ~14 s in modules of 4000, ~9 s in modules of 1000, ~5 s at
#: ``-O0``), while a module of rejected forms costs little whatever its size.
_CHUNK = 1000


class PtxasUnavailable(RuntimeError):
    """No ptxas (or none that reads the PTX ISA version asked for); the message says what was
    found and how to install one."""


#: How to get an assembler that reads every PTX ISA version the spec uses.
INSTALL = "pip install 'ptxops[ptxas]' (NVIDIA's nvidia-cuda-nvcc wheel)"
#: Where a ``$PTXOPS_PTXAS`` folder may hold its ptxas (a ``pip install --target`` folder of
#: nvidia-cuda-nvcc holds it as ``nvidia/cu13/bin/ptxas``).
FOLDER_LAYOUTS = ("ptxas", os.path.join("bin", "ptxas"), os.path.join("nvidia", "*", "bin", "ptxas"))

_CURRENT = re.compile(r"current version is '(\d+)\.(\d+)'")
_RELEASE = re.compile(r"release (\d+\.\d+)")


#: The distributions of NVIDIA's CUDA compiler wheels (CUDA 13, 12, 11), which hold a ptxas.
NVCC_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu11")


def wheel_ptxas() -> list[str]:
    """The ptxas of each installed :data:`NVCC_WHEELS` distribution, from its file list."""
    return list(_wheel_ptxas(tuple(sys.path)))


@functools.cache
def _wheel_ptxas(path: tuple[str, ...]) -> tuple[str, ...]:
    found = []
    for name in NVCC_WHEELS:
        for dist in importlib.metadata.distributions(name=name, path=list(path)):
            found += [str(dist.locate_file(f)) for f in dist.files or () if f.name == "ptxas" and f.parent.name == "bin"]
    return tuple(dict.fromkeys(found))


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def env_ptxas() -> list[str]:
    """The assemblers ``$PTXOPS_PTXAS`` names: each entry a ptxas or a folder holding one
    (:data:`FOLDER_LAYOUTS`).  An entry that names neither raises :class:`PtxasUnavailable`."""
    found = []
    for entry in filter(None, os.environ.get("PTXOPS_PTXAS", "").split(os.pathsep)):
        if os.path.isdir(entry):
            inside = [p for layout in FOLDER_LAYOUTS for p in sorted(glob.glob(os.path.join(entry, layout)))]
            inside = [p for p in inside if _executable(p)]
            if not inside:
                looked = ", ".join(os.path.join(entry, layout) for layout in FOLDER_LAYOUTS)
                raise PtxasUnavailable(f"PTXOPS_PTXAS names the folder {entry}, which holds no ptxas (looked at {looked})")
            found += inside
        elif _executable(entry):
            found.append(entry)
        else:
            raise PtxasUnavailable(f"PTXOPS_PTXAS names {entry}, which is neither an executable ptxas nor a folder")
    return found


def candidates() -> list[str]:
    """Every ptxas ptxops may use, in order of preference (see the module docstring)."""
    found = [*wheel_ptxas(), *env_ptxas(), shutil.which("ptxas")]
    return list(dict.fromkeys(p for p in found if p))


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


@functools.cache
def release(path: str) -> str:
    """The CUDA release of the ptxas at ``path`` (``"13.0"``), from ``ptxas --version``; the
    spec records the verdicts of :data:`~ptxops.spec.targets.PTXAS_RELEASES`."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    m = _RELEASE.search(out)
    return m.group(1) if m else "unknown"


def _parse(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


def ptxas_path(version: str = PTX_VERSION) -> str:
    """The ptxas for PTX ISA ``version``: of the candidates that read it, the oldest (the one
    reading the fewest newer versions; the first in :func:`candidates` order among equals).  What
    the spec records of ptxas (the rules it enforces, the forms it crashes on) was seen with the
    assembler of each version's own CUDA release, and newer ones differ (ptxas 13.5 rejects
    ``ld.param::func`` and stops with an internal error on ``st.async`` forms that 13.0
    assembles: the rules record each release's verdict, ``ptxops.spec.engine.PtxasRecord``).
    :class:`PtxasUnavailable` naming the ones found if none reads it."""
    found = candidates()
    if not found:
        raise PtxasUnavailable(
            f"ptxas not found (no nvidia-cuda-nvcc wheel, PTXOPS_PTXAS unset, none on PATH): {INSTALL}"
        )
    reading = [p for p in found if isa_version(p) >= _parse(version)]
    if reading:
        return min(reading, key=isa_version)
    have = ", ".join(f"{p} (PTX ISA {'.'.join(map(str, isa_version(p)))})" for p in found)
    raise PtxasUnavailable(
        f"no ptxas reads PTX ISA {version}: found {have}; {INSTALL}, or name a newer one "
        "(or its folder) in PTXOPS_PTXAS"
    )


def ptxas_version(version: str = PTX_VERSION) -> str:
    out = subprocess.run([ptxas_path(version), "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def assemble(statements: Sequence[str], target: str, version: str = PTX_VERSION) -> list[str | None]:
    """ptxas's verdict on each statement for ``target``: None if accepted, else its error text.
    The module says ``.version version``, and the assembler is the first that reads it.

    Some errors surface only once a module has no others, so the statements that passed are
    assembled again on their own until a module of them assembles cleanly.  Warnings count
    as rejection only when they say a qualifier is ignored.  ptxas runs at ``-O0``: a verdict
    is its front end's (the parse and the ISA's checks), and the optimiser's time is all that
    skips (the oracle's verdicts and recorded crashes are the same, ptxas 13.0 and 13.5).
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
            [ptxas_path(version), "-O0", f"-arch={target}", src, "-o", os.path.join(tmp, "forms.cubin")],
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
