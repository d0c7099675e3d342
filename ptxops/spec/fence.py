"""``fence``: memory fences, proxy fences and their restricted forms.

PTX ISA 9.0, section 9.7.13.4 (membar/fence).  ``fence.sem.scope`` orders this thread's memory
operations; ``fence.proxy.*`` orders across proxies (the generic proxy against the async proxy
of TMA and multicast, or the tensormap proxy); ``mbarrier_init`` and ``sync_restrict`` are
cluster-scoped lightweight variants.
"""

from __future__ import annotations

from .engine import Family, Qualifier, ptxas_record, rule

SCOPES = ("cta", "cluster", "gpu", "sys")
BIDIRECTIONAL = ("alias", "async", "async.global", "async.shared::cta", "async.shared::cluster")
#: ptxas 13.5 assembles the ``.acq_rel`` forms of the one-way proxy fences, which the ISA and
#: ptxas 13.0 do not have.
ASSEMBLES_ACQ_REL = ptxas_record("13.5", "assembles", sem="acq_rel")

FENCE = Family(
    name="fence",
    summary="Memory fence: order memory operations at a scope, or across proxies.",
    qualifiers=(
        Qualifier(
            "proxy", (None,) + BIDIRECTIONAL + ("tensormap::generic", "async::generic"),
            "proxy kind (absent: an ordinary fence)", prefix=".proxy.",
        ),
        Qualifier("op_restrict", (None, "mbarrier_init"), "restrict to mbarrier.init ordering"),
        Qualifier(
            "sem", (None, "sc", "acq_rel", "acquire", "release"), "fence semantics",
            absent="acq_rel",
        ),
        Qualifier(
            "sync_restrict", (None, "shared::cta", "shared::cluster"),
            "restrict to shared-memory synchronisation", prefix=".sync_restrict::",
        ),
        Qualifier("scope", (None,) + SCOPES, "the set of threads the fence orders with"),
    ),
    rules=(
        rule(
            "scope-required",
            "A fence (other than a bidirectional proxy fence) needs a scope (ptxas: \"Scope "
            "modifier required for instruction 'fence'\").",
            when={"proxy": (None, "tensormap::generic", "async::generic")},
            allow={"scope": SCOPES},
        ),
        rule(
            "bidirectional-proxy-bare",
            "Bidirectional proxy fences (fence.proxy.alias/async/async.global/async.shared::*) "
            "take no sem, no scope and no restriction.",
            when={"proxy": BIDIRECTIONAL},
            allow={"sem": None, "scope": None, "op_restrict": None},
        ),
        rule(
            "tensormap-sem",
            "fence.proxy.tensormap::generic is .release, or .acquire with operands [a], 128 "
            "(the ISA's syntax: fence.proxy.tensormap::generic.release.scope and "
            "...acquire.scope [addr], size).  ptxas 13.5 also assembles .acq_rel here, without "
            "operands; ptxas 13.0 and the ISA do not, and ptxops follows them.",
            when={"proxy": "tensormap::generic"},
            allow={"sem": ("acquire", "release"), "op_restrict": None},
            ptxas=[ASSEMBLES_ACQ_REL],
        ),
        rule(
            "tensormap-acquire-unrestricted",
            "fence.proxy.tensormap::generic.acquire takes no .sync_restrict (ptxas: \"Illegal "
            "modifier '.sync_restrict::shared::cta' for instruction 'fence.proxy'\").",
            when={"proxy": "tensormap::generic", "sem": "acquire"},
            allow={"sync_restrict": None},
        ),
        rule(
            "async-generic-restricted",
            "fence.proxy.async::generic exists only with a .sync_restrict qualifier (ptxas 13.5 "
            "also assembles fence.proxy.async::generic.acq_rel.scope, which the ISA does not list).",
            when={"proxy": "async::generic"},
            allow={"sync_restrict": ("shared::cta", "shared::cluster"), "op_restrict": None},
            ptxas=[ASSEMBLES_ACQ_REL],
        ),
        rule(
            "mbarrier-init",
            "fence.mbarrier_init exists only as fence.mbarrier_init.release.cluster.",
            when={"op_restrict": "mbarrier_init"},
            allow={"proxy": None, "sem": "release", "scope": "cluster"},
        ),
        rule(
            "sync-restrict-placement",
            ".sync_restrict goes only on fence.acquire/.release and fence.proxy.async::generic. "
            "ptxas 13.0 accepts and ignores it on the proxy, tensormap and mbarrier_init fences; "
            "the PTX ISA gives those forms no .sync_restrict, so ptxops rejects it there.",
            when={"sync_restrict": ("shared::cta", "shared::cluster")},
            allow={"proxy": (None, "async::generic"), "op_restrict": None},
            ptxas_enforced=False,
        ),
        rule(
            "sync-restrict-cta",
            ".sync_restrict::shared::cta requires .release and .cluster scope (ptxas 13.5 also "
            "assembles fence.proxy.async::generic.acq_rel.sync_restrict::shared::cta at any scope).",
            when={"sync_restrict": "shared::cta", "proxy": (None, "async::generic"), "op_restrict": None},
            allow={"sem": "release", "scope": "cluster"},
            ptxas=[ptxas_record("13.5", "assembles", proxy="async::generic", sem="acq_rel")],
        ),
        rule(
            "sync-restrict-cluster",
            ".sync_restrict::shared::cluster requires .acquire and .cluster scope (ptxas 13.5 also "
            "assembles fence.proxy.async::generic.acq_rel.sync_restrict::shared::cluster at any scope).",
            when={"sync_restrict": "shared::cluster", "proxy": (None, "async::generic"), "op_restrict": None},
            allow={"sem": "acquire", "scope": "cluster"},
            ptxas=[ptxas_record("13.5", "assembles", proxy="async::generic", sem="acq_rel")],
        ),
    ),
    operands=(),
    operand_variants={"proxy=tensormap::generic,sem=acquire": ("a", "128")},
    device_function="fence",
    section="9.7.13.4 membar/fence (PTX ISA 9.0)",
)

FAMILIES = (FENCE,)
