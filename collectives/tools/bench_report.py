"""docs/benchmarks.md's figures, rendered from the benches' JSON files ("where we lose" first).

    python -m collectives.tools.bench_report docs/data --device 4xH200              # Markdown on stdout
    python -m collectives.tools.bench_report docs/data --device 4xH200 --write docs/benchmarks.md

Reads ``DIR/<bench>-<device>.json`` for every bench of :data:`BENCHES` that is there (written
by ``collectives/tools/bench_all.sh``, or each bench's ``--out``;
:class:`collectives.tools.records.Recorder`) and renders one section: the machine, "Where we
lose" (every row where a baseline column beats ours, worst first, derived from the records:
nothing is written by hand), the columns a run skipped with their reasons, then the tables,
and the GEMM overlap's timeline of one call (``collectives.tools.overlap_timeline``).
``--write FILE`` puts the section between ``<!-- bench_report DEVICE -->`` and ``<!--
/bench_report DEVICE -->`` in FILE (replacing what was there; where the markers are absent,
after the other machines' sections, else before the file's first ``##`` heading), so the prose
around it stays.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict

from .bench import _size, auto_pick, markdown, skipped_lines, strongest_nccl

#: The benches whose JSON a section renders, in its order (file name prefixes).
BENCHES = ("bench", "gemm-overlap", "moe", "moe-symm-mem", "overlap-timeline")
#: Published figures of other MoE all-to-all implementations (from issue 51), shown beside ours:
#: (system, hardware, part, tokens per rank, us).
LEADERS = (
    ("pplx-kernels (fp8 dispatch)", "8 x H100", "dispatch", 1, 41.6),
    ("pplx-kernels", "8 x H100", "combine", 1, 41.7),
    ("pplx-kernels (fp8 dispatch)", "8 x H100", "dispatch", 128, 83.6),
    ("pplx-kernels", "8 x H100", "combine", 128, 102.3),
    ("DeepEP low latency, NVLink", "8 x H20", "dispatch", 128, 37.0),
    ("DeepEP low latency, NVLink", "8 x H20", "combine", 128, 59.0),
)


def load(directory: str, device: str) -> dict[str, dict]:
    """Bench name -> its run (the JSON of ``DIR/<bench>-<device>.json``), for those present."""
    runs = {}
    for bench in BENCHES:
        path = os.path.join(directory, f"{bench}-{device}.json")
        if os.path.exists(path):
            with open(path) as f:
                runs[bench] = json.load(f)
    return runs


def _group(results: list[dict], keys: tuple[str, ...]) -> dict[tuple, dict[str, float]]:
    """Records grouped by ``keys`` (a row): row -> implementation -> us."""
    rows: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in results:
        rows[tuple(r[k] for k in keys)][r["impl"]] = r["us"]
    return rows


def _loss(what: str, ours: str, us: float, theirs: str, them: float) -> tuple[float, str]:
    return us / them, f"{what}: {ours} {us:.1f} us, {theirs} {them:.1f} us (**{us / them:.2f}x** its time)"


def _method(bench: dict | None) -> str:
    """How the figures were taken: best of 3, and where the collectives' run has interleaved eager
    rows (records with ``us_min``: :func:`collectives.tools.bench.time_row`), those the median."""
    if bench and any("us_min" in r for r in bench["results"]):
        return ("the collectives' eager rows the median of interleaved bursts (collectives.tools.bench.time_row), "
                "the rest best of 3")
    return "best of 3"


def collective_losses(run: dict) -> list[tuple[float, str]]:
    """(ours / theirs, line) of every collective row where the fastest NCCL column beats our
    ``auto`` (symmetric or plain), or torch symm_mem beats our symmetric ``auto``, and of the
    barrier where torch's beats ours."""
    found = []
    for (collective, dtype, mode, nbytes), us in _group(run["results"], ("collective", "dtype", "mode", "bytes")).items():
        what = f"{collective}, {dtype}, {mode}, {_size(nbytes)}" if nbytes else f"{collective}, {mode}"
        if collective == "barrier":
            if "ours" in us and "torch_symm_mem" in us and us["ours"] > us["torch_symm_mem"]:
                found.append(_loss(what, "ours", us["ours"], "torch symm_mem", us["torch_symm_mem"]))
            continue
        nccl = strongest_nccl(us)
        for auto, label in (("ours_auto", "ours (auto, symmetric)"), ("ours_auto_plain", "ours (auto, plain)")):
            if auto in us and nccl and us[auto] > nccl[1]:
                found.append(_loss(what, label, us[auto], nccl[0].replace("_", " "), nccl[1]))
        for torch_impl in sorted(i for i in us if i.startswith("torch_")):
            if "ours_auto" in us and us["ours_auto"] > us[torch_impl]:
                found.append(_loss(what, "ours (auto, symmetric)", us["ours_auto"], torch_impl.replace("_", " "),
                                   us[torch_impl]))
    return found


#: How much slower than our fastest algorithm the one ``auto`` picks may be in a graph row (best
#: of 3, no spread recorded) before :func:`auto_misses` names the row: about twice the spread of
#: one column's graph rows from run to run (three 2 x H200 runs of the same kernels: 16.16-16.38
#: and 16.31-17.0 us for the plain reduce-scatter's one-shot and push at 4 MB).
AUTO_SLACK = 1.06


def _auto_rows(run: dict) -> list[tuple]:
    """Per collective row and placement timed with the pick: (collective, dtype, mode, bytes,
    placement, pick, our fastest algorithm, the pick's us, the fastest's us, missed) (see
    :func:`auto_misses`)."""
    from ..algorithms import ALGORITHMS

    records: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in run["results"]:
        records[(r["collective"], r["dtype"], r["mode"], r["bytes"])][r["impl"]] = r
    rows = []
    for (collective, dtype, mode, nbytes), row in records.items():
        for symmetric, placement in ((True, ""), (False, "_plain")):
            pick = auto_pick(collective, run["world"], nbytes, symmetric)
            timed = {a: row[f"ours_{a}{placement}"] for a in ALGORITHMS.get(collective, ())
                     if f"ours_{a}{placement}" in row}
            if pick not in timed:
                continue
            best = min(timed, key=lambda a: timed[a]["us"])
            mine, fastest = timed[pick], timed[best]
            missed = mine["us"] > AUTO_SLACK * fastest["us"]
            if "us_min" in mine and "us_max" in fastest:  # (eager rows of interleaved bursts)
                missed = missed and mine["us_min"] > fastest["us_max"]
            rows.append((collective, dtype, mode, nbytes, "symmetric" if symmetric else "plain", pick, best,
                         mine["us"], fastest["us"], missed))
    return rows


def auto_misses(run: dict) -> list[tuple[float, str]]:
    """(pick / fastest, line) of every collective row where the algorithm ``auto`` picks now
    (:func:`~collectives.tools.bench.auto_pick`, for the run's world; symmetric and plain tensors apart) was not our
    fastest algorithm in that run: more than :data:`AUTO_SLACK` slower, and in an eager row of
    interleaved bursts (``us_min`` and ``us_max`` recorded) with the bursts apart besides (the
    pick's fastest burst slower than the other's slowest: eager rows at one size spread by up to
    2x on a busy host).  The pick's own column (``ours_<algorithm>``) is compared, not
    ``ours_auto``'s, so that the tuning is judged and not that column's noise; variants (other
    knobs than the defaults) and rows whose pick was not timed are left out.  A row missed in
    every mode timed is marked so (:func:`decisive_misses`)."""
    rows = _auto_rows(run)
    decisive = set(_decisive(rows))
    found = []
    for collective, dtype, mode, nbytes, placement, pick, best, us, them, missed in rows:
        if missed:
            what = f"{collective}, {dtype}, {mode}, {_size(nbytes)}, {placement}"
            ratio, line = _loss(what, f"auto's pick {pick}", us, best, them)
            both = " (in every mode: a clear loss)" if (collective, dtype, nbytes, placement) in decisive else ""
            found.append((ratio, line + both))
    return found


def decisive_misses(run: dict) -> list[tuple[str, str, int, str]]:
    """The rows (collective, dtype, bytes, placement) that ``auto``'s pick missed in every mode
    timed (graphs and eagerly, :func:`auto_misses`): where one run's graph and eager columns
    agree, run-to-run noise (the same column moves by up to 10-15 % between runs of one
    machine: 2 x H200, the 16 MB all-reduce's TMA 57.6 then 67.1 us) does not explain it."""
    return _decisive(_auto_rows(run))


def _decisive(rows: list[tuple]) -> list[tuple[str, str, int, str]]:
    """:func:`decisive_misses` of :func:`_auto_rows`' rows."""
    modes: dict[tuple, list[bool]] = defaultdict(list)
    for collective, dtype, _, nbytes, placement, _, _, _, _, missed in rows:
        modes[(collective, dtype, nbytes, placement)].append(missed)
    return sorted(row for row, missed in modes.items() if all(missed))


def _best_ours(us: dict[tuple[str, int], float]) -> tuple[str, int, float] | None:
    ours = [(impl, chunks, t) for (impl, chunks), t in us.items() if impl.startswith("ours")]
    return min(ours, key=lambda o: o[2]) if ours else None


def gemm_losses(run: dict) -> list[tuple[float, str]]:
    """(ours / theirs, line) of every GEMM-overlap row where a baseline beats our best setting."""
    found = []
    for (op, m, n, mode), us in _gemm_rows(run).items():
        best = _best_ours(us)
        if best is None or mode == "host":  # (host time explains an eager row; no target of its own)
            continue
        impl, chunks, t = best
        alone = _alone(us)
        note = f" (GEMM alone: {alone:.1f} us)" if alone else ""
        for base in ("mm_nccl", "torch_fused"):
            them = next((v for (i, _), v in us.items() if i == base), None)
            if them is not None and t > them:
                found.append(_loss(f"{op}, M = {m}, N = K = {n}, {mode}", f"ours ({impl}, {chunks} chunks)", t,
                                   base.replace("_", " "), them))
                found[-1] = (found[-1][0], found[-1][1] + note)
    return found


def _alone(us: dict[tuple[str, int], float]) -> float | None:
    """The GEMM alone (impl ``gemm``: one GEMM of the whole shape; in older runs, the same
    chunks as ours)."""
    return next((t for (impl, _), t in us.items() if impl == "gemm"), None)


def _gemm_rows(run: dict) -> dict[tuple, dict[tuple[str, int], float]]:
    rows: dict[tuple, dict[tuple[str, int], float]] = defaultdict(dict)
    for r in run["results"]:
        rows[(r["op"], r["M"], r["N"], r["mode"])][(r["impl"], r["chunks"])] = r["us"]
    return rows


def moe_losses(run: dict) -> list[tuple[float, str]]:
    """(ours / theirs, line) of every MoE row where NCCL's or torch's column beats ours (the
    all-to-all's outputs, the fused dispatch and combine), and where the fused fp8 dispatch is
    slower than the fused bf16 one of the same part."""
    found = []
    for (part, dtype, tokens, mode), us in _group(run["results"], ("part", "dtype", "tokens", "mode")).items():
        what = f"{part.replace('_', ' ')}, {dtype}, {tokens} tokens, {mode}"
        ours = ("ours_plain", "ours_symmetric") if part == "all_to_all" else ("ours_fused",)
        for mine in (o for o in ours if o in us):
            for base in (b for b in ("nccl", "torch_symm_mem") if b in us and us[mine] > us[b]):
                found.append(_loss(what, mine.replace("_", " "), us[mine], base.replace("_", " "), us[base]))
    fp8: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in run["results"]:
        if r["part"] == "fp8_dispatch":
            fp8[(r["impl"], r["tokens"], r["mode"])][r["dtype"]] = r["us"]
    for (impl, tokens, mode), us in fp8.items():
        if "fp8" in us and "bf16" in us and us["fp8"] > us["bf16"]:
            found.append(_loss(f"dispatch, {tokens} tokens, {mode}", f"fp8 rows ({impl.replace('_', ' ')})",
                               us["fp8"], "bf16 rows", us["bf16"]))
    return found


def _merged_moe(runs: dict[str, dict]) -> dict | None:
    """The MoE run with the torch symm_mem all-to-all's records (a process of its own) added."""
    if "moe" not in runs:
        return None
    extra = runs.get("moe-symm-mem", {})
    return dict(runs["moe"], results=runs["moe"]["results"] + extra.get("results", []),
                skipped=runs["moe"].get("skipped", []) + extra.get("skipped", []))


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def _cell(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f}"


def gemm_tables(run: dict, level: int) -> list[str]:
    """One table per op: every implementation and chunk count, ours' best over the GEMM alone
    and over the fastest baseline."""
    rows = _gemm_rows(run)
    lines = []
    for op in sorted({key[0] for key in rows}):
        mine = {key: us for key, us in rows.items() if key[0] == op}
        columns = sorted({c for us in mine.values() for c in us}, key=lambda c: (not c[0].startswith("gemm"), c))
        head = ["M", "N = K", "mode"] + [f"{i.replace('_', ' ')}" + (f" ({c} chunks)" if c else "") for i, c in columns]
        head += ["best ours", "best ours / GEMM alone", "best ours / best baseline"]
        body = []
        for (_, m, n, mode), us in sorted(mine.items(), key=lambda kv: (kv[0][3], kv[0][1], kv[0][2])):
            best = _best_ours(us)
            bases = [t for (i, _), t in us.items() if i in ("mm_nccl", "torch_fused")]
            alone = _alone(us) if best else None
            body.append([str(m), str(n), mode] + [_cell(us.get(c)) for c in columns]
                        + ([f"{best[0].replace('_', ' ')}, {best[1]}", f"{best[2] / alone:.2f}" if alone else "-",
                            f"{best[2] / min(bases):.2f}" if bases else "-"] if best else ["-"] * 3))
        lines += [f"{'#' * level} {op.replace('_', ' ')}", ""] + _table(head, body)
    return lines


def moe_tables(run: dict, level: int) -> list[str]:
    """One table per part: a row per mode, tokens and dtype, a column per implementation."""
    lines = []
    for part in dict.fromkeys(r["part"] for r in run["results"]):
        records = [r for r in run["results"] if r["part"] == part]
        impls = list(dict.fromkeys(r["impl"] for r in records))
        rows = _group(records, ("mode", "tokens", "dtype"))
        body = [[mode, str(tokens), dtype] + [_cell(us.get(i)) for i in impls]
                for (mode, tokens, dtype), us in sorted(rows.items())]
        lines += [f"{'#' * level} {part.replace('_', ' ')}", ""]
        lines += _table(["mode", "tokens", "dtype"] + [i.replace("_", " ") for i in impls], body)
    return lines + leader_table(run, level)


def leader_table(run: dict, level: int) -> list[str]:
    """Each published figure (:data:`LEADERS`) beside ours at the same part and tokens per rank:
    the fused layer replayed from a graph, bf16 rows and, for the dispatch, fp8 rows."""
    ours = {(r["part"], r["dtype"], r["tokens"]): r["us"] for r in run["results"]
            if r["impl"] == "ours_fused" and r["mode"] == "graph" and r["part"] in ("dispatch", "combine")}
    fp8 = {r["tokens"]: r["us"] for r in run["results"]
           if (r["part"], r["impl"], r["dtype"], r["mode"]) == ("fp8_dispatch", "ours_fused", "fp8", "graph")}
    body = [[part, str(tokens), f"{name}, {hardware}", f"{us:.1f}", _cell(ours.get((part, "bf16", tokens))),
             _cell(fp8.get(tokens)) if part == "dispatch" else "-", f"{run['world']} x {run['gpu']}"]
            for name, hardware, part, tokens, us in LEADERS]
    return [f"{'#' * level} Published figures beside ours", "",
            "Graphs, hidden 7168, top-8 of 256 experts; theirs as published, on their machines:", ""] + _table(
        ["part", "tokens per rank", "published", "their us", "ours fused, bf16", "ours fused, fp8", "ours on"], body)


def timeline_tables(run: dict[str, list[dict]], level: int) -> list[str]:
    """One table per call of ``collectives.tools.overlap_timeline`` (call name -> its
    intervals): every chunk's GEMM and communication in order of start, and what the call
    spent beyond its GEMMs (the communication left showing)."""
    lines = []
    for call, rows in run.items():
        rows = sorted(rows, key=lambda r: r["start"])
        end = max(r["end"] for r in rows)
        gemms = [r for r in rows if r["kind"] == "gemm"]
        busy = sum(r["end"] - r["start"] for r in gemms)
        lines += [f"{'#' * level} {call}", "",
                  f"{end:.1f} us from the first event to the last; the GEMMs {busy:.1f} us in all; "
                  f"{end - max(r['end'] for r in gemms):.1f} us after the last GEMM ended.", ""]
        lines += _table(["stream", "chunk", "start (us)", "end (us)", "us"],
                        [[r["kind"], "own rows" if r["chunk"] < 0 else str(r["chunk"]), f"{r['start']:.1f}",
                          f"{r['end']:.1f}", f"{r['end'] - r['start']:.1f}"] for r in rows])
    return lines


def render(runs: dict[str, dict], device: str, level: int = 2) -> str:
    """The section of ``device``'s runs (:func:`load`): "where we lose" first, then every table."""
    if not runs:
        raise SystemExit(f"no JSON of {device} found (files {', '.join(f'{b}-{device}.json' for b in BENCHES)})")
    runs = dict(runs)
    timeline = runs.pop("overlap-timeline", None)
    sources = [*runs, *(["overlap-timeline"] if timeline else [])]
    any_run = next(iter(runs.values()), {"world": device.split("x")[0], "gpu": device.split("x", 1)[-1]})
    moe = _merged_moe(runs)
    losses = (collective_losses(runs["bench"]) if "bench" in runs else []) + (
        gemm_losses(runs["gemm-overlap"]) if "gemm-overlap" in runs else []) + (moe_losses(moe) if moe else [])
    h = "#" * level
    lines = [f"{h} {any_run['world']} x {any_run['gpu']} ({device})", "",
             "Generated by `python -m collectives.tools.bench_report` from "
             + ", ".join(f"`docs/data/{b}-{device}.json`" for b in sources)
             + "; microseconds per call, the slowest rank's, " + _method(runs.get("bench")) + ".", "",
             f"{h}# Where we lose ({device})", ""]
    lines += [f"- {line}" for _, line in sorted(losses, key=lambda x: -x[0])] or ["Nowhere: ours is ahead in every row."]
    if "bench" in runs:
        misses = [f"- {line}" for _, line in sorted(auto_misses(runs["bench"]), key=lambda x: -x[0])]
        lines += ["", f"{h}# Where auto is not our fastest ({device})", "",
                  "Rows where the algorithm `auto` picks with today's tuning (`collectives.algorithms.tuning`) "
                  f"was not our fastest in this run: more than {AUTO_SLACK - 1:.0%} slower, eagerly with the "
                  "bursts' ranges apart too (`collectives.tools.bench_report.auto_misses`); a row missed both in "
                  "graphs and eagerly is marked.", ""]
        lines += misses or ["Nowhere: every pick was our fastest algorithm, or within that margin."]
    skipped = [f"- {b}: {line}" for b, run in runs.items() for line in skipped_lines(run.get("skipped", []))]
    lines += ["", f"{h}# Skipped columns ({device})", ""] + (skipped or ["None."]) + [""]
    if "bench" in runs:
        lines += [markdown(runs["bench"], level + 1, f"Collectives ({device})")]
    if "gemm-overlap" in runs:
        lines += [f"{h}# GEMM overlap ({device})", ""] + gemm_tables(runs["gemm-overlap"], level + 2)
    if moe:
        lines += [f"{h}# All-to-all and MoE ({device})", ""] + moe_tables(moe, level + 2)
    if timeline:
        lines += [f"{h}# GEMM overlap, one call's timeline ({device})", "",
                  "From `collectives.tools.overlap_timeline` (CUDA events around each chunk's GEMM on the "
                  "current stream and its communication on the side stream; rank 0):", ""]
        lines += timeline_tables(timeline, level + 2)
    return "\n".join(lines).rstrip() + "\n"


def _marker(text: str, marker: str) -> int:
    """Where ``marker`` first starts as a line of its own in ``text``, or -1: prose that quotes
    a marker (in backticks, mid-line) is never taken for one."""
    found = re.search(rf"^{re.escape(marker)}$", text, re.MULTILINE)
    return found.start() if found else -1


def write(path: str, device: str, section: str) -> None:
    """Put ``section`` between ``device``'s markers (each a line of its own) in the Markdown file
    ``path``."""
    begin, end = f"<!-- bench_report {device} -->", f"<!-- /bench_report {device} -->"
    with open(path) as f:
        text = f.read()
    block = f"{begin}\n{section}{end}\n"
    first, stop = _marker(text, begin), _marker(text, end)
    if 0 <= first < stop:
        text = text[:first] + block + text[stop + len(end) + 1:]
    else:  # after the other machines' sections, else before the first section of the page
        last = max((m.start() for m in re.finditer(r"^<!-- /bench_report \S+ -->$", text, re.MULTILINE)),
                   default=-1)
        at = text.index("\n", last) + 2 if last >= 0 else text.find("\n## ") + 1
        at = len(text) if at <= 0 else at
        text = text[:at] + block + "\n" + text[at:]
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.bench_report", description=__doc__)
    parser.add_argument("directory", help="where the JSON files are (docs/data)")
    parser.add_argument("--device", required=True, help="the machine of the file names, e.g. 4xH200")
    parser.add_argument("--write", metavar="MARKDOWN", help="put the section into this file, between its markers")
    args = parser.parse_args(argv)
    section = render(load(args.directory, args.device), args.device)
    if args.write:
        write(args.write, args.device, section)
    else:
        print(section, end="")


__all__ = ["AUTO_SLACK", "BENCHES", "LEADERS", "auto_misses", "auto_pick", "decisive_misses", "leader_table", "load",
           "render", "write"]

if __name__ == "__main__":
    main()
