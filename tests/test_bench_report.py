"""The benchmark's tables (console and docs/benchmarks.md) from a run's results: plain and
symmetric columns side by side, NCCL over ours for each, auto over the best fixed algorithm of
its own placement.  Synthetic timings; no GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from collectives.tools import bench  # noqa: E402


def _results(world: int) -> list[dict]:
    us = {"ours_one_shot": 10.0, "ours_tma": 8.0, "ours_auto": 8.0, "ours_one_shot_plain": 12.0,
          "ours_tma_plain": 20.0, "ours_push_plain": 9.0, "ours_auto_plain": 9.9, "nccl": 11.0}
    return [dict(collective="reduce_scatter", impl=impl, dtype="bf16", bytes=1 << 20, mode="graph", us=t, busbw=0.0)
            for impl, t in us.items()] + [
        dict(collective="barrier", impl="ours", dtype="-", bytes=0, mode="graph", us=2.0, busbw=0.0),
        dict(collective="barrier", impl="torch_symm_mem", dtype="-", bytes=0, mode="graph", us=4.0, busbw=0.0)]


def test_table_ratios_compare_each_placement_with_its_own_best() -> None:
    head, row = bench.table(_results(2), 2, "reduce_scatter", "bf16", "graph")
    cell = dict(zip(head, row))
    assert cell["size"] == "1 MB" and cell["push plain"] == "9.0"
    assert cell["nccl/auto"] == f"{11 / 8:.2f}" and cell["nccl/auto plain"] == f"{11 / 9.9:.2f}"
    assert cell["auto/best"] == "1.00" and cell["auto plain/best plain"] == "1.10"
    assert cell["auto picks"].count("/") == 1


def test_markdown_has_the_barrier_line_and_one_table_per_mode() -> None:
    text = bench.markdown({"world": 2, "gpu": "GPU", "results": _results(2)})
    assert "Barrier (graph): ours 2.00 us, torch symm_mem 4.00 us (ours/torch 0.50)." in text
    assert text.count("### reduce_scatter, bf16, graph") == 1 and "### reduce_scatter, bf16, eager" not in text
