"""The launch contract every collective kernel shares: its runtime arguments (see
:mod:`collectives.algorithms.design` for what each holds) and the ``@cute.jit`` launcher around
the ``@cute.kernel`` that takes them.

For ``backend="multicast_emulated"`` the kernel traces its body under
:func:`ptxops.emulate_multicast`: ``data_mc`` is then the address of a translation table of two
windows (:data:`EMULATION_WINDOWS`: the data buffer, then the signal pad; ``W + 2`` int64
entries each, see :func:`ptxops.translation_table`) and the body sees the windows' fake
multicast bases as ``data_mc`` and ``pad_mc``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cuda.bindings import driver
from cutlass import Int32, Int64

import ptxops

#: Windows of a collective's translation table: the data buffer's, then the signal pad's.
EMULATION_WINDOWS = 2


def launcher(body, threads: int, grid: int | None = None, *, emulate: int = 0, pdl: bool = False):
    """The ``@cute.jit`` launch of a kernel running the ``@cute.jit`` ``body`` with ``threads``
    threads per block, on ``blocks`` thread blocks (a runtime argument) or, given ``grid``,
    always on that many; ``emulate``: the world size of a multicast emulation (0: none).

    ``pdl``: launched with programmatic stream serialization, the kernel may start while the
    kernel before it in the stream drains; every thread first waits for that kernel's completion
    and memory (``griddepcontrol.wait``: before any global access, the epochs' and the
    tables' loads included, since the kernel before may be a collective on the same signal pad),
    then lets a kernel launched after it with the same attribute be scheduled
    (``griddepcontrol.launch_dependents``: it orders nothing, the dependent waits for our
    completion in turn; all our blocks have started by then, so its blocks take no SM a block of
    ours still needs)."""

    @cute.kernel
    def kernel(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
    ):
        if cutlass.const_expr(pdl):
            ptxops.griddepcontrol_wait()
            ptxops.griddepcontrol_launch_dependents()
        if cutlass.const_expr(emulate):
            with ptxops.emulate_multicast(data_mc, world=emulate, windows=EMULATION_WINDOWS):
                entry = cute.make_ptr(Int64, data_mc, cute.AddressSpace.gmem, assumed_align=8)
                body(data_table, ptxops.ld(entry, dtype=Int64), out, src, n, pad_table,
                     ptxops.ld(entry + (emulate + 2), dtype=Int64), pad, err, rank, timeout_ns)
        else:
            body(data_table, data_mc, out, src, n, pad_table, pad_mc, pad, err, rank, timeout_ns)

    @cute.jit
    def launch(
        data_table: Int64, data_mc: Int64, out: Int64, src: Int64, n: Int64,
        pad_table: Int64, pad_mc: Int64, pad: Int64, err: Int64, rank: Int32, timeout_ns: Int64,
        blocks: Int32, stream: driver.CUstream,
    ):
        size = blocks if cutlass.const_expr(grid is None) else grid
        kernel(data_table, data_mc, out, src, n, pad_table, pad_mc, pad, err, rank, timeout_ns).launch(
            grid=[size, 1, 1], block=[threads, 1, 1], stream=stream, use_pdl=pdl
        )

    return launch


def example_arguments() -> tuple:
    """Placeholder runtime arguments for compiling without a GPU."""
    return (Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0), Int64(0),
            Int32(0), Int64(0), Int32(1), driver.CUstream(0))


def flag_launcher(body):
    """The ``@cute.jit`` launch of a one-thread kernel running the ``@cute.jit``
    ``body(flags, consumed, index, err, rank, timeout_ns)``: the stream flags' contract
    (``flags`` and ``consumed``: the counter words, ``index`` the slot, ``err`` the error record)."""

    @cute.kernel
    def kernel(flags: Int64, consumed: Int64, index: Int32, err: Int64, rank: Int32, timeout_ns: Int64):
        body(flags, consumed, index, err, rank, timeout_ns)

    @cute.jit
    def launch(flags: Int64, consumed: Int64, index: Int32, err: Int64, rank: Int32, timeout_ns: Int64,
               stream: driver.CUstream):
        kernel(flags, consumed, index, err, rank, timeout_ns).launch(grid=[1, 1, 1], block=[1, 1, 1], stream=stream)

    return launch


def flag_example_arguments() -> tuple:
    """Placeholder runtime arguments of :func:`flag_launcher`'s launch."""
    return Int64(0), Int64(0), Int32(0), Int64(0), Int32(0), Int64(0), driver.CUstream(0)


__all__ = ["EMULATION_WINDOWS", "example_arguments", "flag_example_arguments", "flag_launcher", "launcher"]
