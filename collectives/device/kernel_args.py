"""The kernels' view of their runtime arguments, whose layouts are declared once in
:mod:`collectives.layouts` (:class:`~collectives.layouts.Layout`: names, types and meanings in
launch order, the host's packing of a launch): :class:`KernelArgs`, fields by name; each
argument's CuTeDSL type (:func:`dsl_type`), and the placeholder arguments of a compile without
a GPU (:func:`examples`).  The launchers' signatures derive from the same layouts
(:func:`collectives.device.launch.launcher`).

``multicast_emulated``: the host passes a translation table where the layout says
"multicast address" (see :func:`ptxops.translation_table`); the launcher traces the body under
:func:`ptxops.emulate_multicast` and hands it the windows' fake multicast bases instead.
"""

from __future__ import annotations

from typing import Any

from cutlass import Int32, Int64
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

from ..layouts import ARG_TYPES, Arg, Layout

#: The CuTeDSL type of each of :data:`~collectives.layouts.ARG_TYPES`.
DSL_TYPES = {"Int32": Int32, "Int64": Int64}
assert set(DSL_TYPES) == set(ARG_TYPES) and all(t.width == ARG_TYPES[n] for n, t in DSL_TYPES.items())


def dsl_type(arg: Arg) -> type:
    """The CuTeDSL type of ``arg``."""
    return DSL_TYPES[arg.type]


def examples(layout: Layout) -> tuple:
    """Placeholder values of every argument of ``layout`` (compiling without a GPU)."""
    return tuple(dsl_type(a)(0) for a in layout.args)


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


__all__ = ["DSL_TYPES", "KernelArgs", "dsl_type", "examples"]
