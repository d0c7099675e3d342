"""The all-to-all and the MoE dispatch and combine as PyTorch custom operators, next to those of
:mod:`collectives.torch_ops` (namespace ``collectives``), with their fake implementations::

    collectives::all_to_all(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, Tensor? in_splits=None) -> ()
    collectives::moe_dispatch(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts,
                              int max_tokens, int world) -> (Tensor, ...)  # expert_x, counts, the handle's 7
    collectives::moe_combine(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid,
                             Tensor send_splits, Tensor recv_splits, Tensor place, Tensor kept) -> Tensor

Splits are int64 tensors (a traced call's list becomes a CPU tensor, read on the host by the
kernel, which costs no GPU sync); the dispatch's handle travels as its tensors
(:data:`HANDLE_FIELDS`); every shape follows from the arguments (``world``
one of them: a fake implementation cannot ask the communicator), so nothing is data-dependent
and ``torch.compile(fullgraph=True)`` traces through.  The CUDA kernels are the eager
functions, on the default communicator (``group=None``), registered by :mod:`collectives.moe`
and :mod:`collectives.api` (:func:`collectives.runtime.torch_ops.implement`); this module
imports nothing else of the package.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

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


def traced_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens, world) -> tuple:
    """What :func:`collectives.moe.dispatch` records: ``(expert_x, counts, handle tensors)``."""
    expert_x, counts, *handle = torch.ops.collectives.moe_dispatch(x, topk_ids, topk_weights, num_experts, max_tokens,
                                                                   world)
    return expert_x, counts, tuple(handle)


def traced_combine(expert_out: Tensor, topk_weights: Tensor, handle: tuple) -> Tensor:
    """What :func:`collectives.moe.combine` records (``handle``: its :data:`COMBINE_FIELDS`)."""
    return torch.ops.collectives.moe_combine(expert_out, topk_weights, *handle)


__all__ = ["COMBINE_FIELDS", "HANDLE_FIELDS", "SCHEMAS", "traced_all_to_all", "traced_combine",
           "traced_dispatch"]
