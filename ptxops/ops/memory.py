"""Device functions for ``ld`` and ``st``: memory-ordering semantics, state spaces, cache
operators and cache hints.

Values of sub-word dtypes are packed into 32-bit words when they fill them: eight BFloat16 load
as one ``.v4.b32``.  The state space follows the pointer unless ``space=`` says otherwise: a
gmem, smem, dsmem, rmem (``.local``) or cmem (``.const``) pointer, or a generic one.  The
``.param`` space is legal PTX that ptxops does not wrap (no CuTeDSL pointer addresses it).

Cache keywords, validated through the spec (:mod:`ptxops.spec.memory`): ``cache`` (ld:
``"ca"``, ``"cg"``, ``"cs"``, ``"lu"``, ``"cv"``; st: ``"wb"``, ``"cg"``, ``"cs"``, ``"wt"``),
``l1_eviction`` (``"evict_normal"``, ``"evict_unchanged"``, ``"evict_first"``, ``"evict_last"``,
``"no_allocate"``), ``l2_eviction`` (``"evict_normal"``, ``"evict_first"``, ``"evict_last"``;
256-bit accesses only), ``cache_policy`` (a 64-bit policy from ``createpolicy``:
``.L2::cache_hint``), and for ``ld`` ``prefetch`` (64, 128 or 256 bytes into L2) and ``nc=True``
(``ld.global.nc``, the non-coherent load through the read-only path: the data must not change
while the kernel runs).
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import dsl_user_op

from ..spec.engine import Value
from ..spec.memory import PARAM
from . import emit, forms, values

SPACES = (None, "global", "shared", "shared::cta", "shared::cluster", "local", "const")


def _form(family: str, ptr, dtype, n: int, type, vec, space, **q: Value):
    if space in PARAM:  # no pointer reaches .param: the spec says why
        emit.instruction(family, space=space, type="b32")
    q["space"] = emit.state_space(family, ptr, space, SPACES)
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
    cache: str | None = None,
    nc: bool = False,
    l1_eviction: str | None = None,
    l2_eviction: str | None = None,
    prefetch: int | str | None = None,
    cache_policy: Any = None,
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int = 1,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> Any:
    """Load ``num_elements`` values of ``dtype`` (default: the pointer's) from ``ptr``.

    ``ld{.sem}{.scope}{.space}{.cop}{.nc}{.L1::*}{.L2::*}{.L2::cache_hint}{.L2::size}{.vec}.type
    d, [a]{, cache_policy}``; sem is weak (default), ``"relaxed"``, ``"acquire"`` (both need
    ``scope``), ``"volatile"`` or ``"mmio.relaxed"`` (sys scope).  ``nc=True`` is
    ``ld.global.nc`` (no sem).  See the module docstring for the cache keywords.
    Returns a scalar for one value, else a TensorSSA.
    """
    dtype = dtype or ptr.dtype
    cache_hint, extra = emit.cache_hint(cache_policy, loc=loc, ip=ip)
    inst = _form(
        "ld", ptr, dtype, num_elements, type, vec, space, sem=sem, scope=scope, cache=cache,
        nc="nc" if nc else None, l1_eviction=l1_eviction, l2_eviction=l2_eviction,
        cache_hint=cache_hint, prefetch=f"{prefetch}B" if isinstance(prefetch, int) else prefetch,
    )
    return emit.send(inst, ptr, [], packed, result=dtype, extra=extra, loc=loc, ip=ip)


@dsl_user_op
def st(
    ptr: cute.Pointer,
    value: Any,
    *,
    sem: str | None = None,
    scope: str | None = None,
    space: Value = "auto",
    cache: str | None = None,
    l1_eviction: str | None = None,
    l2_eviction: str | None = None,
    cache_policy: Any = None,
    dtype: type[cutlass.Numeric] | None = None,
    num_elements: int | None = None,
    type: str | None = None,
    vec: int | None = None,
    packed: bool = False,
    loc=None,
    ip=None,
) -> None:
    """Store ``value`` (a scalar, a sequence or a TensorSSA) at ``ptr``.

    ``st{.sem}{.scope}{.space}{.cop}{.L1::*}{.L2::*}{.L2::cache_hint}{.vec}.type [a], b
    {, cache_policy}``; sem is weak (default), ``"relaxed"``, ``"release"`` (both need
    ``scope``), ``"volatile"`` or ``"mmio.relaxed"``.  ``cache="wt"`` writes through to
    system memory (signals polled by the host).  See the module docstring for the cache keywords.
    """
    dtype, n = values.data_shape(value, dtype, ptr.dtype, num_elements, packed, type is not None)
    cache_hint, extra = emit.cache_hint(cache_policy, loc=loc, ip=ip)
    inst = _form(
        "st", ptr, dtype, n, type, vec, space, sem=sem, scope=scope, cache=cache,
        l1_eviction=l1_eviction, l2_eviction=l2_eviction, cache_hint=cache_hint,
    )
    emit.send(inst, ptr, [(value, dtype)], packed, extra=extra, loc=loc, ip=ip)


@dsl_user_op
def ld_acquire(ptr: cute.Pointer, *, scope: str, loc=None, ip=None, **kwargs: Any) -> Any:
    """``ld.acquire.scope``: a load that later reads and writes of this thread cannot pass.
    Pairs with :func:`st_release` (or a release ``red``/``atom``) at a scope that contains
    both threads: ``"sys"`` when the writer is another GPU.  Takes :func:`ld`'s keywords
    (eviction priorities, ``cache_policy``, ``prefetch``; no cache operator)."""
    return ld(ptr, sem="acquire", scope=scope, loc=loc, ip=ip, **kwargs)


@dsl_user_op
def st_release(ptr: cute.Pointer, value: Any, *, scope: str, loc=None, ip=None, **kwargs: Any) -> None:
    """``st.release.scope``: a store that earlier reads and writes of this thread cannot pass;
    a thread whose acquire load at a containing scope reads it sees them.  Takes :func:`st`'s
    keywords (eviction priorities, ``cache_policy``; no cache operator)."""
    st(ptr, value, sem="release", scope=scope, loc=loc, ip=ip, **kwargs)


__all__ = ["ld", "ld_acquire", "st", "st_release"]
