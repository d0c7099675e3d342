"""The collectives as PyTorch custom operators, so that ``torch.compile`` keeps them in its graph.

Defined (with :mod:`torch.library`) here, with their fake implementations; their CUDA kernels
are the eager functions, registered by :mod:`collectives.api` and :mod:`collectives.overlap`
when they are imported (as any use of the collectives functions does)::

    collectives::all_reduce(Tensor(a!) t, str op="sum", str algorithm="auto", str backend="auto") -> ()
    collectives::reduce_scatter(Tensor(a!) out, Tensor inp, str op="sum", str algorithm="auto",
                                str backend="auto", SymInt? max_blocks=None) -> ()
    collectives::all_gather(Tensor(a!) out, Tensor inp, str algorithm="auto", str backend="auto",
                            SymInt? max_blocks=None) -> ()
    collectives::barrier(str backend="auto") -> ()
    collectives::all_to_all(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, Tensor? in_splits=None) -> ()
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
CUDA kernels, which call them.  This module imports nothing else of the package.
"""

import functools
from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor
from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

#: The operators' schemas, by name (namespace ``collectives``).
SCHEMAS = {
    "all_reduce": '(Tensor(a!) t, str op="sum", str algorithm="auto", str backend="auto") -> ()',
    "reduce_scatter": '(Tensor(a!) out, Tensor inp, str op="sum", str algorithm="auto", str backend="auto", '
                      "SymInt? max_blocks=None) -> ()",
    "all_gather": '(Tensor(a!) out, Tensor inp, str algorithm="auto", str backend="auto", '
                  "SymInt? max_blocks=None) -> ()",
    "barrier": '(str backend="auto") -> ()',
    "all_to_all": "(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, Tensor? in_splits=None) -> ()",
    "gemm_reduce_scatter": "(Tensor a, Tensor b, SymInt world) -> Tensor",
    "all_gather_gemm": "(Tensor a_shard, Tensor b, SymInt world) -> Tensor",
}

LIB = torch.library.Library("collectives", "DEF")
for _name, _schema in SCHEMAS.items():
    LIB.define(_name + _schema)
# The barrier reads and writes no tensor: an ordered effect keeps it (with a token) in the graph.
_register_effectful_op(torch.ops.collectives.barrier.default, _EffectType.ORDERED)


def implement(name: str, dispatch_key: str = "CUDA") -> Callable[[Callable], Callable]:
    """Register the decorated function as operator ``name``'s kernel for ``dispatch_key``
    (any operator of namespace ``collectives``).  The dispatcher leaves out the trailing arguments
    that equal their schema's default (as Inductor's generated code passes them): the kernel
    is called with every argument of the schema, in its order, those restored."""
    arguments = getattr(torch.ops.collectives, name).default._schema.arguments

    def register(kernel: Callable) -> Callable:
        @functools.wraps(kernel)
        def with_defaults(*args, **kwargs):
            return kernel(*args, *[kwargs[a.name] if a.name in kwargs else a.default_value
                                   for a in arguments[len(args):]])

        LIB.impl(name, with_defaults, dispatch_key)
        return kernel

    return register


def _fake(name: str) -> Callable[[Callable], Callable]:
    return torch.library.register_fake(f"collectives::{name}", lib=LIB)


@_fake("all_reduce")
def _(t, op="sum", algorithm="auto", backend="auto"):
    return None


@_fake("reduce_scatter")
def _(out, inp, op="sum", algorithm="auto", backend="auto", max_blocks=None):
    return None


@_fake("all_gather")
def _(out, inp, algorithm="auto", backend="auto", max_blocks=None):
    return None


@_fake("barrier")
def _(backend="auto"):
    return None


@_fake("all_to_all")
def _(out, inp, out_splits=None, in_splits=None):
    return None


@_fake("gemm_reduce_scatter")
def _(a, b, world):
    torch._check(a.shape[0] % world == 0, lambda: f"gemm_reduce_scatter: a's rows are not a multiple of {world}")
    return a.new_empty((a.shape[0] // world, b.shape[1]))


@_fake("all_gather_gemm")
def _(a_shard, b, world):
    return a_shard.new_empty((world * a_shard.shape[0], b.shape[1]))


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


def traced_all_to_all(out: Tensor, inp: Tensor, out_splits, in_splits) -> Tensor:
    """What :func:`collectives.all_to_all` records in a traced graph (list splits as tensors: a
    CPU tensor the kernel reads on the host, no GPU sync)."""
    as_tensor = (lambda s: s if s is None or isinstance(s, Tensor) else torch.tensor(list(s), dtype=torch.int64))
    torch.ops.collectives.all_to_all(out, inp, as_tensor(out_splits), as_tensor(in_splits))
    return out


def traced_gemm(name: str, a: Tensor, b: Tensor, world: int, out: Optional[Tensor]) -> Tensor:
    """What :func:`collectives.gemm_reduce_scatter` / :func:`collectives.all_gather_gemm`
    (``name``) record in a traced graph: the functional operator over ``world`` ranks, copied
    into ``out`` if given."""
    result = getattr(torch.ops.collectives, name)(a, b, world)
    return result if out is None else out.copy_(result)
