"""Device functions for ``clusterlaunchcontrol``: a persistent kernel steals the work of
clusters that have not started yet (sm_100+).

One thread calls :func:`clusterlaunchcontrol_try_cancel` with a 16-byte response buffer and an
mbarrier in shared memory, after arriving on that mbarrier with 16 expected transaction bytes
(:func:`~ptxops.mbarrier_arrive` with ``tx_count=16``); once the phase completes
(:func:`~ptxops.mbarrier_try_wait`), the response is read from shared memory (two Int64, e.g.
``ptxops.ld(ptr, num_elements=2)`` on an Int64 pointer) and decoded with
:func:`clusterlaunchcontrol_query_cancel`: whether a cluster was canceled and, if so, the ctaid
of its first CTA, whose work the caller then does.  After a failed response a CTA must not ask
again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from . import emit

#: The response is 16 bytes, naturally aligned.
RESPONSE_ALIGN = 16
SPACES = (None, "shared::cta")


@dsl_user_op
def clusterlaunchcontrol_try_cancel(
    response: cute.Pointer,
    mbar: cute.Pointer,
    *,
    space: Value = "auto",
    multicast: bool = False,
    loc=None,
    ip=None,
) -> None:
    """``clusterlaunchcontrol.try_cancel.async{.shared::cta}.mbarrier::complete_tx::bytes
    {.multicast::cluster::all}.b128 [response], [mbar]``: ask to cancel the launch of a cluster
    of this grid that has not started, asynchronously.  The 16-byte opaque answer lands at
    ``response`` (16-byte aligned) with a complete-tx of 16 bytes on the mbarrier at ``mbar``
    (8-byte aligned), both in this CTA's shared memory (shared pointers give ``.shared::cta``,
    generic ones generic addressing).  With ``multicast=True`` the answer lands at the same
    offset in every CTA of the cluster, each completing on its mbarrier at ``mbar``'s offset
    (each CTA arrives expecting 16 bytes).
    """
    space = emit.state_space("clusterlaunchcontrol.try_cancel", response, space, SPACES)
    inst = emit.instruction(
        "clusterlaunchcontrol.try_cancel", space=space,
        multicast="multicast::cluster::all" if multicast else None,
    )
    emit.require_alignment(inst, response, "response", RESPONSE_ALIGN)
    extra = emit.mbarrier_operand(inst, mbar, space, (space,), loc=loc, ip=ip)
    emit.emit(inst, emit.address(response, loc=loc, ip=ip), extra, loc=loc, ip=ip)


@dsl_user_op
def clusterlaunchcontrol_query_cancel(
    response: Sequence[Any], query: str = "is_canceled", *, loc=None, ip=None
) -> Any:
    """Decode a try_cancel ``response`` (its two 64-bit halves, low first: two Int64 or a
    TensorSSA of two) with ``clusterlaunchcontrol.query_cancel.query``.

    ``query="is_canceled"`` returns a Boolean, true if a cluster was canceled;
    ``"get_first_ctaid"`` returns the ctaid ``(x, y, z)`` of its first CTA as three Int32;
    ``"get_first_ctaid::x"`` (``::y``, ``::z``) one Int32.  The ctaid of a failed response is
    undefined.
    """
    inst = emit.instruction("clusterlaunchcontrol.query_cancel", query=query)
    halves = [cutlass.Int64(response[i]).ir_value(loc=loc, ip=ip) for i in range(2)]
    out = emit.emit(inst, None, [halves], loc=loc, ip=ip)
    if query == "is_canceled":
        return cutlass.Int32(out[0]) != 0
    values = [cutlass.Int32(v) for v in out]
    return tuple(values[:3]) if query == "get_first_ctaid" else values[0]


__all__ = ["clusterlaunchcontrol_query_cancel", "clusterlaunchcontrol_try_cancel"]
