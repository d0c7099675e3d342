"""Device functions for ``ld`` and ``st`` with memory-ordering semantics.

Values of sub-word dtypes are packed into 32-bit words when they fill them: eight BFloat16 load
as one ``.v4.b32``.  The state space follows the pointer unless ``space=`` says otherwise.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from . import emit, forms, values

SPACES = (None, "global", "shared", "shared::cta", "shared::cluster")


def _form(family: str, ptr, dtype, n: int, sem, scope, space, type, vec):
    space = emit.state_space(family, ptr, space, SPACES)
    q = {"sem": sem, "scope": scope, "space": space}
    if type is not None:
        return emit.instruction(family, type=type, vec=vec, **q)
    return forms.choose(family, dtype, n, forms.words(dtype), **q)


@dsl_user_op
def ld(
    ptr: cute.Pointer,
    *,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int = 1,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> Any:
    """Load ``num_elements`` values of ``dtype`` (default: the pointer's) from ``ptr``.

    ``ld{.sem}{.scope}{.space}{.vec}.type d, [a]``; sem is weak (default), ``"relaxed"``,
    ``"acquire"`` (both need ``scope``), ``"volatile"`` or ``"mmio.relaxed"`` (sys scope).
    Returns a scalar for one value, else a TensorSSA.
    """
    dtype = dtype or ptr.dtype
    inst = _form("ld", ptr, dtype, num_elements, sem, scope, space, type, vec)
    return emit.send(inst, ptr, [], packed, result=dtype, loc=loc, ip=ip)


@dsl_user_op
def st(
    ptr: cute.Pointer,
    value: Any,
    *,
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
    """Store ``value`` (a scalar, a sequence or a TensorSSA) at ``ptr``.

    ``st{.sem}{.scope}{.space}{.vec}.type [a], b``; sem is weak (default), ``"relaxed"``,
    ``"release"`` (both need ``scope``), ``"volatile"`` or ``"mmio.relaxed"``.
    """
    dtype, n = values.data_shape(value, dtype, ptr.dtype, num_elements, packed, type is not None)
    inst = _form("st", ptr, dtype, n, sem, scope, space, type, vec)
    emit.send(inst, ptr, [(value, dtype)], packed, loc=loc, ip=ip)


@dsl_user_op
def ld_acquire(ptr: cute.Pointer, *, scope: str, loc=None, ip=None, **kwargs: Any) -> Any:
    """``ld.acquire.scope``: a load that later reads and writes of this thread cannot pass.
    Pairs with :func:`st_release` (or a release ``red``/``atom``) at a scope that contains
    both threads: ``"sys"`` when the writer is another GPU."""
    return ld(ptr, sem="acquire", scope=scope, loc=loc, ip=ip, **kwargs)


@dsl_user_op
def st_release(ptr: cute.Pointer, value: Any, *, scope: str, loc=None, ip=None, **kwargs: Any) -> None:
    """``st.release.scope``: a store that earlier reads and writes of this thread cannot pass;
    a thread whose acquire load at a containing scope reads it sees them."""
    st(ptr, value, sem="release", scope=scope, loc=loc, ip=ip, **kwargs)


__all__ = ["ld", "ld_acquire", "st", "st_release"]
