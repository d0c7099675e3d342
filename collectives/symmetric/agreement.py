"""How the ranks of a :class:`~collectives.symmetric.context.Context` agree on the host: the
:class:`Agreement` protocol (all-gathers, barriers and bounded agreements), on
``torch.distributed`` (:class:`DistAgreement`, a process per rank) or on the threads of a
one-GPU world (:class:`~collectives.symmetric.loopback.ThreadAgreement`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from ..errors import SymmetricMemoryError
from .capability import TorchGroup, collective_device
from .groups import global_rank

__all__ = ["Agreement", "DistAgreement"]

#: Agreements (one per context) made so far in this process over each tuple of global ranks.
_GENERATIONS: dict[tuple[int, ...], int] = {}


def _next_generation(group: TorchGroup, world_size: int) -> int:
    """The generation of a new context's agreement over ``group`` (its ``world_size`` ranks):
    how many contexts over the same ranks this process opened before.  Every rank opens them in the same
    order (collectively), so the ranks agree on it without communicating."""
    ranks = tuple(global_rank(group, r) for r in range(world_size))
    generation = _GENERATIONS.get(ranks, 0)
    _GENERATIONS[ranks] = generation + 1
    return generation


class Agreement(Protocol):
    """What a context's ranks agree through; ``what`` names the step in errors."""

    def all_gather(self, what: str, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values``, in rank order (collective)."""
        ...

    def bounded(self, what: str, values: Sequence[int], timeout_s: float) -> list[list[int]]:
        """Every rank's ``values``, waiting at most ``timeout_s``: the ``k``-th call of each rank
        meets only the ``k``-th of the others, and a rank that never arrives blocks nothing
        else (raises CollectiveError naming the ranks that did not arrive)."""
        ...

    def barrier(self, what: str) -> None:
        """Wait for every rank (collective)."""
        ...


class DistAgreement:
    """:class:`Agreement` over a ``torch.distributed`` group (None: every process): the group's
    all-gathers and barriers, bounded agreements through the default store.  Make one per
    context: its bounded agreements' keys name the ranks, the context's generation among
    those over the same ranks (:func:`_next_generation`) and the call's number, so a second
    context over the same ranks never meets the first one's keys; the last rank to read a
    call's keys deletes them."""

    def __init__(self, group: TorchGroup, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self._bounded = 0  # bounded calls so far
        self._generation = _next_generation(group, world_size)

    def all_gather(self, what: str, values: Sequence[int]) -> list[list[int]]:
        mine = torch.tensor(list(values), dtype=torch.int64, device=collective_device(self.group))
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine, group=self.group)
        return [r.tolist() for r in rows]

    def bounded(self, what: str, values: Sequence[int], timeout_s: float) -> list[list[int]]:
        ranks = [global_rank(self.group, r) for r in range(self.world_size)]
        prefix = f"collectives/agree/{ranks}/{self._generation}/{self._bounded}"
        keys = [f"{prefix}/{r}" for r in range(self.world_size)]
        self._bounded += 1
        store = dist.distributed_c10d._get_default_store()
        store.set(keys[self.rank], json.dumps(list(values)))
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as e:  # the store's timeout error type varies by store
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise SymmetricMemoryError(f"{what}: ranks {missing} did not arrive within {timeout_s:g}s") from e
        got = [json.loads(store.get(k)) for k in keys]
        if store.add(f"{prefix}/read", 1) == self.world_size:
            for k in [*keys, f"{prefix}/read"]:
                store.delete_key(k)
        return got

    def barrier(self, what: str) -> None:
        dist.barrier(group=self.group)
