"""The collectives as torch custom operators (collectives.runtime.torch_ops), on the CPU: their schemas,
``torch.library.opcheck`` against a CPU model of the kernels, and ``torch.compile(fullgraph=True)``
of a model that calls the public functions, traced under fake tensors (no kernel runs)."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
import collectives  # noqa: E402
from collectives import overlap  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

SCHEMAS = {
    "all_reduce": 'collectives::all_reduce(Tensor(a!) t, str op="sum", str algorithm="auto", str backend="auto") -> ()',
    "reduce_scatter": 'collectives::reduce_scatter(Tensor(a!) out, Tensor inp, str op="sum", str algorithm="auto", '
                      'str backend="auto", SymInt? max_blocks=None) -> ()',
    "all_gather": 'collectives::all_gather(Tensor(a!) out, Tensor inp, str algorithm="auto", str backend="auto", '
                  "SymInt? max_blocks=None) -> ()",
    "barrier": 'collectives::barrier(str backend="auto") -> ()',
    "gemm_reduce_scatter": "collectives::gemm_reduce_scatter(Tensor a, Tensor b, SymInt world) -> Tensor",
    "all_gather_gemm": "collectives::all_gather_gemm(Tensor a_shard, Tensor b, SymInt world) -> Tensor",
}
#: The world of the CPU model below: W ranks that all hold this rank's inputs.
W = 2


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schemas_declare_what_each_operator_writes(name: str) -> None:
    assert str(getattr(torch.ops.collectives, name).default._schema) == SCHEMAS[name]


def test_the_eager_functions_are_the_operators_cuda_kernels() -> None:
    from collectives import api, overlap  # noqa: F401 (they register the kernels)

    for name in SCHEMAS:
        key = "CompositeExplicitAutograd" if name == "barrier" else "CUDA"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"collectives::{name}", key), name


# -- opcheck: the operators' registrations (schema, fake, functionalization) against a CPU model ---


def _model_all_reduce(t, op="sum", algorithm="auto", backend="auto"):
    if op == "sum":
        t.mul_(W)


def _model_reduce_scatter(out, inp, op="sum", algorithm="auto", backend="auto", max_blocks=None):
    block = inp[: out.numel()].view_as(out)
    out.copy_(block * (inp.numel() // out.numel()) if op == "sum" else block)


def _model_all_gather(out, inp, algorithm="auto", backend="auto", max_blocks=None):
    out.copy_(inp.repeat(out.numel() // inp.numel()).view_as(out))


def _model_gemm_reduce_scatter(a, b, world):
    return (a[: a.shape[0] // world] @ b) * world


def _model_all_gather_gemm(a_shard, b, world):
    return (a_shard @ b).repeat(world, 1)


@pytest.fixture(scope="module")
def cpu_model():
    """CPU kernels of the operators for ``opcheck``: rank 0 of W ranks that all hold the same
    inputs (the real kernels are CUDA only), registered for this module's tests."""
    lib = torch.library.Library("collectives", "IMPL")
    for name, kernel in (("all_reduce", _model_all_reduce), ("reduce_scatter", _model_reduce_scatter),
                         ("all_gather", _model_all_gather), ("gemm_reduce_scatter", _model_gemm_reduce_scatter),
                         ("all_gather_gemm", _model_all_gather_gemm)):
        lib.impl(name, kernel, "CPU")
    yield
    lib._destroy()


def _args(name: str) -> tuple:
    x = torch.arange(8, dtype=torch.float32)
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    return {
        "all_reduce": (x.clone(), "sum", "auto", "auto"),
        "reduce_scatter": (torch.zeros(4), x, "sum", "one_shot", "peer", 8),
        "all_gather": (torch.zeros(16), x, "auto", "auto", None),
        "gemm_reduce_scatter": (a, b, W),
        "all_gather_gemm": (a, b, W),
    }[name]


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_gather", "gemm_reduce_scatter",
                                  "all_gather_gemm"])
def test_opcheck(cpu_model, name: str) -> None:
    """Schema (declared mutations and aliasing), fake implementation against the kernel
    (shapes, dtypes, strides), autograd registration and AOT dispatch with dynamic shapes."""
    torch.library.opcheck(getattr(torch.ops.collectives, name).default, _args(name))


# -- implement(): a kernel gets every argument, those the dispatcher leaves out restored -----------


@pytest.fixture
def cpu_registry(monkeypatch: pytest.MonkeyPatch):
    """``torch_ops.implement`` registering into a library of this test (destroyed after it)."""
    from collectives.runtime import torch_ops

    lib = torch.library.Library("collectives", "IMPL")
    monkeypatch.setattr(torch_ops, "LIB", lib)
    yield torch_ops.implement
    lib._destroy()


#: What Inductor's generated code passes (every argument by name, defaults included), what the
#: kernel must receive.
DEFAULTED_CALLS = {
    "all_reduce": (lambda x: ((x,), {"op": "sum", "algorithm": "auto", "backend": "auto"}),
                   ("sum", "auto", "auto")),
    "reduce_scatter": (lambda x: ((x[:4], x), {"op": "sum", "algorithm": "auto", "backend": "auto",
                                              "max_blocks": None}),
                       ("sum", "auto", "auto", None)),
    "all_gather": (lambda x: ((x, x[:4]), {"algorithm": "tma", "backend": "auto", "max_blocks": None}),
                   ("tma", "auto", None)),
    "all_to_all": (lambda x: ((x, x), {"out_splits": None, "in_splits": None}), (None, None)),
}


@pytest.mark.filterwarnings("ignore:Warning only once for all operators")  # the CPU model's kernel, overridden
@pytest.mark.parametrize("name", list(DEFAULTED_CALLS))
def test_a_kernel_gets_the_defaults_the_dispatcher_leaves_out(cpu_registry, name: str) -> None:
    """The dispatcher drops the trailing arguments equal to their schema default before it
    calls a Python kernel (on 2 GPUs, a compiled all-reduce failed: "_all_reduce_kernel() missing
    3 required positional arguments"); the kernel gets them back, by position."""
    import collectives.moe  # noqa: F401 (defines the all-to-all's operator)

    seen = []
    cpu_registry(name, "CPU")(lambda *args: seen.append(args[-len(DEFAULTED_CALLS[name][1]):]))
    make, want = DEFAULTED_CALLS[name]
    args, kwargs = make(torch.zeros(8))
    getattr(torch.ops.collectives, name).default(*args, **kwargs)
    getattr(torch.ops.collectives, name)(*args)
    assert seen == [want, tuple(a.default_value for a in getattr(torch.ops.collectives, name).default._schema.arguments
                                if a.has_default_value())]


# -- torch.compile(fullgraph=True) of a model calling the public functions -------------------------


class Model(torch.nn.Module):
    """A tensor-parallel-like block calling every public collective and GEMM-overlap function."""

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x) * 2
        collectives.all_reduce(y)  # in place, on an intermediate
        z = collectives.all_reduce(y + 1, op="max", algorithm="one_shot", out=torch.empty_like(y))
        scattered = collectives.reduce_scatter(torch.empty(y.numel() // W), y, max_blocks=4)
        gathered = collectives.all_gather(torch.empty(W * y.numel()), y, algorithm="tma")
        collectives.barrier()
        rs = collectives.gemm_reduce_scatter(a, b)
        ag = collectives.all_gather_gemm(a, b, out=torch.empty(W * a.shape[0], b.shape[1]))
        collectives.all_reduce(x)  # in place, on an input
        return z.sum() + scattered.sum() + gathered.sum(), rs, ag


def _compile(model: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """``model`` compiled with fullgraph=True (a graph break raises) by a backend that records
    dynamo's graph and AOT autograd's functionalized forward graph, as code."""
    graphs: list[str] = []

    def forward_compiler(gm, example_inputs):
        graphs.append(gm.code)
        return gm

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return aot_autograd(fw_compiler=forward_compiler)(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend=backend), graphs


def test_compiled_model_has_no_graph_break(monkeypatch: pytest.MonkeyPatch) -> None:
    # The communicator's world size is read while tracing; there is none here (no GPU).
    monkeypatch.setattr(overlap, "_world", lambda: W)
    compiled, graphs = _compile(Model())
    with FakeTensorMode():  # nothing runs: every operator's fake implementation answers
        total, rs, ag = compiled(torch.randn(8), torch.randn(4, 3), torch.randn(3, 5))
    assert (rs.shape, ag.shape, total.shape) == ((4 // W, 5), (W * 4, 5), ())
    traced, functional = graphs
    calls = [line.split("torch.ops.collectives.")[1].split("(")[0] for line in traced.splitlines()
             if "torch.ops.collectives." in line]
    assert calls == ["all_reduce", "all_reduce", "reduce_scatter", "all_gather", "barrier",
                     "gemm_reduce_scatter", "all_gather_gemm", "all_reduce"]
    # Functionalized: the in-place operators as auto_functionalized, the barrier as an ordered
    # effect (kept, threaded with a token), the GEMM operators as they are, in program order.
    kinds = {"auto_functionalized_v2(": "functional ", "with_effects(": "effect ", "": ""}
    found = [kinds[m[0]] + m[1] for m in re.findall(
        r"(auto_functionalized_v2\(|with_effects\(|)(?:arg\d+_1, )?torch\.ops\.collectives\.(\w+)\.default", functional)]
    assert found == ["functional all_reduce", "functional all_reduce", "functional reduce_scatter",
                     "functional all_gather", "effect barrier", "gemm_reduce_scatter", "all_gather_gemm",
                     "functional all_reduce"]
    # x, the input reduced in place, is written back: the graph returns the last all-reduce's result.
    last = re.findall(r"(getitem_\d+) = auto_functionalized_v2_\d+\[1\]", functional)[-1]
    assert re.search(rf"return \(getitem_\d+, {last},", functional)


class GroupModel(torch.nn.Module):
    """A model whose all-reduce names a sub-group (which the compiled operators cannot carry)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        collectives.all_reduce(x, group="tp")
        return x


def test_a_group_inside_torch_compile_is_refused_not_run_on_every_rank() -> None:
    compiled, _ = _compile(GroupModel())
    with FakeTensorMode(), pytest.raises(Exception, match=r"all_reduce\(group=...\) inside torch.compile"):
        compiled(torch.randn(8))


def test_fake_gemm_reduce_scatter_refuses_rows_not_divisible_by_world() -> None:
    with FakeTensorMode(), pytest.raises(Exception, match="not a multiple of 3"):
        torch.ops.collectives.gemm_reduce_scatter(torch.empty(4, 3), torch.empty(3, 5), 3)


class OutModel(torch.nn.Module):
    """An all-reduce into ``out``: what eager refuses, tracing must refuse too."""

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return collectives.all_reduce(x, out=o)


@pytest.mark.parametrize("out", [lambda: torch.randn(2, 8), lambda: torch.randn(8, dtype=torch.float64)],
                         ids=["broadcast-shape", "other-dtype"])
def test_a_traced_all_reduce_refuses_the_out_eager_refuses(out) -> None:
    compiled, _ = _compile(OutModel())
    with FakeTensorMode(), pytest.raises(Exception, match="out must be a contiguous tensor of t's dtype and shape"):
        compiled(torch.randn(8), out())
