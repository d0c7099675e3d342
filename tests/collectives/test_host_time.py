"""``collectives.tools.host_time``'s rows on CPU (torch.distributed and the GPU's synchronisation
stood in for): a row whose measurement raises a Python error prints it and becomes that
error, the tool goes on, and the failing rank meets the same synchronisations as one that
measured (so that no rank waits for it)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest


@pytest.fixture
def host_time(monkeypatch):
    """The module, its ``dist`` and ``torch.cuda.synchronize`` stubbed; yields it and the list of
    synchronisations met (``barrier``, and ``slowest``: the all-reduce of the rank's time)."""
    from ptxops.nvls import MULTICAST_OFF

    for name, value in MULTICAST_OFF.items():
        monkeypatch.setenv(name, value)  # (the import sets them: undone after the test)
    from collectives.tools import host_time

    met: list[str] = []
    monkeypatch.setattr(host_time.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host_time, "dist", SimpleNamespace(barrier=lambda: met.append("barrier"), get_rank=lambda: 0))
    monkeypatch.setattr(host_time, "_slowest", lambda mine: met.append("slowest") or mine)
    return host_time, met


def boom() -> None:
    raise ValueError("boom")


@pytest.mark.parametrize("where", ["making the calls", "a call"])
def test_a_row_that_raises_prints_its_error_and_the_next_row_is_measured(host_time, capsys, where: str) -> None:
    module, met = host_time
    rows: list = []
    calls = (lambda: boom()) if where == "making the calls" else (lambda: [lambda: None, boom])
    module.add(rows, "  bad", lambda: module.host_us(calls))
    failing, met[:] = list(met), []
    module.add(rows, "good", lambda: module.host_us(lambda: [lambda: None] * 4))
    assert rows[0] == ("  bad", "failed: ValueError: boom")
    assert "rank 0: bad: ValueError: boom" in capsys.readouterr().out
    assert rows[1][0] == "good" and isinstance(rows[1][1], float) and math.isfinite(rows[1][1])
    assert failing == met == ["barrier", "slowest"] * module.REPEATS


def test_a_row_another_rank_failed_says_so(host_time, monkeypatch) -> None:
    module, _ = host_time
    monkeypatch.setattr(module, "_slowest", lambda mine: math.inf)  # (what a failed rank sends)
    rows: list = []
    module.add(rows, "row", lambda: module.host_us(lambda: [lambda: None]))
    assert rows == [("row", "failed: RuntimeError: failed on another rank")]


def test_the_rows_compared_are_timed_interleaved_each_its_best(host_time, monkeypatch) -> None:
    """measure_rows on a host that slows down run by run (a fake clock): every round runs each
    row once, the first row rotating, so that the drift reaches every row alike (timed one row
    after the other, the last would read 2 x (REPEATS - 1) steps slower); each row reports its
    best run; a row whose call raises becomes its error (after the same runs as the others)."""
    module, _ = host_time
    order: list[str] = []

    def host_run(calls):
        try:
            fns = calls()
        except Exception as e:  # noqa: BLE001
            return math.inf, e
        order.append(fns[0].__name__)
        return 10.0 + len(order), None  # (every call costs the same; the host drifts a step a run)

    monkeypatch.setattr(module, "host_run", host_run)

    def make(name: str):
        def call() -> None:
            pass
        call.__name__ = name
        return lambda: call

    rows: list = []
    module.measure_rows(rows, [("a", make("a"), False), ("b", make("b"), False), ("c", make("c"), False),
                               ("bad", lambda: boom, False)], calls=4)
    rounds = [order[r * 3:(r + 1) * 3] for r in range(module.REPEATS)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds) and {r[0] for r in rounds} == {"a", "b", "c"}
    best = dict(rows[:3])
    assert max(best.values()) - min(best.values()) <= 2  # less than a round apart
    assert best == {f"{name}, plan hit": 11.0 + order.index(name) for name in "abc"}
    assert rows[3] == ("bad, plan hit", "failed: ValueError: boom")


def test_the_breakdown_times_the_apis_own_keys_and_parts(monkeypatch) -> None:
    """--breakdown on the stubbed world of tests.support.host_path (launches no-ops, timings
    stood in for): the all-reduce's and the reduce-scatter's rows are all there, its flat keys
    hit the plans the API made (a key built otherwise than the API's raises, and its rows go
    missing), and torch's rows fail alone where torch symm_mem cannot run (no GPU here)."""
    from ptxops.nvls import MULTICAST_OFF

    for name, value in MULTICAST_OFF.items():
        monkeypatch.setenv(name, value)
    torch = pytest.importorskip("torch")
    from collectives.algorithms import plan
    from collectives.tools import host_time
    from tests.support import host_path

    with host_path.world() as comm:
        monkeypatch.setattr(host_time, "host_us", lambda calls, repeats=5: ([f() for f in calls()[:2]], 1.0)[1])
        monkeypatch.setattr(host_time, "gpu_us", lambda fns: (fns[0](), 2.0)[1])
        monkeypatch.setattr(plan, "current_stream", lambda device: 0)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda n: None, raising=False)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0))
        monkeypatch.setattr(host_time, "dist", SimpleNamespace(
            get_rank=lambda: 0, group=SimpleNamespace(WORLD=SimpleNamespace(group_name="world"))))
        rows = host_time.breakdown(comm, torch.ones(host_path.N, dtype=torch.bfloat16), 10)
    names = [name.strip() for name, _ in rows]
    for head in ("all_reduce", "reduce_scatter"):
        part = names[names.index(f"{head}, plan hit: the call"):]
        assert part[:6] == [f"{head}, plan hit: the call", f"the call, runs of {host_time.SHORT} (the launch queue never full)",
                            "GPU time per call, 10 back to back", "the call, its launch a no-op (our Python)",
                            "key: the flat key + plan lookup (PlanCache.hit)",
                            "launch alone: the plan's TVM-FFI function, bound once"]
    failures = [name for name, us in rows if isinstance(us, str)]
    assert failures == ["torch symm_mem: its buffer"], rows


def test_the_ratios_compare_each_plan_hit_with_torchs_same_call_at_each_size(host_time) -> None:
    module, _ = host_time
    rows = [("barrier, plan hit", 6.5), ("torch symm_mem barrier, plan hit", 6.5),
            ("all_reduce 4096 B, plan hit", 5.0), ("all_reduce 4096 B, new tensors", 8.0),
            ("reduce_scatter 4096 B, plan hit", 7.0), ("torch two_shot_all_reduce_ 4096 B, plan hit", 8.0),
            ("torch reduce_scatter_out 4096 B, plan hit", "failed: RuntimeError: x"),
            ("all_reduce 65536 B, plan hit", 6.0), ("torch two_shot_all_reduce_ 65536 B, plan hit", 9.0),
            ("reduce_scatter 65536 B, plan hit", 9.0), ("torch reduce_scatter_out 65536 B, plan hit", 10.0)]
    assert module.ratios(rows, [4096, 65536]) == [
        "barrier: 6.50 / 6.50 us = 1.00x",
        "all_reduce 4096 B: 5.00 / 8.00 us = 0.62x",
        "all_reduce 65536 B: 6.00 / 9.00 us = 0.67x",
        "reduce_scatter 65536 B: 9.00 / 10.00 us = 0.90x",  # (4 KB: torch's row failed, left out)
    ]


def test_each_rank_us_is_every_ranks_best_and_fails_as_host_us(host_time, monkeypatch) -> None:
    """Each rank's best of the runs (not the slowest's alone), every run's figures gathered from
    every rank; a rank that failed fails the measurement on every rank, as ``host_us``'s rows do."""
    module, _ = host_time
    runs = iter([[5.0, 9.0], [4.0, 11.0], [6.0, 8.0], [5.5, 9.5], [4.5, 10.0]])
    gathered: list = []

    def all_gather_object(out, mine):
        out[:] = next(runs)
        gathered.append(mine)

    monkeypatch.setattr(module, "dist", SimpleNamespace(barrier=lambda: None, get_rank=lambda: 0,
                                                        get_world_size=lambda: 2, all_gather_object=all_gather_object))
    assert module.each_rank_us(lambda: [lambda: None] * 3) == [4.0, 8.0]
    assert len(gathered) == module.REPEATS and all(math.isfinite(us) for us in gathered)
    runs = iter([[5.0, math.inf]] * module.REPEATS)  # (rank 1 failed)
    with pytest.raises(RuntimeError, match="failed on another rank"):
        module.each_rank_us(lambda: [lambda: None])


def test_moe_rows_time_the_public_dispatch_and_combine(monkeypatch) -> None:
    """--moe on the stubbed MoE world of tests.support.host_path (kernels loaded, launching
    nothing): per token count a dispatch's and a combine's rows (the slowest rank's host time,
    each rank's, the GPU time), each measuring the public call, which runs (a call raising
    would turn its row into the error)."""
    from ptxops.nvls import MULTICAST_OFF

    for name, value in MULTICAST_OFF.items():
        monkeypatch.setenv(name, value)
    torch = pytest.importorskip("torch")
    from collectives.tools import host_time
    from tests.support import host_path

    ran: list[str] = []

    def each_rank_us(calls):
        fns = calls()
        ran.append(type(fns[0]()).__name__)
        return [3.0, 4.0, 2.0, 3.5]

    def gpu_us(fns):
        fns[0]()
        return 4.5

    monkeypatch.setattr(host_time, "each_rank_us", each_rank_us)
    monkeypatch.setattr(host_time, "gpu_us", gpu_us)
    monkeypatch.setattr(host_time, "dist", SimpleNamespace(get_rank=lambda: 0))
    shape = host_time.MOE_SHAPE

    def inputs(tokens: int) -> tuple:
        gen = torch.Generator().manual_seed(tokens)
        ids = torch.stack([torch.randperm(shape["experts"], generator=gen)[:shape["topk"]] for _ in range(tokens)])
        return (torch.randn((tokens, shape["hidden"]), generator=gen).bfloat16(), ids,
                torch.rand((tokens, shape["topk"]), generator=gen))

    with host_path.moe_world():
        rows = host_time.moe_rows([1, 2], 10, inputs)
    assert ran == ["tuple", "Tensor"] * 2  # dispatch's (expert_x, ..., handle), combine's output
    names = [name for name, _ in rows]
    for tokens in ("1 token", "2 tokens"):
        for part in ("dispatch", "combine"):
            at = names.index(f"moe {part}, {tokens}: host, slowest rank")
            assert rows[at][1] == 4.0
            assert rows[at + 1:at + 6] == [("  rank 0's host", 3.0), ("  rank 1's host", 4.0), ("  rank 2's host", 2.0),
                                          ("  rank 3's host", 3.5), ("  GPU time per call, 10 back to back", 4.5)]
