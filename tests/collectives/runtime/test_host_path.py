"""The eager host path (issue 50): a guard that cannot drift, and the moved plan's correctness.

A plan hit costs one dictionary lookup and the launch: the Python functions of ``collectives``
that one eager call enters, with the launch stubbed (:mod:`tests.support.host_path`), stay under
a ceiling per collective (the all-to-all's too: its plan hit is the same lookup and launch), so a
change that puts work back on the hot path fails here (raise a ceiling only with the reason in
the commit).  A call on tensors the allocator placed elsewhere
(same sizes, dtypes, kinds) takes the earlier call's plan with its own addresses swapped in,
and launches exactly what planning it afresh launches."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.support import host_path  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

#: Python calls into collectives/ of one plan-hit call (measured: raise only with a reason):
#: the collective's function, ``communicator()`` and the ``current()`` context it finds, the error
#: record's ``poll`` and ``Plan.run`` (the key is built inline, the plan looked up by the
#: dictionary's own ``get``: no call).  The all-to-all's also builds its key (plan_key, its two
#: lists of splits: _splits_key twice, a list of ints its own values) and runs its plan's run,
#: then the Plan's own run: 9 with list splits (11 while each list's values were checked one by
#: one: split_values twice).  (Before issue 50 item 1-3's second pass:
#: 7, 8, 8, 7 and 14, with ``communicator()`` a stand-in, uncounted.)
HIT_CEILING = {"all_reduce": 5, "reduce_scatter": 5, "all_gather": 5, "barrier": 5, "all_to_all": 9}
#: ... of one call on moved tensors met the first time: the hit's and ``_replan``, where the key
#: misses and the plan of its facts (one lookup) is run with the call's addresses (no plan made
#: or cached; met again: a plan of their own cached, then plan hits).  17 before (the facts' plan
#: copied into a new Plan, bound anew and cached at once; 19, 20, 20 without
#: ``communicator()``'s lookup).
MOVED_CEILING = {"all_reduce": 6, "reduce_scatter": 6, "all_gather": 6}
#: What only planning does: none of it on either path.
PLANNING = {"_plan", "_all_reduce_call", "_block_call", "describe", "prepare", "plan", "buffer", "staging", "kernel"}


def ours(seen) -> dict[str, int]:
    """The calls into the collectives package, by function name."""
    counts: dict[str, int] = {}
    for (path, name), n in seen.items():
        if "/collectives/" in path:
            counts[name] = counts.get(name, 0) + n
    return counts


@pytest.mark.parametrize("collective", sorted(HIT_CEILING))
def test_a_plan_hit_stays_under_its_ceiling_of_python_calls(collective: str) -> None:
    _, seen = host_path.python_calls(collective)
    mine = ours(seen)
    assert not PLANNING & set(mine), f"planning on a plan hit: {sorted(PLANNING & set(mine))}"
    assert "_replan" not in mine
    assert sum(mine.values()) <= HIT_CEILING[collective], f"{collective} plan hit: {sorted(mine.items())}"


def test_the_current_context_is_read_without_an_exception_in_a_thread_that_bound_none() -> None:
    """Every call finds its communicator through :func:`~collectives.symmetric.context.current`,
    which reads the thread's own context first: a default on the thread-local's class, so that
    a thread that bound none (every rank of a torchrun job) reads None directly, not through a
    raised and caught AttributeError (``getattr(local, "ctx", None)``: 0.4 us of each call on
    this CPU, more on the H200 host)."""
    import threading

    from collectives.symmetric import context

    seen = []
    thread = threading.Thread(target=lambda: seen.append(context._THREAD.ctx))
    thread.start()
    thread.join()
    assert seen == [None]


@pytest.mark.parametrize("collective", ["all_gather", "all_reduce", "barrier", "reduce_scatter"])
def test_a_plan_hit_runs_no_torch_operator(collective: str) -> None:
    """No torch operator on a plan hit: no view, slice or allocation of ``out``, no copy (each
    costs 1.5-6 us of host time on the H200 host; the all-to-all's harness slices its tensors
    in the call itself, so it is left out here).  The reduce-scatter's hit enters the same
    functions as the all-reduce's (issue 50: its eager time at 4-64 KB); what it adds is its key's
    second tensor (five attribute reads, no operator)."""
    with host_path.world():
        warm, hit = host_path.calls(collective, False)
        warm()
        warm()
        ops = host_path.torch_ops(hit)
    assert not ops, f"{collective} plan hit runs torch operators: {dict(ops)}"


@pytest.mark.parametrize("collective", sorted(HIT_CEILING))
def test_a_plan_hit_asks_whether_a_capture_is_on_only_where_its_plan_depends_on_it(collective: str) -> None:
    """``capturing()`` costs about 0.6 us on an H100 host.  No key holds it (but the
    all-to-all's plan run, which pins its split tensors under capture): a plan records whether
    it depends on it (:attr:`~collectives.algorithms.plan.Plan.capture`: an eagerly alternating
    staging), and only such a plan's hit asks.  At this size ``auto`` runs the Lamport kernels,
    which stage nothing: on the stream of the last collective, no hit asks (the all-reduce's and
    the reduce-scatter's asked once before, twice before issue 50)."""
    _, seen = host_path.python_calls(collective)
    asks = sum(n for (_, name), n in seen.items() if name == "capturing_now")
    want = 1 if collective == "all_to_all" else 0
    assert asks == want, f"{collective} plan hit asked capturing() {asks} times"


@pytest.mark.parametrize(("collective", "algorithm"), [("all_reduce", "one_shot"), ("reduce_scatter", "one_shot"),
                                                       ("reduce_scatter", "push")])
def test_a_plan_made_for_one_capture_state_is_not_launched_in_the_other(monkeypatch, collective: str,
                                                                         algorithm: str) -> None:
    """A staged one-shot (or pushed reduce-scatter) plan alternates two buffers eagerly, one
    under capture: its hit asks ``capturing()`` and, in the other state, the call is planned
    anew, launching what a communicator that never saw the other state launches; back in the
    first state, the same."""
    import collectives as api

    def launches(states: list[bool]) -> list[tuple]:
        """Per call: its kernel and blocks, and the capture state and argument sets of the plan
        under its key (addresses differ from heap to heap)."""
        comm, capturing = FakeComm(FakeHeap(world_size=4)), [False]
        install(monkeypatch, comm, capturing)
        block, whole, seen = FakeTensor(1 << 40, 4096), FakeTensor(2 << 40, 4 * 4096), []
        for state in states:
            capturing[0] = state
            if collective == "all_reduce":
                api.all_reduce(block, algorithm=algorithm)
            else:
                api.reduce_scatter(block, whole, algorithm=algorithm)
            (plan,) = [p for k, p in comm.plans._plans.items() if k[0] == collective]
            seen.append((comm.grids[-1], plan.capture, len(plan.args)))
        return seen

    mixed = launches([False, False, True, True, False])
    assert mixed[2:4] == launches([True, True]) and mixed[4] == mixed[0] == launches([False])[0]
    assert mixed[0][1:] == (False, 2) and mixed[2][1:] == (True, 1)  # (alternating eagerly only)


def test_a_call_on_moved_tensors_in_the_other_capture_state_is_planned(monkeypatch) -> None:
    """An eager plan that alternates its staging is no template for tensors placed elsewhere
    under capture: the call is planned for the capture (one buffer, the end barrier kept)."""
    import collectives as api

    comm, capturing = FakeComm(FakeHeap(world_size=4)), [False]
    install(monkeypatch, comm, capturing)
    api.all_reduce(FakeTensor(1 << 40, 4096), algorithm="one_shot")
    assert not comm.grids[-1][0].end_barrier
    capturing[0] = True
    api.all_reduce(FakeTensor(2 << 40, 4096), algorithm="one_shot")
    assert comm.grids[-1][0].end_barrier


@pytest.mark.parametrize(("collective", "algorithm"), CASES_BY_ALGORITHM := [
    (c, a) for c in ("all_reduce", "reduce_scatter", "all_gather")
    for a in ("one_shot", "two_shot", "tma", "push", "lamport") if not (c == "all_gather" and a in ("two_shot", "push"))
    and not (c == "reduce_scatter" and a == "two_shot")])
@pytest.mark.parametrize("symmetric", [False, True])
def test_a_plan_records_the_capture_state_wherever_its_launch_depends_on_it(monkeypatch, collective: str,
                                                                             algorithm: str, symmetric: bool) -> None:
    """The guard of :attr:`~collectives.algorithms.plan.Plan.capture`: every algorithm's call
    planned eagerly and under capture; where the two launch differently (another kernel or
    block count, or alternating argument sets), the plans record the state they were made for
    (else an eager plan would be launched under capture: no key holds the state)."""
    import collectives as api

    def plan(state: bool):
        heap = FakeHeap(world_size=4)
        comm = FakeComm(heap)
        install(monkeypatch, comm, [state])
        # (past tuning.STAGE_MAX_BYTES, a symmetric reduce-scatter input is read in place)
        n = (8 << 20) // 2 // 4 if symmetric and collective == "reduce_scatter" and algorithm != "lamport" else 4096
        whole = heap.empty(4 * n * 2) if symmetric else FakeTensor(2 << 40, 4 * n)
        whole = FakeTensor(whole.data_ptr(), 4 * n)
        block = FakeTensor(1 << 40, n)
        if collective == "all_reduce":
            api.all_reduce(whole, algorithm=algorithm)
        elif collective == "reduce_scatter":
            api.reduce_scatter(block, whole, algorithm=algorithm)
        else:
            api.all_gather(whole, block, algorithm=algorithm)
        (made,) = {id(p): p for k, p in comm.plans._plans.items() if k[0] in (collective, "moved")}.values()
        return (comm.grids[-1], len(made.args)), made  # (kernel, blocks, argument sets; addresses: each heap's)

    (eager, eager_plan), (captured, captured_plan) = plan(False), plan(True)
    if eager != captured:
        assert (eager_plan.capture, captured_plan.capture) == (False, True)


def test_a_barrier_on_another_stream_asks_whether_a_capture_is_on() -> None:
    """Where the stream changed, the plan's run asks (the stream's order after the last
    collective depends on it: :func:`~collectives.algorithms.plan.follow`)."""
    from collectives.algorithms import plan

    with host_path.world() as comm:
        warm, hit = host_path.calls("barrier", False)
        warm()
        ordered = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plan, "current_stream", lambda device: 7)
            mp.setattr(plan, "order", lambda device, before, after: ordered.append((before, after)))
            seen = host_path.profile(hit)
        assert sum(n for (_, name), n in seen.items() if name == "capturing_now") == 1
        assert comm.stream == 7 and ordered == [(0, 7)]


@pytest.mark.parametrize("collective", sorted(MOVED_CEILING))
def test_a_call_on_moved_tensors_prepares_and_caches_nothing(collective: str) -> None:
    with host_path.world() as comm:
        warm, measured = host_path.calls(collective, True)
        warm()
        plans = dict(comm.plans._plans)
        seen = host_path.profile(measured)
        assert comm.plans._plans == plans, "a plan made or cached for the moved tensors"
    mine = ours(seen)
    assert "_replan" in mine and not PLANNING & set(mine), f"planned again: {sorted(PLANNING & set(mine))}"
    assert sum(mine.values()) <= MOVED_CEILING[collective], f"{collective} on moved tensors: {sorted(mine.items())}"


def test_an_all_to_all_on_new_tensors_is_planned_not_moved() -> None:
    """The all-to-all's arguments are not the collective layout whose ``out`` and ``src``
    :meth:`~collectives.algorithms.plan.Plan.moved` swaps, and its key holds split values, not
    only tensor descriptions (a call's facts would cut them): a call on new tensors plans anew
    through its exchange part."""
    _, seen = host_path.python_calls("all_to_all", moved=True)
    mine = ours(seen)
    assert "plan" in mine and not {"movable_from", "is_symmetric"} & set(mine), sorted(mine.items())


@pytest.mark.parametrize("collective", ["all_reduce", "all_reduce_out", "reduce_scatter", "all_gather"])
def test_a_collectives_flat_key_holds_every_field_of_tensor_key(monkeypatch, collective: str) -> None:
    """The keys are built inline (a call per tensor saved on every call): the collective, the
    output's and the input's addresses (None for an in-place all-reduce's output), then the
    input's and (where given) the output's other fields of
    :func:`~collectives.runtime.staging.tensor_key`, the one definition of what a key reads of
    a tensor: a check whose answer may change with any of them misses."""
    import collectives as api
    from collectives.runtime.staging import tensor_key

    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    block, whole = FakeTensor(1 << 40, 64), FakeTensor(2 << 40, 128)
    out, inp = {"all_reduce": (None, block), "all_reduce_out": (FakeTensor(3 << 40, 64), block),
                "reduce_scatter": (block, whole), "all_gather": (whole, block)}[collective]
    if collective.startswith("all_reduce"):
        api.all_reduce(inp, out=out)
    else:
        getattr(api, collective)(out, inp)
    (key,) = [k for k in comm.plans._plans if k[0] != "moved" and k[0] != "barrier"]
    assert key[0] == collective.removesuffix("_out")
    assert key[1:3] == (None if out is None else tensor_key(out)[0], tensor_key(inp)[0])
    assert key[3:7] == tensor_key(inp)[1:]
    if out is not None:
        assert key[7:11] == tensor_key(out)[1:]


def test_an_all_to_alls_flat_key_holds_every_field_of_tensor_key() -> None:
    """The all-to-all's key (:func:`~collectives.runtime.all_to_all.plan_key`) holds each
    tensor's fields of :func:`~collectives.runtime.staging.tensor_key` inline too: the output's,
    then the input's, then the splits."""
    from collectives.runtime import all_to_all as a2a
    from collectives.runtime.staging import tensor_key

    out, inp = FakeTensor(1 << 40, 64), FakeTensor(2 << 40, 64)
    comm = FakeComm(FakeHeap(world_size=2))
    key = a2a.plan_key(comm, out, inp, [32, 32], None)
    assert key[:11] == ("all_to_all", *tensor_key(out), *tensor_key(inp))


def test_a_plan_hit_keeps_its_plan_past_the_caches_capacity() -> None:
    """A hit does no bookkeeping in the plan cache (its dictionary's own ``get``), yet its run
    marks the plan used: past the capacity, plans not launched since go first, whichever were
    cached last (the all-reduce's plan is cached twice, under its call's key and its facts')."""
    from types import SimpleNamespace

    with host_path.world() as comm:
        warm, hit = host_path.calls("all_reduce", False)
        warm()
        ours_ = [k for k in comm.plans._plans if k[0] in ("all_reduce", "moved")]
        comm.plans.capacity = len(comm.plans) + 1
        for i in range(3 * comm.plans.capacity):  # (each a plan never launched)
            hit()
            comm.plans[("other", i)] = SimpleNamespace(used=False, alive=())
        assert set(ours_) <= set(comm.plans._plans) and len(comm.plans) == comm.plans.capacity


CASES = [("all_reduce", a) for a in ("one_shot", "two_shot", "tma", "push", "lamport", "auto")] + \
        [("all_reduce_out", a) for a in ("one_shot", "two_shot", "auto")] + \
        [("reduce_scatter", a) for a in ("one_shot", "tma", "push", "lamport", "auto")] + \
        [("all_gather", a) for a in ("one_shot", "tma", "push", "lamport", "auto")]


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
@pytest.mark.parametrize("capturing", [False, True])
def test_a_moved_plan_launches_what_planning_afresh_launches(monkeypatch, collective: str, algorithm: str,
                                                              capturing: bool) -> None:
    import collectives as api

    world, n = 4, 4096
    comm = FakeComm(FakeHeap(world_size=world))
    install(monkeypatch, comm, [capturing])

    def call(base: int, offset: int = 0) -> tuple:
        """The call on tensors at ``base`` (the block ``offset`` bytes past it) and 1 GB, 2 GB
        past it; its launch and grid."""
        block = FakeTensor(base + offset, n)  # (offset: the block's alignment differs from the others')
        whole, out = FakeTensor(base + (1 << 30), n * world), FakeTensor(base + (2 << 30), n)
        if collective == "all_reduce":
            api.all_reduce(block, algorithm=algorithm)
        elif collective == "all_reduce_out":
            api.all_reduce(block, algorithm=algorithm, out=out)
        elif collective == "reduce_scatter":
            api.reduce_scatter(block, whole, algorithm=algorithm)
        else:
            api.all_gather(whole, block, algorithm=algorithm)
        return comm.launches[-1], comm.grids[-1]

    call(1 << 40)
    # New tensors at each call (alternating plans' turn advancing), the block 16-byte aligned
    # or not (2 bytes off: another vector width) where the algorithm takes both.
    offsets = (48, 2, 96) if algorithm in ("one_shot", "auto") else (48, 64, 96)
    for k, offset in enumerate(offsets, 1):
        base, turns, moved = k << 40, [], []
        for _ in range(2):  # through the facts' plan, then (its tensors again) a plan of its own
            turns.append(comm.turn)
            moved.append(call(base, offset))
        comm.plans.clear()  # the same calls planned afresh (then a plan hit), from the same turns
        for turn, launch in zip(turns, moved, strict=True):
            comm.turn = turn
            assert call(base, offset) == launch


@pytest.mark.parametrize("collective", sorted(MOVED_CEILING))
def test_a_call_on_moved_tensors_again_gets_a_plan_of_its_own(collective: str) -> None:
    """The allocator hands a loop's tensors the same addresses again (its steps allocate
    alike): the second call on them caches a plan of theirs (the facts' plan with their
    addresses, :meth:`~collectives.algorithms.plan.Plan.moved`), and the third is a plan hit."""
    with host_path.world() as comm:
        warm, measured = host_path.calls(collective, True)
        warm()
        plans = len(comm.plans)
        measured()
        assert len(comm.plans) == plans
        seen = ours(host_path.profile(measured))
        assert len(comm.plans) == plans + 1 and "moved" in seen and not PLANNING & set(seen), sorted(seen.items())
        seen = ours(host_path.profile(measured))
        assert "_replan" not in seen and sum(seen.values()) <= HIT_CEILING[collective], sorted(seen.items())


def test_the_addresses_of_calls_on_moved_tensors_are_remembered_up_to_the_caches_capacity() -> None:
    with host_path.world() as comm:
        comm.plans.capacity = 8
        for _ in range(3 * comm.plans.capacity):
            warm, measured = host_path.calls("all_reduce", True)
            warm()
            measured()
            assert all(len(p.met) <= comm.plans.capacity for p in comm.plans._plans.values())


def test_a_moved_plan_uses_its_tensors_and_holds_the_staging_of_the_plan_it_came_from(monkeypatch) -> None:
    """A plan of moved tensors is cached: a free of memory it uses, or the staging buffer's
    retirement, drops it as it drops the plan it came from."""
    import collectives as api

    comm = FakeComm(FakeHeap(world_size=2))
    install(monkeypatch, comm, [False])
    n = 4096
    first, moved = (FakeTensor(1 << 40, n), FakeTensor(4 << 40, n)), (FakeTensor(2 << 40, n), FakeTensor(3 << 40, n))
    api.all_reduce(first[1], algorithm="one_shot", out=first[0])
    for _ in range(2):
        api.all_reduce(moved[1], algorithm="one_shot", out=moved[0])
    origin, plan = {k[0]: p for k, p in comm.plans._plans.items() if k[0] == "moved" or k[1] == 2 << 40}.values()
    assert plan is not origin and plan.holds == origin.holds and plan.alive == origin.alive
    assert sorted(plan.uses) == sorted([u for u in origin.uses if u not in (1 << 40, 4 << 40)] + [2 << 40, 3 << 40])
    comm.plans.drop_using(3 << 40, 2 * n)
    assert plan not in comm.plans._plans.values() and origin in comm.plans._plans.values()
    for _ in range(2):
        api.all_reduce(moved[1], algorithm="one_shot", out=moved[0])
    comm.plans.drop_holding(origin.holds[0])
    assert not comm.plans._plans


def test_a_call_on_moved_tensors_under_capture_pins_the_staging_its_launch_uses(monkeypatch) -> None:
    """An all-gather's key does not hold whether a capture is on: a plan made eagerly is run
    under capture for tensors the allocator placed elsewhere, and the graph replays its staging
    buffer for good, so the moved launch pins it (:meth:`~collectives.runtime.staging.StagingPool.capture`)
    as the plan's own launch would."""
    import collectives as api

    comm, capturing = FakeComm(FakeHeap(world_size=2)), [False]
    install(monkeypatch, comm, capturing)
    n = 4096
    api.all_gather(FakeTensor(1 << 40, 2 * n), FakeTensor(2 << 40, n), algorithm="one_shot")
    (plan,) = {id(p): p for k, p in comm.plans._plans.items() if k[0] in ("all_gather", "moved")}.values()
    assert plan.holds and not comm.pool._captured
    plans, capturing[0] = dict(comm.plans._plans), True
    api.all_gather(FakeTensor(3 << 40, 2 * n), FakeTensor(4 << 40, n), algorithm="one_shot")
    assert comm.plans._plans == plans  # (moved: nothing planned)
    assert comm.pool._captured == set(plan.holds)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_a_symmetric_tensors_plan_is_never_moved(monkeypatch, collective: str) -> None:
    """A zero-copy plan's data buffer is the caller's symmetric tensor (its peer table): a call
    on another symmetric tensor of the same facts plans on that tensor's own table (the
    all-reduce's in place, the reduce-scatter's input, the all-gather's output; the other
    tensor plain)."""
    import collectives as api

    heap = FakeHeap(world_size=4)
    comm = FakeComm(heap)
    install(monkeypatch, comm, [False])
    n = (8 << 20) // 2 // 4  # a reduce-scatter input past tuning.STAGE_MAX_BYTES: read in place
    for k in range(1, 3):
        block = heap.empty(n * 4 * 2)
        whole, part = FakeTensor(block.data_ptr(), n * 4), FakeTensor(k << 40, n)
        if collective == "all_reduce":
            api.all_reduce(whole, algorithm="two_shot")
        elif collective == "reduce_scatter":
            api.reduce_scatter(part, whole, algorithm="tma")
        else:
            api.all_gather(whole, part, algorithm="one_shot")
        assert comm.launches[-1][1][0] == block.data_ptr()  # the data buffer's table: this tensor's


#: Python calls into collectives/ of an MoE dispatch and combine like the call before (issue 50:
#: fused kernels, 1 token, top-8 of 256, 4 ranks; measured: raise only with a reason): their
#: checks, the layer's state (one lookup), each all-to-all's plan hit and each of the four
#: kernels' argument pack and launch.  Before the layer's state they were 133 and 74: each
#: kernel prepared again and every all-to-all planned again (its tensors and splits made anew
#: at each call).  57 and 34 before the flat keys and the inline plan hit (61 and 36 with
#: ``communicator()``'s lookup, counted since); 51 and 31 before the layer's plans of a shape
#: (:class:`collectives.moe.DispatchPlan`, :class:`~collectives.moe.CombinePlan`: the steps,
#: buffers and views derived once) and the all-to-all called without a wrapper; 36 and 26 before
#: each plan kept its all-to-alls' plans and launched them directly (:class:`collectives.api.BoundAllToAll`)
#: (then 24 and 18; the kernels' small outputs in one allocation: its fields' addresses and the
#: dispatch's eager body shared with the torch operator's, 4 more and 1; then the kernels'
#: arguments by a C getter (``Layout.take``, since replaced by
#: :meth:`collectives.layouts.Layout.template`): 3 and 2 fewer; the function-level
#: imports gone, and every function counted, collectives.moe's and runtime.moe's of one name apart;
#: then 26 -> 22 for the dispatch: one all-to-all, the counts travelling at the head of the rows';
#: then 22 -> 14 and 17 -> 12 (issue 50/51's host path): the checks on a plan miss only (their
#: facts in the key), the kernels' launches bound per plan (argument templates: no dictionary, no
#: alignment or grid call), the handle made from the plan's facts, the combine's kernels in its
#: plan (one lookup); the fp8 dispatch, 22 before, the same as the bf16 one).
MOE_CEILING = {"moe.dispatch": 14, "moe.dispatch fp8": 14, "moe.combine": 12}
#: Torch operators that launch GPU work in them (the dispatch: the rows' all-to-all's splits
#: copied from the counts' messages into one scratch buffer, until the rows per token and rank
#: a sum of the counts; the combine: none, its gather kernel copies the splits).  Before
#: (to 2026-11-27) the dispatch's were 10: the id mapping, the mask, the sort, the counts, the
#: splits and the dropped count in torch.  Since the one exchange (issue 51/50), the dispatch's none:
#: the routing kernel writes the rows' splits, the all-to-all the rows each source sent.
MOE_TORCH_CEILING = {"moe.dispatch": 0, "moe.dispatch fp8": 0, "moe.combine": 0}
#: Every torch operator in them, allocations and views included (each 1.5-6 us of host time on
#: the 4 x H200 host): the dispatch's expert_x, one allocation of its kernels' small outputs
#: (:class:`collectives.runtime.moe.Carve`: the handle's fields made views only where read) and the
#: counts' view; the combine's output.  Before: the counts' view, its sum (since the rows per token
#: and rank: the rows' splits' copy) and one view of expert_x; 12 and 3 before that
#: (the handle's tensors allocated one by one, the combine's two views), 34 (5 select, 6 slice,
#: 8 view, 4 detach) and 7 before the layer's plans of a shape; then 5 -> 4 for the dispatch (the
#: splits' copy gone with the counts' all-to-all); then 4 -> 3 (6 -> 3 with fp8): expert_x
#: allocated exactly [L, capacity, hidden] (the placement kernel never writes the trash row: no
#: view of it), the fp8 scales carved with the handle's fields (a view only where read), the
#: counts one view of the small allocation by arguments made once per plan.  (One allocation of
#: all, as bytes, would cost more: a view of another dtype is two operators, view and detach.)
MOE_TORCH_OPS_CEILING = {"moe.dispatch": 3, "moe.dispatch fp8": 3, "moe.combine": 1}
#: What only a first call does: kernels looked up and their launches made, buffers allocated,
#: all-to-alls planned.
MOE_FIRST = {("moe", n) for n in ("pack", "placement", "gather", "weighted_sum", "route", "pack_key",
                                   "place_key", "combine_key", "route_key")} | \
            {("communicator", n) for n in ("kernel_together", "agree_growth")} | \
            {("all_to_all", n) for n in ("prepare", "plan", "device_splits")} | {("api", "_replan")}


@pytest.mark.parametrize("call", sorted(MOE_CEILING))
def test_an_moe_call_like_the_one_before_prepares_nothing_again(call: str) -> None:
    with host_path.moe_world() as comm:
        fn = host_path.moe_calls()[call]
        plans = len(comm.plans._plans)
        seen = host_path.profile(fn)
        launches = host_path.torch_launches(fn)
        ops = host_path.torch_ops(fn)
        assert len(comm.plans._plans) == plans, "an all-to-all planned again"
    mine = {(path.rsplit("/", 1)[-1].removesuffix(".py"), name): n for (path, name), n in seen.items()
            if "/collectives/" in path}
    assert not MOE_FIRST & set(mine), f"{call} prepared again: {sorted(MOE_FIRST & set(mine))}"
    calls = sum(n for (path, _), n in seen.items() if "/collectives/" in path)  # (mine merges moe's and runtime.moe's)
    assert calls <= MOE_CEILING[call], f"{call}: {calls}, {sorted(mine.items())}"
    assert launches <= MOE_TORCH_CEILING[call], launches
    assert sum(ops.values()) <= MOE_TORCH_OPS_CEILING[call], f"{call}: {dict(ops)}"


def test_an_moe_layer_makes_a_plan_once_per_key_and_keeps_a_bounded_number() -> None:
    from types import SimpleNamespace

    from collectives.runtime import moe as runtime_moe

    layer = runtime_moe.Layer(SimpleNamespace(device_index=0), None, None)
    made = []
    first = layer.plan(("shape", 0), lambda: made.append(0) or object())
    assert layer.plan(("shape", 0), lambda: made.append(1) or object()) is first and made == [0]
    for i in range(1, 2 * runtime_moe.MAX_PLANS):
        layer.plan(("shape", i), object)
    assert len(layer._plans) <= runtime_moe.MAX_PLANS


def test_a_bound_all_to_all_launches_its_plan_until_an_allocation_then_goes_through_the_api() -> None:
    from collectives import api

    with host_path.world() as comm:
        out, inp = torch.ones(8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
        splits = torch.full((host_path.WORLD,), 8 // host_path.WORLD, dtype=torch.int64)
        bound = api.BoundAllToAll(out, inp, splits, splits)
        assert bound() is out and bound.plan is not None
        plan, plans = bound.plan, len(comm.plans._plans)

        def names(seen) -> set[str]:
            return {name for (_, name), n in seen.items()}

        direct = names(host_path.profile(lambda: bound()))  # the kept plan: no key made, the error record polled
        assert "plan_key" not in direct and {"poll", "run"} <= direct, direct
        comm.ctx.generation += 1  # a symmetric allocation or free since: the api's path, a plan under the new key
        assert "plan_key" in names(host_path.profile(lambda: bound()))
        assert bound.plan is not plan and len(comm.plans._plans) == plans + 1
        assert "plan_key" not in names(host_path.profile(lambda: bound()))
