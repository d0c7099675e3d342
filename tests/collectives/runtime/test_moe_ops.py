"""The all-to-all and MoE operators (collectives.runtime.moe) on the CPU: schemas, ``opcheck``
against a one-rank CPU model, and ``torch.compile(fullgraph=True)`` of a MoE layer traced under
fake tensors (no kernel runs)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import collectives  # noqa: E402
from collectives import moe  # noqa: E402
from collectives.runtime import moe as runtime_moe  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

SCHEMAS = {
    "all_to_all": "collectives::all_to_all(Tensor(a!) out, Tensor inp, Tensor? out_splits=None, "
                  "Tensor? in_splits=None) -> ()",
    "moe_dispatch": "collectives::moe_dispatch(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts, "
                    "int max_tokens, int world) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
                    "Tensor)",
    "moe_combine": "collectives::moe_combine(Tensor expert_out, Tensor topk_weights, Tensor order, Tensor valid, "
                   "Tensor send_splits, Tensor recv_splits, Tensor place, Tensor kept) -> Tensor",
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schemas(name: str) -> None:
    from collectives import api  # noqa: F401  (registers the all-to-all's kernel)

    assert str(getattr(torch.ops.collectives, name).default._schema) == SCHEMAS[name]
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"collectives::{name}", "CUDA")


def _copy(out, inp, out_splits, in_splits, bounded=False):  # a world of one: the all-to-all is a copy
    rows = inp.shape[0] if in_splits is None else int(sum(int(s) for s in in_splits))
    out[:rows] = inp[:rows]
    if bounded:  # (the rows received written back)
        out_splits.copy_(in_splits)


@pytest.fixture(scope="module")
def cpu_model():
    """CPU kernels for ``opcheck``: one rank (world 1), the all-to-all a copy."""
    lib = torch.library.Library("collectives", "IMPL")
    lib.impl("all_to_all", lambda out, inp, o=None, i=None: _copy(out, inp, o, i), "CPU")

    def dispatch(x, ids, w, experts, max_tokens, world):
        expert_x, counts, handle = moe.dispatch_with(_copy, world, x, ids, w, experts, max_tokens)
        for le, n in enumerate(counts.tolist()):  # rows past the counts are unspecified: made comparable
            expert_x[le, n:] = 0
        return (expert_x, counts) + moe.handle_tensors(handle)

    lib.impl("moe_dispatch", dispatch, "CPU")
    lib.impl("moe_combine", lambda out, w, *h: moe.combine_with(_copy, out, moe.handle_from(h, w)), "CPU")
    yield
    lib._destroy()


def _routing(tokens=5, topk=2, experts=4, hidden=8):
    gen = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    return torch.randn(tokens, hidden, generator=gen), ids, torch.rand(tokens, topk, generator=gen)


def test_opcheck(cpu_model) -> None:
    x, ids, w = _routing()
    torch.library.opcheck(torch.ops.collectives.all_to_all.default,
                          (torch.zeros(6, 3), torch.randn(6, 3), torch.tensor([6]), torch.tensor([6])))
    torch.library.opcheck(torch.ops.collectives.moe_dispatch.default, (x, ids, w, 4, 5, 1))
    out = torch.ops.collectives.moe_dispatch(x, ids, w, 4, 5, 1)
    torch.library.opcheck(torch.ops.collectives.moe_combine.default, (out[0] * 2, w) + tuple(out[2:-1]))


class Layer(torch.nn.Module):
    """A MoE layer: route, dispatch, an expert per local expert, combine; and an all-to-all with
    splits on the device."""

    def forward(self, x, logits, splits):
        weights, ids = torch.topk(torch.softmax(logits, -1), 2)
        expert_x, counts, handle = moe.dispatch(x, ids, weights, logits.shape[1], max_tokens=x.shape[0])
        y = moe.combine(torch.relu(expert_x) * 3, handle)
        z = torch.empty_like(x)
        collectives.all_to_all(z, x, splits, splits)
        return y + z, counts


def test_a_moe_layer_compiles_without_a_graph_break(monkeypatch) -> None:
    monkeypatch.setattr(moe, "_world", lambda: 2)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(Layer(), fullgraph=True, backend=backend)
    with FakeTensorMode():
        y, counts = compiled(torch.randn(6, 16), torch.randn(6, 4), torch.tensor([3, 3]))
    assert y.shape == (6, 16) and counts.shape == (2,)
    calls = [line.split("torch.ops.collectives.")[1].split("(")[0] for line in graphs[0].splitlines()
             if "torch.ops.collectives." in line]
    assert calls == ["moe_dispatch", "moe_combine", "all_to_all"]
