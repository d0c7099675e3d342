"""The collectives as PyTorch custom operators, so that ``torch.compile`` keeps them in its graph.

Registered (with :mod:`torch.library`) when :mod:`collectives.api` is imported::

    collectives::all_reduce(Tensor(a0!) t, str op="sum", str algorithm="auto", str backend="auto") -> ()
    collectives::reduce_scatter(Tensor(a0!) out, Tensor inp, str op="sum", str algorithm="auto",
                                str backend="auto", SymInt? max_blocks=None) -> ()
    collectives::all_gather(Tensor(a0!) out, Tensor inp, str algorithm="auto", str backend="auto",
                            SymInt? max_blocks=None) -> ()
    collectives::barrier(str backend="auto") -> ()
    collectives::gemm_reduce_scatter(Tensor a, Tensor b, SymInt world) -> Tensor
    collectives::all_gather_gemm(Tensor a_shard, Tensor b, SymInt world) -> Tensor

The collectives write into a tensor the caller passes (``(a!)``: mutated in place, nothing
returned), as the Python functions do; the GEMM-overlap operators return a new tensor, whose
shape needs the world size (an argument: a fake implementation cannot ask the communicator).
While ``torch.compile`` traces, nothing runs: each operator's fake implementation gives what it
writes or returns.  Functionalization turns an in-place operator into its functional form
(``auto_functionalized``) and Inductor writes it back in place; ``barrier``, which reads and
writes no tensor, is an ordered effect (threaded with a token), so it is never dropped and
stays in order with other effects.

The public functions (:func:`collectives.all_reduce` and the others) are the API: traced by
``torch.compile`` (:func:`torch.compiler.is_compiling`) they call these operators through
the ``traced_*`` functions below; anywhere else they run eagerly, and so do the operators'
CUDA kernels, which call them.
"""

from typing import Optional

import torch
from torch import Tensor
from torch._higher_order_ops.effects import _EffectType


@torch.library.custom_op("collectives::all_reduce", mutates_args=("t",), device_types="cuda")
def all_reduce(t: Tensor, op: str = "sum", algorithm: str = "auto", backend: str = "auto") -> None:
    """:func:`collectives.all_reduce` of ``t`` in place."""
    from . import api

    api.all_reduce(t, op, algorithm, backend)


@all_reduce.register_fake
def _(t, op="sum", algorithm="auto", backend="auto"):
    return None


@torch.library.custom_op("collectives::reduce_scatter", mutates_args=("out",), device_types="cuda")
def reduce_scatter(out: Tensor, inp: Tensor, op: str = "sum", algorithm: str = "auto", backend: str = "auto",
                   max_blocks: Optional[int] = None) -> None:
    """:func:`collectives.reduce_scatter` of ``inp`` into ``out``."""
    from . import api

    api.reduce_scatter(out, inp, op, algorithm, backend, max_blocks=max_blocks)


@reduce_scatter.register_fake
def _(out, inp, op="sum", algorithm="auto", backend="auto", max_blocks=None):
    return None


@torch.library.custom_op("collectives::all_gather", mutates_args=("out",), device_types="cuda")
def all_gather(out: Tensor, inp: Tensor, algorithm: str = "auto", backend: str = "auto",
               max_blocks: Optional[int] = None) -> None:
    """:func:`collectives.all_gather` of every rank's ``inp`` into ``out``."""
    from . import api

    api.all_gather(out, inp, algorithm, backend, max_blocks=max_blocks)


@all_gather.register_fake
def _(out, inp, algorithm="auto", backend="auto", max_blocks=None):
    return None


@torch.library.custom_op("collectives::barrier", mutates_args=())
def barrier(backend: str = "auto") -> None:
    """:func:`collectives.barrier` on the current stream."""
    from . import api

    api.barrier(backend)


@barrier.register_fake
def _(backend="auto"):
    return None


if hasattr(barrier, "register_effect"):
    barrier.register_effect(_EffectType.ORDERED)
else:  # torch before CustomOpDef.register_effect: the table of effects by operator overload
    from torch._higher_order_ops.effects import _register_effectful_op

    _register_effectful_op(torch.ops.collectives.barrier.default, _EffectType.ORDERED)


@torch.library.custom_op("collectives::gemm_reduce_scatter", mutates_args=(), device_types="cuda")
def gemm_reduce_scatter(a: Tensor, b: Tensor, world: int) -> Tensor:
    """:func:`collectives.gemm_reduce_scatter` of ``a`` and ``b`` over ``world`` ranks."""
    from . import overlap

    _check_world("gemm_reduce_scatter", world)
    return overlap.gemm_reduce_scatter(a, b)


@gemm_reduce_scatter.register_fake
def _(a, b, world):
    torch._check(a.shape[0] % world == 0, lambda: f"gemm_reduce_scatter: a's rows are not a multiple of {world}")
    return a.new_empty((a.shape[0] // world, b.shape[1]))


@torch.library.custom_op("collectives::all_gather_gemm", mutates_args=(), device_types="cuda")
def all_gather_gemm(a_shard: Tensor, b: Tensor, world: int) -> Tensor:
    """:func:`collectives.all_gather_gemm` of ``a_shard`` and ``b`` over ``world`` ranks."""
    from . import overlap

    _check_world("all_gather_gemm", world)
    return overlap.all_gather_gemm(a_shard, b)


@all_gather_gemm.register_fake
def _(a_shard, b, world):
    return a_shard.new_empty((world * a_shard.shape[0], b.shape[1]))


def _check_world(name: str, world: int) -> None:
    """Refuse a traced world size that is not the communicator's (its output shape would be wrong)."""
    from .errors import CollectiveError
    from .runtime import communicator

    if world != communicator().world:
        raise CollectiveError(f"{name}: traced for {world} ranks, but the communicator has {communicator().world}")


@torch.compiler.assume_constant_result
def world_size() -> int:
    """The communicator's world size, a constant of a compiled graph (read once, while tracing)."""
    from .runtime import communicator

    return communicator().world


# -- the public functions' traced path ------------------------------------------------------------


def traced_all_reduce(t: Tensor, op: str, algorithm: str, backend: str, out: Optional[Tensor]) -> Tensor:
    """What :func:`collectives.all_reduce` records in a traced graph: the in-place operator, on
    ``out`` (a copy of ``t``) when given."""
    target = t if out is None else out.copy_(t)
    torch.ops.collectives.all_reduce(target, op, algorithm, backend)
    return target


def traced_reduce_scatter(out: Tensor, inp: Tensor, op: str, algorithm: str, backend: str,
                          max_blocks: Optional[int]) -> Tensor:
    torch.ops.collectives.reduce_scatter(out, inp, op, algorithm, backend, max_blocks)
    return out


def traced_all_gather(out: Tensor, inp: Tensor, algorithm: str, backend: str, max_blocks: Optional[int]) -> Tensor:
    torch.ops.collectives.all_gather(out, inp, algorithm, backend, max_blocks)
    return out


def traced_barrier(backend: str) -> None:
    torch.ops.collectives.barrier(backend)


def traced_gemm(name: str, a: Tensor, b: Tensor, out: Optional[Tensor]) -> Tensor:
    """What :func:`collectives.gemm_reduce_scatter` / :func:`collectives.all_gather_gemm`
    (``name``) record in a traced graph: the functional operator, copied into ``out`` if given."""
    result = getattr(torch.ops.collectives, name)(a, b, world_size())
    return result if out is None else out.copy_(result)
