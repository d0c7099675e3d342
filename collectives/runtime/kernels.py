"""Compiling collective kernels: the one compile path (the runtime's launches and
``python -m collectives ptx`` (:func:`kernel_ptx`) both go through :func:`compile_kernel`, so the
PTX printed is the PTX launched), the process-wide store of compiled kernels (each key compiled
once per process, whichever communicator or thread asks first; the others wait for it) with each
kernel's occupancy, and the per-communicator cache in front of it.  Imports neither torch nor
CuTeDSL until a compile."""

from __future__ import annotations

import functools
import tempfile
import threading
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
    with tempfile.TemporaryDirectory() as dump:  # the PTX and cubin are kept in memory, the files dropped
        return cute.compile[cute.KeepPTX, cute.KeepCUBIN, cute.EnableTVMFFI, cute.GPUArch(target),
                            DumpDir(dump)](launch, *args)


#: Every kernel compiled in this process, by (key, target): (compiled kernel, its TVM-FFI function).
_COMPILED: dict[tuple[KernelKey | str, str], tuple[Any, Callable[..., Any]]] = {}
#: Kernels' occupancy, by (key, target, device).
_OCCUPANCY: dict[tuple[KernelKey | str, str, int], Any] = {}
#: One compile at a time in this process (CuTeDSL's compiler is not re-entrant across threads;
#: a second thread asking for a key being compiled waits for it instead of compiling it again).
_COMPILE_LOCK = threading.Lock()


def compiled(key: KernelKey | str, target: str) -> tuple[Any, Callable[..., Any]]:
    """(compiled kernel, TVM-FFI function) of ``key`` on ``target``: compiled on the first ask
    in this process, whoever asks (thread-safe)."""
    entry = _COMPILED.get((key, target))
    if entry is None:
        with _COMPILE_LOCK:
            entry = _COMPILED.get((key, target))
            if entry is None:
                kernel = compile_kernel(key, target)
                entry = _COMPILED[(key, target)] = (kernel, kernel.__tvm_ffi_object__())
    return entry


def occupancy(key: KernelKey, target: str, device: int) -> Any:
    """The :class:`~collectives.algorithms.residency.Occupancy` of ``key``'s compiled kernel on
    GPU ``device``: blocks per SM as the CUDA driver computes them for its cubin, else (no
    driver answer) its registers from ``ptxas`` and its shared memory bound."""
    from ..algorithms.residency import Occupancy, kernel_registers, shared_bound

    found = _OCCUPANCY.get((key, target, device))
    if found is None:
        kernel, _ = compiled(key, target)
        # Under the compile lock, as the compile: the first rank to ask loads the cubin while the
        # others wait on the host, so no rank has yet launched this kernel (whose spinning blocks
        # a module load might wait for).
        with _COMPILE_LOCK:
            found = _OCCUPANCY.get((key, target, device))
            if found is None:
                per_sm = _driver_blocks_per_sm(kernel, key.threads, shared_bound(key), device)
                found = (Occupancy(per_sm=per_sm) if per_sm is not None
                         else Occupancy(registers=kernel_registers(kernel.__ptx__, target), shared=shared_bound(key)))
                _OCCUPANCY[(key, target, device)] = found
    return found


def _driver_blocks_per_sm(kernel: Any, threads: int, shared: int, device: int) -> int | None:
    """``cuOccupancyMaxActiveBlocksPerMultiprocessor`` of the kernel's cubin on ``device`` with
    ``shared`` bytes of dynamic shared memory per block (CuTeDSL sizes a kernel's shared memory
    at launch: the cubin declares none), None where the cubin, the function or the driver is not
    at hand."""
    cubin, names = getattr(kernel, "__cubin__", None), list(getattr(kernel, "kernel_info", None) or ())
    if not cubin or len(names) != 1:
        return None
    try:
        import torch
        from cuda.bindings import driver

        with torch.cuda.device(device):  # (the module stays loaded: an unload may wait for the device)
            err, module = driver.cuModuleLoadData(bytes(cubin))
            if err != driver.CUresult.CUDA_SUCCESS:
                return None
            err, function = driver.cuModuleGetFunction(module, names[0].encode())
            if err != driver.CUresult.CUDA_SUCCESS:
                return None
            attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            if driver.cuFuncSetAttribute(function, attribute, shared)[0] != driver.CUresult.CUDA_SUCCESS:
                return None
            err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared)
            return int(blocks) if err == driver.CUresult.CUDA_SUCCESS else None
    except Exception:  # noqa: BLE001 (no driver answer, whatever the reason: the arithmetic decides)
        return None


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
    """The compiled kernels a context running on ``backend`` launches, by (key, target), as
    their TVM-FFI functions (CuTeDSL's low-overhead positional call path), from the
    process-wide store (:func:`compiled`), each checked once for this backend."""

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
            entry = compiled(key, target)
            refuse_multimem(entry[0].__ptx__, key, self.backend)
            self._kernels[(key, target)] = entry
        return entry[1]
