"""``prefetch``, ``prefetchu`` and ``cp.async.bulk.prefetch``: bring data (or a tensor map) into
a cache ahead of its use, without loading it into registers.

PTX ISA 9.0, Data Movement and Conversion Instructions: prefetch, prefetchu and
cp.async.bulk.prefetch.  ``prefetch{.space}.level [a]`` brings the line holding ``a`` (in
``.global`` or ``.local`` memory, or a generic address in either) into the L1 or L2 cache
(PTX ISA 2.0); ``prefetch.global.L2::evict_last`` / ``.L2::evict_normal`` prefetch into L2
with that eviction priority (PTX ISA 7.4, sm_80+; ``.global`` written out, as the ISA's syntax
has it); ``prefetch{.const,.param}.tensormap [a]``
brings the 128-byte tensor map at ``a`` into the cache the tensor-map proxy reads (PTX ISA 8.0,
sm_90+).  ``prefetchu.L1 [a]`` brings the line at the generic address ``a`` into the uniform
cache.  ``cp.async.bulk.prefetch.L2.global [a], size`` asynchronously prefetches ``size`` bytes
(a multiple of 16, ``a`` 16-byte aligned) of global memory into L2, optionally under an L2
cache policy (``.L2::cache_hint``, PTX ISA 8.0, sm_90+).  None of them has a visible effect on
memory: a prefetch is a hint, never a load the memory model orders.
"""

from __future__ import annotations

from .engine import Family, Qualifier, implied, rule

CACHE_LEVELS = ("L1", "L2")
EVICTION = ("L2::evict_last", "L2::evict_normal")
PARAM = "param"

PREFETCH = Family(
    name="prefetch",
    summary="Prefetch the line at an address into the L1 or L2 cache (L2 with an eviction "
    "priority), or a tensor map into the tensor-map cache.",
    qualifiers=(
        Qualifier(
            "space", (None, "global", "local", "const", PARAM),
            "state space of the address (absent: generic addressing)", absent="generic",
        ),
        Qualifier(
            "level", CACHE_LEVELS + EVICTION + ("tensormap",),
            "what is prefetched where: the line into L1 or L2, into L2 with an eviction "
            "priority, or the 128-byte tensor map at the address (.tensormap)",
        ),
    ),
    rules=(
        rule(
            "cache-spaces",
            "A prefetch into L1 or L2 addresses .global or .local memory, or a generic address "
            "(ptxas: \"State space incorrect for instruction 'prefetch'\").",
            when={"level": CACHE_LEVELS + EVICTION},
            allow={"space": (None, "global", "local")},
        ),
        rule(
            "eviction-priority-global",
            "An L2 eviction priority (.L2::evict_last, .L2::evict_normal) is for .global memory "
            "(PTX ISA 7.4, sm_80+; ptxas: \"State space incorrect for feature 'cache eviction "
            "priority'\" for .local).",
            when={"level": EVICTION},
            allow={"space": (None, "global")},
        ),
        rule(
            "eviction-priority-names-global",
            "The PTX ISA's syntax writes the space: prefetch.global.level::eviction_priority "
            "[a] (\".global\" is not optional there, as it is in prefetch{.space}.level).  "
            "ptxas 13.0 and 13.5 assemble prefetch.L2::evict_last on a generic address too; "
            "ptxops follows the ISA (pass a global pointer, or space='global').",
            when={"level": EVICTION},
            allow={"space": "global"},
            ptxas_enforced=False,
        ),
        rule(
            "tensormap-spaces",
            "prefetch.tensormap addresses a tensor map in .const or .param space, or through a "
            "generic address (PTX ISA 8.0, sm_90+; ptxas: \"Modifier '.tensormap' cannot be "
            "applied to '.global' space\").",
            when={"level": "tensormap"},
            allow={"space": (None, "const", PARAM)},
        ),
        rule(
            "param-not-wrapped",
            "prefetch.param.tensormap prefetches a tensor map passed as a kernel parameter; no "
            "CuTeDSL pointer addresses the .param space, so ptxops does not wrap it: prefetch a "
            "TMA atom's own tensor map (a kernel parameter) with CuTeDSL's "
            "cute.nvgpu.cpasync.prefetch_descriptor(atom), or pass a tensor map's generic "
            "address to prefetch(level='tensormap').",
            when={"space": PARAM},
            allow={"space": ()},
            ptxas_enforced=False,
            wrapped=False,
        ),
    ),
    operands=("a",),
    device_function="prefetch",
    section="Data Movement and Conversion Instructions: prefetch, prefetchu (PTX ISA 2.0; "
    "eviction priority 7.4, sm_80+; tensormap 8.0, sm_90+)",
)

PREFETCHU = Family(
    name="prefetchu",
    summary="Prefetch the line at a generic address into the uniform cache.",
    qualifiers=(Qualifier("level", ("L1",), "the uniform cache (.L1 only)"),),
    rules=(),
    operands=("a",),
    device_function="prefetchu",
    section="Data Movement and Conversion Instructions: prefetch, prefetchu (PTX ISA 2.0)",
)

CP_ASYNC_BULK_PREFETCH = Family(
    name="cp.async.bulk.prefetch",
    summary="Prefetch a contiguous block of global memory into the L2 cache asynchronously "
    "(TMA, no tensor map).",
    qualifiers=(
        implied("level", "L2", "the cache prefetched into: always .L2", by={}),
        implied("space", "global", "the state space of the source: always .global", by={}),
        Qualifier(
            "cache_hint", (None, "cache_hint"),
            "prefetch under the 64-bit L2 cache policy operand (createpolicy)",
            prefix=".L2::",
        ),
    ),
    rules=(),
    operands=("a", "size"),
    operand_variants={"cache_hint=cache_hint": ("a", "size", "policy")},
    device_function="cp_async_bulk_prefetch",
    section="Data Movement and Conversion Instructions: cp.async.bulk.prefetch "
    "(PTX ISA 8.0, sm_90+)",
)

FAMILIES = (PREFETCH, PREFETCHU, CP_ASYNC_BULK_PREFETCH)
__all__ = ["CP_ASYNC_BULK_PREFETCH", "FAMILIES", "PREFETCH", "PREFETCHU"]
