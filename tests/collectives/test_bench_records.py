"""The benches' records on the CPU (timings stubbed: fake numbers, never performance): a
baseline column that raises is skipped with its reason on every rank and the run goes on, one
record shape per bench, JSON named after the machine, the tables and "where we lose" rendered
from the JSON, NCCL's copy-engine column kept off the default stream where NCCL refuses it, and
the chunked GEMM timed with exactly our blocks' launches."""

from __future__ import annotations

import contextlib
import functools
import json

import pytest

torch = pytest.importorskip("torch")
from collectives.tools import bench_report, nccl_baselines, result_checks  # noqa: E402
from collectives.tools.bench import FIELDS  # noqa: E402
from collectives.tools.records import Recorder, device_tag  # noqa: E402


def _nccl_error() -> float:
    raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:3690, unhandled cuda error\n"
                       "Last error: Cuda failure 'invalid argument'")


def _row(nbytes: int, mode: str = "eager") -> dict:
    return dict(collective="all_gather", dtype="bf16", bytes=nbytes, mode=mode)


def test_a_failing_baseline_is_skipped_with_its_reason_and_the_run_goes_on(capsys) -> None:
    rec = Recorder("bench", FIELDS, agree=lambda ok: ok)
    assert rec.baseline(lambda: 5.0, impl="nccl", **_row(4096)) == 5.0
    assert rec.baseline(_nccl_error, impl="nccl_ce", **_row(4096)) is None
    assert rec.ours(lambda: 2.0, impl="ours_auto", **_row(4096)) == 2.0
    tried = []
    assert rec.baseline(lambda: tried.append(1) or 1.0, impl="nccl_ce", **_row(1 << 20, "graph")) is None
    assert not tried  # a column that failed is not tried again in the run (its communicator may be broken)
    assert [(r["impl"], r["us"]) for r in rec.results] == [("nccl", 5.0), ("ours_auto", 2.0)]
    first, later = rec.skipped
    assert first == {**_row(4096), "impl": "nccl_ce",
                     "reason": "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:3690, unhandled cuda error"}
    assert later["bytes"] == 1 << 20 and later["reason"].startswith("not tried: failed at collective=all_gather")
    assert "nccl_ce skipped (all_gather, nccl_ce, bf16, 4096, eager): RuntimeError" in capsys.readouterr().out


def test_a_baseline_failing_on_another_rank_is_skipped_here_too() -> None:
    rec = Recorder("bench", FIELDS, agree=lambda ok: False, rank=1)
    assert rec.baseline(lambda: 3.0, impl="nccl_symm", **_row(4096)) is None
    assert rec.results == [] and rec.skipped[0]["reason"] == "failed on another rank"


def test_ours_failing_stops_the_run_and_records_keep_one_shape() -> None:
    rec = Recorder("bench", FIELDS, agree=lambda ok: ok)
    with pytest.raises(ZeroDivisionError):
        rec.ours(lambda: 1 / 0, impl="ours_auto", **_row(4096))
    with pytest.raises(ValueError, match="fields"):
        rec.add(1.0, impl="ours_auto", collective="all_gather", dtype="bf16", bytes=4096)  # no mode


@pytest.mark.parametrize("gpu,tag", [("NVIDIA H200", "4xH200"), ("NVIDIA H100 80GB HBM3", "4xH100"),
                                     ("NVIDIA GB200", "4xGB200"), ("NVIDIA GeForce RTX 4090", "4xGeForce-RTX-4090")])
def test_json_is_named_after_the_machine(tmp_path, gpu: str, tag: str) -> None:
    assert device_tag(4, gpu) == tag
    rec = Recorder("gemm-overlap", ("op", "impl"), agree=lambda ok: ok)
    rec.add(1.5, op="all_gather_gemm", impl="gemm")
    path = rec.write(str(tmp_path), 4, gpu, sms=132)
    assert path == str(tmp_path / f"gemm-overlap-{tag}.json")
    run = json.loads((tmp_path / f"gemm-overlap-{tag}.json").read_text())
    assert run["fields"] == ["op", "impl", "us"] and run["sms"] == 132 and run["world"] == 4
    assert run["results"] == [{"op": "all_gather_gemm", "impl": "gemm", "us": 1.5}] and run["skipped"] == []


@pytest.mark.parametrize("version,side", [("2.28.9", True), ("2.29.6", True), ("2.29.7", False), ("2.30.1", False)])
def test_nccl_copy_engines_are_timed_off_the_default_stream_where_nccl_refuses_it(version: str, side: bool) -> None:
    """NCCL before 2.29.7 passes the legacy default stream to cudaMemcpyBatchAsync, which
    refuses it ('invalid argument': the 4 x H200 all-gather bench's first row)."""
    found = nccl_baselines.Baselines(version)
    assert found.needs_side_stream("nccl_ce") is side
    assert not found.needs_side_stream("nccl_symm") and not found.needs_side_stream("nccl")


def _runs() -> dict[str, dict]:
    def rows(keys: tuple[str, ...], table: list[tuple]) -> list[dict]:
        return [dict(zip((*keys, "us"), values)) for values in table]

    bench = {"world": 4, "gpu": "NVIDIA H200", "results": rows(("collective", "impl", "dtype", "bytes", "mode"), [
        ("all_gather", "ours_auto", "bf16", 1 << 20, "graph", 10.0),
        ("all_gather", "ours_auto_plain", "bf16", 1 << 20, "graph", 30.0),
        ("all_gather", "nccl", "bf16", 1 << 20, "graph", 20.0),
        ("all_gather", "nccl_symm", "bf16", 1 << 20, "graph", 15.0),
        ("barrier", "ours", "-", 0, "graph", 3.0), ("barrier", "torch_symm_mem", "-", 0, "graph", 2.0),
        ("barrier", "empty_kernel", "-", 0, "graph", 1.5)]),
        "skipped": [{**_row(1 << 20, "graph"), "impl": "nccl_ce", "reason": "RuntimeError: invalid argument"}]}
    gemm = {"world": 4, "gpu": "NVIDIA H200", "results": rows(("op", "impl", "M", "N", "K", "chunks", "mode"), [
        ("all_gather_gemm", "gemm", 4096, 4096, 4096, 1, "graph", 200.0),
        ("all_gather_gemm", "ours", 4096, 4096, 4096, 4, "graph", 290.0),
        ("all_gather_gemm", "ours_ce", 4096, 4096, 4096, 4, "graph", 250.0),
        ("all_gather_gemm", "mm_nccl", 4096, 4096, 4096, 1, "graph", 300.0),
        ("all_gather_gemm", "torch_fused", 4096, 4096, 4096, 0, "graph", 205.0)])}
    moe = {"world": 4, "gpu": "NVIDIA H200", "results": rows(("part", "impl", "dtype", "tokens", "mode"), [
        ("fp8_dispatch", "ours_fused", "bf16", 128, "graph", 140.0),
        ("fp8_dispatch", "ours_fused", "fp8", 128, "graph", 650.0),
        ("combine", "ours_fused", "bf16", 1, "eager", 300.0), ("combine", "nccl", "bf16", 1, "eager", 186.0)])}
    return {"bench": bench, "gemm-overlap": gemm, "moe": moe}


def test_report_puts_where_we_lose_first_worst_first_from_the_records() -> None:
    text = bench_report.render(_runs(), "4xH200")
    losses = text[text.index("### Where we lose"):text.index("### Where auto")].splitlines()[2:-1]
    assert text.index("### Where we lose") < text.index("### Where auto") < text.index("### Skipped")
    assert [line.split(":")[0] for line in losses] == [
        "- dispatch, 128 tokens, graph",  # fp8 4.64x our bf16
        "- all_gather, bf16, graph, 1 MB",  # plain auto 2.00x nccl symm
        "- combine, bf16, 1 tokens, eager",  # 1.61x NCCL
        "- barrier, graph",  # 1.50x torch
        "- all_gather_gemm, M = 4096, N = K = 4096, graph"]  # best ours (ce) 1.22x torch fused
    assert "ours (auto, plain) 30.0 us, nccl symm 15.0 us (**2.00x** its time)" in text
    assert "ours (ours_ce, 4 chunks) 250.0 us, torch fused 205.0 us (**1.22x** its time) (GEMM alone: 200.0 us)" in text
    assert "ours (auto, symmetric)" not in text.split("### Skipped")[0]  # 10 us beats both NCCL columns
    assert text.index("### Where we lose") < text.index("### Collectives") < text.index("### GEMM overlap")
    assert "- bench: nccl_ce skipped in 1 row(s), first at collective=all_gather" in text
    head, row = [line for line in text.splitlines() if line.startswith("| 4096 |") or line.startswith("| M |")]
    cell = dict(zip(*([c.strip() for c in line.strip("|").split("|")] for line in (head, row))))
    assert cell["best ours / GEMM alone"] == "1.25" and cell["best ours / best baseline"] == "1.22"
    leaders = [line for line in text.splitlines() if line.startswith("| dispatch | 128 | pplx-kernels")]
    assert leaders == ["| dispatch | 128 | pplx-kernels (fp8 dispatch), 8 x H100 | 83.6 | - | 650.0 | 4 x NVIDIA H200 |"]


def test_the_empty_kernel_is_the_barriers_floor_and_no_loss() -> None:
    """The empty kernel (a floor, faster than every call) is printed beside the barrier and never
    listed as a row where we lose."""
    text = bench_report.render(_runs(), "4xH200")
    assert "Barrier (graph): ours 3.00 us, torch symm_mem 2.00 us (ours/torch 1.50); an empty kernel 1.50 us." in text
    assert "empty" not in text[text.index("### Where we lose"):text.index("### Where auto")]


def test_report_goes_between_its_markers_and_leaves_the_prose(tmp_path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nIntro.\n\n## Older figures\n\ntext\n")
    bench_report.write(str(page), "4xH200", "## first\n")
    bench_report.write(str(page), "4xH200", "## second\n")
    bench_report.write(str(page), "2xH100", "## other\n")
    assert page.read_text() == ("# Benchmarks\n\nIntro.\n\n<!-- bench_report 4xH200 -->\n## second\n"
                                "<!-- /bench_report 4xH200 -->\n\n<!-- bench_report 2xH100 -->\n## other\n"
                                "<!-- /bench_report 2xH100 -->\n\n## Older figures\n\ntext\n")


def test_report_markers_quoted_in_the_prose_are_not_markers(tmp_path) -> None:
    """A sentence that names the markers (in backticks, mid-line) is prose: the section replaces
    only the markers on lines of their own, and the sentence stays."""
    prose = "The section goes between `<!-- bench_report 4xH200 -->` markers (and `<!-- /bench_report 4xH200 -->`).\n"
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\n{prose}\n<!-- bench_report 4xH200 -->\nold\n<!-- /bench_report 4xH200 -->\n\ntail\n")
    bench_report.write(str(page), "4xH200", "## new\n")
    assert page.read_text() == (f"# Benchmarks\n\n{prose}\n<!-- bench_report 4xH200 -->\n## new\n"
                                "<!-- /bench_report 4xH200 -->\n\ntail\n")


@pytest.mark.parametrize("alternate", [False, True])
@pytest.mark.parametrize("op", ["gemm_reduce_scatter", "all_gather_gemm"])
def test_the_chunked_gemm_makes_our_blocks_products_in_our_order(monkeypatch, op: str, alternate: bool) -> None:
    """gemm_overlap_bench's gemm_chunked: one GEMM per rank's block of rows, in ours' order (the
    peers by collectives.overlap.peer_order; this rank's own last in gemm_reduce_scatter, first in
    all_gather_gemm), each block's product in its place, no communication; given a side stream
    (``gemm_alternate``), the peers' blocks on it and the current stream in turn, the side stream
    forked from the current one first and joined back last."""
    import types

    from collectives import overlap
    from collectives.tools.gemm_overlap_bench import gemm_chunked

    on, edges = ["main"], []
    main, side = (types.SimpleNamespace(name=name) for name in ("main", "side"))
    for stream in (main, side):
        stream.wait_stream = lambda other, stream=stream: edges.append((stream.name, other.name, len(blocks)))

    @contextlib.contextmanager
    def switched(stream):
        on.append(stream.name)
        yield
        on.pop()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: main)
    monkeypatch.setattr(torch.cuda, "stream", switched)

    world, rank, m, k, n = 3, 2, 2, 4, 5
    a = torch.arange((world * m if op == "gemm_reduce_scatter" else m) * k, dtype=torch.float32).view(-1, k) % 7
    b = torch.arange(k * n, dtype=torch.float32).view(k, n) % 5
    out = torch.zeros(world * m, n)
    blocks = []
    real = torch.mm
    streams = []
    monkeypatch.setattr(torch, "mm", lambda x, y, out: (blocks.append(out.data_ptr()), streams.append(on[-1]),
                                                        real(x, y, out=out))[2])
    gemm_chunked(op, a, b, out, world, rank, side if alternate else None)()
    order = [out[q * m].data_ptr() for q in overlap.peer_order(world, rank)]
    own = out[rank * m].data_ptr()
    assert blocks == (order + [own] if op == "gemm_reduce_scatter" else [own] + order)
    lanes = ["side", "main"] if alternate else ["main", "main"]  # (world 3: two peers)
    assert streams == (lanes + ["main"] if op == "gemm_reduce_scatter" else ["main"] + lanes)
    assert edges == ([("side", "main", 0), ("main", "side", world)] if alternate else [])
    want = a @ b if op == "gemm_reduce_scatter" else torch.cat([a] * world) @ b
    assert torch.equal(out, want)


def test_the_all_gather_rows_survive_nccls_copy_engine_column_failing(monkeypatch) -> None:
    """The bench's all-gather rows (collectives.tools.bench.gather_rows) with every GPU call
    stubbed and NCCL's copy-engine all-gather raising as on 4 x H100 at 2e7d141: that column
    is skipped with its reason, every other column and ours are recorded."""
    import types

    import collectives
    from collectives.runtime import communicator
    from collectives.tools import bench

    monkeypatch.setattr(communicator, "communicator",
                        lambda: types.SimpleNamespace(world=4, rank=0, ctx=types.SimpleNamespace(free=lambda t: None)))
    monkeypatch.setattr(collectives, "empty", lambda n, dtype: torch.zeros(n, dtype=dtype))
    monkeypatch.setattr(collectives, "all_gather", lambda out, inp, **kwargs: out.copy_(  # (as if every rank's
        torch.cat([result_checks.check_values(r, inp.numel(), inp.dtype, "cpu") for r in range(4)])))  # input were its check's)
    checked, time_row = [], bench.time_row

    def checking_time_row(rec, columns, *args, **row):
        checked.extend((c.impl, c.check is not None) for c in columns)
        return time_row(rec, columns, *args, **row)

    monkeypatch.setattr(bench, "time_row", checking_time_row)
    monkeypatch.setattr(collectives, "synchronize", lambda: None)
    for name in ("ones", "empty"):  # the CPU build has no cuda device
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *args, real=real, device=None, **kwargs: real(*args, **kwargs))
    calls = []

    def all_gather_into_tensor(out, inp, group=None) -> None:
        calls.append(group)
        if group == "ce group":
            _nccl_error()

    monkeypatch.setattr(bench.dist, "all_gather_into_tensor", all_gather_into_tensor)
    monkeypatch.setattr(bench, "time_op", lambda fn, iters, graph: (fn(), 7.0)[1])
    monkeypatch.setattr(bench, "warm_up", lambda fn: fn())
    monkeypatch.setattr(bench, "burst", lambda fn, iters: (fn(), (7.0, None))[1])
    windows = {name: nccl_baselines.Windows(group, None, torch.zeros(1 << 16, dtype=torch.uint8),
                                            torch.zeros(1 << 16, dtype=torch.uint8))
               for name, group in (("nccl_symm", "symm group"), ("nccl_ce", "ce group"))}
    nccl = nccl_baselines.Baselines("2.29.7", windows=windows)
    rec = Recorder("bench", FIELDS, agree=lambda ok: ok)
    for mode in ("eager", "graph"):
        us = bench.gather_rows(rec, nccl, "bf16", 1 << 14, mode, 10)
        assert set(us) == {"nccl", "nccl_symm"} | {f"ours_{a}{s}" for a in bench.ALGORITHMS_ALL_GATHER
                                                  for s in ("", "_plain")}
    # eager: each column's warm-up (where the copy-engine column fails), then BURSTS bursts of the others;
    # graphs: the failed column is not retried
    assert calls[:3] == [None, "symm group", "ce group"] and calls[-2:] == [None, "symm group"]
    assert sorted(calls[3:-2], key=str) == [None] * bench.BURSTS + ["symm group"] * bench.BURSTS
    assert [(s["impl"], s["mode"]) for s in rec.skipped] == [("nccl_ce", "eager"), ("nccl_ce", "graph")]
    assert "unhandled cuda error" in rec.skipped[0]["reason"]
    assert {r["bytes"] for r in rec.results} == {1 << 14}
    assert len(rec.results) == 2 * (2 + 2 * len(bench.ALGORITHMS_ALL_GATHER))  # 2 modes: 2 NCCL columns and ours
    assert {impl for impl, check in checked if check} == {impl for impl, _ in checked if impl.startswith("ours")}


def _bench_all_commands() -> list[tuple[str, list[str]]]:
    """(module, arguments) of every bench collectives/tools/bench_all.sh runs."""
    import shlex
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "collectives/tools/bench_all.sh").read_text()
    lines = script.replace("\\\n", " ").splitlines()
    runs = [shlex.split(line) for line in lines if line.startswith("bench ")]
    return [(words[3], words[4:]) for words in runs]


@pytest.mark.parametrize("module,args", _bench_all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_bench_of_bench_all_takes_its_arguments(monkeypatch, tmp_path, module: str, args: list[str]) -> None:
    """A flag a bench does not know would cost a GPU run: each command line of bench_all.sh
    (with the --out it adds) parses, and the run stops right after parsing."""
    import argparse
    import importlib

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        parse(self, argv, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(Parsed):
        importlib.import_module(module).main(["--out", str(tmp_path), *args])


@pytest.mark.parametrize("module,args", _bench_all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_torchrun_passes_every_bench_its_arguments(module: str, args: list[str]) -> None:
    """torchrun parses the whole command line: an argument that abbreviates one of its own
    options (``--m`` for ``--max-restarts``) ends the run before the bench starts."""
    run = pytest.importorskip("torch.distributed.run")
    parsed = run.get_args_parser().parse_args(["--nproc-per-node", "4", "-m", module, "--out", "o", *args])
    assert (parsed.training_script, parsed.training_script_args) == (module, ["--out", "o", *args])


def test_bench_all_runs_every_bench_writing_json() -> None:
    modules = [m for m, _ in _bench_all_commands()]
    assert modules == ["collectives.tools.bench", "collectives.tools.gemm_overlap_bench",
                       "collectives.tools.all_to_all_bench", "collectives.tools.all_to_all_bench",
                       "collectives.tools.overlap_timeline"]


def test_a_column_named_by_more_fields_is_disabled_only_there() -> None:
    """gemm_overlap_bench's torch_fused column is per op and mode: a fused op refusing a graph
    capture leaves its eager rows and the other op's rows timed."""
    rec = Recorder("gemm-overlap", ("op", "impl", "mode"), agree=lambda ok: ok, column=("op", "impl", "mode"))
    tried = []

    def refuse_graphs(op: str, mode: str) -> float:
        tried.append((op, mode))
        if mode == "graph":
            raise RuntimeError("capture refused")
        return 1.0

    for _ in range(2):  # two shapes
        for op in ("gemm_reduce_scatter", "all_gather_gemm"):
            for mode in ("eager", "graph"):
                rec.baseline(lambda: refuse_graphs(op, mode), op=op, impl="torch_fused", mode=mode)
    assert tried == [(op, mode) for op in ("gemm_reduce_scatter", "all_gather_gemm") for mode in ("eager", "graph")] + [
        (op, "eager") for op in ("gemm_reduce_scatter", "all_gather_gemm")]
    assert len(rec.results) == 4 and len(rec.skipped) == 4


def test_the_timeline_of_one_call_is_rendered_with_what_shows_beyond_the_gemms() -> None:
    timeline = {"gemm_reduce_scatter M=8 N=8 K=8, 4 GPUs": [
        dict(kind="comm", chunk=0, start=12.0, end=30.0), dict(kind="gemm", chunk=0, start=0.0, end=10.0),
        dict(kind="gemm", chunk=1, start=11.0, end=21.0), dict(kind="comm", chunk=1, start=31.0, end=40.0)]}
    text = bench_report.render({"overlap-timeline": timeline}, "4xH200")
    assert "40.0 us from the first event to the last; the GEMMs 20.0 us in all; 19.0 us after the last GEMM ended." in text
    rows = [line for line in text.splitlines() if line.startswith("| gemm") or line.startswith("| comm")]
    assert [r.split(" | ")[0:2] for r in rows] == [["| gemm", "0"], ["| gemm", "1"], ["| comm", "0"], ["| comm", "1"]]
    assert "## 4 x H200 (4xH200)" in text and "Nowhere" in text


def test_the_gemm_overlap_variants_set_their_knobs_inside_and_restore_them() -> None:
    """``gemm_overlap_bench --variants``: ``first`` sets the all-gather's start, ``carve<N>`` the
    SM carveout cuBLAS gets, ``blocks`` / ``one`` the eager path, ``engine`` the peer copies,
    joined by ``+``; the defaults come back after, and an unknown variant is refused."""
    import torch

    from collectives import config, overlap
    from collectives.tools.gemm_overlap_bench import applied

    before = (config.OVERLAP_START, torch._C._get_sm_carveout_experimental())
    with applied("first+carve16"):
        assert (config.OVERLAP_START, torch._C._get_sm_carveout_experimental()) == ("first", 16)
    assert (config.OVERLAP_START, torch._C._get_sm_carveout_experimental()) == before
    host_us, big, small = config.OVERLAP_EAGER_HOST_US_PER_BLOCK, (4, 16384, 8192, 8192), (4, 64, 64, 64)
    with applied("blocks"):
        assert overlap.eager_blocks(*small)
    with applied("side+one+engine"):
        assert not overlap.eager_blocks(*big) and (config.OVERLAP_START, config.OVERLAP_COPY) == ("side", "engine")
    assert config.OVERLAP_EAGER_HOST_US_PER_BLOCK == host_us and config.OVERLAP_START == before[0]
    assert config.OVERLAP_COPY == "copy"
    with applied("alternate+first"):
        assert (config.OVERLAP_SCHEDULE, config.OVERLAP_START) == ("alternate", "first")
    assert config.OVERLAP_SCHEDULE == "auto"
    with applied("carve8"):
        assert (config.OVERLAP_START, torch._C._get_sm_carveout_experimental()) == (before[0], 8)
    with pytest.raises(ValueError, match="unknown variant"), applied("first+ce"):
        pass
    assert (config.OVERLAP_START, torch._C._get_sm_carveout_experimental()) == before


def test_host_time_rows_of_the_gemm_overlap_are_no_loss() -> None:
    """``gemm_overlap_bench``'s ``host`` rows (host time per eager call) explain an eager row;
    a baseline enqueued faster than ours is not a loss of its own."""
    def record(impl: str, mode: str, us: float) -> dict:
        return dict(zip(("op", "impl", "M", "N", "K", "chunks", "mode", "us"),
                        ("all_gather_gemm", impl, 4096, 4096, 4096, 4, mode, us)))

    run = {"results": [record("ours", "host", 90.0), record("mm_nccl", "host", 30.0),
                       record("ours", "eager", 300.0), record("mm_nccl", "eager", 290.0)]}
    assert [line.split(":")[0] for _, line in bench_report.gemm_losses(run)] == [
        "all_gather_gemm, M = 4096, N = K = 4096, eager"]


class _Drift:
    """A fake clock of a drifting host: every burst takes its column's cost plus ``step`` more
    than the burst before (the host slowing down), and records its column."""

    def __init__(self, step: float = 1.0) -> None:
        self.step, self.t, self.order = step, 0.0, []

    def burst(self, impl: str, cost: float) -> float:
        self.order.append(impl)
        self.t += self.step
        return cost + self.t


def test_interleaved_bursts_rotate_so_that_drift_lands_on_every_column_alike() -> None:
    """Three columns of equal cost on a host that slows down burst by burst: timed one after the
    other (the old order) the last would read 2 x BURSTS steps slower than the first; interleaved
    with a rotating start their medians differ by less than a round, and each goes first in
    some round."""
    import statistics

    from collectives.tools import bench

    clock = _Drift()
    names = ("a", "b", "c")
    samples = bench.interleaved([lambda i=i: clock.burst(i, 10.0) for i in names], bench.BURSTS)
    assert [len(s) for s in samples] == [bench.BURSTS] * 3
    rounds = [clock.order[r * 3:(r + 1) * 3] for r in range(bench.BURSTS)]
    assert all(sorted(r) == list(names) for r in rounds)
    assert {r[0] for r in rounds} == set(names)  # each column goes first in some round
    medians = [statistics.median(s) for s in samples]
    assert max(medians) - min(medians) <= (len(names) - 1) * clock.step


def test_an_eager_row_records_the_median_of_interleaved_bursts_and_their_spread(monkeypatch) -> None:
    """time_row on a drifting fake clock: each column's record is the median of its bursts, with
    us_min and us_max; a baseline failing at its warm-up is skipped, one failing in a burst (on
    any rank: an infinite slowest time) is skipped with its error, ours failing raises; graphs
    are timed column by column (time_op)."""
    from collectives.tools import bench

    clock = _Drift(step=0.5)
    failing = {"broken_burst"}

    def burst(fn, iters):
        impl, cost = fn()
        if impl in failing:
            return float("inf"), RuntimeError(f"{impl} died")
        return clock.burst(impl, cost), None

    def warm_up(fn):
        if fn()[0] == "broken_warm":
            raise RuntimeError("no window")

    monkeypatch.setattr(bench, "burst", burst)
    monkeypatch.setattr(bench, "warm_up", warm_up)
    monkeypatch.setattr(bench, "time_op", lambda fn, iters, graph: fn()[1])
    rec = Recorder("bench", FIELDS, agree=lambda ok: ok)
    cols = [bench.column("ours_x", lambda: ("ours_x", 5.0)), bench.column("nccl", lambda: ("nccl", 5.0), True),
            bench.column("broken_warm", lambda: ("broken_warm", 1.0), True),
            bench.column("broken_burst", lambda: ("broken_burst", 1.0), True)]
    row = dict(collective="all_reduce", dtype="bf16", bytes=4096)
    us = bench.time_row(rec, cols, 10, False, mode="eager", **row)
    assert set(us) == {"ours_x", "nccl"} and abs(us["ours_x"] - us["nccl"]) <= clock.step
    records = {r["impl"]: r for r in rec.results}
    for impl in us:
        times = [clock.step * (k + 1) + 5.0 for k, i in enumerate(clock.order) if i == impl]
        assert len(times) == bench.BURSTS
        assert records[impl]["us"] == sorted(times)[bench.BURSTS // 2]
        assert (records[impl]["us_min"], records[impl]["us_max"]) == (min(times), max(times))
    assert [(s["impl"], s["reason"]) for s in rec.skipped] == [("broken_warm", "RuntimeError: no window"),
                                                                ("broken_burst", "RuntimeError: broken_burst died")]
    assert bench.time_row(rec, cols[:2], 10, True, mode="graph", **row) == {"ours_x": 5.0, "nccl": 5.0}
    failing.add("ours_x")
    with pytest.raises(RuntimeError, match="ours_x failed in a timed burst"):
        bench.time_row(rec, cols[:2], 10, False, mode="eager", **row)


def test_the_report_says_how_the_eager_rows_were_timed() -> None:
    """Records with a spread (us_min: interleaved eager bursts) render as the median; a run
    without (the older JSON files) as best of 3; the extra keys change no table."""
    runs = _runs()
    assert "the slowest rank's, best of 3." in bench_report.render(runs, "4xH200")
    plain = bench_report.render(runs, "4xH200")
    runs["bench"]["results"] = [dict(r, us_min=r["us"] - 1, us_max=r["us"] + 1) for r in runs["bench"]["results"]]
    text = bench_report.render(runs, "4xH200")
    assert "eager rows the median of interleaved bursts" in text
    assert text.split("### Where we lose")[1] == plain.split("### Where we lose")[1]


def test_result_checks_pass_the_right_result_and_catch_a_wrong_one_on_any_rank() -> None:
    """The checks of ours' columns, on CPU tensors as rank 1 of 4: the right result passes; a
    call that does nothing (the input left in place), leaves a rank out or takes another rank's
    block raises WrongResult, as does a wrong result on another rank (``agree`` False)."""
    world, rank, dtype = 4, 1, torch.bfloat16
    values = functools.partial(result_checks.check_values, device="cpu")
    assert sorted({float(v) for r in range(8) for v in values(r, 40, torch.float32)}) == [float(v) for v in range(1, 13)]
    total = result_checks.summed_values(world, 40, dtype, "cpu")
    assert torch.equal(total, sum(values(r, 40, torch.float32) for r in range(world)).to(dtype))

    def everyone(ok: bool) -> bool:
        return ok

    t = torch.zeros(40, dtype=dtype)
    check = result_checks.all_reduce_check(t, rank, world, everyone)
    check(lambda: t.copy_(total))
    for wrong in (lambda: None, lambda: t.copy_(result_checks.summed_values(world - 1, 40, dtype, "cpu"))):
        with pytest.raises(result_checks.WrongResult, match="elements wrong on this rank"):
            check(wrong)
    with pytest.raises(result_checks.WrongResult, match="another rank"):
        result_checks.all_reduce_check(t, rank, world, lambda ok: False)(lambda: t.copy_(total))

    inp, out = torch.zeros(4 * 8, dtype=dtype), torch.zeros(8, dtype=dtype)  # (blocks of a power of two, as benched)
    check = result_checks.reduce_scatter_check(out, inp, rank, world, everyone)
    check(lambda: out.copy_(total[8:16]))
    with pytest.raises(result_checks.WrongResult):
        check(lambda: out.copy_(total[:8]))  # rank 0's block

    inp, out = torch.zeros(8, dtype=dtype), torch.zeros(4 * 8, dtype=dtype)
    check = result_checks.all_gather_check(out, inp, rank, world, everyone)
    check(lambda: out.copy_(torch.cat([values(r, 8, dtype) for r in range(world)])))
    for wrong in (lambda: out.copy_(inp.repeat(world)),  # this rank's input in every block
                  lambda: out.copy_(torch.cat([values(r, 8, dtype) for r in (1, 0, 2, 3)]))):  # two blocks swapped
        with pytest.raises(result_checks.WrongResult):
            check(wrong)


def test_a_wrong_result_stops_the_run_for_ours_and_skips_a_variant(monkeypatch) -> None:
    """time_row runs a column's check once before timing it, in its context: ours' wrong
    result raises (eager and graphs), a variant's (a baseline) is skipped with the reason, a
    right one is timed."""
    from collectives.tools import bench

    monkeypatch.setattr(bench, "burst", lambda fn, iters: (fn(), None))
    monkeypatch.setattr(bench, "warm_up", lambda fn: fn())
    monkeypatch.setattr(bench, "time_op", lambda fn, iters, graph: fn())
    inside: list[bool] = []
    knob = [False]

    @contextlib.contextmanager
    def context():
        knob[0] = True
        try:
            yield
        finally:
            knob[0] = False

    def check(ok: bool):
        def run(call) -> None:
            inside.append(knob[0])
            call()
            if not ok:
                raise result_checks.WrongResult("3 of 40 elements wrong on this rank")
        return run

    row = dict(collective="all_reduce", dtype="bf16", bytes=4096)
    for mode in ("eager", "graph"):
        rec = Recorder("bench", FIELDS, agree=lambda ok: ok)
        cols = [bench.column("ours_x", lambda: 5.0, check=check(True)),
                bench.column("ours_x_u4", lambda: 4.0, baseline=True, context=context, check=check(False))]
        us = bench.time_row(rec, cols, 10, mode == "graph", mode=mode, **row)
        assert us == {"ours_x": 5.0}
        assert [(s["impl"], s["reason"]) for s in rec.skipped] == [
            ("ours_x_u4", "WrongResult: 3 of 40 elements wrong on this rank")]
        with pytest.raises(result_checks.WrongResult):
            bench.time_row(Recorder("bench", FIELDS, agree=lambda ok: ok),
                           [bench.column("ours_x", lambda: 5.0, check=check(False))], 10, mode == "graph",
                           mode=mode, **row)
    assert inside == [False, True, False] * 2  # (the variant's check inside its knobs' context)
