"""The all-to-all and the MoE dispatch and combine as PyTorch custom operators, next to those of
:mod:`collectives.torch_ops` (namespace ``collectives``), with their fake implementations::

    collectives::all_to_all(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, Tensor? in_splits=None) -> ()
    collectives::moe_dispatch(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts,
                              int max_tokens, int world) -> (Tensor, ...)  # expert_x, counts, the handle's 7
    collectives::moe_combine(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid,
                             Tensor send_splits, Tensor recv_splits, Tensor place, Tensor kept) -> Tensor

Splits are int64 tensors (a traced call's list becomes a CPU tensor, read on the host by the
kernel, which costs no GPU sync); the dispatch's handle travels as its tensors
(:func:`handle_tensors`, :func:`handle_from`); every shape follows from the arguments (``world``
one of them: a fake implementation cannot ask the communicator), so nothing is data-dependent
and ``torch.compile(fullgraph=True)`` traces through.  The CUDA kernels are the eager
functions, on the default communicator (``group=None``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import moe

SCHEMAS = {
    "all_to_all": "(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, Tensor? in_splits=None) -> ()",
    "moe_dispatch": "(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts, int max_tokens, int world) "
                    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "moe_combine": "(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid, Tensor send_splits, "
                   "Tensor recv_splits, Tensor place, Tensor kept) -> Tensor",
}

LIB = torch.library.Library("collectives", "FRAGMENT")
for _name, _schema in SCHEMAS.items():
    LIB.define(_name + _schema)

#: The handle's tensors in the operators' order (the dispatch's, after expert_x and counts;
#: the combine takes all but the last).
HANDLE_FIELDS = ("order", "valid", "send_splits", "recv_splits", "place", "kept", "dropped")
COMBINE_FIELDS = HANDLE_FIELDS[:-1]


def handle_tensors(handle: moe.Handle, fields: tuple[str, ...] = HANDLE_FIELDS) -> tuple[Tensor, ...]:
    return tuple(getattr(handle, f) for f in fields)


def handle_from(tensors: tuple[Tensor, ...], topk_weights: Tensor) -> moe.Handle:
    fields = dict(zip(HANDLE_FIELDS, tensors))
    tokens, topk = topk_weights.shape
    return moe.Handle(weights=topk_weights, tokens=tokens, topk=topk, **fields)


def _splits(t: Optional[Tensor]):
    """A split tensor as the eager function takes it: a CPU one as a list (no GPU sync)."""
    return t.tolist() if t is not None and not t.is_cuda else t


@torch.library.impl(LIB, "all_to_all", "CUDA")
def _all_to_all_kernel(out: Tensor, inp: Tensor, out_splits: Optional[Tensor] = None,
                       in_splits: Optional[Tensor] = None) -> None:
    from . import api

    api.all_to_all(out, inp, _splits(out_splits), _splits(in_splits))


@torch.library.impl(LIB, "moe_dispatch", "CUDA")
def _moe_dispatch_kernel(x, topk_ids, topk_weights, num_experts, max_tokens, world):
    expert_x, counts, handle = moe.dispatch(x, topk_ids, topk_weights, num_experts, max_tokens=max_tokens)
    return (expert_x, counts) + handle_tensors(handle)


@torch.library.impl(LIB, "moe_combine", "CUDA")
def _moe_combine_kernel(expert_out, topk_weights, *handle):
    return moe.combine(expert_out, handle_from(handle, topk_weights))


@torch.library.register_fake("collectives::all_to_all", lib=LIB)
def _(out, inp, out_splits=None, in_splits=None):
    return None


@torch.library.register_fake("collectives::moe_dispatch", lib=LIB)
def _(x, topk_ids, topk_weights, num_experts, max_tokens, world):
    tokens, topk = topk_ids.shape
    local = num_experts // world
    room = world * max_tokens * min(topk, local)
    i64 = dict(dtype=torch.int64)
    return (x.new_empty((local, world * max_tokens, x.shape[1])), x.new_empty((local,), **i64),
            x.new_empty((tokens * topk,), **i64), x.new_empty((tokens * topk,), dtype=torch.bool),
            x.new_empty((world,), **i64), x.new_empty((world,), **i64), x.new_empty((room,), **i64),
            x.new_empty((room,), dtype=torch.bool), x.new_empty((), **i64))


@torch.library.register_fake("collectives::moe_combine", lib=LIB)
def _(expert_out, topk_weights, order, valid, send_splits, recv_splits, place, kept):
    return expert_out.new_empty((topk_weights.shape[0], expert_out.shape[2]))


def traced_all_to_all(out: Tensor, inp: Tensor, out_splits, in_splits) -> Tensor:
    """What :func:`collectives.all_to_all` records in a traced graph (list splits as tensors)."""
    as_tensor = (lambda s: s if s is None or isinstance(s, Tensor) else torch.tensor(list(s), dtype=torch.int64))
    torch.ops.collectives.all_to_all(out, inp, as_tensor(out_splits), as_tensor(in_splits))
    return out


def traced_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens, world):
    expert_x, counts, *handle = torch.ops.collectives.moe_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens,
                                                                   world)
    return expert_x, counts, handle_from(tuple(handle), topk_weights)


def traced_combine(expert_out, handle: moe.Handle):
    return torch.ops.collectives.moe_combine(expert_out, handle.weights, *handle_tensors(handle, COMBINE_FIELDS))


__all__ = ["COMBINE_FIELDS", "HANDLE_FIELDS", "SCHEMAS", "handle_from", "handle_tensors", "traced_all_to_all", "traced_combine",
           "traced_dispatch"]
