"""What makes CuTeDSL arithmetic signed, as ``collectives.algorithms.lamport._like`` and
``collectives.device.signals.gmem`` say: not a Python constant beside a ``Uint32`` (which stays
unsigned), but a load through a pointer moved by ``+`` without ``dtype=`` (signed, so its
``>>`` is ``shr.s64``); and a constant past ``Int32``'s range widens the operation to 64 bits."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass")
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from tests.support.cute_support import compile_ptx, global_tensor  # noqa: E402
from cutlass import Uint32, Uint64  # noqa: E402

import ptxops  # noqa: E402
from collectives.config import LAMPORT_CALLS  # noqa: E402
from collectives.device.signals import gmem  # noqa: E402


def test_what_makes_kernel_arithmetic_signed() -> None:
    types: dict[str, type] = {}

    @cute.kernel
    def kernel(t: cute.Tensor, c: Uint32):
        at = t.iterator.toint()
        moved = ptxops.ld(gmem(Uint64, at, 8) + 1)
        typed = ptxops.ld(gmem(Uint64, at, 8) + 1, dtype=Uint64)
        types.update(moved=type(moved), typed=type(typed), small=type(c % 3), large=type(c % LAMPORT_CALLS))
        ptxops.st(gmem(Uint64, at, 8) + 2, moved >> 32)
        ptxops.st(gmem(Uint64, at, 8) + 3, typed >> 32)

    @cute.jit
    def launch(t: cute.Tensor, c: Uint32):
        kernel(t, c).launch(grid=[1, 1, 1], block=[1, 1, 1])

    ptx = compile_ptx(launch, global_tensor(cutlass.Uint64), Uint32(7))
    assert types == {"moved": cutlass.Int64, "typed": Uint64, "small": Uint32, "large": cutlass.Int64}
    shifts = re.findall(r"\bshr\.([su]64)\s+%rd\d+, %rd\d+, 32;", ptx)
    assert sorted(shifts) == ["s64", "u64"], shifts
