"""``nanosleep``: suspend the thread for about a given number of nanoseconds.

PTX ISA 9.0, Miscellaneous Instructions: nanosleep (sm_70+).  ``nanosleep.u32 ns`` sleeps for a
time in [0, 2*ns] nanoseconds, at most 1 ms; threads of a warp may wake together.  It backs off a
spin loop so that the waiting threads leave issue slots and memory bandwidth to others.
"""

from __future__ import annotations

from .engine import Family, implied

NANOSLEEP = Family(
    name="nanosleep",
    summary="Suspend the thread for a time in [0, 2*ns] nanoseconds (at most 1 ms).",
    qualifiers=(implied("type", "u32", "the delay is always .u32", by={}),),
    rules=(),
    operands=("ns",),
    device_function="nanosleep",
    section="Miscellaneous Instructions: nanosleep (PTX ISA 9.0)",
)

FAMILIES = (NANOSLEEP,)
__all__ = ["FAMILIES", "NANOSLEEP"]
