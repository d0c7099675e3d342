"""Device function for ``elect.sync``: one leader lane per warp without a branch on the lane id."""

from __future__ import annotations

from typing import Any

import cutlass
from cutlass.cutlass_dsl import dsl_user_op

from . import emit

#: Every lane of a warp.
FULL_MASK = 0xFFFFFFFF


@dsl_user_op
def elect_sync(mask: Any = FULL_MASK, *, loc=None, ip=None) -> tuple[Any, Any]:
    """``elect.sync d|p, mask``: elect one active lane among the lanes in ``mask`` (an int or a
    32-bit register; default the whole warp).

    Returns ``(is_leader, lane)``: a Boolean true in the elected lane only, and the elected
    lane's id (an Int32) in every lane.  The election is deterministic: the same mask elects
    the same lane.  Every lane in ``mask`` must execute the call (it is ``.sync``), and a lane
    outside ``mask`` must not: the PTX ISA leaves that undefined.
    """
    if isinstance(mask, bool) or (isinstance(mask, int) and not 0 < mask <= FULL_MASK):
        raise ValueError(f"elect_sync: mask must be a non-zero 32-bit lane mask or a register, got {mask!r}")
    inst = emit.instruction("elect.sync")
    lane, leader = emit.emit(inst, None, [[cutlass.Uint32(mask).ir_value(loc=loc, ip=ip)]], loc=loc, ip=ip)
    return cutlass.Int32(leader) != 0, cutlass.Int32(lane)


__all__ = ["elect_sync"]
