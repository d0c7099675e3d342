"""``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait``: programmatic dependent
launch (PDL), the overlap of a kernel's launch with the tail of the kernel before it.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: griddepcontrol
(introduced in PTX ISA 7.8, requires sm_90 or higher).  When the runtime launches a grid as
programmatically dependent on another (``cudaLaunchAttributeProgrammaticStreamSerialization``),
``.launch_dependents`` in the prerequisite grid lets the dependent be scheduled once every CTA of
the prerequisite has issued it or completed; the dependent may then start before the
prerequisite completes, but need not.  Repeated calls in one CTA add nothing.  ``.wait`` in the
dependent blocks the thread until every prerequisite grid in flight has completed and all of its
memory operations are performed and visible to this grid.  Without a programmatic dependency
both are no-ops.
"""

from __future__ import annotations

from .engine import Family

SECTION = (
    "Parallel Synchronization and Communication Instructions: griddepcontrol "
    "(PTX ISA 7.8, sm_90+)"
)

LAUNCH_DEPENDENTS = Family(
    name="griddepcontrol.launch_dependents",
    summary="Let the grids that depend on this one be scheduled once every CTA of this grid "
    "has issued it or completed (programmatic dependent launch).",
    qualifiers=(),
    rules=(),
    operands=(),
    device_function="griddepcontrol_launch_dependents",
    section=SECTION,
)

WAIT = Family(
    name="griddepcontrol.wait",
    summary="Wait until every prerequisite grid in flight has completed and its memory "
    "operations are visible to this grid (programmatic dependent launch).",
    qualifiers=(),
    rules=(),
    operands=(),
    device_function="griddepcontrol_wait",
    section=SECTION,
)

FAMILIES = (LAUNCH_DEPENDENTS, WAIT)
__all__ = ["FAMILIES", "LAUNCH_DEPENDENTS", "WAIT"]
