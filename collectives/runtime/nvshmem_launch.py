"""Launching a collective kernel that links NVSHMEM's device library (the all-to-all's
``transport="nvshmem"``: :class:`collectives.algorithms.all_to_all.NvshmemTransport`).

Such a kernel reads NVSHMEM's device state from a global of its own CUDA library, which
``nvshmem.core.library_init`` fills once the library is loaded: so it is compiled without
CuTeDSL's TVM-FFI path (whose function loads its library where we cannot name it) and called
through CuTeDSL's executor on the GPU, whose library is registered with NVSHMEM when
:meth:`NvshmemLaunch.bind` loads it (before any launch, outside any capture).  One
:class:`NvshmemLaunch` per communicator (its :class:`~collectives.runtime.kernels.KernelCache`):
a new NVSHMEM job (a new context) registers the library again.

The load and the registration run on a helper thread that :meth:`NvshmemLaunch.bind` waits
for at most twice the communicator's timeout: a load waits for every kernel running on the GPU
(each bounded by that timeout), so one that has not returned by then is reported as a
:class:`~collectives.errors.CollectiveError` naming the step, not a silent hang (the thread
itself cannot be stopped and is left behind).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveError

__all__ = ["NvshmemLaunch", "bounded", "register", "uses_nvshmem"]


def uses_nvshmem(key: Any) -> bool:
    """Whether ``key``'s kernel links NVSHMEM's device library."""
    return getattr(key, "transport", None) == "nvshmem"


class NvshmemLaunch:
    """The positional call of a compiled NVSHMEM kernel (``kernel``), as the runtime calls the
    TVM-FFI functions: the layout's fields and the grid as integers, then the stream;
    ``examples``: the launcher's example arguments (their types convert the integers);
    ``timeout_s``: the communicator's timeout (its kernels' bound), read at :meth:`bind`."""

    def __init__(self, kernel: Any, examples: tuple, timeout_s: Callable[[], float]) -> None:
        self.kernel = kernel
        self.timeout_s = timeout_s
        self.types = [type(v) for v in examples[:-1]]
        self.executors: dict[int, Any] = {}
        self.libraries: list[Any] = []  # NVSHMEM's handles of the registered libraries (kept alive)

    def bind(self, device: int) -> Any:
        """Load the kernel's library onto GPU ``device`` and register it with NVSHMEM (once),
        within twice the communicator's timeout (:func:`bounded`)."""
        executor = self.executors.get(device)
        if executor is None:
            import torch
            from cuda.bindings import driver

            with torch.cuda.device(device):  # torch's context of the GPU, made current on the helper thread
                err, context = driver.cuCtxGetCurrent()
            if err != driver.CUresult.CUDA_SUCCESS or not int(context):
                raise CollectiveError(f"all_to_all over NVSHMEM: no CUDA context on GPU {device} ({err})")
            executor, library = bounded(
                f"loading the NVSHMEM kernel's library onto GPU {device} and registering it with NVSHMEM "
                "(nvshmem.core.library_init)", lambda: register(self.kernel, device, context), 2 * self.timeout_s())
            self.libraries.append(library)
            self.executors[device] = executor
        return executor

    def __call__(self, *values: Any) -> None:
        import torch
        from cuda.bindings import driver

        *fields, stream = values
        executor = self.bind(torch.cuda.current_device())
        executor(*(t(v) for t, v in zip(self.types, fields, strict=True)), driver.CUstream(int(stream)))


def register(kernel: Any, device: int, context: Any) -> tuple[Any, Any]:
    """On the calling thread, with ``context`` current: ``kernel``'s executor on GPU ``device``
    (its library loaded) and NVSHMEM's handle of that library, registered
    (``nvshmem.core.library_init``: NVSHMEM writes its device state into the library's
    ``nvshmemi_device_state_d``)."""
    import nvshmem.core as nvshmem
    import torch
    from cuda.bindings import driver

    (err,) = driver.cuCtxSetCurrent(context)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CollectiveError(f"all_to_all over NVSHMEM: cuCtxSetCurrent failed ({err})")
    with torch.cuda.device(device):
        executor = kernel.to(device)
        library = nvshmem.NvshmemKernelObject.from_handle(int(executor.jit_module.cuda_library[0]))
        library._keepalive = executor
        nvshmem.library_init(library)
    return executor, library


def bounded(what: str, step: Callable[[], Any], timeout_s: float) -> Any:
    """``step()``'s value (or its exception), run on a daemon thread waited for at most
    ``timeout_s``; past that a :class:`~collectives.errors.CollectiveError` naming ``what`` (the
    thread, which cannot be stopped, is left to finish or block on its own)."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(step())
        except BaseException as error:  # handed to the waiting thread
            failed.append(error)

    thread = threading.Thread(target=run, name="collectives-nvshmem-bind", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CollectiveError(f"all_to_all over NVSHMEM: {what} did not return in {timeout_s:g} s (a CUDA module "
                              "load waits for every kernel on the GPU; NVSHMEM may block here: see "
                              "docs/guide-multinode.md, the NVSHMEM transport)")
    if failed:
        raise failed[0]
    return result[0]
