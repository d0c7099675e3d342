"""One compile per kernel key and target in a test run: the PTX that
:func:`collectives.runtime.kernels.kernel_ptx` compiles (ptxas included) is kept in a folder the
run's processes share (xdist's workers), so a key that another test or worker compiled already
is read there, not compiled again (some 60 keys are asked for by more than one test).  A key
determines its kernel (every knob a test turns, ``config.PDL`` or ``UNROLL``, is a field of
the key), so the text read is the one a compile would return."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

#: The shared folder, named by the process that starts the run (its workers inherit it).
FOLDER_ENV = "PTXOPS_TEST_PTX_DIR"


def install(folder: Path) -> None:
    """Route ``kernel_ptx``'s compiles (``compile_kernel(..., ptx_only=True)``) through
    ``folder``; a launchable kernel's compile is left as it is."""
    from collectives.runtime import kernels

    compile_kernel = kernels.compile_kernel

    def compile_once(key, target: str, *, ptx_only: bool = False):
        if not ptx_only:
            return compile_kernel(key, target)
        path = folder / (hashlib.sha256(f"{key!r}|{target}".encode()).hexdigest()[:32] + ".ptx")
        if path.exists():
            return SimpleNamespace(__ptx__=path.read_text())
        kernel = compile_kernel(key, target, ptx_only=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(kernel.__ptx__)
        partial.replace(path)  # (whole or absent for a reader in another worker)
        return kernel

    kernels.compile_kernel = compile_once
