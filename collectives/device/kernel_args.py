"""The runtime arguments of every collective kernel, declared once.

:data:`COLLECTIVE` lists them (name, type, meaning) in launch order; the launcher's signature
(:func:`collectives.device.launch.launcher`), the kernels' view of them (:class:`KernelArgs`, fields
by name), the host's packing of a launch (:meth:`Layout.pack`) and the placeholder arguments
of a compile without a GPU (:meth:`Layout.examples`) all derive from it.  One position, one
meaning: a kernel whose second argument means something else declares a layout of its own
(:data:`PUSH_ALL_REDUCE`), with the same types in the same order, so both launch alike.

``multicast_emulated``: the host passes a translation table where the layout says
"multicast address" (see :func:`ptxops.translation_table`); the launcher traces the body under
:func:`ptxops.emulate_multicast` and hands it the windows' fake multicast bases instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cutlass import Int32, Int64
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values


@dataclass(frozen=True)
class Arg:
    """One runtime argument: its name in kernels and on the host, its CuTeDSL type, what it holds."""

    name: str
    type: type
    meaning: str


class KernelArgs:
    """A kernel's runtime arguments as one object with a field per :class:`Arg` (a CuTeDSL
    argument: it passes into a ``@cute.kernel`` as its fields' scalars, in order)."""

    __slots__ = ("layout", "values")

    def __init__(self, layout: Layout, values: tuple) -> None:
        self.layout, self.values = layout, tuple(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[self.layout.index[name]]
        except KeyError:
            raise AttributeError(f"{self.layout.name} has no argument {name!r}") from None

    def replace(self, **changes: Any) -> KernelArgs:
        """The same arguments with ``changes`` (by name)."""
        values = list(self.values)
        for name, value in changes.items():
            values[self.layout.index[name]] = value
        return KernelArgs(self.layout, values)

    def __extract_mlir_values__(self) -> list:
        return [v for value in self.values for v in extract_mlir_values(value)]

    def __new_from_mlir_values__(self, values: list) -> KernelArgs:
        return KernelArgs(self.layout, [new_from_mlir_values(old, [v]) for old, v in zip(self.values, values)])

    def __repr__(self) -> str:  # CuTeDSL names the kernel after its arguments: keep it stable
        return self.layout.name


@dataclass(frozen=True)
class Layout:
    """The arguments of one kind of kernel, in launch order.  ``emulated``: the argument that
    carries a translation table under a multicast emulation (the launcher hands the body that
    table's first fake multicast base in its place)."""

    name: str
    args: tuple[Arg, ...]
    emulated: str = ""

    @cached_property
    def index(self) -> dict[str, int]:
        return {a.name: i for i, a in enumerate(self.args)}

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def pack(self, **values: int) -> tuple[int, ...]:
        """The host's launch arguments in order, given every one by name (no Python frame per
        argument: the MoE kernels pack theirs at every call)."""
        if values.keys() != self.index.keys():
            raise TypeError(f"{self.name}: missing {sorted(set(self.index) - set(values))}, "
                            f"unknown {sorted(set(values) - set(self.index))}")
        return tuple(map(values.__getitem__, self.names))

    def examples(self) -> tuple:
        """Placeholder values of every argument (compiling without a GPU)."""
        return tuple(a.type(0) for a in self.args)

    def renamed(self, name: str, **replacements: Arg) -> Layout:
        """This layout with the arguments named in ``replacements`` replaced (same types)."""
        args = tuple(replacements.get(a.name, a) for a in self.args)
        assert [a.type for a in args] == [a.type for a in self.args]
        emulated = replacements[self.emulated].name if self.emulated in replacements else self.emulated
        return Layout(name, args, emulated)


COLLECTIVE = Layout("CollectiveArgs", (
    Arg("data_table", Int64, "device table of every rank's data buffer address (int64[W])"),
    Arg("data_mc", Int64, "the data buffer's multicast address (0 on the peer backend; emulated: its translation "
                          "table of two windows, the data buffer's and the signal pad's)"),
    Arg("out", Int64, "this rank's output (one-shot all-reduce, reduce-scatter, gathered two-shot/TMA, all-gather)"),
    Arg("src", Int64, "this rank's input (stage_in: copied in-kernel; push and all-gather: pushed; 0: in place)"),
    Arg("n", Int64, "elements per rank (all-reduce, all-gather's input) or per output (reduce-scatter)"),
    Arg("kinds", Int32, "the call's signature (collectives.algorithms.Call.signature: the kinds of the caller's "
                        "tensors, its collective, dtype and op), brought to the barriers with n in their size word"),
    Arg("pad_table", Int64, "device table of every rank's signal pad"),
    Arg("pad_mc", Int64, "the signal pad's multicast address (0 on the peer backend)"),
    Arg("pad", Int64, "this rank's signal pad (its entry of pad_table, saving the kernel a load)"),
    Arg("err", Int64, "the error records (host-mapped int32[2][5], collectives.config.ERROR_FIELDS)"),
    Arg("rank", Int32, "this rank"),
    Arg("timeout_ns", Int64, "the bound of every wait, in nanoseconds of %globaltimer"),
), emulated="data_mc")

#: The push all-reduce (:mod:`collectives.algorithms.push`): no multicast address of its
#: receive slots (its pushes are plain stores), but the table of every rank's result buffer.
PUSH_ALL_REDUCE = COLLECTIVE.renamed("PushAllReduceArgs", data_mc=Arg(
    "results", Int64, "device table of every rank's result buffer (emulated: its translation table of two "
                      "windows, the result buffers' and the signal pad's)"))

#: The stream-flag kernels (:mod:`collectives.algorithms.flags`): one thread, one GPU.
FLAGS = Layout("FlagArgs", (
    Arg("flags", Int64, "each slot's count of posts (int32[FLAG_SLOTS])"),
    Arg("consumed", Int64, "each slot's count of posts its consumer took"),
    Arg("index", Int32, "the slot"),
    Arg("err", Int64, "the error records"),
    Arg("rank", Int32, "this rank"),
    Arg("timeout_ns", Int64, "the bound of a wait"),
))

__all__ = ["COLLECTIVE", "FLAGS", "PUSH_ALL_REDUCE", "Arg", "KernelArgs", "Layout"]
