"""Typed, validated NVSHMEM device calls for CuTeDSL kernels, over nvshmem4py's CuTe bindings.

One-sided puts, gets, put-with-signal, signal updates, a bounded signal wait and fetch-add
between PEs, on symmetric memory (:mod:`ptxops.spec.nvshmem` holds the rules and the ordering
each call gives, as data; each function's docstring ends with its entry).  Every call checks
at trace time, raising :class:`~ptxops.QualifierError` with the rule's name and the legal
values: a remote operand must be tagged ``ptxops.reach(ptr, "symmetric")`` (a peer's mapped
address is refused), a local one must not be a peer's or a multicast address, element types
must be ones NVSHMEM binds (and equal for dst and src), and the element count must match or be
given (never nvshmem4py's silent ``min(size(dst), size(src))``).  Signals are ``Uint64``.

Importing this module needs CuTeDSL and nvshmem4py (``pip install nvshmem4py-cu13
nvidia-nvshmem-cu13``); without nvshmem4py it raises :class:`~ptxops.errors.NvshmemMissing`.
The NVSHMEM device bitcode is linked for the compile target (``cute.GPUArch`` or
``CUTE_DSL_ARCH``): nvshmem4py 0.4.1 picks the visible GPU's, and without one a generic
``libnvshmem_device.bc`` that nvidia-nvshmem-cu13 3.8 does not ship, so kernels could not be
compiled without a GPU, nor for another architecture than the visible one.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import ops  # noqa: F401  (first: without CuTeDSL this says how to install it)
from .errors import NvshmemMissing

try:
    import nvshmem.bindings.device.cute as bindings
    from cuda.pathfinder import find_nvidia_header_directory
    from nvshmem.bindings.device.cute import _bitcode
    from nvshmem.core import SignalOp
    from nvshmem.core.init_fini import find_device_bitcode_library
except ModuleNotFoundError as missing:
    if (missing.name or "").partition(".")[0] != "nvshmem":
        raise
    raise NvshmemMissing(missing.name) from missing

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int64, Uint64

from .ops import emit, memory, pointer_reach
from .spec import nvshmem as rules

_F = TypeVar("_F", bound=Callable[..., Any])


def bitcode_path(target: str) -> str:
    """The NVSHMEM device bitcode for compile target ``target`` (``sm_90a``): the installed
    per-architecture library of the newest architecture not above the target's."""
    wanted = int(re.match(r"sm_(\d+)", target)[1])  # type: ignore[index]
    lib = Path(find_nvidia_header_directory("nvshmem")).parent / "lib"  # where nvshmem4py looks
    archs = sorted(int(m[1]) for p in lib.glob("libnvshmem_device_sm_*.bc")
                   if (m := re.fullmatch(r"libnvshmem_device_sm_(\d+)\.bc", p.name)))
    usable = [a for a in archs if a <= wanted]
    if not usable:
        raise RuntimeError(f"ptxops.nvshmem: no NVSHMEM device bitcode for {target} in {lib} (it has "
                           f"{', '.join(f'sm_{a}' for a in archs) or 'none'})")
    return find_device_bitcode_library(arch=usable[-1])


_bitcode._device_bitcode_path = lambda: bitcode_path(emit.compile_target())


def _documented(*names: str) -> Callable[[_F], _F]:
    """Append the ordering of calls ``names`` (:data:`ptxops.spec.nvshmem.CALLS`; default: the
    function's name) to the function's docstring."""

    def document(fn: _F) -> _F:
        for call in (rules.CALLS[n] for n in names or (fn.__name__,)):
            fn.__doc__ = (f"{fn.__doc__}\n\n    ``{call.name}`` orders: {call.orders}.  On return: "
                          f"{call.returns}.  Reuse: {call.reuse}.  (nvshmem4py binding: ``{call.binding}``.)")
        return fn

    return document


def _operand(call: str, op: rules.Operand, arg: Any) -> tuple[cute.Pointer, int | None, type[cutlass.Numeric]]:
    """``arg`` (a CuTe tensor or pointer) checked as operand ``op`` of ``call``: its pointer,
    static element count (None: dynamic or a bare pointer) and element type."""
    target = emit.compile_target()
    if isinstance(arg, cute.Tensor):
        ptr, size, cosize = arg.iterator, cute.size(arg.layout), cute.cosize(arg.layout)
        if isinstance(size, int) and isinstance(cosize, int):
            rules.check_contiguous(call, op.name, size, cosize, target)
        size = size if isinstance(size, int) else None
    else:
        ptr, size = arg, None
    tag = pointer_reach.reach_of(ptr)
    dtype = arg.element_type if isinstance(arg, cute.Tensor) else ptr.dtype
    name = rules.check_operand(call, op, tag and tag.kind, tag.origin if tag else "", ptr.memspace.name,
                               dtype.__name__, target)
    return ptr, size, getattr(cutlass, name)


def _narrow(ptr: cute.Pointer) -> cute.Pointer:
    """``ptr`` as the global pointer of its element's alignment that nvshmem4py's externs take."""
    return cute.make_ptr(ptr.dtype, ptr.toint(), cute.AddressSpace.gmem, assumed_align=ptr.dtype.width // 8)


def _signal_op(call: str, op: str) -> cutlass.Int32:
    """NVSHMEM's code for signal update ``op`` (checked)."""
    rules.check_choice(call, "nvshmem-signal-op", "op", op, rules.SIGNAL_OPS, emit.compile_target())
    return cutlass.Int32(int(getattr(SignalOp, f"SIGNAL_{op.upper()}")))


def _transfer(call: str, dst: Any, src: Any, count: Any) -> tuple[cute.Pointer, cute.Pointer, str, Uint64]:
    """The checked dst and src pointers of an RMA ``call``, the type prefix and the count."""
    first, second = rules.CALLS[call].operands[:2]
    dst_ptr, dst_n, dtype = _operand(call, first, dst)
    src_ptr, src_n, src_dtype = _operand(call, second, src)
    target = emit.compile_target()
    rules.check_same_type(call, dtype.__name__, src_dtype.__name__, target)
    rules.check_count(call, dst_n, src_n, count, target)
    n = count if count is not None else dst_n
    return _narrow(dst_ptr), _narrow(src_ptr), rules.RMA_TYPES[dtype.__name__], Uint64(n)


def _rma(call: str, prefix: str, scope: str = "thread") -> Callable[..., Any]:
    """nvshmem4py's binding of ``call`` for the element type of binding prefix ``prefix``, issued
    by ``scope`` (checked: :data:`ptxops.spec.nvshmem.SCOPES`)."""
    rules.check_choice(call, "nvshmem-scope", "scope", scope, list(rules.SCOPES), emit.compile_target())
    return getattr(bindings, rules.CALLS[call].binding.format(type=prefix, scope=rules.SCOPES[scope]))


@_documented("put", "put_nbi")
def put(dst: Any, src: Any, pe: Any, *, count: Any = None, nbi: bool = False, scope: str = "thread") -> None:
    """Copy ``src`` (local) to ``dst`` (symmetric) on PE ``pe``: ``count`` elements, or all
    of equally sized ``dst`` and ``src``.  ``nbi=True`` is ``put_nbi``; ``scope`` (``thread``,
    ``warp``, ``block``): who issues it (:data:`ptxops.spec.nvshmem.SCOPE_ORDERS`)."""
    call = "put_nbi" if nbi else "put"
    d, s, prefix, n = _transfer(call, dst, src, count)
    _rma(call, prefix, scope)(d, s, n, cutlass.Int32(pe))


@_documented()
def get(dst: Any, src: Any, pe: Any, *, count: Any = None) -> None:
    """Copy ``src`` (symmetric, on PE ``pe``) into ``dst`` (local)."""
    d, s, prefix, n = _transfer("get", dst, src, count)
    _rma("get", prefix)(d, s, n, cutlass.Int32(pe))


@_documented("put_signal", "put_signal_nbi")
def put_signal(dst: Any, src: Any, signal: Any, value: Any, pe: Any, *, op: str = "set", count: Any = None,
               nbi: bool = False, scope: str = "thread") -> None:
    """Copy ``src`` to ``dst`` on PE ``pe``, then update ``signal`` (symmetric ``Uint64``) there
    with ``value`` (``op``: ``set`` or ``add``).  ``nbi=True`` is ``put_signal_nbi``;
    ``scope`` as for :func:`put`."""
    call = "put_signal_nbi" if nbi else "put_signal"
    d, s, prefix, n = _transfer(call, dst, src, count)
    sig, _, _ = _operand(call, rules.CALLS[call].operands[2], signal)
    _rma(call, prefix, scope)(d, s, n, _narrow(sig), Uint64(value), _signal_op(call, op), cutlass.Int32(pe))


@_documented()
def signal_op(signal: Any, value: Any, pe: Any, *, op: str = "set") -> None:
    """Update ``signal`` (symmetric ``Uint64``) on PE ``pe`` with ``value`` (``set``/``add``)."""
    sig, _, _ = _operand("signal_op", rules.CALLS["signal_op"].operands[0], signal)
    bindings.signal_op(_narrow(sig), Uint64(value), _signal_op("signal_op", op), cutlass.Int32(pe))


@_documented()
def signal_wait(signal: Any, value: Any, deadline: Any, *, cmp: str = "ge") -> Boolean:
    """Poll this PE's ``signal`` (symmetric ``Uint64``) with acquire loads at ``.sys`` until
    ``signal <cmp> value`` holds or ``%globaltimer`` passes ``deadline`` (ns); True if it held.
    Bounded, unlike NVSHMEM's ``signal_wait_until``, which spins forever."""
    sig, _, _ = _operand("signal_wait", rules.CALLS["signal_wait"].operands[0], signal)
    rules.check_choice("signal_wait", "nvshmem-compare", "cmp", cmp, list(rules.COMPARISONS), emit.compile_target())
    return _poll(sig, Uint64(value), Int64(deadline), cmp)


@cute.jit
def _poll(sig: cute.Pointer, value: Uint64, deadline: Int64, cmp: cutlass.Constexpr) -> Boolean:
    holds = getattr(operator, cmp)
    seen = memory.ld_acquire(sig, scope="sys", dtype=Uint64)
    while not holds(seen, value) and cute.arch.globaltimer() < deadline:
        seen = memory.ld_acquire(sig, scope="sys", dtype=Uint64)
    return Boolean(holds(seen, value))


@_documented()
def fetch_add(ptr: Any, value: Any, pe: Any) -> Any:
    """Add ``value`` atomically at ``ptr`` (symmetric) on PE ``pe``; the value before."""
    p, _, dtype = _operand("fetch_add", rules.CALLS["fetch_add"].operands[0], ptr)
    return _rma("fetch_add", rules.AMO_TYPES[dtype.__name__])(_narrow(p), dtype(value), cutlass.Int32(pe))


@_documented()
def fence() -> None:
    """``nvshmem_fence``: order this thread's operations to each PE."""
    bindings.fence()


@_documented()
def quiet() -> None:
    """``nvshmem_quiet``: complete this thread's outstanding operations."""
    bindings.quiet()


__all__ = ["bitcode_path", "fence", "fetch_add", "get", "put", "put_signal", "quiet", "signal_op", "signal_wait"]
