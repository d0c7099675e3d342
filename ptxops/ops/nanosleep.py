"""Device function for ``nanosleep``: back off in a spin loop."""

from __future__ import annotations

from typing import Any

import cutlass
from cutlass.cutlass_dsl import dsl_user_op

from . import emit

#: The longest sleep the PTX ISA grants (1 ms), in nanoseconds.
MAX_SLEEP_NS = 1_000_000


@dsl_user_op
def nanosleep(ns: Any, *, loc=None, ip=None) -> None:
    """``nanosleep.u32 ns``: suspend this thread for about ``ns`` nanoseconds (an int or an
    Int32/Uint32 register).  The PTX ISA grants a time in [0, 2*ns], at most 1 ms, and may wake
    the sleeping threads of a warp together.  Put it in a spin loop's retry path so that the
    waiting threads leave issue slots and memory bandwidth to the ones they wait for; a Python
    int travels in a register like a computed delay (exponential backoff)."""
    if isinstance(ns, bool) or (isinstance(ns, int) and not 0 <= ns <= MAX_SLEEP_NS):
        raise ValueError(f"nanosleep: ns must be an int in [0, {MAX_SLEEP_NS}] or a register, got {ns!r}")
    inst = emit.instruction("nanosleep")
    emit.emit(inst, None, [[cutlass.Uint32(ns).ir_value(loc=loc, ip=ip)]], loc=loc, ip=ip)


__all__ = ["nanosleep"]
