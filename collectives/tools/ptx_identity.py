"""The PTX of every collective kernel key, recorded and compared: the guard that a change to the
Python around the kernels (a refactor) leaves what every kernel does unchanged.

``python -m collectives.tools.ptx_identity record [--dir D]`` compiles every key of
:func:`snapshot_keys` for sm_90a and writes the hash of each kernel's normalised PTX (or the
error that refused the key) to :data:`SNAPSHOT`; ``--dir`` also keeps the normalised texts, for
diffing.  ``check [--dir D] [--sample]`` compiles them again and lists every key whose PTX
differs.  ``--only PREFIX`` takes the keys whose id starts with it (``record --only all_to_all``
records a change to one kernel family and keeps every other hash).  Normalised: comments
dropped, the kernel's name and its labels and registers renamed by first use, so that only what
the kernel executes is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ptx_identity.json"
ARCH = "sm_90a"
#: The fields of a key id, in order (``collective/algorithm/backend/dtype/w<world>/<op>/v<vector>/
#: t<threads>/g<gather_out>s<stage_in>e<end_barrier>``; an all-to-all's:
#: ``all_to_all/push/peer/dtype/w<world>/p<parts>/t<threads>/d<direct>``, the one kernel of every
#: backend).
WORLDS = (2, 4, 8)


def key_id(collective: str, algorithm: str, backend: str, dtype: str, world: int, op: str = "sum",
           vector: int = 0, threads: int = 512, gather_out: bool = False, stage_in: bool = False,
           end_barrier: bool = True) -> str:
    return (f"{collective}/{algorithm}/{backend}/{dtype}/w{world}/{op}/v{vector}/t{threads}/"
            f"g{int(gather_out)}s{int(stage_in)}e{int(end_barrier)}")


def all_to_all_id(dtype: str, world: int, direct: bool, parts: int | None = None, threads: int = 256) -> str:
    """The id of an all-to-all key (``parts``: the runtime's for ``world`` by default)."""
    from collectives.algorithms.all_to_all import default_parts

    parts = default_parts(world) if parts is None else parts
    return f"all_to_all/push/peer/{dtype}/w{world}/p{parts}/t{threads}/d{int(direct)}"


def parse_id(kid: str) -> dict:
    if kid.startswith("all_to_all/"):
        _, _, _, dtype, world, parts, threads, direct = kid.split("/")
        return dict(collective="all_to_all", dtype=dtype, world=int(world[1:]), parts=int(parts[1:]),
                    threads=int(threads[1:]), direct=direct == "d1")
    collective, algorithm, backend, dtype, world, op, vector, threads, flags = kid.split("/")
    return dict(collective=collective, algorithm=algorithm, backend=backend, dtype=dtype, world=int(world[1:]),
                op=op, vector=int(vector[1:]), threads=int(threads[1:]), gather_out=flags[1] == "1",
                stage_in=flags[3] == "1", end_barrier=flags[5] == "1")


def make_key(kid: str):
    """The kernel key a key id names (raises ValueError where the key is refused)."""
    from collectives.algorithms import KernelKey
    from collectives.algorithms.all_to_all import AllToAllKey

    f = parse_id(kid)
    if f["collective"] == "all_to_all":
        return AllToAllKey(f["dtype"], f["world"], parts=f["parts"], threads=f["threads"], direct=f["direct"])
    return KernelKey(f["collective"], f["algorithm"], f["backend"], f["dtype"], f["world"], op=f["op"],
                     vector=f["vector"], threads=f["threads"], gather_out=f["gather_out"],
                     stage_in=f["stage_in"], end_barrier=f["end_barrier"])


def snapshot_keys() -> list[str]:
    """Every key ``python -m collectives ptx`` builds (collective x algorithm x backend x dtype x
    world 2/4/8, sum, aligned), at world 4 every variant the API builds (staging, gather,
    end barrier, unaligned, min/max, the Lamport's 256 threads) for bf16, f32 and e4m3, and the
    all-to-all's kernels (dtype x world x staged or direct, as the runtime launches them)."""
    from collectives.algorithms import ALGORITHMS
    from collectives.config import BACKENDS
    from collectives.dtypes import DTYPES

    ids: list[str] = []
    for collective, algorithms in ALGORITHMS.items():
        for algorithm, backend in itertools.product(algorithms, BACKENDS):
            threads = 32 if collective == "barrier" else 512
            for dtype, world in itertools.product(("bf16",) if collective == "barrier" else DTYPES, WORLDS):
                ids.append(key_id(collective, algorithm, backend, dtype, world, threads=threads,
                                  stage_in=algorithm == "push"))
            if collective == "barrier":
                continue
            variants = itertools.chain(
                itertools.product(("bf16", "f32"), ("sum",), (0, 1), (False, True), (False, True), (False, True),
                                  (512, 256) if algorithm == "lamport" else (512,)),
                itertools.product(("bf16", "f32", "e4m3"), ("min", "max"), (0, 1), (False,),
                                  (algorithm == "push",), (True,), (512,)))
            for dtype, op, vector, g, s, e, t in variants:
                kid = key_id(collective, algorithm, backend, dtype, 4, op, vector, t, g, s, e)
                if kid not in ids and _legal(kid):
                    ids.append(kid)
    ids += [all_to_all_id(dtype, world, direct) for dtype, world, direct in
            itertools.product(DTYPES, WORLDS, (False, True))]
    return ids


def _legal(kid: str) -> bool:
    try:
        make_key(kid)
    except ValueError:
        return False
    return True


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
    """A few keys covering every (collective, algorithm, backend) and every variant flag: what CI
    compiles (the whole set takes a quarter of an hour on two cores)."""
    chosen: dict[tuple, str] = {}
    for kid in ids:
        f = parse_id(kid)
        if f["collective"] == "all_to_all":
            for facet in (("all_to_all", f["dtype"]), ("all_to_all", f["world"], f["direct"])):
                chosen.setdefault(facet, kid)
            continue
        for facet in ((f["collective"], f["algorithm"], f["backend"]),
                      (f["collective"], f["algorithm"], f["gather_out"], f["stage_in"], f["end_barrier"], f["vector"],
                       f["threads"]),
                      (f["world"], f["algorithm"]), (f["dtype"], f["op"], f["collective"])):
            chosen.setdefault(facet, kid)
    return sorted(set(chosen.values()), key=ids.index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.ptx_identity", description=__doc__)
    parser.add_argument("command", choices=("record", "check", "list"))
    parser.add_argument("--dir", type=Path, help="keep (record) or write (check) the normalised PTX texts here")
    parser.add_argument("--sample", action="store_true", help="only the keys CI checks")
    parser.add_argument("--only", metavar="PREFIX", help="only the keys whose id starts with PREFIX (record: the "
                                                         "others keep their recorded hashes)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    ids = snapshot_keys()
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
        if args.only:  # the other keys as recorded
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
