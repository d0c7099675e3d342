"""Launching a collective kernel that links NVSHMEM's device library (the all-to-all's
``transport="nvshmem"``: :class:`collectives.algorithms.all_to_all.NvshmemTransport`).

Such a kernel reads NVSHMEM's device state from a global of its own CUDA library, which
``nvshmem.core.library_init`` fills once the library is loaded: so it is compiled without
CuTeDSL's TVM-FFI path (whose function loads its library where we cannot name it) and called
through CuTeDSL's executor on the GPU, whose library is registered with NVSHMEM when
:meth:`NvshmemLaunch.bind` loads it (before any launch, outside any capture).  One
:class:`NvshmemLaunch` per communicator (its :class:`~collectives.runtime.kernels.KernelCache`):
a new NVSHMEM job (a new context) registers the library again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NvshmemLaunch", "uses_nvshmem"]


def uses_nvshmem(key: Any) -> bool:
    """Whether ``key``'s kernel links NVSHMEM's device library."""
    return getattr(key, "transport", None) == "nvshmem"


class NvshmemLaunch:
    """The positional call of a compiled NVSHMEM kernel (``kernel``), as the runtime calls the
    TVM-FFI functions: the layout's fields and the grid as integers, then the stream;
    ``examples``: the launcher's example arguments (their types convert the integers)."""

    def __init__(self, kernel: Any, examples: tuple) -> None:
        self.kernel = kernel
        self.types = [type(v) for v in examples[:-1]]
        self.executors: dict[int, Any] = {}
        self.libraries: list[Any] = []  # NVSHMEM's handles of the registered libraries (kept alive)

    def bind(self, device: int) -> Any:
        """Load the kernel's library onto GPU ``device`` and register it with NVSHMEM (once)."""
        executor = self.executors.get(device)
        if executor is None:
            import nvshmem.core as nvshmem
            import torch

            with torch.cuda.device(device):
                executor = self.kernel.to(device)
                library = nvshmem.NvshmemKernelObject.from_handle(int(executor.jit_module.cuda_library[0]))
                library._keepalive = executor
                nvshmem.library_init(library)
            self.libraries.append(library)
            self.executors[device] = executor
        return executor

    def __call__(self, *values: Any) -> None:
        import torch
        from cuda.bindings import driver

        *fields, stream = values
        executor = self.bind(torch.cuda.current_device())
        executor(*(t(v) for t, v in zip(self.types, fields, strict=True)), driver.CUstream(int(stream)))
