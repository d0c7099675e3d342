"""Reading every rank's values at one offset and combining them, in either backend.

The multicast backend asks the switch: one ``multimem.ld_reduce`` returns the reduced values
(16-bit floats accumulated in f32, fp8 in f16).  The peer backend loads each rank's copy over
NVLink and combines them in registers in rank order 0..W-1, accumulating in the same precision,
so every rank computes bit-identical results.  Storing to every rank is one ``multimem.st`` or
one store per peer.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64

import ptxops

from ..config import PTX_OP
from .signals import MULTICAST, PEER, gmem


@cute.jit
def combine(a, b, op: cutlass.Constexpr):
    """``a op b`` elementwise for op in sum/min/max (TensorSSA or scalars)."""
    if cutlass.const_expr(op == "sum"):
        return a + b
    elif cutlass.const_expr(isinstance(a, cute.TensorSSA)):
        return cute.where(a < b, a, b) if cutlass.const_expr(op == "min") else cute.where(a > b, a, b)
    else:
        return cutlass.min(a, b) if cutlass.const_expr(op == "min") else cutlass.max(a, b)


@cute.jit
def convert(values, dtype: cutlass.Constexpr):
    """Values (TensorSSA or scalar) converted to ``dtype``."""
    if cutlass.const_expr(isinstance(values, cute.TensorSSA)):
        return values.to(dtype)
    else:
        return dtype(values)


@cute.jit
def load_reduce_peer(
    addrs,
    offsets,
    dtype: cutlass.Constexpr,
    acc: cutlass.Constexpr,
    n: cutlass.Constexpr,
    op: cutlass.Constexpr,
):
    """For each offset in ``offsets``: every rank's ``n`` values at that element offset of the
    buffer whose per-rank addresses are ``addrs`` (rank order), combined with ``op`` in ``acc``
    precision and returned as ``dtype``.  All loads are issued before any is used, so
    ``len(addrs) * len(offsets)`` NVLink reads are in flight at once."""
    align = cutlass.const_expr(n * dtype.width // 8)
    loaded = []
    for u in cutlass.range_constexpr(len(offsets)):
        for r in cutlass.range_constexpr(len(addrs)):
            src = gmem(dtype, addrs[r], align, PEER, "collectives.device.reduce.load_reduce_peer")
            src = src + cute.assume(offsets[u], divby=n)
            loaded.append(ptxops.ld(src, num_elements=n))
    results = []
    for u in cutlass.range_constexpr(len(offsets)):
        total = convert(loaded[u * len(addrs)], acc)
        for r in cutlass.range_constexpr(1, len(addrs)):
            total = combine(total, convert(loaded[u * len(addrs) + r], acc), op)
        results.append(convert(total, dtype))
    return results


@cute.jit
def load_reduce_multicast(
    mc: Int64,
    offset: Int64,
    dtype: cutlass.Constexpr,
    acc: cutlass.Constexpr,
    n: cutlass.Constexpr,
    op: cutlass.Constexpr,
):
    """The same through one ``multimem.ld_reduce`` on the multicast address ``mc`` (``acc`` is
    implied: the instruction accumulates 16-bit floats in f32 and fp8 in f16, as ``acc``)."""
    align = cutlass.const_expr(n * dtype.width // 8)
    ptx_op = cutlass.const_expr(PTX_OP[op])
    return ptxops.multimem_ld_reduce(
        gmem(dtype, mc, align, MULTICAST, "collectives.device.reduce.load_reduce_multicast")
        + cute.assume(offset, divby=n),
        dtype=dtype, num_elements=n, op=ptx_op, acc="auto" if cutlass.const_expr(op == "sum") else None,
    )


@cute.jit
def store_peers(addrs, offset: Int64, values, dtype: cutlass.Constexpr, n: cutlass.Constexpr):
    """Store ``values`` at element ``offset`` of every rank's buffer (``addrs``)."""
    align = cutlass.const_expr(n * dtype.width // 8)
    for r in cutlass.range_constexpr(len(addrs)):
        dst = gmem(dtype, addrs[r], align, PEER, "collectives.device.reduce.store_peers")
        ptxops.st(dst + cute.assume(offset, divby=n), values)


@cute.jit
def store_multicast(mc: Int64, offset: Int64, values, dtype: cutlass.Constexpr, n: cutlass.Constexpr):
    """Store ``values`` at element ``offset`` on every rank with one ``multimem.st``."""
    align = cutlass.const_expr(n * dtype.width // 8)
    dst = gmem(dtype, mc, align, MULTICAST, "collectives.device.reduce.store_multicast")
    ptxops.multimem_st(dst + cute.assume(offset, divby=n), values)


__all__ = ["combine", "convert", "load_reduce_multicast", "load_reduce_peer", "store_multicast", "store_peers"]
