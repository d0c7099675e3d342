"""Compile a collective kernel for a target without a GPU and return its PTX; refuse PTX that
holds multimem where there is no NVLink multicast."""

from __future__ import annotations

import tempfile

from .algorithms.key import KernelKey
from .errors import CollectiveError


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


def refuse_multimem(ptx: str | None, key: KernelKey | str, backend: str) -> None:
    """Refuse a kernel whose PTX holds a ``multimem`` instruction unless the context runs on
    NVLink multicast (``backend``), and one whose PTX could not be read."""
    if backend == "multicast":
        return
    if not ptx:
        raise CollectiveError(f"no PTX to check for {key}: refusing to launch it without multicast")
    if "multimem." in ptx:
        raise CollectiveError(
            f"the kernel for {key} holds multimem instructions, but this context has no NVLink "
            f"multicast ({backend!r} backend): refusing to launch it; use backend='peer' or "
            "'multicast_emulated'"
        )
