"""The host path of an eager collective call without a GPU: the real API and communicator logic
(:class:`~tests.support.fake_comm.FakeComm`) on CPU tensors, every launch a no-op, counted with
``sys.setprofile`` and timed.  The guard (``tests/collectives/runtime/test_host_path.py``) holds
the counts under ceilings; run as a script it prints where a call's host time goes:

    PYTHONPATH=. python -m tests.support.host_path [--calls N]

Each collective is measured twice: a plan hit (the same tensors again: one dictionary lookup and
the launch) and a call on tensors the allocator placed elsewhere (the same facts: the plan of
the earlier call with the new addresses swapped in).  The MoE layer's dispatch and combine
(:data:`MOE`) are measured at a call like the one before (their kernels loaded, their buffers
made), with their torch launches counted."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from tests.support.fake_comm import FakeComm, FakeHeap

#: Elements of the all-reduce's tensor (4 KB of bf16: a call whose GPU time is the least).
N = 2048
WORLD = 2


@contextmanager
def world() -> Any:
    """A FakeComm of rank 0 of :data:`WORLD` used by the API, whose launches do nothing, with
    CPU tensors passing the API's device checks; yields the communicator."""
    import pytest

    from collectives import api
    from collectives.dtypes import from_torch
    from tests.support.fake_comm import install

    from collectives.runtime import communicator
    from collectives.symmetric import context

    with pytest.MonkeyPatch.context() as mp:
        heap = FakeHeap(world_size=WORLD)
        comm = FakeComm(heap)
        mp.setattr(comm, "kernel", lambda key: lambda *args: None)
        install(mp, comm, [False])
        # The API finds the communicator as on GPUs (communicator(None): the open context's):
        # its lookup is on every call's path and counted with it.
        heap.closed, heap.group = False, None
        mp.setattr(context, "_CTX", heap)
        mp.setattr(context, "_THREAD", type(context._THREAD)())  # (no thread-bound context)
        mp.setitem(communicator._COMMS, id(heap), comm)
        mp.setattr(api, "communicator", communicator.communicator)
        mp.setattr(api, "_dtype", lambda comm, t: from_torch(t.dtype).name)  # (a plan miss only: CPU tensors)
        stub_exchange(mp, comm)
        yield comm


def stub_exchange(mp: Any, comm: FakeComm) -> None:
    """The all-to-all's exchange part without its collective allocations: its plan (a miss
    only) is an :class:`~collectives.runtime.all_to_all.AllToAllPlan` whose launch does nothing,
    keeping a split tensor for each list of splits as :func:`~collectives.runtime.all_to_all.prepare`
    does (a hit then asks whether a capture is on, as on GPUs)."""
    from collectives.runtime import all_to_all as a2a

    def prepare(comm, state, out, inp, out_splits, in_splits, transport="nvlink", bounded=False):
        keep = tuple(torch.zeros(WORLD, dtype=torch.int64) for s in (in_splits, out_splits)
                     if not isinstance(s, torch.Tensor))
        return a2a.AllToAllPlan(lambda *args: None, (), comm, keep, state.pinned)

    state = object.__new__(a2a.Exchange)
    state.comm, state.pinned = comm, {}
    mp.setattr(a2a, "prepare", prepare)
    mp.setattr(a2a, "capturing", lambda: False)  # (imported by name there: install's patch misses it)
    mp.setattr(comm, "_exchange", state)


def calls(collective: str, moved: bool) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(warm-up, measured call) of ``collective``: the measured one hits the warm-up's plan, or
    with ``moved`` runs on new tensors of the same sizes."""
    import collectives as api

    def tensors() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(N * WORLD, dtype=torch.bfloat16), torch.ones(N, dtype=torch.bfloat16)

    def call(whole: torch.Tensor, block: torch.Tensor) -> Callable[[], Any]:
        return {
            "all_reduce": lambda: api.all_reduce(block),
            "reduce_scatter": lambda: api.reduce_scatter(block, whole),
            "all_gather": lambda: api.all_gather(whole, block),
            "barrier": lambda: api.barrier(),
            # (list splits: the common eager form; the key holds their values)
            "all_to_all": lambda: api.all_to_all(whole[:N], whole[N:], [N // WORLD] * WORLD, [N // WORLD] * WORLD),
        }[collective]

    first = call(*tensors())
    return first, (call(*tensors()) if moved else first)


def profile(fn: Callable[[], Any]) -> Counter:
    """The Python functions one call of ``fn`` enters (file, name) and how often (``fn``
    itself not counted)."""
    seen: Counter = Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[frame.f_code.co_filename, frame.f_code.co_name] += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    seen[fn.__code__.co_filename, fn.__code__.co_name] -= 1
    return +seen


def python_calls(collective: str, moved: bool = False) -> tuple[int, Counter]:
    """The Python calls of one eager ``collective`` call on the stubbed world (a plan hit, or on
    moved tensors), and where they go."""
    with world():
        warm, measured = calls(collective, moved)
        warm()
        warm()
        seen = profile(measured)
    return sum(seen.values()), seen


def host_us(collective: str, moved: bool, count: int, repeats: int = 5) -> float:
    """Microseconds of host time per call (the best of ``repeats`` runs of ``count`` calls);
    with ``moved``, each call on new tensors (the allocation outside the timing)."""
    with world():
        best = float("inf")
        for _ in range(repeats):
            pairs = [calls(collective, moved) for _ in range(count)] if moved else [calls(collective, False)] * count
            pairs[0][0]()
            fns = [measured for _, measured in pairs]
            start = time.perf_counter()
            for fn in fns:
                fn()
            best = min(best, (time.perf_counter() - start) / count * 1e6)
    return best


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "barrier", "all_to_all")

#: The MoE layer measured: ranks, tokens per rank, top-k, experts, hidden (the bench's decode shape).
MOE = dict(world=4, tokens=1, topk=8, experts=256, hidden=7168)


@contextmanager
def moe_world() -> Any:
    """:func:`world` of :data:`MOE`'s ranks for the public ``collectives.moe.dispatch`` and
    ``combine``: their kernels loaded (a kernel cache that has every key), launching nothing."""
    global WORLD
    import pytest

    from collectives.runtime import communicator
    from collectives.runtime import moe as runtime_moe

    class Loaded:
        def has(self, key: Any, target: str) -> bool:
            return True

        def get(self, key: Any, target: str, device: int | None = None) -> Callable[..., None]:
            return lambda *args: None

    world_before, WORLD = WORLD, MOE["world"]
    try:
        with world() as comm, pytest.MonkeyPatch.context() as mp:
            comm.kernels = Loaded()
            mp.setattr(communicator, "compile_target", lambda device=None: "sm_90a")
            mp.setattr(communicator, "communicator", lambda group=None: comm)
            mp.setattr(runtime_moe, "current_stream", lambda device: 0)
            mp.setattr(runtime_moe, "capturing", lambda: False)
            yield comm
    finally:
        WORLD = world_before


def moe_calls() -> dict[str, Callable[[], Any]]:
    """The public dispatch (bf16 and fp8 rows) and combine of one :data:`MOE` layer (fused kernels,
    low latency), by name, each after two warm-up layers (inside :func:`moe_world`)."""
    from collectives import moe

    gen = torch.Generator().manual_seed(0)
    tokens, topk, experts = MOE["tokens"], MOE["topk"], MOE["experts"]
    x = torch.randn((tokens, MOE["hidden"]), generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    w = torch.rand((tokens, topk), generator=gen)
    for _ in range(2):
        expert_x, _, handle = moe.dispatch(x, ids, w, experts, max_tokens=tokens)
        moe.combine(expert_x, handle)
        moe.dispatch(x, ids, w, experts, max_tokens=tokens, fp8=True)
    return {"moe.dispatch": lambda: moe.dispatch(x, ids, w, experts, max_tokens=tokens),
            "moe.dispatch fp8": lambda: moe.dispatch(x, ids, w, experts, max_tokens=tokens, fp8=True),
            "moe.combine": lambda: moe.combine(expert_x, handle)}


def torch_ops(fn: Callable[[], Any]) -> Counter:
    """The torch operators one call of ``fn`` runs, allocations and views included (each costs
    microseconds of host time on a slow GPU host), by name, and how often."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        seen: Counter = Counter()

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        fn()
    return count.seen


def torch_launches(fn: Callable[[], Any]) -> int:
    """The torch operators one call of ``fn`` runs that launch GPU work (views and allocations
    aside: ``tests/collectives/test_moe_launches.py``'s count)."""
    from tests.collectives.test_moe_launches import FREE

    return sum(n for op, n in torch_ops(fn).items() if op not in FREE)


def moe_host(count: int, repeats: int = 5) -> dict[str, tuple[int, int, int, float]]:
    """Per MoE call: (Python calls, torch launches, torch operators, host us: the best of
    ``repeats`` runs of ``count`` calls)."""
    with moe_world():
        out = {}
        for name, fn in moe_calls().items():
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(count):
                    fn()
                best = min(best, (time.perf_counter() - start) / count * 1e6)
            out[name] = (sum(profile(fn).values()), torch_launches(fn), sum(torch_ops(fn).values()), best)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.host_path", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"{'call':32s} {'Python calls':>12s} {'host us':>8s}")
    for collective in COLLECTIVES:
        for moved in (False, True) if collective not in ("barrier", "all_to_all") else (False,):
            name = f"{collective} ({'new tensors' if moved else 'plan hit'})"
            print(f"{name:32s} {python_calls(collective, moved)[0]:12d} {host_us(collective, moved, args.calls):8.2f}")
    for name, (python, launches, ops, us) in moe_host(max(args.calls // 10, 1)).items():
        print(f"{name + f' ({launches} launches, {ops} torch ops)':32s} {python:12d} {us:8.2f}")


if __name__ == "__main__":
    main()
