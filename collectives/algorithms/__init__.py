"""The collective kernels, one module per algorithm, built from the shared
:mod:`~collectives.algorithms.design` (``start barrier -> move data -> end barrier``) and the
:mod:`collectives.device` blocks, with one design for two backends chosen at compile time by
``key.backend``.  :data:`BUILDERS` maps ``(collective, algorithm)`` to the module's ``build``:
a new algorithm is a new module and one line here, and today also its name in
:data:`collectives.config.ALGORITHMS` and its rules in ``KernelKey.__post_init__``, its plan
(buffers, grid) in :mod:`collectives.api` and :mod:`collectives.runtime`, and its place in
:mod:`collectives.tuning`.  :mod:`.flags` holds the stream-flag kernels (no
collective: one thread, one GPU), built by its own ``build``."""

from __future__ import annotations

from typing import Callable

from ..config import KernelKey
from ..launch import example_arguments
from . import all_gather, barrier, lamport, one_shot, push, tma, two_shot

BUILDERS: dict[tuple[str, str], Callable] = {
    ("barrier", "one_shot"): barrier.build,
    ("all_reduce", "one_shot"): one_shot.build,
    ("all_reduce", "two_shot"): two_shot.build,
    ("all_reduce", "lamport"): lamport.build,
    ("all_reduce", "tma"): tma.build,
    ("all_reduce", "push"): push.build,
    ("reduce_scatter", "one_shot"): one_shot.build,
    ("reduce_scatter", "tma"): tma.build,
    ("reduce_scatter", "push"): push.build,
    ("all_gather", "one_shot"): all_gather.build,
    ("all_gather", "tma"): all_gather.build,
}


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the kernel for ``key`` (compile it with ``cute.compile``
    and :func:`~collectives.launch.example_arguments`)."""
    return BUILDERS[key.collective, key.algorithm](key)


__all__ = ["BUILDERS", "build", "example_arguments"]
