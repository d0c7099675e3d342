"""The launch contract every collective kernel shares: its runtime arguments (see
:mod:`collectives.algorithms.design` for what each holds) and the ``@cute.jit`` launcher around a
``@cute.kernel`` that takes them."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cuda.bindings import driver
from cutlass import Int32, Int64


def launcher(kernel, threads: int, grid: int | None = None):
    """The ``@cute.jit`` launch of ``kernel`` with ``threads`` threads per block, on ``blocks``
    thread blocks (a runtime argument) or, given ``grid``, always on that many."""

    @cute.jit
    def launch(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
        blocks: Int32, stream: driver.CUstream,
    ):
        size = blocks if cutlass.const_expr(grid is None) else grid
        kernel(data_table, data_mc, out, src, n, pad_table, pad_mc, pad, err, rank, timeout_ns).launch(
            grid=[size, 1, 1], block=[threads, 1, 1], stream=stream
        )

    return launch


def example_arguments() -> tuple:
    """Placeholder runtime arguments for compiling without a GPU."""
    return (Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0),
            Int32(0), Int64(0), Int32(1), driver.CUstream(0))


__all__ = ["example_arguments", "launcher"]
