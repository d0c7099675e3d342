"""Device functions for ``atom`` and ``red``.

Without ``sem``/``scope`` PTX means ``.relaxed`` and ``.gpu``; the state space follows the
pointer (``.global`` for a global pointer, ``.shared::cta`` for a shared one) unless ``space=``
says otherwise.  A scalar call returns a scalar of the pointer's dtype; ``num_elements > 1``
selects the vector forms (f16/bf16/f32 add, f16/bf16 min/max) and returns a TensorSSA.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from . import emit, forms, values

SPACES = (None, "global", "shared", "shared::cta", "shared::cluster")


def _form(family: str, ptr, dtype, n: int, op: str, sem, scope, space, type, vec):
    space = emit.state_space(family, ptr, space, SPACES)
    q = {"op": op, "sem": sem, "scope": scope, "space": space}
    if type is not None:
        return emit.instruction(family, type=type, vec=vec, **q)
    return forms.choose(family, dtype, n, forms.lanes(forms.arithmetic_types(dtype, op)), **q)


@dsl_user_op
def atom(
    ptr: cute.Pointer,
    value: Any,
    *,
    op: str,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> Any:
    """Atomically apply ``op`` (add/min/max/inc/dec/and/or/xor/exch) with ``value`` at ``ptr``
    and return the old value.  ``atom{.sem}{.scope}{.space}.op{.vec}.type d, [a], b``; sem is
    relaxed (default), acquire, release or acq_rel.  Use :func:`atom_cas` for compare-and-swap.
    """
    if op == "cas":
        raise ValueError("atom: use atom_cas(ptr, compare, value) for op='cas'")
    dtype, n = values.data_shape(value, dtype, ptr.dtype, num_elements, packed, type is not None)
    inst = _form("atom", ptr, dtype, n, op, sem, scope, space, type, vec)
    return emit.send(inst, ptr, [(value, dtype)], packed, result=dtype, loc=loc, ip=ip)


@dsl_user_op
def atom_add(ptr: cute.Pointer, value: Any, *, loc=None, ip=None, **qualifiers: Any) -> Any:
    """``atom.add``: add ``value`` at ``ptr`` atomically, return the old value."""
    return atom(ptr, value, op="add", loc=loc, ip=ip, **qualifiers)


@dsl_user_op
def atom_exch(ptr: cute.Pointer, value: Any, *, loc=None, ip=None, **qualifiers: Any) -> Any:
    """``atom.exch``: store ``value`` at ``ptr`` atomically, return the old value."""
    return atom(ptr, value, op="exch", loc=loc, ip=ip, **qualifiers)


@dsl_user_op
def atom_cas(
    ptr: cute.Pointer,
    compare: Any,
    value: Any,
    *,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    type: str | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> Any:
    """``atom.cas``: if memory at ``ptr`` equals ``compare``, store ``value``; return the old
    value either way.  ``atom{.sem}{.scope}{.space}.cas.type d, [a], b, c`` (b16/b32/b64/b128).
    """
    dtype, n = values.data_shape(value, dtype, ptr.dtype, None, packed, type is not None)
    inst = _form("atom", ptr, dtype, n, "cas", sem, scope, space, type, None)
    return emit.send(inst, ptr, [(compare, dtype), (value, dtype)], packed, result=dtype, loc=loc, ip=ip)


@dsl_user_op
def red(
    ptr: cute.Pointer,
    value: Any,
    *,
    op: str = "add",
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Atomically reduce ``value`` into ``ptr`` (no result): ``red{.sem}{.scope}{.space}.op
    {.vec}.type [a], b``; sem is relaxed (default) or release.  ``red(flag, 1, sem="release",
    scope="sys")`` publishes everything this thread wrote before it."""
    dtype, n = values.data_shape(value, dtype, ptr.dtype, num_elements, packed, type is not None)
    inst = _form("red", ptr, dtype, n, op, sem, scope, space, type, vec)
    emit.send(inst, ptr, [(value, dtype)], packed, loc=loc, ip=ip)


__all__ = ["atom", "atom_add", "atom_cas", "atom_exch", "red"]
