"""The benches' result checks: before a column of ours is timed, one call on known inputs and
every rank's result compared element for element with the exact one
(:attr:`collectives.tools.bench.Column.check`), so that no timing of a kernel that computes a
wrong result is recorded.

The inputs (:func:`check_values`) are small integers, different on every rank and along the
tensor, whose sums over up to 8 ranks every benched dtype holds exactly in any order: a result
is right or wrong bit for bit, whatever order an algorithm adds in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["WrongResult", "all_gather_check", "all_reduce_check", "check_values", "reduce_scatter_check",
           "result_check", "summed_values"]


class WrongResult(RuntimeError):
    """A call of ours returned a wrong result in the bench's check (here or on another rank)."""


def check_values(rank: int, n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Rank ``rank``'s input of ``n`` elements for a result check: ``(i + 3 rank) mod 5 + rank +
    1`` at element ``i``, different on every rank and along the tensor (of period 5: blocks of a
    length no multiple of 5, as the bench's powers of two, differ, so a block put in another's
    place is caught); small integers whose sums over up to 8 ranks (at most 96) every benched
    dtype holds exactly, in any order."""
    i = torch.arange(n, device=device)
    return ((i + 3 * rank) % 5 + rank + 1).to(dtype)


def summed_values(world: int, n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """The sum over ``world`` ranks of their :func:`check_values` (exact)."""
    total = torch.zeros(n, dtype=torch.float32, device=device)
    for r in range(world):
        total += check_values(r, n, torch.float32, device)
    return total.to(dtype)


def result_check(prepare: Callable[[], object], got: torch.Tensor, want: Callable[[], torch.Tensor],
                 agree: Callable[[bool], bool]) -> Callable[[Callable[[], object]], None]:
    """A column's check (:attr:`Column.check`): ``prepare()`` sets the inputs, one call, then
    ``got`` must equal ``want()`` element for element (bitwise for these integers; a NaN is
    wrong); ``agree(ok)`` (a collective: whether every rank's was right) makes every rank raise
    :class:`WrongResult` together, so that none waits for a rank that stopped."""

    def check(call: Callable[[], object]) -> None:
        prepare()
        call()
        if got.is_cuda:
            torch.cuda.synchronize()
        wrong = int((got != want()).sum())
        if not agree(wrong == 0):
            raise WrongResult(f"{wrong} of {got.numel()} elements wrong on this rank" if wrong
                              else "a wrong result on another rank")
    return check


def all_reduce_check(t: torch.Tensor, rank: int, world: int, agree: Callable[[bool], bool]):
    """The check of an in-place all-reduce of ``t`` (sum): every rank's sum of the inputs."""
    return result_check(lambda: t.copy_(check_values(rank, t.numel(), t.dtype, t.device)), t,
                        lambda: summed_values(world, t.numel(), t.dtype, t.device), agree)


def reduce_scatter_check(out: torch.Tensor, inp: torch.Tensor, rank: int, world: int,
                         agree: Callable[[bool], bool]):
    """The check of a reduce-scatter of ``inp`` into ``out`` (sum): block ``rank`` of the sum."""
    m = out.numel()
    return result_check(lambda: inp.copy_(check_values(rank, inp.numel(), inp.dtype, inp.device)), out,
                        lambda: summed_values(world, inp.numel(), out.dtype, out.device)[rank * m:(rank + 1) * m],
                        agree)


def all_gather_check(out: torch.Tensor, inp: torch.Tensor, rank: int, world: int,
                     agree: Callable[[bool], bool]):
    """The check of an all-gather of ``inp`` into ``out``: every rank's input, in rank order."""
    n = inp.numel()
    return result_check(lambda: inp.copy_(check_values(rank, n, inp.dtype, inp.device)), out,
                        lambda: torch.cat([check_values(r, n, out.dtype, out.device) for r in range(world)]), agree)
