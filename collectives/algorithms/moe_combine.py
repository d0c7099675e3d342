"""The MoE combine's weighted sum (:func:`collectives.moe.combine`), one kernel on one GPU.

After a combine's all-to-all, ``entries`` holds every row this rank's tokens got back, in the
dispatch's sorted order.  For each token ``t`` and each element ``h`` the kernel computes

    out[t, h] = round(((e(t, 0) * w(t, 0)) + e(t, 1) * w(t, 1)) + ... + e(t, k-1) * w(t, k-1))

with ``e(t, k) = entries[slots[t * topk + k], h]`` as f32 (0 where the entry was not sent:
``valid`` is 0) and ``w`` the f32 weights (taken as 0 where not valid, whatever they hold: a
NaN weight of a dropped entry reaches no output): each product and each sum
rounded to f32 on its own (:mod:`collectives.device.rounding`: no ``fma``), in ``k`` order,
and the total rounded once to the output's dtype.  So it is bit-identical to the torch steps it
replaces (``y[:, k].float() * w[:, k, None]``, summed in ``k`` order, ``.to(dtype)``), and it
reads each received row once, where those steps read and wrote the rows some ``3 * topk``
times and launched as many kernels.

Threads take 16-byte vectors of a row where the key says so (``vec``: the row's length and
every address allow it), else single elements; the grid strides over ``tokens x hidden / vec``
such pieces.  A plain kernel: no wait, no other rank, no residency constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64, Uint8

import ptxops

from ..dtypes import DTYPES
from ..device import rounding
from ..device.kernel_args import KernelArgs
from ..device.launch import check_threads, launcher
from ..device.signals import LOCAL, gmem
from ..layouts import Arg, Layout
from .family import Family, register

#: Output dtypes the kernel rounds to as torch does (to float8, torch's conversion and PTX's
#: saturating one differ; those combines stay in torch).
DTYPES_ROUNDED = ("f32", "f16", "bf16")
#: The largest top-k the kernel unrolls.
MAX_TOPK = 16
#: Most thread blocks of a launch (the grid strides past them).
MAX_BLOCKS = 1024

MOE_COMBINE = Layout("MoeCombineArgs", (
    Arg("out", Int64, "the output: tokens x hidden of the key's dtype"),
    Arg("entries", Int64, "the received rows (hidden elements each), in the dispatch's sorted order"),
    Arg("slots", Int64, "int64[tokens * topk]: the row of entries that entry (t, k) came back as"),
    Arg("valid", Int64, "uint8[tokens * topk]: 1 where entry (t, k) was sent (and came back)"),
    Arg("weights", Int64, "f32[tokens * topk]: entry (t, k)'s weight (taken as 0 where not valid)"),
    Arg("tokens", Int64, "tokens"),
    Arg("hidden", Int64, "elements per row (a multiple of the key's vec)"),
))


@dataclass(frozen=True)
class MoeCombineKey:
    """The compile-time choices of one weighted-sum kernel: the rows' dtype (one of
    :data:`DTYPES_ROUNDED`), ``topk`` (1..:data:`MAX_TOPK`, unrolled), ``vec`` (elements per
    access: 1, or a 16-byte vector's) and threads per block."""

    dtype: str
    topk: int
    vec: int = 1
    threads: int = 256

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES_ROUNDED:
            raise ValueError(f"the MoE combine kernel takes dtypes {DTYPES_ROUNDED}, not {self.dtype!r}")
        if not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"topk must be 1..{MAX_TOPK}, not {self.topk}")
        if self.vec not in (1, DTYPES[self.dtype].elements(16)):
            raise ValueError(f"vec must be 1 or {DTYPES[self.dtype].elements(16)} for {self.dtype}, not {self.vec}")
        check_threads(self.threads)

    def blocks(self, tokens: int, hidden: int) -> int:
        """Thread blocks of a launch for ``tokens`` rows of ``hidden``: one piece per thread,
        at most :data:`MAX_BLOCKS` (at least 1)."""
        pieces = tokens * (hidden // self.vec)
        return max(1, min(MAX_BLOCKS, -(-pieces // self.threads)))


@cute.jit
def weighted_sum(args: KernelArgs, row_at, dtype: cutlass.Constexpr, align: cutlass.Constexpr, topk: cutlass.Constexpr,
                 vec: cutlass.Constexpr, threads: cutlass.Constexpr, reach: cutlass.Constexpr,
                 by: cutlass.Constexpr) -> None:
    """The sum of every token's entries (``args``: ``out``, ``slots``, ``valid``, ``weights``,
    ``tokens``, ``hidden``) by the grid's threads, ``vec`` elements of ``dtype`` at a time
    (``align``: their bytes), entry row ``row`` read at address ``row_at(row)`` (traced
    inline; ``reach``: whose memory the rows lie in)."""
    per_row = args.hidden // vec
    pieces = args.tokens * per_row
    g = Int64(cute.arch.block_idx()[0]) * threads + Int64(cute.arch.thread_idx()[0])
    stride = Int64(cute.arch.grid_dim()[0]) * threads
    while g < pieces:
        t = g // per_row
        at = (g - t * per_row) * vec  # the piece's first element in its row
        total = [rounding.zero()] * vec
        for k in cutlass.range_constexpr(topk):
            f = t * topk + k
            sent = ptxops.ld(gmem(Uint8, args.valid, 1, LOCAL, by) + f)
            w = rounding.widen(ptxops.ld(gmem(Float32, args.weights, 4, LOCAL, by) + f))
            w = cutlass.select_(sent != Uint8(0), w, rounding.zero())  # unsent: 0, whatever it holds
            row = ptxops.ld(gmem(Int64, args.slots, 8, LOCAL, by) + f, dtype=Int64)
            row = cutlass.select_(sent != Uint8(0), row, Int64(0))  # unsent: read row 0 (it exists), use zeros
            src = gmem(dtype, row_at(row), align, reach, by) + cute.assume(at, divby=vec)
            values = ptxops.ld(src, num_elements=vec)
            for i in cutlass.range_constexpr(vec):
                e = rounding.widen(values[i] if cutlass.const_expr(vec > 1) else values)
                e = cutlass.select_(sent != Uint8(0), e, rounding.zero())
                term = rounding.mul_rn(e, w)
                total[i] = term if cutlass.const_expr(k == 0) else rounding.add_rn(total[i], term)
        dst = gmem(dtype, args.out, align, LOCAL, by) + cute.assume(t * args.hidden + at, divby=vec)
        ptxops.st(dst, rounding.narrow(total, dtype))
        g += stride


def build(key: MoeCombineKey):
    """The ``@cute.jit`` launcher of the weighted-sum kernel for ``key`` (grid: a runtime argument)."""
    dtype, topk, vec, threads = DTYPES[key.dtype].cute, key.topk, key.vec, key.threads
    element = DTYPES[key.dtype].bytes
    by = "collectives.algorithms.moe_combine"

    @cute.jit
    def kernel(args: KernelArgs):
        weighted_sum(args, lambda row: args.entries + row * args.hidden * element, dtype, vec * element, topk, vec,
                     threads, LOCAL, by)

    return launcher(kernel, threads, layout=MOE_COMBINE)


def _to_text(key: MoeCombineKey) -> str:
    return f"moe_combine/{key.dtype}/k{key.topk}/v{key.vec}/t{key.threads}"


def _from_text(kid: str) -> MoeCombineKey:
    _, dtype, topk, vec, threads = kid.split("/")
    return MoeCombineKey(dtype, int(topk[1:]), int(vec[1:]), int(threads[1:]))


def _snapshot() -> list[str]:
    """Every dtype, top-k 1, 2 and 8, by elements and by 16-byte vectors."""
    return [_to_text(MoeCombineKey(dtype, topk, vec))
            for dtype in DTYPES_ROUNDED for topk in (1, 2, 8) for vec in (1, DTYPES[dtype].elements(16))]


def _facets(kid: str) -> tuple[tuple, ...]:
    key = _from_text(kid)
    return ("moe_combine", key.dtype, key.vec > 1), ("moe_combine", key.topk)


FAMILY = register(Family("moe_combine", MoeCombineKey, ("moe_combine",), MOE_COMBINE, build, _snapshot, _to_text,
                         _from_text, _facets))


__all__ = ["DTYPES_ROUNDED", "FAMILY", "MAX_BLOCKS", "MAX_TOPK", "MOE_COMBINE", "MoeCombineKey", "build", "weighted_sum"]
