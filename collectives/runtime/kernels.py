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
from collections.abc import Callable, Hashable
from typing import Any

from ..algorithms.family import Family
from ..algorithms.key import KernelKey
from ..errors import CollectiveError
from .collection import no_collection
from .driver_streams import create_stream
from .nvshmem_launch import NvshmemLaunch, uses_nvshmem

#: A kernel key of any kernel family (:data:`collectives.algorithms.FAMILIES`).
Key = Hashable


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


def compile_kernel(key: Key, target: str, *, ptx_only: bool = False) -> Any:
    """CuTeDSL's compiled kernel for ``key`` on ``target`` (no GPU needed; ptxas runs), with its
    PTX (``__ptx__``) and its TVM-FFI function (``__tvm_ffi_object__()``): built by the key's
    kernel family (:func:`collectives.algorithms.family_of`).  ``ptx_only``: the PTX and cubin
    alone, nothing to launch (no TVM-FFI function, no host JIT engine: about a tenth less time)."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    family = _family(key)
    launchable = not (ptx_only or uses_nvshmem(key))
    ffi = (cute.EnableTVMFFI,) if launchable else ()  # (NVSHMEM: collectives.runtime.nvshmem_launch says why)
    with tempfile.TemporaryDirectory() as dump:  # the PTX and cubin are kept in memory, the files dropped
        return cute.compile[cute.KeepPTX, cute.KeepCUBIN, *ffi, cute.GPUArch(target),
                            DumpDir(dump)](family.build(key), *family.example_arguments(), no_jit_engine=ptx_only)


def example_arguments(key: Key) -> tuple:
    """The placeholder arguments ``key``'s launcher compiles from (its runtime arguments: the
    layout's, then the grid where it is one, then the stream)."""
    return _family(key).example_arguments()


def _family(key: Key) -> Family:
    from ..algorithms import family_of  # (every family registered)

    return family_of(key)


#: Every kernel compiled in this process, by (key, target): (compiled kernel, its TVM-FFI function).
_COMPILED: dict[tuple[Key, str], tuple[Any, Callable[..., Any]]] = {}
#: Kernels' occupancy, by (key, target, device).
_OCCUPANCY: dict[tuple[Key, str, int], Any] = {}
#: The (key, target, device) whose kernel :func:`load` has loaded onto the device.
_LOADED: set[tuple[Key, str, int]] = set()
#: One compile or load at a time in this process (CuTeDSL's compiler is not re-entrant across
#: threads; a second thread asking for a key being compiled waits for it instead of compiling it
#: again).
_COMPILE_LOCK = threading.Lock()
#: A private stream per device for :func:`load`'s throwaway captures.
_LOAD_STREAMS: dict[int, Any] = {}


def compiled(key: Key, target: str) -> tuple[Any, Callable[..., Any]]:
    """(compiled kernel, TVM-FFI function) of ``key`` on ``target``: compiled on the first ask
    in this process, whoever asks (thread-safe).  Not loaded onto a GPU: see :func:`load`."""
    entry = _COMPILED.get((key, target))
    if entry is None:
        with _COMPILE_LOCK:
            entry = _COMPILED.get((key, target))
            if entry is None:
                kernel = compile_kernel(key, target)
                fn = None if uses_nvshmem(key) else kernel.__tvm_ffi_object__()  # NVSHMEM's: KernelCache.get
                entry = _COMPILED[(key, target)] = (kernel, fn)
    return entry


def load(key: Key, target: str, device: int) -> None:
    """Load ``key``'s compiled kernel onto GPU ``device`` now (once per process), launching
    nothing, and measure its occupancy there (:func:`occupancy`).

    Loading a CUDA module waits for every kernel running on the GPU, whatever its stream (on an
    H100, a load waited out an unrelated 1 s kernel: ``tests/collectives/gpu/one_gpu/
    test_kernel_loading.py``), and ``CUDA_MODULE_LOADING=EAGER`` does not move it: CuTeDSL's
    TVM-FFI function loads its library at its first call, and the occupancy probe loads the
    cubin.  Left to the first launch or to a CUDA-graph capture's first call (then the
    graph's instantiation waits), the load can fall where another rank sharing the GPU (a
    one-GPU world) already spins in a kernel waiting for this rank's launch: neither moves
    until that kernel's timeout.  Done here instead, when a call is planned, before this rank
    launches it.  In a world that is not enough where this rank's earlier kernels still wait
    for another rank's launch, which CUDA holds behind the load: there every rank meets first
    (:meth:`~collectives.runtime.communicator.Communicator.kernel_together`).  The first call
    goes into a capture on a private stream that is ended and destroyed at once: recorded,
    never instantiated, never run."""
    if (key, target, device) in _LOADED:
        return
    kernel, fn = compiled(key, target)
    with _COMPILE_LOCK:
        if (key, target, device) in _LOADED:
            return
        _call_in_throwaway_capture(fn, key, device)
        if _family(key).measured and (key, target, device) not in _OCCUPANCY:
            _OCCUPANCY[(key, target, device)] = _measure(kernel, key, target, device)
        _LOADED.add((key, target, device))


def _call_in_throwaway_capture(fn: Callable[..., Any], key: Key, device: int) -> None:
    """Call ``fn`` with placeholder arguments (null addresses, one block) on a private stream of
    GPU ``device`` under a thread-local stream capture (garbage collection paused:
    :mod:`~collectives.runtime.collection`), then end the capture and destroy its graph:
    CuTeDSL's first-call library load happens, the launch is only recorded."""
    import torch
    from cuda.bindings import driver

    with torch.cuda.device(device):
        stream = _LOAD_STREAMS.get(device)
        if stream is None:
            stream = _LOAD_STREAMS[device] = create_stream()
        *values, _ = example_arguments(key)
        arguments = (*(int(v) for v in values), int(stream))
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        with no_collection():
            _check(driver.cuStreamBeginCapture(stream, mode)[0], "cuStreamBeginCapture")
            try:
                fn(*arguments)
            finally:
                err, graph = driver.cuStreamEndCapture(stream)
                if err == driver.CUresult.CUDA_SUCCESS and graph is not None and int(graph):
                    driver.cuGraphDestroy(graph)
        _check(err, "cuStreamEndCapture")


def _check(err: Any, what: str) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise CollectiveError(f"loading a collective kernel: {what} failed: {err}")


def occupancy(key: KernelKey, target: str, device: int) -> Any:
    """The :class:`~collectives.algorithms.residency.Occupancy` of ``key``'s compiled kernel on
    GPU ``device``: blocks per SM as the CUDA driver computes them for its cubin, else (no
    driver answer) its registers from ``ptxas`` and its shared memory bound.  Measured when
    the kernel is loaded (:func:`load`, which this calls: nothing where it was loaded)."""
    load(key, target, device)
    return _OCCUPANCY[(key, target, device)]


def _measure(kernel: Any, key: KernelKey, target: str, device: int) -> Any:
    from ..algorithms.residency import Occupancy, kernel_registers, shared_bound

    per_sm = _driver_blocks_per_sm(kernel, key.threads, shared_bound(key), device)
    if per_sm is not None:
        return Occupancy(per_sm=per_sm)
    return Occupancy(registers=kernel_registers(kernel.__ptx__, target), shared=shared_bound(key))


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

        with torch.cuda.device(device):  # (the module stays loaded: an unload, like a load, waits for the device)
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
    return compile_kernel(key, arch, ptx_only=True).__ptx__


def refuse_multimem(ptx: str | None, key: Key, backend: str) -> None:
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

    def __init__(self, backend: str, timeout_s: Callable[[], float] | None = None) -> None:
        self.backend = backend
        #: The communicator's timeout, which bounds an NVSHMEM kernel's library registration
        #: (:class:`~collectives.runtime.nvshmem_launch.NvshmemLaunch`); None: no NVSHMEM kernels.
        self.timeout_s = timeout_s
        #: (compiled kernel, its TVM-FFI function): the compiled kernel kept alive with it.
        self._kernels: dict[tuple[Key, str], tuple[Any, Callable[..., Any]]] = {}

    def has(self, key: Key, target: str) -> bool:
        """Whether this cache holds ``key``'s kernel on ``target`` (then loaded, given a device)."""
        return (key, target) in self._kernels

    def get(self, key: Key, target: str, device: int | None = None) -> Callable[..., Any]:
        """The kernel for ``key`` on ``target``, compiled on first use and, given ``device``,
        loaded onto that GPU then (:func:`load`: never at a launch).

        Raises:
            CollectiveError: the kernel's PTX holds a ``multimem`` instruction and the context
                has no NVLink multicast (a safety net, checked once per compiled kernel, before
                it is loaded).
        """
        entry = self._kernels.get((key, target))  # the per-call path: a lookup
        if entry is None:
            entry = compiled(key, target)
            refuse_multimem(entry[0].__ptx__, key, self.backend)
            if uses_nvshmem(key):  # this communicator's launch, its library registered with NVSHMEM
                if self.timeout_s is None:
                    raise CollectiveError(f"{key}: an NVSHMEM kernel needs a communicator's kernel cache (its timeout "
                                          "bounds the library's registration)")
                entry = (entry[0], NvshmemLaunch(entry[0], example_arguments(key), self.timeout_s))
                if device is not None:
                    entry[1].bind(device)
            elif device is not None:
                load(key, target, device)
            self._kernels[(key, target)] = entry
        return entry[1]
