"""Device functions for ``mbarrier.init``, ``mbarrier.arrive`` and ``mbarrier.try_wait``.

``mbar`` points at a 64-bit mbarrier object in shared memory (8-byte aligned).  The state space
follows the pointer (``.shared::cta`` for a shared pointer, ``.shared::cluster`` for a
distributed-shared one) unless ``space=`` says otherwise.  Without ``sem``/``scope`` PTX means
``.release.cta`` for an arrive and ``.acquire.cta`` for a wait.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from ..spec.mbarrier import LOCAL, SPACES
from . import emit, pointer_reach

def _address(inst, mbar: cute.Pointer, *, loc=None, ip=None):
    pointer_reach.check(inst, mbar)
    emit.require_alignment(inst, mbar, "mbarrier", emit.MBARRIER_ALIGN)
    return emit.address(mbar, loc=loc, ip=ip)


def _int32(value: Any, *, loc=None, ip=None):
    return cutlass.Int32(value).ir_value(loc=loc, ip=ip)


@dsl_user_op
def mbarrier_init(
    mbar: cute.Pointer, count: Any, *, space: Value = "auto", loc=None, ip=None
) -> None:
    """``mbarrier.init{.space}.b64 [mbar], count``: set up the mbarrier for phases of
    ``count`` arrivals (an int or Int32).  Make it visible to the async proxy (TMA) with
    ``fence(op_restrict="mbarrier_init", sem="release", scope="cluster")`` or
    ``fence(proxy="async.shared::cta")`` before a bulk copy completes on it."""
    space = emit.state_space("mbarrier.init", mbar, space, LOCAL)
    inst = emit.instruction("mbarrier.init", space=space)
    emit.emit(inst, _address(inst, mbar, loc=loc, ip=ip), [[_int32(count, loc=loc, ip=ip)]], loc=loc, ip=ip)


@dsl_user_op
def mbarrier_arrive(
    mbar: cute.Pointer,
    tx_count: Any = None,
    *,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    loc=None,
    ip=None,
) -> Any:
    """Arrive on the mbarrier at ``mbar``: ``mbarrier.arrive{.expect_tx}{.sem}{.scope}{.space}.b64
    state, [mbar]{, tx_count}``.

    With ``tx_count`` (an int or Int32: bytes), first raise the phase's expected transaction
    count by it (``.expect_tx``), as the thread that issues a bulk copy does.  ``sem`` is
    ``"release"`` (the default) or ``"relaxed"``, with ``scope`` ``"cta"`` or ``"cluster"``.
    Returns the phase state (an Int64 for :func:`mbarrier_try_wait`), or None for an arrive on
    another CTA's mbarrier (``.shared::cluster``, whose destination is the sink ``_``).
    """
    space = emit.state_space("mbarrier.arrive", mbar, space, SPACES)
    inst = emit.instruction(
        "mbarrier.arrive", expect_tx=None if tx_count is None else "expect_tx",
        sem=sem, scope=scope, space=space,
    )
    sources = [] if tx_count is None else [[_int32(tx_count, loc=loc, ip=ip)]]
    out = emit.emit(inst, _address(inst, mbar, loc=loc, ip=ip), sources, loc=loc, ip=ip)
    return cutlass.Int64(out[0]) if out else None


@dsl_user_op
def mbarrier_try_wait(
    mbar: cute.Pointer,
    state: Any = None,
    *,
    phase: Any = None,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    loc=None,
    ip=None,
) -> Any:
    """Test whether a phase of the mbarrier at ``mbar`` has completed, suspending the thread
    for a bounded time first: ``mbarrier.try_wait{.parity}{.sem}{.scope}{.space}.b64 p, [mbar],
    state|phase``.

    Name the phase by the ``state`` an arrive returned (an Int64), or by its ``phase`` parity
    (an int or Int32, 0 or 1: ``.parity``).  ``sem`` is ``"acquire"`` (the default) or
    ``"relaxed"``, with ``scope`` ``"cta"`` or ``"cluster"``.  Returns a Boolean: True once
    the phase has completed; loop until it is.
    """
    if (state is None) == (phase is None):
        raise ValueError("mbarrier_try_wait: give exactly one of state= and phase=")
    space = emit.state_space("mbarrier.try_wait", mbar, space, LOCAL)
    inst = emit.instruction(
        "mbarrier.try_wait", parity=None if phase is None else "parity",
        sem=sem, scope=scope, space=space,
    )
    operand = (
        _int32(phase, loc=loc, ip=ip) if phase is not None
        else cutlass.Int64(state).ir_value(loc=loc, ip=ip)
    )
    out = emit.emit(inst, _address(inst, mbar, loc=loc, ip=ip), [[operand]], loc=loc, ip=ip)
    return cutlass.Int32(out[0]) != 0


__all__ = ["mbarrier_arrive", "mbarrier_init", "mbarrier_try_wait"]
