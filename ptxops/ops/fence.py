"""Device function for ``fence``: memory fences at a scope, proxy fences and restricted forms."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from . import emit


@dsl_user_op
def fence(
    *,
    sem: str | None = None,
    scope: str | None = None,
    proxy: str | None = None,
    op_restrict: str | None = None,
    sync_restrict: str | None = None,
    ptr: cute.Pointer | None = None,
    loc=None,
    ip=None,
) -> None:
    """Emit one fence.

    ``fence(sem="sc", scope="sys")`` is ``fence.sc.sys``; without ``sem`` PTX means acq_rel.
    ``fence(proxy="async.global")`` orders generic-proxy against async-proxy (TMA, multimem)
    accesses; ``fence(proxy="tensormap::generic", sem="acquire", scope="gpu", ptr=desc)`` takes
    the 128-byte tensor-map address.  Every form is in ``ptxops.spec.forms("fence")``.
    """
    inst = emit.instruction(
        "fence", sem=sem, scope=scope, proxy=proxy, op_restrict=op_restrict,
        sync_restrict=sync_restrict,
    )
    needs_address = any(o.role == "a" for o in inst.operands)
    if needs_address != (ptr is not None):
        raise ValueError(
            f"{inst.opcode}: " + ("needs ptr= (the tensor-map address)" if needs_address else "takes no ptr")
        )
    emit.emit(inst, emit.address(ptr, loc=loc, ip=ip) if ptr is not None else None, loc=loc, ip=ip)


__all__ = ["fence"]
