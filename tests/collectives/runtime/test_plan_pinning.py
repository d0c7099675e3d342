"""CUDA graphs captured per size, smallest first and largest first, never lose the memory they
use (pure Python, no GPU): the real API plans and staging pool on a fake heap that records
frees (:mod:`fake_comm`).

Each size is called eagerly (the warm-up that plans, grows the staging and compiles) and then
under capture, as an inference server captures one graph per batch size.  A graph uses every
address its launches pass (staging, result and workspace buffers; for the GEMM overlap also the
workspace its GEMMs write).  After the 16 captures, every graph is "replayed": none of its
addresses may lie in freed memory.  And no eager call may run through a buffer a graph pinned:
every rank plans anew on the slot's new buffer.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from collectives import api, overlap  # noqa: E402
from collectives.algorithms import plan  # noqa: E402
from collectives.algorithms.plan import Plan  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

WORLD = 2
#: 16 sizes (bf16 elements, multiples of 64) from 128 KB to 13 MB: they cross every staging
#: capacity from 1 MB to 16 MB.
SIZES = [round(2 ** (16 + 0.45 * i)) // 64 * 64 for i in range(16)]
_addresses = itertools.count(0x7F00_0000_0000, 1 << 32)


def _user(numel: int) -> FakeTensor:
    """A plain (non-symmetric) CUDA tensor of its own."""
    return FakeTensor(next(_addresses), numel)


def _workspace_call(comm: FakeComm, name: str, numel: int, collective):
    """What ``gemm_reduce_scatter`` / ``all_gather_gemm`` do with their workspace: take it,
    let the GEMMs write (or read) it, and hand each chunk of it to a collective (the same
    other tensors every call).  Returns the workspace addresses the GEMMs touch."""
    others = [_user(numel // WORLD if name == "all_gather_gemm" else numel // WORLD) for _ in range(2)]

    def call() -> set[int]:
        work = overlap._workspace(comm, name, WORLD * numel, torch.bfloat16)
        for c in range(2):
            collective(FakeTensor(work.data_ptr() + c * numel, numel), others[c])
        return {work.data_ptr()}  # the GEMMs' accesses: in the graph, not in a plan
    return call


def _call(fn, *tensors):
    def call() -> set[int]:
        fn(*tensors)
        return set()
    return call


#: Per case: given the communicator and a size, the call (its tensors made once, as a server's
#: static graph inputs are).
CALLS = {
    "all_reduce one_shot": lambda comm, n: _call(
        lambda t: api.all_reduce(t, algorithm="one_shot", backend="peer"), _user(n)),
    "all_reduce two_shot": lambda comm, n: _call(
        lambda t: api.all_reduce(t, algorithm="two_shot", backend="peer"), _user(n)),
    "all_reduce tma": lambda comm, n: _call(lambda t: api.all_reduce(t, algorithm="tma", backend="peer"), _user(n)),
    "all_reduce push": lambda comm, n: _call(lambda t: api.all_reduce(t, algorithm="push", backend="peer"), _user(n)),
    "reduce_scatter one_shot": lambda comm, n: _call(
        lambda o, i: api.reduce_scatter(o, i, algorithm="one_shot", backend="peer"), _user(n), _user(WORLD * n)),
    "reduce_scatter push": lambda comm, n: _call(
        lambda o, i: api.reduce_scatter(o, i, algorithm="push", backend="peer"), _user(n), _user(WORLD * n)),
    "all_gather one_shot": lambda comm, n: _call(
        lambda o, i: api.all_gather(o, i, algorithm="one_shot", backend="peer"), _user(WORLD * n), _user(n)),
    "all_gather tma": lambda comm, n: _call(
        lambda o, i: api.all_gather(o, i, algorithm="tma", backend="peer"), _user(WORLD * n), _user(n)),
    "gemm_reduce_scatter": lambda comm, n: _workspace_call(
        comm, "gemm_reduce_scatter", n,
        lambda p, out: api.reduce_scatter(out, p, algorithm="tma", backend="peer")),
    "all_gather_gemm": lambda comm, n: _workspace_call(
        comm, "all_gather_gemm", n,
        lambda g, src: api.all_gather(g, src, algorithm="tma", backend="peer")),
}


def _graphs(monkeypatch, case: str, sizes: list[int]) -> tuple[FakeHeap, list[set[int]]]:
    """Warm up and capture ``case`` at each size in turn: the heap, and each graph's addresses."""
    heap = FakeHeap(world_size=WORLD)
    comm = FakeComm(heap)
    capturing = [False]
    install(monkeypatch, comm, capturing)
    graphs = []
    for n in sizes:
        call = CALLS[case](comm, n)
        call()
        capturing[0] = True
        start = len(comm.launches)
        touched = call()
        capturing[0] = False
        assert len(comm.launches) > start
        graphs.append({a for _, used in comm.launches[start:] for a in used} | touched)
    return heap, graphs


def _replay(heap: FakeHeap, graphs: list[set[int]]) -> None:
    for g, used in enumerate(graphs):
        lost = [hex(a) for a in used if FakeHeap.find(a, heap.freed) is not None]
        assert not lost, f"graph {g} of {len(graphs)} uses freed memory at {lost}"


@pytest.mark.parametrize("order", ["increasing", "decreasing"])
@pytest.mark.parametrize("case", list(CALLS))
def test_graphs_per_size_keep_their_memory(monkeypatch, case: str, order: str) -> None:
    heap, graphs = _graphs(monkeypatch, case, SIZES if order == "increasing" else SIZES[::-1])
    _replay(heap, graphs)
    if order == "increasing" and case != "all_reduce tma":  # the pool did grow under the graphs
        assert any(op == "agree_any" for op, *_ in heap.log)
    if order == "decreasing":  # the first call sized every buffer: nothing grew, nothing was freed
        assert not heap.freed


def test_without_graphs_superseded_staging_is_freed(monkeypatch) -> None:
    """Pinning is for captures only: eager calls of growing sizes keep the heap bounded."""
    heap = FakeHeap(world_size=WORLD)
    comm = FakeComm(heap)
    install(monkeypatch, comm, [False])
    for n in SIZES:
        CALLS["all_gather one_shot"](comm, n)()
    assert heap.freed and comm.pool.live_bytes == sum(t.numel() for t in comm.pool.current if t is not None)


def _old_plan_rule(monkeypatch) -> None:
    """Before the fix: a plan pinned what it held only when made under capture, and ``run``
    pinned nothing (an eager warm-up's plan reused under capture was never pinned)."""
    def run(self: Plan, capture: bool) -> None:
        comm = self.comm
        args = self.args[0] if len(self.args) == 1 else self.args[comm.turn]
        if len(self.args) > 1:
            comm.turn ^= 1
        self.fn(*args, 0)

    made = plan.prepare

    def prepare(comm, *args, **kwargs):
        p = made(comm, *args, **kwargs)
        if plan.capturing():
            comm.pool.capture(p.holds)
        return p

    monkeypatch.setattr(Plan, "run", run)
    monkeypatch.setattr(plan, "prepare", prepare)


@pytest.mark.parametrize("case", ["all_gather one_shot", "all_gather tma", "all_gather_gemm"])
def test_the_old_rule_frees_what_a_graph_uses(monkeypatch, case: str) -> None:
    """all_gather's plan key had no capture flag: its eager plan ran under capture unpinned."""
    _old_plan_rule(monkeypatch)
    heap, graphs = _graphs(monkeypatch, case, SIZES)
    with pytest.raises(AssertionError, match="uses freed memory"):
        _replay(heap, graphs)


def _old_workspace(comm, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Before the fix: the overlap's own workspace, freed and regrown whatever graphs used it."""
    cache = comm.__dict__.setdefault("_old_workspace", {})
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    current = cache.get(name)
    if current is None or current.numel() < nbytes:
        if current is not None:
            comm.ctx.free(current)
        current = cache[name] = comm.ctx.empty(nbytes, torch.uint8)
    return current[:nbytes].view(dtype)


@pytest.mark.parametrize("case", ["gemm_reduce_scatter", "all_gather_gemm"])
def test_the_old_overlap_workspace_frees_what_a_graph_uses(monkeypatch, case: str) -> None:
    monkeypatch.setattr(overlap, "_workspace", _old_workspace)
    heap, graphs = _graphs(monkeypatch, case, SIZES)
    with pytest.raises(AssertionError, match="uses freed memory"):
        _replay(heap, graphs)


#: The cases whose plans hold a staging-pool buffer that a larger size grows.
STAGED = [c for c in CALLS if c not in ("all_reduce tma", "gemm_reduce_scatter", "all_gather_gemm")]


@pytest.mark.parametrize("case", STAGED)
def test_an_eager_call_after_a_graph_pinned_its_buffer_plans_on_the_current_one(monkeypatch, case: str) -> None:
    """A superseded buffer that a graph used stays allocated, but no eager call may use it
    again: plan-cache hits follow each rank's own tensor addresses and eviction order, so a rank
    that reused a plan holding the old buffer moved its data through it while the others,
    planning anew, used the current one (wrong results, no error: a one-GPU world of 7 ranks,
    a push all-reduce whose plain tensor came back at an earlier call's address)."""
    heap = FakeHeap(world_size=WORLD)
    comm = FakeComm(heap)
    capturing = [False]
    install(monkeypatch, comm, capturing)
    small = CALLS[case](comm, SIZES[0])  # its tensors made once: the same addresses every call
    small()  # eager: plans on the slot's first buffer
    capturing[0] = True
    small()  # a graph uses that buffer
    capturing[0] = False
    CALLS[case](comm, SIZES[-1])()  # a larger call grows the slot: the first buffer is pinned
    assert comm.pool.pinned
    start = len(comm.launches)
    small()
    used = {a for _, addresses in comm.launches[start:] for a in addresses}
    stale = [hex(a) for a in used for t in comm.pool.pinned if t.data_ptr() <= a < t.data_ptr() + t.numel()]
    assert not stale, f"an eager call used the superseded buffer at {stale}"


def _soak_launches(monkeypatch, world: int, same_place: bool) -> list[tuple]:
    """The soak's calls (seed 1, the first 410) on one rank's host: every launch as (call, kernel
    key, blocks, and for each address it passes the number of the symmetric allocation it lies
    in, or "user" for the caller's tensors).  ``same_place``: a size's tensors always come back
    at one address (plan-cache hits); else every tensor is new (misses only)."""
    import argparse
    import random

    from collectives.dtypes import DTYPES
    from collectives.tools import soak

    heap = FakeHeap(world_size=world)
    comm = FakeComm(heap)
    capturing = [False]
    install(monkeypatch, comm, capturing)
    draws = soak.Soak.__new__(soak.Soak)
    draws.args, draws.rng, draws.collectives = argparse.Namespace(graph_fraction=0.3), random.Random(1), api
    allocations: list[tuple[int, int]] = []  # the heap's (address, bytes) in order: numbered alike on every rank
    made = heap.empty

    def empty(shape, dtype=torch.uint8):
        t = made(shape, dtype)
        allocations.append((t.data_ptr(), t.nbytes))
        return t

    heap.empty = empty
    places: dict[int, int] = {}

    def tensor(numel: int, dtype: str) -> FakeTensor:
        kind = DTYPES[dtype].torch
        nbytes = numel * torch.empty((), dtype=kind).element_size()
        at = places.setdefault(nbytes, next(_addresses)) if same_place else next(_addresses)
        return FakeTensor(at, numel, kind)

    def number(a: int) -> int | str:
        return next((i for i, (base, nbytes) in enumerate(allocations) if base <= a < base + nbytes), "user")

    captured, launches = set(), []
    for step in range(1, 411):
        if step % 40 == 39:
            draws.rng.choice(("one_shot", "two_shot", "lamport", "push"))
            continue
        collective, algorithm, backend, dtype, n, graph = draws.draw()
        t = tensor(world * n if collective == "reduce_scatter" else n, dtype)
        out = t if collective == "all_reduce" else tensor(world * n if collective == "all_gather" else n, dtype)
        if graph and (collective, algorithm, backend, dtype, n) in captured:
            continue
        for capture in ([False, True] if graph else [False]):
            capturing[0] = capture
            start = len(comm.launches)
            draws.launch(collective, algorithm, backend, t, out)
            for (key, used), (_, blocks) in zip(comm.launches[start:], comm.grids[start:]):
                launches.append((step, capture, key, blocks, [number(a) for a in used]))
        capturing[0] = False
        if graph:
            captured.add((collective, algorithm, backend, dtype, n))
    return launches


@pytest.mark.parametrize("world", range(2, 9))
def test_ranks_launch_alike_whatever_their_plan_cache_hits(monkeypatch, world: int) -> None:
    """A rank that hits its plan cache at every call and one that never does launch the same
    kernels, on the same grids, through the same symmetric allocations: what a call moves
    through may not depend on a rank's own addresses.  Before the pinned-buffer fix, at W = 3,
    5, 6 and 7 (where the 1 MB push slots grow at call 113, just after call 112's graph captured
    them), the hitting rank went through the superseded buffers at call 226 (and 302 and 410:
    in a one-GPU world of 7 ranks, call 410 returned wrong data, no error)."""
    hits = _soak_launches(monkeypatch, world, same_place=True)
    misses = _soak_launches(monkeypatch, world, same_place=False)
    assert len(hits) == len(misses)
    for a, b in zip(hits, misses):
        assert a == b, f"call {a[0]}: {a[2:]} where a rank without plan-cache hits made {b[2:]}"
