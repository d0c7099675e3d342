"""Compiling collective kernels: the one compile path (the runtime's launches and
``python -m collectives ptx`` (:func:`kernel_ptx`) both go through :func:`compile_kernel`, so the
PTX printed is the PTX launched) and the per-communicator cache of compiled kernels.  Imports
neither torch nor CuTeDSL until a compile."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from typing import Any

from ..algorithms.key import KernelKey
from ..errors import CollectiveError


def compile_target(device: int | None = None) -> str:
    """``sm_90a`` on Hopper, ``sm_100a`` on Blackwell data-centre parts: what GPU ``device``
    (default: the current one) runs."""
    import torch  # the compile itself needs none (python -m collectives ptx runs without torch)

    return _target(torch.cuda.current_device() if device is None else device)


@functools.cache
def _target(device: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


def compile_kernel(key: KernelKey | str, target: str) -> Any:
    """CuTeDSL's compiled kernel for ``key`` on ``target`` (no GPU needed; ptxas runs), with its
    PTX (``__ptx__``) and its TVM-FFI function (``__tvm_ffi_object__()``).  A string key names
    a stream-flag kernel (:mod:`collectives.algorithms.flags`), an
    :class:`~collectives.algorithms.all_to_all.AllToAllKey` the all-to-all's."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from .. import algorithms
    from ..algorithms import all_to_all, flags
    from ..device.launch import example_arguments, flag_example_arguments

    if isinstance(key, str):
        launch, args = flags.build(key), flag_example_arguments()
    elif isinstance(key, all_to_all.AllToAllKey):
        launch, args = all_to_all.build(key), example_arguments(all_to_all.ALL_TO_ALL)
    else:
        launch, args = algorithms.build(key), algorithms.example_arguments()
    with tempfile.TemporaryDirectory() as dump:  # the PTX is kept in memory, the files dropped
        return cute.compile[cute.KeepPTX, cute.EnableTVMFFI, cute.GPUArch(target), DumpDir(dump)](launch, *args)


def kernel_ptx(key: KernelKey, arch: str = "sm_90a") -> str:
    """The PTX of ``key``'s kernel compiled for ``arch`` (ptxas runs, so it also assembles):
    what ``python -m collectives ptx`` prints."""
    return compile_kernel(key, arch).__ptx__


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


class KernelCache:
    """The compiled kernels of a context running on ``backend``, by (key, target), as their
    TVM-FFI functions (CuTeDSL's low-overhead positional call path)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        #: (compiled kernel, its TVM-FFI function): the compiled kernel kept alive with it.
        self._kernels: dict[tuple[KernelKey | str, str], tuple[Any, Callable[..., Any]]] = {}

    def get(self, key: KernelKey | str, target: str) -> Callable[..., Any]:
        """The kernel for ``key`` on ``target``, compiled on first use.

        Raises:
            CollectiveError: the kernel's PTX holds a ``multimem`` instruction and the context
                has no NVLink multicast (a safety net, checked once per compiled kernel).
        """
        entry = self._kernels.get((key, target))  # the per-call path: a lookup
        if entry is None:
            compiled = compile_kernel(key, target)
            refuse_multimem(compiled.__ptx__, key, self.backend)
            entry = self._kernels[(key, target)] = (compiled, compiled.__tvm_ffi_object__())
        return entry[1]
