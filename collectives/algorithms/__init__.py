"""The collective algorithms: one module per algorithm, each holding one
:class:`~collectives.algorithms.base.Algorithm` subclass (its key choices, refusals, plan, grid,
error phases) and the kernel it builds from the shared
:mod:`~collectives.algorithms.design` (``start barrier -> move data -> end barrier``) and the
:mod:`collectives.device` blocks.  Each class registers itself in :data:`REGISTRY` when its
module is imported below: a new algorithm is a new module and its line here (and, to be chosen
by ``algorithm="auto"``, its place in :mod:`collectives.algorithms.tuning`).

Every kind of kernel is a family (:mod:`.family`) registered by its module, imported below: the
collective algorithms' (:mod:`.key`), the all-to-all's, the MoE layer's (placement, packing,
gather, combine, routing) and the stream flags' (:mod:`.flags`: no collective, one thread, one GPU)."""

from __future__ import annotations

from ..config import COLLECTIVES
from ..device.launch import example_arguments
from . import one_shot, two_shot, lamport, tma, push, all_gather, push_gather, barrier, lamport_blocks  # noqa: F401,E501  (registration order)
from . import all_to_all, moe_place, moe_pack, moe_gather, moe_combine, moe_route, flags  # noqa: F401  (other families)
from . import moe_send_back, moe_sum_back  # noqa: F401  (the two-kernel combine, not launched yet)
from .base import REGISTRY, Algorithm, Call, algorithms
from .family import FAMILIES, Family, family_of, family_of_id, key_id, key_of
from .key import KernelKey

#: Every collective's algorithm names, in registration order.
ALGORITHMS: dict[str, tuple[str, ...]] = {c: algorithms(c) for c in COLLECTIVES}


def grid(comm, key: KernelKey, work: int, limit: int | None = None) -> int:
    """Thread blocks of ``key``'s kernel on ``comm`` for ``work`` vector accesses per rank, at
    most ``limit`` (:meth:`Algorithm.blocks` of its algorithm)."""
    return key.impl.blocks(comm, key, work, limit)


def build(key: KernelKey):
    """The ``@cute.jit`` launcher of the kernel for ``key`` (compile it with ``cute.compile``
    and :func:`~collectives.device.launch.example_arguments`)."""
    return key.impl.build(key)


__all__ = ["ALGORITHMS", "FAMILIES", "REGISTRY", "Algorithm", "Call", "Family", "KernelKey", "build", "example_arguments",
           "family_of", "family_of_id", "grid", "key_id", "key_of"]
