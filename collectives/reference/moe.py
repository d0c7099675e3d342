"""A reference MoE layer, for tests, soaks and benchmarks of :mod:`collectives.moe`: routings
drawn from a seed, an expert that tells experts apart exactly, and what every rank's dispatch
and combine must return, computed on the CPU from every rank's routing at once (torch, bit for
bit: the rows are moved by their bits, and each output is ``sum_k w[t, k] * expert(x[t])``
accumulated in f32 in ``k`` order and rounded once, as the layer promises)."""

from __future__ import annotations

import torch


def routing(world: int, experts: int, topk: int, tokens: list[int], seed: int, hidden: int, dtype: torch.dtype,
            bad: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's ``(x, topk_ids, topk_weights)`` (rank ``r``: ``tokens[r]`` tokens, each to
    ``topk`` distinct experts), the same on every rank for ``seed``; ``bad``: that many entries
    of rank 0 out of range (above and below), with NaN weights that must reach no output."""
    gen = torch.Generator().manual_seed(seed)
    xs, ids, ws = [], [], []
    for r in range(world):
        xs.append(torch.randn((tokens[r], hidden), generator=gen).to(dtype))
        ids.append(torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens[r])])
                   if tokens[r] else torch.empty((0, topk), dtype=torch.int64))
        ws.append(torch.rand((tokens[r], topk), generator=gen))
    if bad:
        ids[0].view(-1)[:bad] = torch.tensor([experts + 3, -1, experts, -9]).repeat(bad)[:bad]
        ws[0].view(-1)[:bad] = float("nan")
    return xs, ids, ws


def expert_fn(x: torch.Tensor, expert: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Expert ``expert``'s output for rows ``x``: an exact power-of-two scale (2, 4 or 8), which
    tells neighbouring experts apart (into ``out`` where given)."""
    return torch.mul(x, float(2 ** (expert % 3 + 1)), out=out)


def expert_rows(expert: int, xs: list[torch.Tensor], ids: list[torch.Tensor]) -> torch.Tensor:
    """The rows that expert ``expert`` receives: each source's rows for it in ``(token, k)``
    order, sources in rank order (picked by their bits: any dtype, fp8 bytes included)."""
    rows = [bits(x)[torch.nonzero(i.reshape(-1) == expert).flatten() // i.shape[1]] for x, i in zip(xs, ids)]
    return torch.cat(rows).view(xs[0].dtype)


def combined(experts: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A rank's combine output for its tokens ``x`` routed by ``ids`` and ``weights`` through
    :func:`expert_fn` experts (an out-of-range id adds nothing, whatever its weight)."""
    tokens, topk = ids.shape
    total = torch.zeros((tokens, x.shape[1]), dtype=torch.float32)
    for k in range(topk):
        e = ids[:, k]
        valid = (e >= 0) & (e < experts)
        scale = torch.pow(2.0, (e % 3 + 1).float()).to(x.dtype)  # expert_fn's, exact
        y = torch.where(valid[:, None], x * scale[:, None], torch.zeros((), dtype=x.dtype))
        term = y.float() * torch.where(valid, weights[:, k], 0).float()[:, None]
        total = term if k == 0 else total + term
    return total.to(x.dtype)


def reference(world: int, experts: int, xs: list[torch.Tensor], ids: list[torch.Tensor],
              ws: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every expert's received rows (rank ``r``'s local expert ``l`` is expert ``r * L + l``), and
    every rank's combine output."""
    per_expert = [expert_rows(e, xs, ids) for e in range(experts)]
    return per_expert, [combined(experts, xs[s], ids[s], ws[s]) for s in range(world)]


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed as integers of its width (indexing works for every dtype)."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


__all__ = ["bits", "combined", "expert_fn", "expert_rows", "reference", "routing"]
