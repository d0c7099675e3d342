"""Helpers for tests that compile CuTeDSL kernels to PTX on a machine without a GPU."""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")
from cutlass.base_dsl.compiler import DumpDir  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor  # noqa: E402

_DUMP = tempfile.mkdtemp(prefix="ptxops-ptx-")


def compile_ptx(launcher: Callable, *args, arch: str = "sm_90a") -> str:
    """Compile ``launcher(*args)`` for ``arch`` (ptxas runs; no host JIT engine: nothing is
    launched) and return the PTX text."""
    compiled = cute.compile[cute.KeepPTX, cute.GPUArch(arch), DumpDir(_DUMP)](launcher, *args, no_jit_engine=True)
    ptx = compiled.__ptx__
    assert ptx.lstrip().startswith("//") or ".version" in ptx, f"no PTX returned: {ptx[:200]}"
    return ptx


def global_tensor(dtype=None, n: int = 4096, align: int = 32):
    """A fake global tensor argument."""
    return make_fake_compact_tensor(dtype or cutlass.Int32, (n,), assumed_align=align)


_OPCODE = re.compile(
    r"(?<![\w.%])((?:multimem|atom|red|ld|st|fence|cp\.async\.bulk|cp\.reduce\.async\.bulk|mbarrier"
    r"|mapa|nanosleep|griddepcontrol|membar|elect|prefetchu?|clusterlaunchcontrol|tensormap)(?:\.[\w:]+)*)(?=[\s;])"
)


def opcodes(ptx: str, wanted: Iterable[str] | None = None) -> Counter:
    """Opcodes of the instruction families ptxops wraps, counted, as they appear in ``ptx``
    (``ld.param`` loads of kernel arguments excluded)."""
    found = Counter(m for m in _OPCODE.findall(ptx) if not m.startswith(("ld.param", "st.param")))
    if wanted is not None:
        keep = set(wanted)
        return Counter({k: v for k, v in found.items() if k in keep})
    return found
