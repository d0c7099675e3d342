"""Reference results of the uneven all-to-all, by plain indexing (torch, any device).

Split sizes count rows of dimension 0, as :func:`torch.distributed.all_to_all_single`'s do:
rank ``s`` sends rows ``[sum(in_splits[s][:r]), +in_splits[s][r])`` of its input to rank
``r``, which receives them as rows ``[sum(out_splits[r][:s]), +out_splits[r][s])`` of its
output.  Bits are moved, never values converted, so a kernel's result compares with this bit
for bit in every dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def equal_splits(rows: int, world: int) -> list[int]:
    """The splits of ``rows`` rows into ``world`` equal chunks (``splits=None``)."""
    if rows % world:
        raise ValueError(f"without splits, dimension 0 ({rows} rows) must divide by the world size {world}")
    return [rows // world] * world


def all_to_all(inputs: Sequence[torch.Tensor], in_splits: Sequence[Sequence[int]] | None = None,
               out_splits: Sequence[Sequence[int]] | None = None) -> list[torch.Tensor]:
    """Every rank's output of an all-to-all of ``inputs`` (one tensor per rank, in rank order),
    each rank's rows split as ``in_splits[s]`` and received as ``out_splits[r]`` (None: equal
    splits).  Raises ValueError where a sender's split and its receiver's differ."""
    world = len(inputs)
    ins = [list(in_splits[s]) if in_splits is not None else equal_splits(inputs[s].shape[0], world)
           for s in range(world)]
    outs = [list(out_splits[r]) if out_splits is not None else [ins[s][r] for s in range(world)]
            for r in range(world)]
    for s in range(world):
        for r in range(world):
            if ins[s][r] != outs[r][s]:
                raise ValueError(f"rank {s} sends {ins[s][r]} rows to rank {r}, which expects {outs[r][s]}")
    chunks = [torch.split(inputs[s], ins[s]) for s in range(world)]
    return [torch.cat([chunks[s][r] for s in range(world)]) for r in range(world)]


__all__ = ["all_to_all", "equal_splits"]
