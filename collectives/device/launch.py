"""The ``@cute.jit`` launchers around every collective kernel and the stream-flag kernels:
their signatures are the argument layouts of :mod:`collectives.layouts` (then the grid and
the stream), and the ``@cute.kernel`` inside hands its body one
:class:`~collectives.device.kernel_args.KernelArgs`.

For ``backend="multicast_emulated"`` the kernel traces its body under
:func:`ptxops.emulate_multicast`: the layout's ``emulated`` argument (``data_mc``) is then the
address of a translation table of two windows (:data:`EMULATION_WINDOWS`: the data buffer, then
the signal pad; ``W + 2`` int64 entries each, see :func:`ptxops.translation_table`) and the body
sees the windows' fake multicast bases in place of it and of ``pad_mc``.
"""

from __future__ import annotations

import inspect

import cutlass
import cutlass.cute as cute
from cuda.bindings import driver
from cutlass import Int32, Int64

import ptxops
from ptxops.ops.pointer_reach import required

from ..layouts import COLLECTIVE, FLAGS, Layout
from .kernel_args import KernelArgs, dsl_type, examples

#: Windows of a collective's translation table: the data buffer's, then the signal pad's.
EMULATION_WINDOWS = 2
#: Threads per block a kernel key may ask for.
BLOCK_THREADS = (128, 256, 512, 1024)


def check_threads(threads: int) -> None:
    """ValueError unless ``threads`` is one of :data:`BLOCK_THREADS` (a key's check)."""
    if threads not in BLOCK_THREADS:
        raise ValueError(f"threads must be one of {', '.join(map(str, BLOCK_THREADS))}, not {threads}")


def _signature(fn, layout: Layout, *extra: tuple[str, type]):
    """``fn`` (taking ``*values``) with the named, typed signature CuTeDSL compiles from:
    ``layout``'s arguments, then ``extra``."""
    params = [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dsl_type(a))
              for a in layout.args]
    params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for name, t in extra]
    fn.__signature__ = inspect.Signature(params)
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn


def launcher(body, threads: int, grid: int | None = None, *, emulate: int = 0, pdl: bool = False,
             layout: Layout = COLLECTIVE):
    """The ``@cute.jit`` launch of a kernel running the ``@cute.jit`` ``body(args)`` (the
    :class:`~collectives.device.kernel_args.KernelArgs` of ``layout``) with ``threads`` threads per
    block, on ``blocks`` thread blocks (a runtime argument) or, given ``grid``, always on that
    many; ``emulate``: the world size of a multicast emulation (0: none).

    ``pdl``: launched with programmatic stream serialization, the kernel may start while the
    kernel before it in the stream drains; every thread first waits for that kernel's completion
    and memory (``griddepcontrol.wait``: before any global access, the epochs' and the
    tables' loads included, since the kernel before may be a collective on the same signal pad),
    then lets a kernel launched after it with the same attribute be scheduled
    (``griddepcontrol.launch_dependents``: it orders nothing, the dependent waits for our
    completion in turn; all our blocks have started by then, so its blocks take no SM a block of
    ours still needs).

    Every pointer the body accesses through ptxops must have a reach (:func:`ptxops.reach`,
    ``gmem(..., reach)``): ptxops checks each ordered access's scope against it."""

    def kernel(args: KernelArgs):
        with required("a collectives kernel"):
            traced(args)

    def traced(args: KernelArgs):
        if cutlass.const_expr(pdl):
            ptxops.griddepcontrol_wait()
            ptxops.griddepcontrol_launch_dependents()
        if cutlass.const_expr(emulate):
            table = getattr(args, layout.emulated)
            with ptxops.emulate_multicast(table, world=emulate, windows=EMULATION_WINDOWS):
                entry = ptxops.reach(cute.make_ptr(Int64, table, cute.AddressSpace.gmem, assumed_align=8), "gpu",
                                     by="collectives.launch.launcher (the multicast emulation's table)")
                body(args.replace(**{layout.emulated: ptxops.ld(entry, dtype=Int64),
                                     "pad_mc": ptxops.ld(entry + (emulate + 2), dtype=Int64)}))
        else:
            body(args)

    kernel.__annotations__["args"] = KernelArgs
    kernel = cute.kernel(kernel)

    def launch(*values):
        *fields, blocks, stream = values
        size = blocks if cutlass.const_expr(grid is None) else grid
        kernel(KernelArgs(layout, fields)).launch(grid=[size, 1, 1], block=[threads, 1, 1], stream=stream,
                                                  use_pdl=pdl)

    return cute.jit(_signature(launch, layout, ("blocks", Int32), ("stream", driver.CUstream)))


def example_arguments(layout: Layout = COLLECTIVE) -> tuple:
    """Placeholder runtime arguments of a launcher of ``layout`` (compiling without a GPU)."""
    return examples(layout) + (Int32(1), driver.CUstream(0))


def flag_launcher(body):
    """The ``@cute.jit`` launch of a one-thread kernel running the ``@cute.jit`` ``body(args)``
    (:data:`~collectives.layouts.FLAGS`: the counter words, the slot, the error record)."""

    def kernel(args: KernelArgs):
        with required("a collectives kernel"):
            body(args)

    kernel.__annotations__["args"] = KernelArgs
    kernel = cute.kernel(kernel)

    def launch(*values):
        *fields, stream = values
        kernel(KernelArgs(FLAGS, fields)).launch(grid=[1, 1, 1], block=[1, 1, 1], stream=stream)

    return cute.jit(_signature(launch, FLAGS, ("stream", driver.CUstream)))


def flag_example_arguments() -> tuple:
    """Placeholder runtime arguments of :func:`flag_launcher`'s launch."""
    return examples(FLAGS) + (driver.CUstream(0),)


__all__ = ["BLOCK_THREADS", "EMULATION_WINDOWS", "check_threads", "example_arguments", "flag_example_arguments",
           "flag_launcher", "launcher"]
