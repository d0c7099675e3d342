"""Compile a collective kernel for a target without a GPU and return its PTX."""

from __future__ import annotations

import os
import tempfile

from .config import KernelKey


def kernel_ptx(key: KernelKey, arch: str = "sm_90a") -> str:
    """The PTX of ``key``'s kernel compiled for ``arch`` (ptxas runs, so it also assembles)."""
    import cutlass.cute as cute

    from . import kernels

    with tempfile.TemporaryDirectory() as dump:
        previous = os.environ.get("CUTE_DSL_DUMP_DIR")
        os.environ["CUTE_DSL_DUMP_DIR"] = dump
        try:
            compiled = cute.compile[cute.KeepPTX, cute.GPUArch(arch)](
                kernels.build(key), *kernels.example_arguments()
            )
            return compiled.__ptx__
        finally:
            if previous is None:
                os.environ.pop("CUTE_DSL_DUMP_DIR", None)
            else:
                os.environ["CUTE_DSL_DUMP_DIR"] = previous
