"""Device function for ``st.bulk``: zero a block of memory with one instruction (sm_100+)."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from . import emit

#: The block's address and size are multiples of 8 bytes.
ST_BULK_ALIGN = 8


@dsl_user_op
def st_bulk(
    ptr: cute.Pointer, size: Any, *, sem: str | None = None, space: Value = "auto", loc=None, ip=None
) -> None:
    """``st.bulk{.weak}{.shared::cta} [ptr], size, 0``: set ``size`` bytes (an int or Int64, a
    multiple of 8, proved from its arithmetic or ``cute.assume``) from ``ptr`` (8-byte aligned) to zero with weak stores.

    A pointer into this CTA's shared memory gives ``.shared::cta``; a global or generic one,
    generic addressing.  The PTX ISA allows only 0 as the value written, so there is no value
    argument.  The stores are weak: publish them like any weak store (a release, or a barrier).
    """
    if space == "auto" and ptr.memspace == cute.AddressSpace.gmem:
        space = None
    space = emit.state_space("st.bulk", ptr, space, (None, "shared::cta"))
    inst = emit.instruction("st.bulk", sem=sem, space=space)
    emit.require_size_multiple(inst, size, ST_BULK_ALIGN)
    emit.require_alignment(inst, ptr, "destination", ST_BULK_ALIGN)
    sources = [[cutlass.Int64(size).ir_value(loc=loc, ip=ip)]]
    emit.emit(inst, emit.address(ptr, loc=loc, ip=ip), sources, loc=loc, ip=ip)


__all__ = ["st_bulk"]
