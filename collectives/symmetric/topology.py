"""Node boundaries, and the intra-node / inter-node groups of a group spanning nodes (pure Python).

Our kernels reach only GPUs of one NVLink domain (a node).  A group spanning ``N`` nodes with
``L`` of its ranks on each is run as two levels (:mod:`collectives.hierarchical`): the ``L``
ranks of each node (the *intra* groups, our kernels) and the ``N`` ranks with the same local
index on every node (the *inter* groups, ``torch.distributed``, NCCL on GPUs).

A launcher numbers ranks node by node (torchrun: global rank ``g`` lives on node
``g // node_size``), so the node size is all this module needs: ``COLLECTIVES_NODE_SIZE`` (to
force a split for testing, e.g. 2 "nodes" of 2 GPUs on one 4-GPU machine), else torchrun's
``LOCAL_WORLD_SIZE``, else the ranks per host name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import CollectiveError

#: Environment variable forcing the ranks per node (testing a multi-node split on one node).
NODE_SIZE_ENV = "COLLECTIVES_NODE_SIZE"


def node_size(world: int, env: Mapping[str, str] | None = None,
              hosts: Callable[[], Sequence[str]] | None = None) -> int:
    """Ranks per node of a job of ``world`` ranks: ``COLLECTIVES_NODE_SIZE``, else
    ``LOCAL_WORLD_SIZE``, else from ``hosts()`` (every rank's host name, by global rank: each
    host's ranks must be consecutive and equally many), else ``world`` (one node).

    Raises CollectiveError for a size that does not divide ``world`` or uneven hosts."""
    env = os.environ if env is None else env
    for name in (NODE_SIZE_ENV, "LOCAL_WORLD_SIZE"):
        if env.get(name):
            size = int(env[name])
            if size < 1 or world % size:
                raise CollectiveError(f"{name}={size} does not split {world} ranks into equal nodes")
            return size
    if hosts is None:
        return world
    names = list(hosts())
    size = names.count(names[0])
    runs = [names[i:i + size] for i in range(0, len(names), size)]
    if world % size or any(len(set(run)) != 1 for run in runs):
        raise CollectiveError(f"ranks are not spread over hosts in equal consecutive runs: {names}")
    return size


@dataclass(frozen=True)
class Hierarchy:
    """The two levels of a group (its members: global ranks in group-rank order).

    ``intra[n]``: the group ranks on node ``n`` (their order: local index ``l``);
    ``inter[l]``: the group ranks of local index ``l`` on every node (node order).
    So group rank ``intra[n][l] == inter[l][n]``."""

    members: tuple[int, ...]
    intra: tuple[tuple[int, ...], ...]
    inter: tuple[tuple[int, ...], ...]

    @property
    def nodes(self) -> int:
        return len(self.intra)

    @property
    def local(self) -> int:
        return len(self.inter)

    def position(self, group_rank: int) -> tuple[int, int]:
        """(node, local index) of ``group_rank``."""
        for n, ranks in enumerate(self.intra):
            if group_rank in ranks:
                return n, ranks.index(group_rank)
        raise CollectiveError(f"group rank {group_rank} is not in {self.members}")

    def global_ranks(self, group_ranks: Sequence[int]) -> list[int]:
        return [self.members[r] for r in group_ranks]


def hierarchy(members: Sequence[int], size: int) -> Hierarchy:
    """The levels of a group of global ranks ``members`` on nodes of ``size`` ranks.

    Raises CollectiveError where the group has unequal numbers of ranks on its nodes (then no
    inter group could hold one rank per node)."""
    nodes: dict[int, list[int]] = {}
    for r, g in enumerate(members):
        nodes.setdefault(g // size, []).append(r)
    counts = {n: len(rs) for n, rs in nodes.items()}
    if len(set(counts.values())) != 1:
        raise CollectiveError(
            f"group {list(members)} has unequal numbers of ranks per node (node: ranks {counts}); "
            "a hierarchical collective needs the same number on every node")
    intra = tuple(tuple(nodes[n]) for n in sorted(nodes))
    inter = tuple(zip(*intra, strict=True))
    return Hierarchy(tuple(members), intra, inter)


__all__ = ["NODE_SIZE_ENV", "Hierarchy", "hierarchy", "node_size"]
