"""``mbarrier.init``, ``mbarrier.arrive`` and ``mbarrier.try_wait``: the shared-memory barrier
objects that TMA pipelines count arrivals and bulk-copy bytes on.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: mbarrier.  An mbarrier is
a 64-bit object in shared memory.  ``init`` sets the number of arrivals a phase expects;
``arrive`` counts one (``.expect_tx`` also raises the bytes the phase waits for, which
``cp.async.bulk...mbarrier::complete_tx::bytes`` count down) and returns an opaque state;
``try_wait`` tests for the end of the phase that state (or, with ``.parity``, a phase parity)
names, suspending the thread for a while first.  The arrival-count operand of ``arrive``,
``.noComplete``, ``arrive_drop``, ``test_wait``, ``expect_tx`` on its own, ``complete_tx`` and the
suspend-time hint of ``try_wait`` are not wrapped.
"""

from __future__ import annotations

from .engine import Family, Qualifier, Rule, implied, rule

SECTION = "Parallel Synchronization and Communication Instructions: mbarrier (PTX ISA 9.0)"
SCOPES = (None, "cta", "cluster")
SPACES = (None, "shared", "shared::cta", "shared::cluster")
LOCAL = (None, "shared", "shared::cta")

_SPACE = Qualifier(
    "space", SPACES, "state space of the mbarrier (absent: generic addressing)", absent="generic",
)
_TYPE = implied("type", "b64", "the mbarrier object is always .b64", by={})
_SCOPE_DOC = "the set of threads the ordering is with"


def _sem_scope_rules(name: str, sem: str) -> tuple[Rule, ...]:
    """A sem and a scope go together on mbarrier operations (ptxas enforces both directions)."""
    return (
        rule(
            "sem-needs-scope",
            f"{name} with a sem (.relaxed or .{sem}) needs a scope, .cta or .cluster (ptxas: "
            f"\"Modifier '.{sem}' requires scope with '{name}' instruction\").",
            when={"sem": ("relaxed", sem)},
            allow={"scope": SCOPES[1:]},
        ),
        rule(
            "scope-needs-sem",
            f"{name} with a scope needs a sem, .relaxed or .{sem} (ptxas: \"Modifier '.cta' "
            f"requires order with '{name}' instruction\"); leave both out for .{sem}.cta.",
            when={"sem": None},
            allow={"scope": None},
        ),
    )


MBARRIER_INIT = Family(
    name="mbarrier.init",
    summary="Initialise an mbarrier object with the number of arrivals each phase expects.",
    qualifiers=(_SPACE, _TYPE),
    rules=(
        rule(
            "init-local",
            "mbarrier.init takes {.shared{::cta}} or generic addressing: an mbarrier is "
            "initialised by a thread of its own CTA (ptxas: \"Illegal modifier '::cluster' for "
            "instruction 'mbarrier.init'\").",
            allow={"space": LOCAL},
        ),
    ),
    operands=("a", "count"),
    device_function="mbarrier_init",
    section=SECTION,
)

MBARRIER_ARRIVE = Family(
    name="mbarrier.arrive",
    summary="Arrive on an mbarrier (with .expect_tx, also raise the bytes the phase waits for); "
    "returns the phase state.",
    qualifiers=(
        Qualifier(
            "expect_tx", (None, "expect_tx"),
            "first raise the phase's expected transaction count by tx bytes",
        ),
        Qualifier("sem", (None, "relaxed", "release"), "memory-ordering semantics", absent="release"),
        Qualifier("scope", SCOPES, _SCOPE_DOC, absent="cta"),
        _SPACE,
        _TYPE,
    ),
    rules=_sem_scope_rules("mbarrier.arrive", "release"),
    operands=("d", "a"),
    operand_variants={
        # "The destination of an arrive on a .shared::cluster mbarrier is the sink _" (ptxas:
        # "Sink '_' is expected as a destination operand ... with '.shared::cluster'").
        "expect_tx=expect_tx,space=shared::cluster": ("_", "a", "tx"),
        "expect_tx=None,space=shared::cluster": ("_", "a"),
        "expect_tx=expect_tx": ("d", "a", "tx"),
    },
    device_function="mbarrier_arrive",
    section=SECTION,
)

MBARRIER_TRY_WAIT = Family(
    name="mbarrier.try_wait",
    summary="Test, after a bounded suspension, whether the phase named by a state (or, with "
    ".parity, a phase parity) has completed; returns a predicate.",
    qualifiers=(
        Qualifier(
            "parity", (None, "parity"),
            "name the phase by its parity (0 or 1) instead of an arrive's state",
        ),
        Qualifier("sem", (None, "relaxed", "acquire"), "memory-ordering semantics", absent="acquire"),
        Qualifier("scope", SCOPES, _SCOPE_DOC, absent="cta"),
        _SPACE,
        _TYPE,
    ),
    rules=_sem_scope_rules("mbarrier.try_wait", "acquire") + (
        rule(
            "wait-local",
            "mbarrier.try_wait takes {.shared{::cta}} or generic addressing: a thread waits "
            "only on an mbarrier of its own CTA (ptxas: \"Illegal modifier '::cluster' for "
            "instruction 'mbarrier.try_wait'\").",
            allow={"space": LOCAL},
        ),
    ),
    operands=("p", "a", "state"),
    operand_variants={"parity=parity": ("p", "a", "phase")},
    device_function="mbarrier_try_wait",
    section=SECTION,
)

FAMILIES = (MBARRIER_INIT, MBARRIER_ARRIVE, MBARRIER_TRY_WAIT)
__all__ = ["FAMILIES", "MBARRIER_ARRIVE", "MBARRIER_INIT", "MBARRIER_TRY_WAIT"]
