"""ptxops.litmus: memory-model litmus tests that run ptxops' orderings on real GPUs.

Pure Python (importable without CuTeDSL, torch or a GPU):

* :mod:`.model` -- a checker of the PTX memory model's axioms for small tests
  (:func:`allowed_outcomes`, :func:`sc_outcomes`);
* :mod:`.shapes` -- the tests as data: shapes MP, SB, LB, 2+2W, IRIW, WRC in styles of
  ptxops operations (weak/relaxed/volatile/release/acquire ld/st, atom/red with a sem, fences),
  at scopes cta/gpu/sys, placed on two warps of a CTA, two CTAs or two GPUs, each outcome with
  its expected verdict (:class:`LitmusTest`, :func:`catalogue`, :func:`parse`);
* :mod:`.classify` -- histograms to verdict counts, the summary table (:class:`Result`,
  :func:`render_summary`, :func:`render_histogram`, :func:`render_verdicts`).

Needing CuTeDSL: :mod:`.kernels` (one stress kernel per shape x style); needing torch and a
GPU: :class:`Runner` (:mod:`.runner`).  Command line: ``python -m ptxops.litmus --help``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .classify import (
    Result,
    classify,
    histogram_from_rows,
    render_histogram,
    render_summary,
    render_verdicts,
)
from .model import Op, Where, allowed_outcomes, sc_outcomes
from .shapes import (
    EXPECTED_FORBIDDEN,
    FORBIDDEN,
    PLACEMENTS,
    SC,
    SCOPES,
    SHAPES,
    WEAK,
    LitmusTest,
    catalogue,
    kernel_keys,
    parse,
)

_LAZY = {"Runner": ".runner", "make_launcher": ".kernels"}

__all__ = [
    "EXPECTED_FORBIDDEN",
    "FORBIDDEN",
    "PLACEMENTS",
    "SC",
    "SCOPES",
    "SHAPES",
    "WEAK",
    "LitmusTest",
    "Op",
    "Result",
    "Runner",
    "Where",
    "allowed_outcomes",
    "catalogue",
    "classify",
    "histogram_from_rows",
    "kernel_keys",
    "make_launcher",
    "parse",
    "render_histogram",
    "render_summary",
    "render_verdicts",
    "sc_outcomes",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'ptxops.litmus' has no attribute {name!r}")
