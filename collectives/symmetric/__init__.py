"""Host memory: symmetric tensors every rank of a group can address.

- :mod:`~collectives.symmetric.heap`: the :class:`Heap` protocol a context allocates through
  (collective allocations); :mod:`~collectives.symmetric.nvshmem_heap`: the NVSHMEM heap;
  :mod:`~collectives.symmetric.torch_heap`: the heap on PyTorch's symmetric memory.
- :mod:`~collectives.symmetric.context`: :class:`Context`, an open heap over a group (``empty``,
  peer and multicast views, host agreement), :func:`current`, :func:`is_symmetric`, :data:`ALIGN`.
- :mod:`~collectives.symmetric.bootstrap`: :func:`init` (the base context, or a sub-group's),
  with the topology exchange (:mod:`~collectives.symmetric.topology`: ranks per node).
- :mod:`~collectives.symmetric.groups`: sub-group contexts' pool heaps.
- :mod:`~collectives.symmetric.capability`: probing which backend can run (multicast or peer).

Importing this package loads neither torch nor nvshmem4py: the names below load their module on
first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: Each name of this package's face -> the module that holds it.
_HOME = {
    "Adopted": "heap", "Heap": "heap", "NvshmemHeap": "nvshmem_heap", "TorchHeap": "torch_heap",
    "ALIGN": "context", "Context": "context", "current": "context", "is_symmetric": "context",
    "init": "bootstrap", "choose_heap": "bootstrap",
    "Capabilities": "capability", "probe": "capability", "agree": "capability", "choose_backend": "capability",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'collectives.symmetric' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
