"""Device functions for ``griddepcontrol``: programmatic dependent launch (PDL).

A kernel launched with the programmatic stream serialization attribute may start while the
kernel before it in the stream still runs.  The earlier kernel calls
:func:`griddepcontrol_launch_dependents` once its CTAs no longer need the SMs to themselves (the
dependent is scheduled when every CTA has called it or exited); the dependent calls
:func:`griddepcontrol_wait` before it reads anything the earlier kernel writes.  Without a
programmatic dependency both are no-ops, so a kernel may use them whatever its launch.
"""

from __future__ import annotations

from cutlass.cutlass_dsl import dsl_user_op

from . import emit


@dsl_user_op
def griddepcontrol_launch_dependents(*, loc=None, ip=None) -> None:
    """``griddepcontrol.launch_dependents``: let the grids that depend on this one be
    scheduled once every CTA of this grid has issued this or completed.  It orders no memory:
    a dependent still calls :func:`griddepcontrol_wait` before it reads this grid's results.
    Repeated calls in one CTA add nothing."""
    emit.emit(emit.instruction("griddepcontrol.launch_dependents"), None, loc=loc, ip=ip)


@dsl_user_op
def griddepcontrol_wait(*, loc=None, ip=None) -> None:
    """``griddepcontrol.wait``: block this thread until every prerequisite grid in flight has
    completed and all its memory operations are performed and visible to this grid.  Call it
    before the first read of a prerequisite's output (and before writes the prerequisite may
    still read)."""
    emit.emit(emit.instruction("griddepcontrol.wait"), None, loc=loc, ip=ip)


__all__ = ["griddepcontrol_launch_dependents", "griddepcontrol_wait"]
