"""Compiling collective kernels: the one compile path (the runtime's launches and
``python -m collectives ptx`` (:func:`kernel_ptx`) both go through :func:`compile_kernel`, so the
PTX printed is the PTX launched), the process-wide store of compiled kernels (each key compiled
once per process, whichever communicator or thread asks first; the others wait for it) with each
kernel's occupancy and its :class:`DirectLaunch` (a plan's launch through the CUDA driver with
its arguments packed once), and the per-communicator cache in front of it.  Imports neither
torch nor CuTeDSL until a compile."""

from __future__ import annotations

import ctypes
import functools
import operator
import struct
import tempfile
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..algorithms.family import Family
from ..algorithms.key import KernelKey
from ..errors import CollectiveError
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


def compile_kernel(key: Key, target: str) -> Any:
    """CuTeDSL's compiled kernel for ``key`` on ``target`` (no GPU needed; ptxas runs), with its
    PTX (``__ptx__``) and its TVM-FFI function (``__tvm_ffi_object__()``): built by the key's
    kernel family (:func:`collectives.algorithms.family_of`)."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    family = _family(key)
    ffi = () if uses_nvshmem(key) else (cute.EnableTVMFFI,)  # collectives.runtime.nvshmem_launch says why
    with tempfile.TemporaryDirectory() as dump:  # the PTX and cubin are kept in memory, the files dropped
        return cute.compile[cute.KeepPTX, cute.KeepCUBIN, *ffi, cute.GPUArch(target),
                            DumpDir(dump)](family.build(key), *family.example_arguments())


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
#: Each loaded kernel's :class:`DirectLaunch`, by (key, target, device): None where the load
#: could not establish one (the TVM-FFI function launches it).
_DIRECT: dict[tuple[Key, str, int], DirectLaunch | None] = {}
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
    never instantiated, never run; what it recorded gives the kernel's :class:`DirectLaunch`
    (:func:`direct_launch`)."""
    if (key, target, device) in _LOADED:
        return
    kernel, fn = compiled(key, target)
    with _COMPILE_LOCK:
        if (key, target, device) in _LOADED:
            return
        _DIRECT[(key, target, device)] = _call_in_throwaway_capture(fn, key, device, kernel.__ptx__)
        if _family(key).measured and (key, target, device) not in _OCCUPANCY:
            _OCCUPANCY[(key, target, device)] = _measure(kernel, key, target, device)
        _LOADED.add((key, target, device))


def _call_in_throwaway_capture(fn: Callable[..., Any], key: Key, device: int,
                               ptx: str | None) -> DirectLaunch | None:
    """Call ``fn`` with probe arguments (:func:`probe_values`: never run) on a private stream of
    GPU ``device`` under a thread-local stream capture, then end the capture and destroy its
    graph: CuTeDSL's first-call library load happens, the launch is only recorded.  Returns
    the :class:`DirectLaunch` read from the recorded launch (:func:`_recorded_launch`)."""
    import torch
    from cuda.bindings import driver

    with torch.cuda.device(device):
        stream = _LOAD_STREAMS.get(device)
        if stream is None:
            stream = _LOAD_STREAMS[device] = create_stream()
        *values, _ = example_arguments(key)
        probe = probe_values(values)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(driver.cuStreamBeginCapture(stream, mode)[0], "cuStreamBeginCapture")
        try:
            fn(*probe, int(stream))
        finally:
            err, graph = driver.cuStreamEndCapture(stream)
            direct = None
            if err == driver.CUresult.CUDA_SUCCESS and graph is not None and int(graph):
                try:
                    direct = _recorded_launch(graph, probe, widths(values), ptx)
                except Exception:  # noqa: BLE001 (no readable record, whatever the reason: TVM-FFI launches)
                    direct = None
                finally:
                    driver.cuGraphDestroy(graph)
        _check(err, "cuStreamEndCapture")
    return direct


def widths(values: list | tuple) -> tuple[int, ...]:
    """Bytes of each of a launcher's placeholder arguments (its layout's, then the grid's):
    4 for an ``Int32``, 8 for anything else (``Int64``: addresses, counts)."""
    from cutlass import Int32

    return tuple(4 if isinstance(v, Int32) else 8 for v in values)


def probe_values(values: list | tuple) -> tuple[int, ...]:
    """Distinct arguments of the placeholders' widths for a recorded-only launch: argument
    ``i`` is ``i + 2`` in its low 16 bits and, 8 bytes wide, ``0x5A`` in its top byte (an
    argument read at the wrong width or place then differs), the last (the grid)
    :data:`PROBE_GRID` blocks."""
    return tuple((i + 2) | ((0x5A << 56) if w == 8 else 0) for i, w in enumerate(widths(values)[:-1])) + (PROBE_GRID,)


#: The grid of a probe launch: blocks no launcher fixes its grid to (a fixed grid is a few
#: blocks per SM), so that a recorded grid of this many is the launch's runtime argument.
PROBE_GRID = 65521


def _recorded_launch(graph: Any, probe: tuple[int, ...], sizes: tuple[int, ...],
                     ptx: str | None) -> DirectLaunch | None:
    """The :class:`DirectLaunch` of the one kernel node ``graph`` recorded from a launch with
    ``probe`` (:func:`probe_values`; ``sizes``: their widths): CuTeDSL's own function, block
    and dynamic shared memory, taken where the node's grid is the probe's (a runtime grid) and
    its parameters are the probe's values, each at its width, in order (else None: the
    TVM-FFI function stays the launch).  Programmatic stream serialization is what the
    launcher gave the kernel: it waits on the kernel before it (``griddepcontrol.wait``) iff
    it launches with it (:func:`collectives.device.launch.launcher`)."""
    from cuda.bindings import driver

    err, _, count = driver.cuGraphGetNodes(graph)
    if err or count != 1:
        return None
    err, nodes, _ = driver.cuGraphGetNodes(graph, count)
    if err or driver.cuGraphNodeGetType(nodes[0])[1] != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        return None
    err, node = driver.cuGraphKernelNodeGetParams(nodes[0])
    if err or node.gridDimX != probe[-1] or (node.gridDimY, node.gridDimZ) != (1, 1) or not node.kernelParams:
        return None
    fields = sizes[:-1]
    recorded = [int.from_bytes(ctypes.string_at(ctypes.c_void_p.from_address(node.kernelParams + 8 * i).value, w),
                               "little") for i, w in enumerate(fields)]
    if recorded != [v & ((1 << (8 * w)) - 1) for v, w in zip(probe, fields)]:
        return None
    function = node.func if int(node.func) else node.kern
    if not int(function):
        return None
    return DirectLaunch(function, (node.blockDimX, node.blockDimY, node.blockDimZ), node.sharedMemBytes,
                        bool(ptx) and "griddepcontrol.wait" in ptx, fields)


@dataclass(frozen=True)
class DirectLaunch:
    """A loaded kernel launched through the CUDA driver (``cuLaunchKernelEx``) with arguments
    packed once per plan (:meth:`bind`), instead of its TVM-FFI function converting them at
    each call: CuTeDSL's own function (or library kernel) of the kernel, its block and dynamic
    shared memory and its arguments' widths as the TVM-FFI function launched it
    (:func:`_recorded_launch`), and whether it launches with programmatic stream serialization.
    The same kernel with the same arguments, block, shared memory and attribute; the grid is
    the launch's last argument (``blocks``)."""

    function: Any
    block: tuple[int, int, int]
    shared: int
    pdl: bool
    sizes: tuple[int, ...]

    def bind(self, args: tuple[int, ...]) -> Callable[[int], None]:
        """The launch of ``args`` (the TVM-FFI function's arguments but the stream) as a function
        of the raw stream: its parameters packed now, each call sets the stream and launches."""
        from cuda.bindings import driver

        *values, blocks = args
        if len(values) != len(self.sizes):
            raise CollectiveError(f"a direct launch takes {len(self.sizes)} arguments and the grid, not {len(args)}")
        params = pack(values, self.sizes)
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = blocks, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.shared
        if self.pdl:
            config.attrs, config.numAttrs = [_serialization()], 1
        return functools.partial(_launch, driver.cuLaunchKernelEx, config, self.function,
                                 ctypes.addressof(params) + 8 * len(values), params)


@functools.cache
def _serialization() -> Any:
    """The launch attribute of programmatic stream serialization (one, read by every launch)."""
    from cuda.bindings import driver

    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    return attribute


def pack(values: list[int] | tuple[int, ...], sizes: tuple[int, ...]) -> ctypes.Array:
    """Kernel parameters as ``cuLaunchKernelEx`` takes them, in one buffer: an 8-byte slot per
    value (a 4-byte value in its low half, little-endian: the value truncated to its width, as
    the TVM-FFI function casts it), then the array of the slots' addresses (the parameters are
    at ``addressof(buffer) + 8 * len(values)``)."""
    n = len(values)
    buffer_type, layout, masks = _layout(sizes)
    buffer = buffer_type()
    base = ctypes.addressof(buffer)
    struct.pack_into(layout, buffer, 0, *map(operator.and_, values, masks), *range(base, base + 8 * n, 8))
    return buffer


@functools.cache
def _layout(sizes: tuple[int, ...]) -> tuple[type, str, tuple[int, ...]]:
    """:func:`pack`'s buffer type for values of ``sizes`` bytes, its :mod:`struct` format and
    each value's mask (its width's bits)."""
    return (ctypes.c_uint64 * (2 * len(sizes)), "<" + "".join("Q" if w == 8 else "I4x" for w in sizes) +
            f"{len(sizes)}Q", tuple((1 << (8 * w)) - 1 for w in sizes))


def _launch(launch_kernel: Callable[..., tuple], config: Any, function: Any, address: int,
            params: ctypes.Array, stream: int) -> None:
    """Launch a bound :class:`DirectLaunch` on raw stream ``stream`` (``params``: the packed
    arguments at ``address``, kept alive here)."""
    config.hStream = stream
    err, = launch_kernel(config, function, address, 0)
    if err:
        raise CollectiveError(f"launching a collective kernel: cuLaunchKernelEx failed: {err!r}")


def direct_launch(key: Key, target: str, device: int) -> DirectLaunch | None:
    """The :class:`DirectLaunch` of ``key``'s kernel on GPU ``device``, None where its load
    found none or it is not loaded."""
    return _DIRECT.get((key, target, device))


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
    return compile_kernel(key, arch).__ptx__


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

    def __init__(self, backend: str) -> None:
        self.backend = backend
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
                entry = (entry[0], NvshmemLaunch(entry[0], example_arguments(key)))
                if device is not None:
                    entry[1].bind(device)
            elif device is not None:
                load(key, target, device)
            self._kernels[(key, target)] = entry
        return entry[1]

    def direct(self, key: Key, target: str, device: int) -> DirectLaunch | None:
        """The :class:`DirectLaunch` of ``key``'s kernel on GPU ``device`` (:func:`direct_launch`),
        loading it first (:meth:`get`)."""
        self.get(key, target, device)
        return direct_launch(key, target, device)
