"""Backend rules of a call (pure): which backend a collective reducing a dtype by an op runs on,
and why a kernel key cannot be built on its backend.  The capabilities they read come from the
probing of :mod:`collectives.symmetric.capability`."""

from __future__ import annotations

from collections.abc import Callable

from ..config import MULTICAST_PATHS, PTX_OP
from ..dtypes import dtype as _dtype
from ..errors import CollectiveError, MulticastUnavailable


def multimem_reduces(dtype: str, op: str) -> bool:
    """Whether ``multimem.ld_reduce`` has a form reducing ``dtype`` by ``op`` on any target,
    as ptxops' spec says (PTX has no ``.min``/``.max`` of ``.f32``, for one)."""
    from ptxops import spec

    return spec.family("multimem.ld_reduce").complete(type=dtype, op=PTX_OP[op]) is not None


__all__ = ["REDUCING", "key_backend_refusal", "multimem_reduces", "resolve_backend"]


#: Collectives whose multicast path reduces with ``multimem.ld_reduce``.
REDUCING = ("all_reduce", "reduce_scatter")


def _no_multimem_reduction(backend: str, dtype: str, op: str) -> bool:
    return backend in MULTICAST_PATHS and not multimem_reduces(dtype, op)


def key_backend_refusal(collective: str, backend: str, dtype: str, op: str) -> str | None:
    """Why a kernel of ``collective`` on ``backend`` reducing ``dtype`` by ``op`` cannot be
    built (target aside), or None: fp8 reduces by add only, and a multicast path reduces only
    what ``multimem.ld_reduce`` has a form for (pure: what a kernel key checks)."""
    if _dtype(dtype).fp8 and op != "sum":
        return f"{op} of fp8 is not supported (multimem reduces fp8 by add only)"
    if collective in REDUCING and _no_multimem_reduction(backend, dtype, op):
        return f"multimem.ld_reduce has no {PTX_OP[op]} of {dtype}: use the peer backend"
    return None


def resolve_backend(requested: str, capable: Callable[[str], str], context_backend: str, dtype: str, op: str,
                    target: Callable[[], str]) -> str:
    """The backend a collective reducing ``dtype`` by ``op`` uses on a context opened with
    ``context_backend``, for ``requested`` in ``{"auto", "multicast", "peer",
    "multicast_emulated"}``: ``"auto"`` picks by capability (``capable(requested)``: the
    GPUs' answer, :func:`collectives.symmetric.capability.choose_backend`), and the
    peer backend where multimem has no such reduction; ``"multicast_emulated"`` runs on peer
    access alone and is never picked by ``"auto"``.  ``target()`` (read only for fp8 on a
    multicast path) is the GPU's compile target.

    Raises:
        MulticastUnavailable: multicast requested where this context or GPU lacks it, or
            multimem on fp8 below sm_100a.
        CollectiveError: multimem has no such reduction and the backend was not ``"auto"``;
            no usable backend.
        ValueError: unknown ``requested``.
    """
    if requested == "multicast_emulated":
        backend = requested
    else:
        backend = capable(requested)
        if backend == "multicast" and context_backend != "multicast":
            raise MulticastUnavailable(f"this context was opened with the {context_backend!r} backend")
    if _no_multimem_reduction(backend, dtype, op):
        if requested == "auto":
            return "peer"
        raise CollectiveError(
            f"multimem.ld_reduce has no {PTX_OP[op]} of {dtype} (PTX: .min/.max reduce integers, "
            f"16-bit floats and fp8, not .f32); use backend='peer' or 'auto'"
        )
    if backend in MULTICAST_PATHS and _dtype(dtype).fp8 and not target().startswith("sm_10"):
        raise MulticastUnavailable(f"multimem on {dtype} needs sm_100a or newer, not {target()}")
    return backend
