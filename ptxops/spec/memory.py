"""``ld`` and ``st`` with memory-ordering semantics.

PTX ISA 9.0, sections 9.7.9.8 (ld) and 9.7.9.10 (st).  The state spaces are the ones
communication code addresses: generic, global and shared (``local``/``const``/``param`` are
left out).  Cache operators and eviction hints are not wrapped.
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, rule
from .targets import WIDE_LDST

SCOPES = (None, "cta", "cluster", "gpu", "sys")
SPACES = (None, "global", "shared", "shared::cta", "shared::cluster")
TYPES = (
    "b8", "b16", "b32", "b64", "b128", "u8", "u16", "u32", "u64",
    "s8", "s16", "s32", "s64", "f32", "f64",
)
WORD_TYPES = ("b32", "u32", "s32", "f32")
DWORD_TYPES = ("b64", "u64", "s64", "f64")
SECTION = "9.7.9.8 ld, 9.7.9.10 st (PTX ISA 9.0)"


def _rules(name: str, ordered: str) -> tuple[Rule, ...]:
    later_mmio = f"mmio.{ordered}"
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
            "lets .v8 of 8- and 16-bit types through its checks (and then crashes on ld); the "
            "PTX ISA forbids them, so ptxops does too.",
            when={"vec": 8},
            allow={"type": WORD_TYPES},
            ptxas_enforced=False,
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
    )


def _family(name: str, ordered: str, operands: tuple[str, ...], summary: str, fn: str) -> Family:
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
            Qualifier("vec", (None, 2, 4, 8), "vector width", prefix=".v"),
            Qualifier("type", TYPES, "data type"),
        ),
        rules=_rules(name, ordered),
        operands=operands,
        device_function=fn,
        section=SECTION,
    )


LD = _family("ld", "acquire", ("d", "a"), "Load from memory, weak, relaxed, acquire, volatile or mmio.", "ld")
ST = _family("st", "release", ("a", "b"), "Store to memory, weak, relaxed, release, volatile or mmio.", "st")

FAMILIES = (LD, ST)
