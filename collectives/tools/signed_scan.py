"""Signed arithmetic on synchronisation words, found in the PTX of every kernel key.

Call counts, epochs, tags and flag counters are unsigned 32-bit (or ``tag << 32 | count``
64-bit) words that run past 2^31 (2^63): an arithmetic shift (``shr.s``), a signed division or
remainder (``div.s``, ``rem.s``), a sign extension (``cvt.s64.s32``, ``mul.wide.s32``) or a
signed ordering (``setp.{lt,le,gt,ge}.s``, ``min.s``, ``max.s``) of such a word gives another
answer once its top bit is set (the Lamport tag bug: ``shr.s64`` of the loaded size entry).
Differences (``sub``, or ``add`` of a ``not``) are the wrap-safe way to order epochs and are
signed by design, so a value stops being a word where it is subtracted; a mask below the top
bit (``and`` with a small constant: a parity) or a logical right shift by a constant ends it too.

The scan is a taint analysis of one PTX text: the destinations of scalar integer loads and
atomics (``ld``/``atom`` without ``.v2``/``.v4``, ``ld.param`` aside) are words; a value computed
from a word by a bit-preserving operation (``mov``, ``and``, ``or``, ``xor``, ``shl``,
``shr.u``/``shr.b``, ``add``, ``cvt`` and ``selp``) is one too; every signed operation above with a
word among its sources is a finding.  Registers are followed by name, through loops.

``python -m collectives.tools.signed_scan [--sample] [--jobs N]`` compiles the keys of
:func:`collectives.tools.ptx_identity.snapshot_keys` (every kernel family's, or its CI sample)
for sm_90a and prints each finding; exit status 1 if there is one.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

_REG = re.compile(r"%[a-z]+\d+")
_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s+(.*?);?\s*$")
#: Operations that carry a word's bits into their destination.
PRESERVE = re.compile(r"^(mov|and|or|xor|shl|shr\.[ub]|add|cvt|selp|prmt)\b")
#: Signed operations that change meaning when a word's top bit is set.
SIGNED = re.compile(r"^(shr\.s|div\.s|rem\.s|cvt\.s64\.s32|mul\.wide\.s|min\.s|max\.s|setp\.(lt|le|gt|ge)\.s)")
_SOURCE = re.compile(r"^(ld|atom)\.")
#: A 64-bit word is loaded with a memory order (a plain 64-bit load is an address-table entry).
_ORDERED = re.compile(r"\.(relaxed|acquire|volatile|acq_rel)\.|^atom\.")


@dataclass(frozen=True)
class Finding:
    """A signed operation (``line`` of the PTX, 1-based) on a word loaded at ``origin``."""

    line: int
    text: str
    origin: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.text.strip()}  (word from: {self.origin.strip()})"


def _parse(ptx: str) -> list[tuple[int, str, str, list[str], list[str]]]:
    """(line, text, opcode, destination registers, source registers) of every instruction."""
    out = []
    for number, text in enumerate(ptx.splitlines(), 1):
        m = _INSTRUCTION.match(text)
        if not m or text.lstrip().startswith(("//", ".", "$", "{", "}")):
            continue
        opcode, operands = m.groups()
        if opcode.startswith("st.") or opcode.startswith(("red.", "bra", "ret", "bar", "fence", "multimem.st")):
            dests, sources = [], _REG.findall(operands)
        elif operands.startswith("{"):  # a vector destination
            inner, _, rest = operands.partition("}")
            dests, sources = _REG.findall(inner), _REG.findall(rest)
        else:
            first, _, rest = operands.partition(",")
            dests, sources = _REG.findall(first), _REG.findall(rest)
        out.append((number, text, opcode, dests, sources))
    return out


_IMMEDIATE = re.compile(r",\s*(-?(?:0[xX][0-9a-fA-F]+|\d+))\s*;?\s*$")


def _clears_top_bit(opcode: str, text: str) -> bool:
    """Whether the operation leaves its destination's top bit clear whatever the word: ``and``
    with a non-negative mask below the top bit (a parity, a slot index) or a logical right
    shift by a constant of at least 1 (a tag taken out of ``tag << 32 | count``)."""
    m, width = _IMMEDIATE.search(text), re.search(r"(\d+)$", opcode)
    if m is None or width is None:
        return False
    value = int(m.group(1), 0)
    if opcode.startswith("and."):
        return 0 <= value < 1 << (int(width.group(1)) - 1)
    return opcode.startswith(("shr.u", "shr.b")) and value >= 1


def scan(ptx: str) -> list[Finding]:
    """Every signed operation of ``ptx`` on a synchronisation word (the module docstring)."""
    instructions = _parse(ptx)
    origin: dict[str, str] = {}
    for _, text, opcode, dests, _ in instructions:
        vector = re.search(r"\.v[248]\.", opcode)
        word = re.search(r"\.[bus]32$", opcode) or (re.search(r"\.[bus]64$", opcode) and _ORDERED.search(opcode))
        if _SOURCE.match(opcode) and not opcode.startswith("ld.param") and not vector and word:
            for d in dests:
                origin.setdefault(d, text)
    # ``add d, not(a), b`` is ``b - a - 1``: the compiler's form of a difference, and an ``add``
    # to a difference is one
    negated = {d for _, _, opcode, dests, _ in instructions if opcode.startswith(("not.", "sub.")) for d in dests}
    grown = True
    while grown:
        before = len(negated)
        negated |= {d for _, _, opcode, dests, sources in instructions
                    if opcode.startswith("add.") and any(s in negated for s in sources) for d in dests}
        grown = len(negated) > before
    changed = True
    while changed:  # to a fixed point: registers reassigned in loops carry words around
        changed = False
        for _, text, opcode, dests, sources in instructions:
            difference = opcode.startswith("add.") and any(s in negated for s in sources)
            if not PRESERVE.match(opcode) or difference or _clears_top_bit(opcode, text):
                continue
            carried = next((origin[s] for s in sources if s in origin), None)
            for d in dests:
                if carried is not None and d not in origin and not d.startswith("%p"):
                    origin[d] = carried
                    changed = True
    return [Finding(number, text, next(origin[s] for s in sources if s in origin))
            for number, text, opcode, _, sources in instructions
            if SIGNED.match(opcode) and any(s in origin for s in sources)]


def scan_key(kid: str) -> tuple[str, list[str]]:
    """(key id, findings as text) for a key id of :mod:`collectives.tools.ptx_identity`; a
    refused key has none."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from collectives.runtime.kernels import kernel_ptx
    from collectives.tools.ptx_identity import make_key

    try:
        key = make_key(kid)
        ptx = kernel_ptx(key, "sm_90a")
    except Exception:  # noqa: BLE001 (a refused key compiles nothing to scan)
        return kid, []
    return kid, [str(f) for f in scan(ptx)]


def scanned(sample: bool) -> list[str]:
    """The key ids the scan compiles: every family's snapshot keys, or their CI sample and
    every Lamport key at world 4."""
    from collectives.tools import ptx_identity

    ids = ptx_identity.snapshot_keys()
    if sample:
        ids = sorted(set(ptx_identity.sample(ids)) | {k for k in ids if "/lamport/" in k and "/w4/" in k}, key=ids.index)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.signed_scan", description=__doc__)
    parser.add_argument("--sample", action="store_true", help="only the CI sample of ptx_identity, and every Lamport key")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    ids = scanned(args.sample)
    found = 0
    with ProcessPoolExecutor(args.jobs) as pool:
        for kid, findings in pool.map(scan_key, ids):
            for f in findings:
                print(f"{kid}: {f}")
            found += len(findings)
    print(f"{len(ids)} keys scanned, {found} signed operations on words")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
