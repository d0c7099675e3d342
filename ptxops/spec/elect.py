"""``elect.sync``: elect one leader lane of a warp without a branch on the lane id.

PTX ISA 9.0, Parallel Synchronization and Communication Instructions: elect.sync (introduced in
PTX ISA 8.0, requires sm_90 or higher).  ``elect.sync d|p, membermask`` elects one active lane
of those in ``membermask``: ``p`` is true in the leader only and ``d`` receives the leader's
lane id in every lane.  The election is deterministic (the same mask elects the same lane).
It is a ``.sync`` instruction: every lane in ``membermask`` must execute it, and the behaviour
is undefined if the executing lane is not in the mask.
"""

from __future__ import annotations

from .engine import Family
from ..render import JOIN

ELECT_SYNC = Family(
    name="elect.sync",
    summary="Elect one leader lane among the lanes of a member mask: a predicate true in the "
    "leader only, and the leader's lane id in every lane.",
    qualifiers=(),
    rules=(),
    operands=("d", JOIN, "p", "membermask"),
    device_function="elect_sync",
    section="Parallel Synchronization and Communication Instructions: elect.sync "
    "(PTX ISA 8.0, sm_90+)",
)

FAMILIES = (ELECT_SYNC,)
__all__ = ["ELECT_SYNC", "FAMILIES"]
