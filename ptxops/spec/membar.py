"""``membar``: the older memory barrier, a synonym of ``fence.sc``.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: membar/fence.
``membar.level`` makes this thread's memory accesses before it performed, at the level, before
its accesses after it.  The PTX ISA: "On sm_70 and higher membar is a synonym for fence.sc",
with the levels ``.cta``, ``.gl`` and ``.sys`` synonymous with the fence scopes ``.cta``,
``.gpu`` and ``.sys``: ``membar.gl`` is ``fence.sc.gpu``, stronger (and slower) than the
``fence.acq_rel.gpu`` a release/acquire pattern needs.  ``membar.{cta,gl}`` came in PTX ISA 1.4,
``membar.sys`` in PTX ISA 2.0; every target ptxops knows has them.  ``membar.proxy`` is a
synonym of ``fence.proxy``: use the ``fence`` family's proxy forms.
"""

from __future__ import annotations

from .engine import Family, Qualifier

#: The fence scope each membar level is a synonym of (``membar.level`` = ``fence.sc.scope``).
FENCE_SCOPE = {"cta": "cta", "gl": "gpu", "sys": "sys"}

MEMBAR = Family(
    name="membar",
    summary="Memory barrier at a level (cta, gl, sys): a synonym of fence.sc at the scope "
    "cta, gpu, sys.",
    qualifiers=(
        Qualifier(
            "level", tuple(FENCE_SCOPE),
            "the set of threads that observe the ordering: the CTA, the GPU (gl) or the system",
        ),
    ),
    rules=(),
    operands=(),
    device_function="membar",
    section="Parallel Synchronization and Communication Instructions: membar/fence "
    "(membar.cta/.gl PTX ISA 1.4, .sys PTX ISA 2.0)",
)

FAMILIES = (MEMBAR,)
__all__ = ["FAMILIES", "FENCE_SCOPE", "MEMBAR"]
