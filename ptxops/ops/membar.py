"""Device function for ``membar``: the older memory barrier, a synonym of ``fence.sc``."""

from __future__ import annotations

from cutlass.cutlass_dsl import dsl_user_op

from . import emit


@dsl_user_op
def membar(level: str | None = None, *, proxy: str | None = None, loc=None, ip=None) -> None:
    """``membar.level`` for ``level`` in ``"cta"``, ``"gl"``, ``"sys"``: this thread's memory
    accesses before it are performed, at that level, before its accesses after it.  With
    ``proxy`` instead (``"alias"``): ``membar.proxy.alias``, the old spelling of
    ``fence.proxy.alias`` (:func:`~ptxops.fence` with ``proxy=`` has every proxy kind).

    The PTX ISA makes ``membar`` a synonym of ``fence.sc`` on sm_70 and later, the levels
    ``cta``, ``gl`` and ``sys`` synonyms of the scopes ``cta``, ``gpu`` and ``sys``:
    ``membar("gl")`` is ``fence(sem="sc", scope="gpu")``.  A sequentially consistent fence is
    stronger than release/acquire needs; new code wants :func:`~ptxops.fence` with
    ``sem="acq_rel"`` (or a release store and an acquire load).  ``membar`` is here for code
    that mirrors kernels written with it.
    """
    emit.emit(emit.instruction("membar", level=level, proxy=proxy), None, loc=loc, ip=ip)


__all__ = ["membar"]
