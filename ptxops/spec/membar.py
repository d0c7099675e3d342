"""``membar``: the older memory barrier, a synonym of ``fence.sc``.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: membar/fence.
``membar.level`` makes this thread's memory accesses before it performed, at the level, before
its accesses after it.  The PTX ISA: "On sm_70 and higher membar is a synonym for fence.sc",
with the levels ``.cta``, ``.gl`` and ``.sys`` synonymous with the fence scopes ``.cta``,
``.gpu`` and ``.sys``: ``membar.gl`` is ``fence.sc.gpu``, stronger (and slower) than the
``fence.acq_rel.gpu`` a release/acquire pattern needs.  ``membar.{cta,gl}`` came in PTX ISA 1.4,
``membar.sys`` in PTX ISA 2.0; every target ptxops knows has them.  ``membar.proxy.proxykind``
is the old spelling of the bidirectional proxy fence ``fence.proxy.proxykind`` (the ISA lists
``.alias``, ``.async``, ``.async.global``, ``.async.shared::{cta,cluster}``); ptxas accepts
fewer of them (rule ``proxy-kinds-ptxas``: ``.alias``, and ``.async`` from ptxas 13.5 on), so new
code wants the ``fence`` family's proxy forms.
"""

from __future__ import annotations

from .engine import Family, Qualifier, ptxas_record, rule

#: The fence scope each membar level is a synonym of (``membar.level`` = ``fence.sc.scope``).
FENCE_SCOPE = {"cta": "cta", "gl": "gpu", "sys": "sys"}

#: The proxy kinds of ``membar.proxy`` the PTX ISA lists (those of ``fence.proxy``).
PROXY_KINDS = ("alias", "async", "async.global", "async.shared::cta", "async.shared::cluster")
#: The ones ptxas assembles (13.5; 13.0 only ``alias``).
PTXAS_PROXY_KINDS = ("alias", "async")

MEMBAR = Family(
    name="membar",
    summary="Memory barrier at a level (cta, gl, sys): a synonym of fence.sc at the scope "
    "cta, gpu, sys; or membar.proxy, a bidirectional proxy fence.",
    qualifiers=(
        Qualifier(
            "level", (None, *FENCE_SCOPE),
            "the set of threads that observe the ordering: the CTA, the GPU (gl) or the system",
        ),
        Qualifier(
            "proxy", (None, *PROXY_KINDS),
            "membar.proxy: the proxies ordered (a synonym of fence.proxy with that kind)",
            prefix=".proxy.",
        ),
    ),
    rules=(
        rule(
            "level-or-proxy",
            "membar takes a level (membar.level) or a proxy kind (membar.proxy.proxykind), not "
            "both.",
            when={"proxy": PROXY_KINDS},
            allow={"level": None},
        ),
        rule(
            "level-needed",
            "membar without .proxy needs a level: .cta, .gl or .sys.",
            when={"proxy": None},
            allow={"level": tuple(FENCE_SCOPE)},
        ),
        rule(
            "proxy-kinds-ptxas",
            "The PTX ISA lists membar.proxy.{alias, async, async.global, async.shared::cta, "
            "async.shared::cluster}, but ptxas assembles only membar.proxy.alias and "
            "membar.proxy.async (ptxas 13.0 only .alias: \"Illegal modifier '.async' for "
            "instruction 'membar.proxy'\"; neither takes a state space: \"State space incorrect "
            "for instruction 'membar.proxy'\").  Write fence(proxy=...), its synonym, for the others.",
            when={"proxy": PROXY_KINDS},
            allow={"proxy": PTXAS_PROXY_KINDS},
            isa_allows=True,
            ptxas=[ptxas_record("13.0", "rejects", proxy="async")],
        ),
    ),
    operands=(),
    device_function="membar",
    section="Parallel Synchronization and Communication Instructions: membar/fence "
    "(membar.cta/.gl PTX ISA 1.4, .sys PTX ISA 2.0)",
)

FAMILIES = (MEMBAR,)
__all__ = ["FAMILIES", "FENCE_SCOPE", "MEMBAR", "PROXY_KINDS", "PTXAS_PROXY_KINDS"]
