"""The PTX of every kernel key, recorded and compared: the guard that a change to the Python
around the kernels (a refactor) leaves what every kernel does unchanged.

``python -m collectives.tools.ptx_identity record [--dir D]`` compiles every key of
:func:`snapshot_keys` (every kernel family's, :data:`collectives.algorithms.FAMILIES`) for sm_90a and writes the hash of each kernel's normalised PTX (or the
error that refused the key) to :data:`SNAPSHOT`; ``--dir`` also keeps the normalised texts, for
diffing.  ``check [--dir D] [--sample]`` compiles them again and lists every key whose PTX
differs.  ``--family NAME`` takes one family's keys, ``--only PREFIX`` the keys whose id starts
with it (``record --family all_to_all`` records a change to one kernel family and keeps every
other hash).  Normalised: comments
dropped, the kernel's name and its labels and registers renamed by first use, so that only what
the kernel executes is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ptx_identity.json"
ARCH = "sm_90a"


def families() -> dict:
    """Every kernel family (:data:`collectives.algorithms.FAMILIES`), by name."""
    from collectives.algorithms import FAMILIES

    return FAMILIES


def make_key(kid: str):
    """The kernel key a key id names (raises ValueError where the key is refused)."""
    from collectives.algorithms import key_of

    return key_of(kid)


def snapshot_keys(family: str | None = None) -> list[str]:
    """The ids of every family's snapshot keys (:attr:`collectives.algorithms.Family.snapshot`),
    in registration order (``family``: that family's alone)."""
    return [kid for name, f in families().items() if family in (None, name) for kid in f.snapshot()]


def gaps(recorded: dict[str, str], ids: list[str]) -> list[str]:
    """What a gate compiling ``ids`` against ``recorded`` would miss: every id of ``ids`` that
    ``recorded`` lacks, and every registered family with no key in ``ids`` or none in the CI
    :func:`sample` of them."""
    from collectives.algorithms import family_of_id

    missing = [kid for kid in ids if kid not in recorded]
    for what, keys in (("keys", ids), ("sampled keys", sample(ids))):
        named = {family_of_id(kid).name for kid in keys}
        missing += [f"family {name}: no {what}" for name in families() if name not in named]
    return missing


_REGISTER = re.compile(r"%(p|rs|rd|r|f|fd|h|hh|b|SP|SPL)(\d+)\b")
_LABEL = re.compile(r"\$L__[A-Za-z0-9_]+")


def normalize(ptx: str) -> str:
    """``ptx`` without comments, its entry's name as ``KERNEL``, labels and registers renumbered
    by first use (each register class apart)."""
    lines = [line.rstrip() for line in ptx.splitlines() if line.strip() and not line.lstrip().startswith("//")]
    text = "\n".join(lines)
    for name in re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)", text):
        text = re.sub(rf"\b{re.escape(name)}", "KERNEL", text)
    numbers: dict[tuple[str, str], int] = {}

    def register(m: re.Match) -> str:
        k = (m.group(1), m.group(2))
        if k not in numbers:
            numbers[k] = sum(1 for c, _ in numbers if c == m.group(1))
        return f"%{m.group(1)}{numbers[k]}"

    labels: dict[str, int] = {}
    text = _LABEL.sub(lambda m: f"$L{labels.setdefault(m.group(0), len(labels))}", text)
    return _REGISTER.sub(register, text) + "\n"


def compile_one(kid: str) -> tuple[str, str, str]:
    """(id, hash of the normalised PTX or ``refused: <error type>``, the normalised text)."""
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    from collectives.runtime.kernels import kernel_ptx

    try:
        key = make_key(kid)
    except ValueError:
        return kid, "refused: ValueError", ""
    try:
        text = normalize(kernel_ptx(key, ARCH))
    except Exception as e:  # noqa: BLE001 (a refusal at trace time, QualifierError or other, is part of the record)
        return kid, f"refused: {type(e).__name__}", ""
    return kid, hashlib.sha256(text.encode()).hexdigest()[:24], text


def compile_all(ids: list[str], jobs: int, keep: Path | None) -> dict[str, str]:
    results: dict[str, str] = {}
    with ProcessPoolExecutor(jobs) as pool:
        for i, (kid, digest, text) in enumerate(pool.map(compile_one, ids, chunksize=4)):
            results[kid] = digest
            if keep is not None and text:
                (keep / (kid.replace("/", "__") + ".ptx")).write_text(text)
            if i % 50 == 0:
                print(f"{i}/{len(ids)}", file=sys.stderr, flush=True)
    return results


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {"nvidia-cutlass-dsl": version("nvidia-cutlass-dsl"), "arch": ARCH}


def sample(ids: list[str]) -> list[str]:
    """Few keys that together show every facet of their families
    (:attr:`collectives.algorithms.Family.facets`: every collective x algorithm x backend and
    variant flag, ...), in ``ids``' order: what CI compiles (the whole set takes a quarter of an
    hour on two cores).  A greedy cover: each next key the one with the most facets not yet
    shown, the first in ``ids`` among equals (about 100 keys of 1,096 where the first key of
    each facet took 161)."""
    from collectives.algorithms import family_of_id

    families = {kid: family_of_id(kid) for kid in ids}
    facets = {kid: {(family.name, *facet) for facet in family.facets(kid)} for kid, family in families.items()}
    needed = set().union(*facets.values())
    chosen: list[str] = []
    while needed:
        best = max(ids, key=lambda kid: len(facets[kid] & needed))
        chosen.append(best)
        needed -= facets[best]
    return sorted(chosen, key=ids.index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.ptx_identity", description=__doc__)
    parser.add_argument("command", choices=("record", "check", "list"))
    parser.add_argument("--dir", type=Path, help="keep (record) or write (check) the normalised PTX texts here")
    parser.add_argument("--sample", action="store_true", help="only the keys CI checks")
    parser.add_argument("--only", metavar="PREFIX", help="only the keys whose id starts with PREFIX (record: the "
                                                         "others keep their recorded hashes)")
    parser.add_argument("--family", choices=tuple(families()), help="only this kernel family's keys (record: the "
                                                                    "others keep their recorded hashes)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    ids = snapshot_keys(args.family)
    if args.sample:
        ids = sample(ids)
    if args.only:
        ids = [k for k in ids if k.startswith(args.only)]
    if args.command == "list":
        print("\n".join(ids))
        return 0
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    results = compile_all(ids, args.jobs, args.dir)
    if args.command == "record":
        if args.only or args.family:  # the other keys as recorded
            results = {**json.loads(SNAPSHOT.read_text())["kernels"], **results}
        SNAPSHOT.write_text(json.dumps({"versions": versions(), "kernels": results}, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(results)} keys ({sum(not v.startswith('refused') for v in results.values())} "
              f"compiled) to {SNAPSHOT}")
        return 0
    recorded = json.loads(SNAPSHOT.read_text())["kernels"]
    differ = [k for k in ids if recorded.get(k) != results[k]]
    for k in differ:
        print(f"differs: {k}: recorded {recorded.get(k)}, now {results[k]}")
    print(f"{len(ids) - len(differ)} of {len(ids)} keys identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
