"""``ld`` and ``st``: state spaces, memory-ordering semantics, cache operators and hints.

PTX ISA 9.0, sections 9.7.9.8 (ld), 9.7.9.9 (ld.global.nc) and 9.7.9.10 (st).  Every state
space is in the domain; ``.param`` is legal PTX that ptxops does not wrap (no CuTeDSL pointer
addresses a parameter).  ``ld.global.nc``, the non-coherent read-only load, is the ``nc``
qualifier of ``ld``: it shares ld's operands, types and vectors, and its own syntax block of the
ISA (``ld.global{.cop}.nc{.L1::*}{.L2::*}{.L2::cache_hint}{.L2::size}{.vec}.type``) is written
as rules.  ``.L2::cache_hint`` adds a 64-bit cache-policy operand (from ``createpolicy``).
Not wrapped: the ``.unified`` address suffix and the sink ``_`` in vectors.
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, ptxas_record, rule
from .targets import WIDE_LDST

SCOPES = (None, "cta", "cluster", "gpu", "sys")
SHARED = ("shared", "shared::cta", "shared::cluster")
PARAM = ("param", "param::entry", "param::func")
SPACES = (None, "global", *SHARED, "local", "const", *PARAM)
#: Spaces where eviction priorities, the L2 cache hint and prefetch sizes do not apply.
UNCACHED = (*SHARED, "local", "const", *PARAM)
TYPES = (
    "b8", "b16", "b32", "b64", "b128", "u8", "u16", "u32", "u64",
    "s8", "s16", "s32", "s64", "f32", "f64",
)
WORD_TYPES = ("b32", "u32", "s32", "f32")
#: The 8- and 16-bit types.
SUBWORD_TYPES = ("b8", "u8", "s8", "b16", "u16", "s16")
DWORD_TYPES = ("b64", "u64", "s64", "f64")
L1_EVICTION = ("evict_normal", "evict_unchanged", "evict_first", "evict_last", "no_allocate")
L2_EVICTION = ("evict_normal", "evict_first", "evict_last")
PREFETCH = ("64B", "128B", "256B")
#: Cache operators (``.cop``): ld's default is ``.ca``, st's ``.wb``.
LD_CACHE = ("ca", "cg", "cs", "lu", "cv")
ST_CACHE = ("wb", "cg", "cs", "wt")
#: Cache operators of ld.global.nc.
NC_CACHE = ("ca", "cg", "cs")
SECTION = "9.7.9.8 ld, 9.7.9.9 ld.global.nc, 9.7.9.10 st (PTX ISA 9.0)"


def _rules(name: str, ordered: str) -> tuple[Rule, ...]:
    later_mmio = f"mmio.{ordered}"
    mmio = ("mmio.relaxed", later_mmio)
    strong = ("volatile", "relaxed", ordered, *mmio)
    return (
        rule(
            "scope-needs-order",
            f"{name}.weak (the default), {name}.volatile and no sem take no scope; write "
            f".relaxed or .{ordered} with a scope.",
            when={"sem": (None, "weak", "volatile")},
            allow={"scope": None},
        ),
        rule(
            "order-needs-scope",
            f"{name}.relaxed and {name}.{ordered} need a scope (.cta, .cluster, .gpu or .sys).",
            when={"sem": ("relaxed", ordered)},
            allow={"scope": SCOPES[1:]},
        ),
        rule(
            "mmio-needs-ptx-9.3",
            f"{name}.{later_mmio} arrives in PTX ISA 9.3; ptxas 13.0 reads PTX ISA 9.0, where "
            "only .mmio.relaxed exists.",
            when={"sem": later_mmio},
            allow={"sem": ()},
        ),
        rule(
            "mmio-sys-scope",
            "Only .sys scope is valid for an .mmio operation.",
            when={"sem": "mmio.relaxed"},
            allow={"scope": "sys"},
        ),
        rule(
            "mmio-global",
            ".mmio may be used only with .global space or generic addresses, and without "
            "a vector.",
            when={"sem": "mmio.relaxed"},
            allow={"space": (None, "global"), "vec": None},
        ),
        rule(
            "ordering-spaces",
            f".volatile, .relaxed and .{ordered} may be used only with .global and .shared "
            "spaces and generic addressing (.volatile with .local arrives in PTX ISA 9.1; "
            "ptxas 13.0 reads 9.0).",
            when={"sem": ("volatile", "relaxed", ordered)},
            allow={"space": (None, "global", *SHARED)},
        ),
        *(
            [rule(
                "st-no-const",
                "Stores to const memory are illegal.",
                when={"space": "const"},
                allow={"space": ()},
            ),
            rule(
                "st-param-func",
                "st.param has no ::entry: kernel parameters are read-only (st.param means "
                ".param::func).",
                when={"space": "param::entry"},
                allow={"space": ()},
            )]
            if name == "st" else []
        ),
        rule(
            "cache-op-weak-only",
            f"Cache operators are not permitted with .volatile, .relaxed, .{ordered} or .mmio: "
            "only a weak access takes one.",
            when={"sem": strong},
            allow={"cache": None},
        ),
        rule(
            "cache-op-or-eviction",
            "A cache operator and an eviction priority are alternatives (two syntax blocks of "
            f"{name}): give one or the other.",
            when={"cache": (LD_CACHE if name == "ld" else ST_CACHE)},
            allow={"l1_eviction": None},
        ),
        rule(
            "cache-op-or-l2-eviction",
            "A cache operator takes no L2 eviction priority either (the PTX ISA's syntax). "
            "ptxas 13.0 lets .L2::evict_* through with one; ptxops follows the ISA.",
            when={"cache": (LD_CACHE if name == "ld" else ST_CACHE)},
            allow={"l2_eviction": None},
            ptxas_enforced=False,
        ),
        rule(
            "volatile-no-eviction",
            f"{name}.volatile and {name}.mmio take no eviction priority.",
            when={"sem": ("volatile", *mmio)},
            allow={"l1_eviction": None},
        ),
        rule(
            "volatile-no-l2-eviction",
            f"{name}.volatile takes no L2 eviction priority either (the PTX ISA's syntax). "
            "ptxas 13.0 lets .L2::evict_* through with it; ptxops follows the ISA.",
            when={"sem": ("volatile", *mmio)},
            allow={"l2_eviction": None},
            ptxas_enforced=False,
        ),
        rule(
            "volatile-no-cache-hint",
            f"{name}.volatile and {name}.mmio take no .L2::cache_hint.",
            when={"sem": ("volatile", *mmio)},
            allow={"cache_hint": None},
        ),
        *(
            [rule(
                "mmio-no-prefetch",
                "ld.mmio takes no .L2 prefetch size.",
                when={"sem": mmio},
                allow={"prefetch": None},
            )]
            if name == "ld" else []
        ),
        rule(
            "eviction-global-only",
            "Eviction priorities apply only to the .global space and generic addresses.",
            when={"space": UNCACHED},
            allow={"l1_eviction": None, "l2_eviction": None},
        ),
        rule(
            "cache-hint-global-only",
            ".L2::cache_hint" + (" and the .L2 prefetch sizes apply" if name == "ld" else " applies")
            + " only to the .global space and generic addresses.",
            when={"space": UNCACHED},
            allow={k: None for k in ("cache_hint", "prefetch") if k != "prefetch" or name == "ld"},
        ),
        rule(
            "l2-eviction-256-bit",
            ".L2::evict_* applies only to a 256-bit access: .v8 of a 32-bit type or .v4 of "
            "a 64-bit type.",
            when={"l2_eviction": L2_EVICTION},
            allow={"vec": (4, 8)},
        ),
        rule(
            "l2-eviction-v8",
            ".L2::evict_* with .v8 needs a 32-bit type (a 256-bit access).",
            when={"l2_eviction": L2_EVICTION, "vec": 8},
            allow={"type": WORD_TYPES},
        ),
        rule(
            "l2-eviction-v4",
            ".L2::evict_* with .v4 needs a 64-bit type (a 256-bit access).",
            when={"l2_eviction": L2_EVICTION, "vec": 4},
            allow={"type": DWORD_TYPES},
        ),
        *(_nc_rules() if name == "ld" else ()),
        rule(
            "b128-scalar",
            ".b128 takes no vector (ptxas: \"Vector type too large, exceeds 128 bit limit\").",
            when={"type": "b128"},
            allow={"vec": None},
        ),
        rule(
            "v4-64bit-wide",
            ".v4 of a 64-bit type is a 256-bit access: sm_100 or newer, .global or generic only.",
            when={"vec": 4, "type": DWORD_TYPES},
            allow={"target": WIDE_LDST, "space": (None, "global")},
        ),
        rule(
            "v8-32bit-only",
            ".v8 is supported only with .b32, .s32, .u32 or .f32 (a 256-bit access). ptxas 13.0 "
            "and 13.5 let .v8 of 8- and 16-bit types through their checks (and then crash on "
            "ld); the PTX ISA forbids them, so ptxops does too.",
            when={"vec": 8},
            allow={"type": WORD_TYPES},
            ptxas_enforced=False,
            ptxas=[ptxas_record(("13.0", "13.5"), "crashes", type=SUBWORD_TYPES)] if name == "ld" else (),
        ),
        rule(
            "v8-wide",
            ".v8 of a 32-bit type is a 256-bit access: sm_100 or newer, .global or generic only.",
            when={"vec": 8, "type": WORD_TYPES},
            allow={"target": WIDE_LDST, "space": (None, "global")},
        ),
        rule(
            "v8-64bit",
            "No vector of 64-bit values is wider than .v4.",
            when={"type": DWORD_TYPES},
            allow={"vec": (None, 2, 4)},
        ),
        rule(
            "param-not-wrapped",
            f"{name}.param "
            + ("reads kernel or device-function parameters"
               if name == "ld" else "passes device-function call arguments (ptxas 13.0 and 13.5 "
               "crash on it inside a kernel)")
            + "; no CuTeDSL pointer addresses the .param space, so ptxops does not wrap it."
            + (" ptxas 13.5 rejects ld.param::func inside a kernel (\"Illegal state space for "
               "address operand '::func'\"), which 13.0 assembles." if name == "ld" else ""),
            when={"space": PARAM},
            allow={"space": ()},
            ptxas_enforced=False,
            wrapped=False,
            ptxas=[ptxas_record("13.5", "rejects", space="param::func")] if name == "ld"
            else [ptxas_record(("13.0", "13.5"), "crashes")],
        ),
    )


def _nc_rules() -> tuple[Rule, ...]:
    """ld.global.nc: ``ld.global{.cop}.nc{.L1::*}{.L2::*}{.L2::cache_hint}{.L2::size}...``."""
    return (
        rule(
            "nc-global",
            "ld.global.nc reads the .global space only (write space='global').",
            when={"nc": "nc"},
            allow={"space": "global"},
        ),
        rule(
            "nc-no-sem",
            "ld.global.nc is a weak read-only load with no memory-ordering qualifier, not even "
            ".weak.",
            when={"nc": "nc"},
            allow={"sem": None},
        ),
        rule(
            "nc-cache-ops",
            "ld.global.nc takes only the cache operators .ca, .cg and .cs.",
            when={"nc": "nc"},
            allow={"cache": (None, *NC_CACHE)},
        ),
    )


def _family(name: str, ordered: str, operands: tuple[str, ...], summary: str, fn: str) -> Family:
    ld = name == "ld"
    return Family(
        name=name,
        summary=summary,
        qualifiers=(
            Qualifier(
                "sem",
                (None, "weak", "relaxed", ordered, "volatile", "mmio.relaxed", f"mmio.{ordered}"),
                "memory-ordering semantics",
                absent="weak",
            ),
            Qualifier("scope", SCOPES, "the set of threads the ordering is with"),
            Qualifier("space", SPACES, "state space (absent: generic addressing)", absent="generic"),
            Qualifier(
                "cache", (None, *(LD_CACHE if ld else ST_CACHE)), "cache operator",
                absent="ca" if ld else "wb",
            ),
            *([Qualifier("nc", (None, "nc"), "non-coherent read-only load (ld.global.nc)")] if ld else []),
            Qualifier(
                "l1_eviction", (None, *L1_EVICTION), "L1 eviction priority", prefix=".L1::",
                absent="evict_normal",
            ),
            Qualifier("l2_eviction", (None, *L2_EVICTION), "L2 eviction priority", prefix=".L2::"),
            Qualifier(
                "cache_hint", (None, "cache_hint"),
                "L2 cache hint: a 64-bit cache-policy operand follows the address", prefix=".L2::",
            ),
            *([Qualifier("prefetch", (None, *PREFETCH), "L2 prefetch size", prefix=".L2::")] if ld else []),
            Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
            Qualifier("type", TYPES, "data type"),
        ),
        rules=_rules(name, ordered),
        operands=operands,
        device_function=fn,
        section=SECTION,
        operand_variants={"cache_hint=cache_hint": (*operands, "policy")},
    )


LD = _family("ld", "acquire", ("d", "a"), "Load from memory: weak, relaxed, acquire, volatile or mmio, with cache operators and hints; ld.global.nc.", "ld")
ST = _family("st", "release", ("a", "b"), "Store to memory: weak, relaxed, release, volatile or mmio, with cache operators and hints.", "st")

FAMILIES = (LD, ST)
