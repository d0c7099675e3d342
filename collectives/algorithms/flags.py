"""The stream-flag kernels: one thread each, launched on a stream between a producer's and a
consumer's kernels (:meth:`collectives.runtime.stream_flags.StreamFlags.post` / ``wait``), built from
:mod:`collectives.device.flags`.

``post`` adds 1 to the slot's counter with ``red.release.gpu``; ``wait`` polls it with
``ld.acquire.gpu`` until the communicator's timeout, and on a timeout records
:data:`~collectives.layouts.FLAG_WAIT` (slot in ``block``) in the error record, which the host
raises as :class:`~collectives.CollectiveTimeout`."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32

from ..device import flags, signals
from ..device.kernel_args import KernelArgs
from ..layouts import FLAGS, FLAG_WAIT, TIMEOUT
from ..device.launch import flag_launcher
from .family import Family, register

KINDS = ("post", "wait")


@cute.jit
def _post(args: KernelArgs):
    flags.post(args.flags, args.index)


@cute.jit
def _wait(args: KernelArgs):
    deadline = cute.arch.globaltimer() + args.timeout_ns
    if not flags.wait(args.flags, args.consumed, args.index, deadline):
        signals.record_error(args.err, Int32(TIMEOUT), Int32(FLAG_WAIT), Int32(-1), args.index, args.rank)


def build(kind: str):
    """The ``@cute.jit`` launcher of the ``kind`` (``"post"`` or ``"wait"``) kernel; compile it
    with :func:`~collectives.device.launch.flag_example_arguments`."""
    return flag_launcher({"post": _post, "wait": _wait}[kind])


def _from_text(kid: str) -> str:
    kind = kid.partition("/")[2]
    if kind not in KINDS:
        raise ValueError(f"stream-flag kernels: {KINDS}, not {kind!r}")
    return kind


FAMILY = register(Family("flags", str, ("flags",), FLAGS, build, lambda: [f"flags/{k}" for k in KINDS],
                         lambda kind: f"flags/{kind}", _from_text, lambda kid: (("flags", kid),), gridded=False,
                         measured=False))


__all__ = ["FAMILY", "KINDS", "build"]
