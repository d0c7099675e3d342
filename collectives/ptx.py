"""Compile a collective kernel for a target without a GPU and return its PTX."""

from __future__ import annotations

import tempfile

from .config import KernelKey


def kernel_ptx(key: KernelKey, arch: str = "sm_90a") -> str:
    """The PTX of ``key``'s kernel compiled for ``arch`` (ptxas runs, so it also assembles)."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from . import algorithms

    with tempfile.TemporaryDirectory() as dump:
        compiled = cute.compile[cute.KeepPTX, cute.GPUArch(arch), DumpDir(dump)](
            algorithms.build(key), *algorithms.example_arguments()
        )
        return compiled.__ptx__
