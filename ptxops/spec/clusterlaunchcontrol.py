"""``clusterlaunchcontrol.try_cancel`` and ``clusterlaunchcontrol.query_cancel``: a running
persistent kernel takes over the work of a cluster that has not started yet.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: clusterlaunchcontrol
(introduced in PTX ISA 8.6, requires sm_100 or higher).  ``try_cancel`` asks, asynchronously,
to cancel the launch of a cluster of this grid that has not started running; it writes a
16-byte opaque response to ``[addr]`` (16-byte aligned) and completes on the mbarrier at
``[mbar]`` with a complete-tx of 16 bytes at cluster scope (so the caller arrives on that
mbarrier expecting 16 transaction bytes).  With ``.shared::cta`` both addresses are in this
CTA's shared memory; without it they are generic addresses of it.  Once a CTA has observed a
failed response, another ``try_cancel`` from it is undefined.  ``query_cancel`` decodes a
response held in a ``.b128`` register: ``.is_canceled`` (a predicate, true when the cluster was
canceled) or ``.get_first_ctaid`` (the ctaid of the canceled cluster's first CTA: ``.v4.b32``
x, y, z and an undefined fourth, or one ``::x``/``::y``/``::z`` ``.b32``), undefined for a failed
response.  ``try_cancel.multicast::cluster::all`` writes the response to the same shared-memory
offset of every CTA of the cluster and completes on the mbarrier at the same offset in each.
"""

from __future__ import annotations

from .engine import Family, Qualifier, implied, rule
from .targets import SM100_ON

SECTION = (
    "Parallel Synchronization and Communication Instructions: clusterlaunchcontrol "
    "(PTX ISA 8.6, sm_100+)"
)
MBARRIER = "mbarrier::complete_tx::bytes"
CTAID = ("get_first_ctaid", "get_first_ctaid::x", "get_first_ctaid::y", "get_first_ctaid::z")


def _target_rule(name: str) -> tuple:
    return (
        rule(
            "target",
            f"clusterlaunchcontrol.{name} needs sm_100 or later (PTX ISA 8.6; ptxas: "
            "\"Feature ... requires .target sm_100 or higher\").",
            allow={"target": SM100_ON},
        ),
    )


TRY_CANCEL = Family(
    name="clusterlaunchcontrol.try_cancel",
    summary="Ask asynchronously to cancel the launch of a cluster that has not started; the "
    "16-byte response completes on an mbarrier (sm_100+).",
    qualifiers=(
        implied("async", "async", "the request is asynchronous: always .async", by={}),
        Qualifier(
            "space", (None, "shared::cta"),
            "state space of the response and the mbarrier: this CTA's shared memory (absent: "
            "generic addresses of it)", absent="generic",
        ),
        implied("completion", MBARRIER, "completes on the mbarrier operand", by={}),
        Qualifier(
            "multicast", (None, "multicast::cluster::all"),
            "write the response (and complete on the mbarrier) at the same offsets in every "
            "CTA of the cluster",
        ),
        implied("type", "b128", "the response is 128 bits", by={}),
    ),
    rules=_target_rule("try_cancel"),
    operands=("a", "mbar"),
    device_function="clusterlaunchcontrol_try_cancel",
    section=SECTION,
)

QUERY_CANCEL = Family(
    name="clusterlaunchcontrol.query_cancel",
    summary="Decode a try_cancel response: whether the cluster was canceled, or the ctaid of "
    "its first CTA (sm_100+).",
    qualifiers=(
        Qualifier(
            "query", ("is_canceled",) + CTAID,
            "what to decode: is_canceled (a predicate), or the first CTA's ctaid (all of x, y, "
            "z as .v4.b32, or one of them)",
        ),
        implied("pred", "pred", "is_canceled writes a predicate", by={"query": "is_canceled"}),
        Qualifier(
            "vec", (4,), "get_first_ctaid writes x, y, z and an undefined fourth",
            prefix=".v", implied_by={"query": frozenset(["get_first_ctaid"])},
        ),
        implied("type", "b32", "a ctaid coordinate is .b32", by={"query": CTAID}),
        implied("response", "b128", "the response operand is .b128", by={}),
    ),
    rules=_target_rule("query_cancel"),
    operands=("d", "response"),
    operand_variants={"query=is_canceled": ("p", "response")},
    device_function="clusterlaunchcontrol_query_cancel",
    section=SECTION,
)

FAMILIES = (TRY_CANCEL, QUERY_CANCEL)
__all__ = ["FAMILIES", "QUERY_CANCEL", "TRY_CANCEL"]
