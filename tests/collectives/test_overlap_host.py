"""The GEMM-overlap functions' host logic: the peers' order, the blocks each rank multiplies,
sends and receives (W ranks as threads on the CPU), the meetings of ranks sharing a GPU, and
how a flag wait that timed out is reported (no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from collectives.config import FLAG_SLOTS  # noqa: E402
from collectives.layouts import (  # noqa: E402
    CLAIMED,
    FATAL_RECORD,
    FLAG_WAIT,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
)
from collectives.runtime.error_record import ErrorRecord  # noqa: E402
from collectives.errors import CollectiveError, CollectiveTimeout  # noqa: E402
from collectives.runtime.stream_flags import StreamFlags  # noqa: E402
from collectives import overlap  # noqa: E402
from collectives.overlap import EAGER_PATHS  # noqa: E402
from collectives.runtime.communicator import Communicator  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_each_step_pairs_every_rank_with_a_different_peer(world: int) -> None:
    """peer_order: every rank visits every peer once, never itself, and at each step the ranks'
    peers are a permutation (no rank is sent to, or read from, by two ranks at once)."""
    orders = [overlap.peer_order(world, rank) for rank in range(world)]
    for rank, order in enumerate(orders):
        assert sorted(order) == [q for q in range(world) if q != rank]
    for step in range(world - 1):
        assert sorted(order[step] for order in orders) == list(range(world))


def _bare_communicator(record: list[int], index: int = FATAL_RECORD) -> Communicator:
    """A communicator with only its error record and stream flags (no context, no GPU),
    ``record`` in record ``index`` (the other empty)."""
    comm = Communicator.__new__(Communicator)
    comm.errors = ErrorRecord(2.0, lambda: None, pin_memory=False)  # the flags' GPU rematch aside
    comm.error[index] = torch.tensor(record, dtype=torch.int32)
    comm.stream_flags = StreamFlags.__new__(StreamFlags)
    return comm


def test_flag_wait_timeout_raises_once_and_leaves_the_communicator_usable() -> None:
    comm = _bare_communicator([TIMEOUT, FLAG_WAIT, -1, 5, 1], RECOVERABLE_RECORD)
    with pytest.raises(CollectiveTimeout, match=r"flag wait timed out after 2s.*rank 1, slot 5"):
        comm.errors.check()
    assert comm.errors.failed is None
    comm.errors.check()  # cleared


def test_collective_timeout_still_fails_the_communicator() -> None:
    comm = _bare_communicator([TIMEOUT, 0, 1, 0, 0])
    for _ in range(2):
        with pytest.raises(CollectiveTimeout, match="collective"):
            comm.errors.check()
    assert comm.errors.failed is not None


def test_clearing_a_size_mismatch_keeps_a_collective_timeout() -> None:
    """A size mismatch (recoverable) and a timeout (fatal) recorded by one call: the host
    raises the timeout, and clearing the mismatch's record cannot erase it."""
    comm = _bare_communicator([SIZE_MISMATCH, 0, 1, 0, 0], RECOVERABLE_RECORD)
    comm.error[FATAL_RECORD] = torch.tensor([TIMEOUT, 1, 1, 1, 0], dtype=torch.int32)
    with pytest.raises(CollectiveTimeout, match="collective"):
        comm.errors.check()
    assert comm.errors.failed is not None


def test_a_mismatch_is_raised_once_and_a_record_being_written_waits() -> None:
    comm = _bare_communicator([CLAIMED, 0, 0, 0, 0], RECOVERABLE_RECORD)
    comm.errors.check()  # a kernel is still writing the fields: nothing yet
    comm.error[RECOVERABLE_RECORD] = torch.tensor([SIZE_MISMATCH, 0, 1, 0, 0], dtype=torch.int32)
    with pytest.raises(CollectiveError, match="different sizes"):
        comm.errors.check()
    comm.errors.check()  # cleared: the communicator stays usable
    assert comm.errors.failed is None


@pytest.mark.parametrize("index", [-1, FLAG_SLOTS])
def test_flag_slot_out_of_range_is_refused(index: int) -> None:
    with pytest.raises(CollectiveError, match="flag slot"):
        _bare_communicator([0] * 5).stream_flags.post(index)


def _grid_communicator(sms: int) -> Communicator:
    """A communicator with only what :meth:`Communicator.blocks` reads (no context, no GPU)."""
    from collectives.layouts import PadLayout

    comm = Communicator.__new__(Communicator)
    comm.sms, comm.layout = sms, PadLayout()
    return comm


@pytest.mark.parametrize("algorithm", ["one_shot", "tma"])
def test_max_blocks_caps_the_grid_and_never_raises_it(algorithm: str) -> None:
    from collectives.algorithms import KernelKey, grid
    from collectives.config import LAMPORT_BLOCKS

    comm = _grid_communicator(132)
    key = KernelKey("reduce_scatter", algorithm, "peer", "bf16", 2)
    big, small = 1 << 24, 3
    own = grid(comm, key, big)
    assert own == (33 if algorithm == "tma" else 264)
    assert grid(comm, key, big, 8) == 8
    assert grid(comm, key, big, 10_000) == own
    assert grid(comm, key, small, 8) == grid(comm, key, small) == 1
    lamport = KernelKey("all_reduce", "lamport", "peer", "bf16", 2)
    assert grid(comm, lamport, big, 8) == LAMPORT_BLOCKS  # a fixed grid: the cap does not apply


def test_the_side_stream_takes_the_priority_of_its_communicators_world(monkeypatch) -> None:
    """A communicator's stream flags make its side stream at the priority
    :func:`collectives.algorithms.tuning.overlap_side_priority` gives its world size."""
    from collectives.algorithms import tuning
    from collectives.runtime.stream_flags import SIDE_PRIORITY

    made: list[int] = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority: made.append(priority) or object())
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: None)
    for world in (2, 4):
        priority = tuning.overlap_side_priority(world, SIDE_PRIORITY)
        StreamFlags(0, lambda kind: None, None, 0, lambda device: 0, priority).side()
    assert made == [0, SIDE_PRIORITY]
    StreamFlags(0, lambda kind: None, None, 0, lambda device: 0).side()
    assert made[-1] == SIDE_PRIORITY  # (the default)


def test_each_communicator_has_its_own_side_stream(monkeypatch) -> None:
    """The overlap's side stream belongs to a communicator's stream flags (made once, on first
    use), not to the process: two communicators on one device order their calls apart."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority: object())
    first, second = (StreamFlags.__new__(StreamFlags) for _ in range(2))
    for flags in (first, second):
        flags.device, flags._side, flags.priority = 0, None, -1
    assert first.side() is first.side()
    assert first.side() is not second.side()


class _Meeting:
    """A context's bounded agreement, recorded (``error``: raised instead)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls, self.error = [], error

    def agree_bounded(self, what: str, values: list[int], timeout_s: float) -> None:
        self.calls.append((what, values, timeout_s))
        if self.error is not None:
            raise self.error


def _sharing(ranks_sharing: bool, meeting: _Meeting) -> Communicator:
    comm = _bare_communicator([0, 0, 0, 0, 0])
    comm.residency, comm.ctx = (object() if ranks_sharing else None), meeting
    return comm


def test_ranks_sharing_a_gpu_meet_on_the_host_with_their_values_and_alone_nothing_waits() -> None:
    meeting = _Meeting()
    _sharing(False, meeting).meet_ranks_on_device("gemm", [8, 64, 128])
    assert meeting.calls == []
    _sharing(True, meeting).meet_ranks_on_device("gemm", [8, 64, 128])
    assert meeting.calls == [("gemm", [8, 64, 128], 2.0)]


def test_a_rank_that_does_not_meet_fails_the_communicator() -> None:
    comm = _sharing(True, _Meeting(CollectiveError("gemm: ranks [2] did not arrive within 2s")))
    with pytest.raises(CollectiveError, match="did not meet.*ranks \\[2\\] did not arrive"):
        comm.meet_ranks_on_device("gemm", [8, 64, 128])
    with pytest.raises(CollectiveError, match="did not meet"):  # unusable from then on
        comm.errors.poll()


class _Loads:
    """A communicator's kernel cache that records its loads in ``events`` (keys stand for kernels)."""

    def __init__(self, events: list) -> None:
        self.events, self.held = events, set()

    def has(self, key: str, target: str) -> bool:
        return key in self.held

    def get(self, key: str, target: str, device: int) -> str:
        if key not in self.held:
            self.held.add(key)
            self.events.append(f"load {key}")
        return key


@pytest.mark.parametrize("sharing", [False, True])
def test_ranks_sharing_a_gpu_meet_before_a_kernel_new_to_them_is_loaded(monkeypatch, sharing: bool) -> None:
    """A load waits for every kernel on the GPU and holds other ranks' launches: where ranks share
    it, they meet first, once per new key set (the all-to-all's two variants together)."""
    from collectives.runtime import communicator as module

    monkeypatch.setattr(module, "compile_target", lambda device: "sm_90a")
    events: list = []
    meeting = _Meeting()
    meeting.device = 0
    meeting.agree_bounded = lambda what, values, timeout_s: events.append(f"meet {values}")
    comm = _sharing(sharing, meeting)
    comm.kernels = _Loads(events)
    assert comm.kernel_together("a2a direct", "a2a staged") == "a2a direct"
    assert comm.kernel_together("a2a staged", "a2a direct") == "a2a staged"  # both loaded: no meeting
    assert comm.kernel_together("combine") == "combine"
    assert comm.kernel_together("combine") == "combine"
    if sharing:
        assert events == ["meet [1]", "load a2a staged", "load a2a direct", "meet [0]", "load combine"]
    else:
        assert events == ["load a2a direct", "load a2a staged", "load combine"]


_GROWTH = __import__("threading").Lock()


class _Streams(__import__("threading").local):
    """The CUDA streams of a GEMM-overlap call on the CPU, by name (``main``: the current one at
    the call, ``side``): waits do nothing (each rank's host order is its order on the GPU);
    ``current`` is this thread's current stream."""

    def __init__(self) -> None:
        import types

        self.main, self.side = (types.SimpleNamespace(name=name, wait_stream=lambda other: None,
                                                      wait_event=lambda event: None) for name in ("main", "side"))
        self.current = self.main

    def use(self, stream):
        import contextlib

        @contextlib.contextmanager
        def switched():
            before, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = before
        return switched()


_STREAMS = _Streams()


class _Rank:
    """One rank of a GEMM-overlap call on the CPU: ``workspaces[rank]`` holds its symmetric
    workspaces (one buffer per staging slot) and ``peer_tensors`` maps a view of its own into
    every rank's, as the symmetric context does."""

    def __init__(self, world: int, rank: int, workspaces: list[dict], meet=lambda what, values: None) -> None:
        import types

        self.world, self.rank, self.workspaces, self.meet_ranks_on_device = world, rank, workspaces, meet
        self.stream_flags = StreamFlags.__new__(StreamFlags)  # (its events as on a GPU, the side stream a stand-in)
        self.stream_flags._events, self.stream_flags.side = [], lambda: _STREAMS.side
        self.ctx = types.SimpleNamespace(peer_tensors=self.peer_tensors)
        self.lock, self.device_index = _GROWTH, 0

    def barrier_plan(self) -> None:
        """(The barrier's plan: made on a GPU, nothing here.)"""

    def staging(self, nbytes: int, slot) -> torch.Tensor:
        """Slot ``slot``, grown on every rank at once (the ranks ask for the same size)."""
        with self.lock:
            if slot not in self.workspaces[self.rank] or self.workspaces[self.rank][slot].numel() < nbytes:
                for w in self.workspaces:
                    w[slot] = torch.zeros(nbytes, dtype=torch.uint8)
        return self.workspaces[self.rank][slot]

    def peer_tensors(self, t: torch.Tensor) -> list[torch.Tensor]:
        slot, buffer = next((s, w) for s, w in self.workspaces[self.rank].items()
                            if 0 <= t.data_ptr() - w.data_ptr() < w.numel())
        at = t.data_ptr() - buffer.data_ptr()
        return [w[slot][at:].view(t.dtype).as_strided(t.shape, t.stride()) for w in self.workspaces]


@pytest.fixture
def on_cpu(monkeypatch):
    """The CUDA streams (:data:`_STREAMS`), events and tensor checks of collectives.overlap made
    no-ops, the calls eager (not captured); torch's slow stream API refused (the eager path
    must not use it: 8 us a call on the 4 x H200 host)."""
    import types

    def slow(*args, **kwargs):
        raise AssertionError("torch.cuda.current_stream / torch.cuda.stream on the GEMM overlap's path")

    monkeypatch.setattr(overlap, "_check", lambda name, comm, a, b: (a.shape[0], a.shape[1], b.shape[1]))
    monkeypatch.setattr(overlap, "capturing", lambda: False)
    monkeypatch.setattr(overlap, "_current", lambda device: _STREAMS.current)
    monkeypatch.setattr(overlap, "_switch", lambda stream: setattr(_STREAMS, "current", stream))
    monkeypatch.setattr(torch.cuda, "current_stream", slow)
    monkeypatch.setattr(torch.cuda, "stream", slow)
    monkeypatch.setattr(torch.cuda, "Event", lambda: types.SimpleNamespace(record=lambda stream: None,
                                                                           wait=lambda stream: None))




def small_ints(salt: int, rows: int, cols: int) -> torch.Tensor:
    """Integers in [-2, 2], f16: every product and sum below is exact."""
    i = torch.arange(rows * cols)
    return ((i * 7919 + salt * 97) % 5 - 2).to(torch.float16).view(rows, cols)


def _thread_collectives(monkeypatch, together, world: int) -> None:
    """collectives.api's barrier, reduce_scatter and all_gather for W ranks as threads (each a
    thread barrier around what the ranks leave in a shared table)."""
    import collectives.api

    table: dict = {}

    def exchange(group, t: torch.Tensor) -> list[torch.Tensor]:
        table[group.rank] = t.clone()
        together.wait()
        every = [table[r] for r in range(world)]
        together.wait()
        return every

    def reduce_scatter(out, inp, group):
        every = exchange(group, inp)
        out.copy_(sum(t.reshape(world, -1)[group.rank].float() for t in every).view(out.shape))
        return out

    def all_gather(out, inp, group):
        out.copy_(torch.cat([t.reshape(-1) for t in exchange(group, inp)]).view(out.shape))
        return out

    monkeypatch.setattr(collectives.api, "barrier", lambda group: together.wait())
    monkeypatch.setattr(collectives.api, "reduce_scatter", reduce_scatter)
    monkeypatch.setattr(collectives.api, "all_gather", all_gather)


@pytest.mark.parametrize("schedule", ["comm", "alternate"])
@pytest.mark.parametrize("path", [*EAGER_PATHS, "engine"])
@pytest.mark.parametrize("start", ["side", "first"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_rank_gets_its_rows_of_the_sum_and_the_gathered_product(on_cpu, monkeypatch, world: int,
                                                                      start: str, path: str, schedule: str) -> None:
    """W ranks as threads, each barrier a thread barrier: twice in a row (the workspaces
    reused), gemm_reduce_scatter gives each rank its rows of sum_r a_r @ b_r and all_gather_gemm
    concat_r(shard_r) @ b, exactly, run as blocks (their copies torch's or, ``"engine"``, the
    copy-engine copies of :data:`~collectives.config.OVERLAP_COPY`) or as one GEMM and one
    collective; what each rank pushes, pulls, sums and hands the collective is addressed right."""
    import threading

    from collectives import config

    if path == "one" and (start == "side" or schedule == "alternate"):
        pytest.skip("(the start and the schedule are the blocks')")
    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)
    monkeypatch.setattr(config, "OVERLAP_START", start)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS.get(path, 0.0))
    engine_copies: list = []
    if path == "engine":
        monkeypatch.setattr(config, "OVERLAP_COPY", "engine")
        monkeypatch.setattr(overlap, "_engine_copy",
                            lambda dst, src, stream: (engine_copies.append(stream.name), dst.copy_(src)))
    m, k, n = 3, 8, 5
    workspaces = [{} for _ in range(world)]
    ranks = [_Rank(world, r, workspaces) for r in range(world)]
    together = threading.Barrier(world, timeout=30)
    _thread_collectives(monkeypatch, together, world)
    results: dict = {}

    def run(rank: int, call: int) -> None:
        try:
            call_both(rank, call)
        except BaseException as e:
            results["error"] = e
            together.abort()

    def call_both(rank: int, call: int) -> None:
        a, b = small_ints(rank + call, world * m, k), small_ints(50 + rank, k, n)
        results["rs", rank, call] = overlap._gemm_reduce_scatter_on(ranks[rank], a, b, None, None)
        shard = small_ints(10 * rank + call, m, k)
        results["ag", rank, call] = overlap._all_gather_gemm_on(ranks[rank], shard, small_ints(60, k, n), None, None)

    for call in range(2):
        threads = [threading.Thread(target=run, args=(r, call)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if "error" in results:
            raise results["error"]
        total = sum(small_ints(r + call, world * m, k).float() @ small_ints(50 + r, k, n).float() for r in range(world))
        gathered = torch.cat([small_ints(10 * r + call, m, k) for r in range(world)]).float() @ small_ints(60, k, n).float()
        for rank in range(world):
            assert torch.equal(results["rs", rank, call].float(), total[rank * m:(rank + 1) * m]), (rank, call)
            assert torch.equal(results["ag", rank, call].float(), gathered), (rank, call)
    # (every peer copy by the copy engine, on the side stream ("alternate": the block's stream, the
    # side one first): W ranks, W - 1 pushes and pulls, 2 calls)
    lanes = ["side"] * (world - 1) if schedule == "comm" else [("side", "main")[s % 2] for s in range(world - 1)]
    assert sorted(engine_copies) == (sorted(lanes * world * 2 * 2) if path == "engine" else [])


def _recorded(monkeypatch, events: list[str], world: int, rank: int) -> _Rank:
    """A rank that records a GEMM-overlap call's host steps in ``events``: ``gemm`` (a kernel
    that may be loaded at its launch: cuBLAS, torch's sum, the barrier's plan made), ``launch``
    (a barrier, a reduce-scatter, an all-gather), ``copy`` (a copy engine's), ``meet``."""
    import collectives.api

    def step(kind: str):
        return lambda *args, **kwargs: events.append(f"{kind}@{_STREAMS.current.name}")

    for name in ("mm", "sum"):
        monkeypatch.setattr(torch, name, step("gemm"))
    for name in ("barrier", "reduce_scatter", "all_gather"):
        monkeypatch.setattr(collectives.api, name, step("launch"))
    monkeypatch.setattr(torch.Tensor, "copy_", step("copy"))
    comm = _Rank(world, rank, [{} for _ in range(world)], meet=lambda what, values: events.append("meet"))
    comm.barrier_plan = step("gemm")
    return comm


@pytest.mark.parametrize("path", list(EAGER_PATHS))
def test_no_rank_runs_a_gemm_while_another_may_still_launch_a_collective(on_cpu, monkeypatch, path: str) -> None:
    """cuBLAS may load kernels at a GEMM (a load waits for every kernel on the GPU and holds the
    other ranks' launches), so where ranks share a GPU a meeting separates every GEMM from the
    collectives launched before it, the previous call's included, and every launch from the GEMMs
    enqueued before it (world_gather 5 on an H200 timed out in the f16 all_gather_gemm after a
    gemm_reduce_scatter, whose last reduce-scatters some ranks had not launched yet); as blocks
    or as one GEMM and one collective."""
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS[path])
    events: list[str] = []
    world = 3
    comm = _recorded(monkeypatch, events, world, rank=1)
    a, b = torch.zeros(world * 8, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    calls = []
    for call in (lambda: overlap._gemm_reduce_scatter_on(comm, a, b, None, None),
                 lambda: overlap._all_gather_gemm_on(comm, a[:8], b, None, None),
                 lambda: overlap._gemm_reduce_scatter_on(comm, a, b, None, None)):
        start = len(events)
        call()
        calls.append(events[start:])
    # Eagerly a collective on another stream than the previous one's waits for the work queued
    # on that one: no launch on the side stream after a call's first GEMM changes stream (the
    # previous call's last launch counts), or the side stream would wait for the GEMMs.
    last = None
    for steps in calls:
        gemms = steps.index("gemm@main")
        for at, step in enumerate(steps):
            if step.startswith("launch@"):
                assert at < gemms or step == last or step == "launch@main", (at, steps)
                last = step
    if path == "blocks":  # each push enqueued right after its GEMM (a host-bound call's pushes start early)
        moves = [e for e in calls[0] if e in ("gemm@main", "copy@side")]
        assert moves == ["gemm@main", "copy@side"] * (world - 1) + ["gemm@main"] * 2, moves  # (+ the sum)
    events[:] = [e.split("@")[0] for e in events]
    if path == "blocks":
        # The host's work per call (eagerly, what bounds it): W GEMMs, two barriers (the only
        # launches of this library's kernels), the copies, and the reduce-scatter's sum.
        assert events.count("launch") == 3 * 2 and events.count("gemm") == (world + 1) + world + (world + 1)
        assert events.count("copy") == (world - 1) + world + (world - 1)
    else:  # one GEMM, one collective (and the barrier's plan, made for a later capture)
        assert events.count("launch") == 3 and events.count("gemm") == 3 * 2 and events.count("copy") == 0
    since_meeting: set[str] | None = None  # the steps since the last meeting (None: none yet)
    for at, event in enumerate(events):
        assert event == "meet" or since_meeting is not None, f"step {at}: a {event} before any meeting"
        if event == "meet":
            since_meeting = set()
            continue
        if event == "copy":  # (neither spins nor loads a kernel)
            continue
        other = {"gemm": "launch", "launch": "gemm"}[event]
        assert other not in since_meeting, f"step {at}: a {event} after a {other} with no meeting between: {events}"
        since_meeting.add(event)


@pytest.mark.parametrize("path, start", [("blocks", "side"), ("blocks", "first"), ("one", "first")])
def test_an_eager_call_makes_no_cuda_object_and_launches_only_its_work(on_cpu, monkeypatch, path: str,
                                                                       start: str) -> None:
    """The eager host path of a GEMM-overlap call (issue 53: 572-611 us per call on 4 x H200 at
    4096, against 301-304 for torch.mm + NCCL, the host's time): after the first call, no CUDA
    event or stream is made (a ``wait_stream`` makes an event; the fork, join and per-block events
    are the communicator's, reused), torch's current stream is switched by the raw setter only,
    to the side stream and back around the barriers and each push (``on_cpu`` refuses
    torch.cuda.current_stream and torch.cuda.stream), and the host enqueues, as blocks (each push
    right after its GEMM), W GEMMs, W - 1 peer copies (+ the shard's), two barriers, a sum
    (reduce-scatter), one event record and one wait per cross-stream edge; as one GEMM, that
    GEMM and one collective, nothing else (the ``"comm"`` schedule's streams: ``"auto"`` would
    alternate this small all-gather GEMM's)."""
    import collections
    import types

    import collectives.api
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", "comm")
    monkeypatch.setattr(config, "OVERLAP_START", start)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS[path])
    made: collections.Counter = collections.Counter()
    world, rank = 4, 1
    comm = _recorded(monkeypatch, [], world, rank)

    def event():
        made["event"] += 1
        return types.SimpleNamespace(record=lambda stream: made.update(["record"]),
                                     wait=lambda stream: made.update(["wait"]))

    def switch(stream) -> None:
        made.update([f"switch {stream.name}"])
        _STREAMS.current = stream

    monkeypatch.setattr(torch.cuda, "Event", event)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: made.update(["stream"]))
    monkeypatch.setattr(overlap, "_switch", switch)
    for stream in (_STREAMS.main, _STREAMS.side):
        stream.wait_stream = lambda other: made.update(["wait_stream"])
        stream.wait_event = lambda e: made.update(["wait_event"])
    for name in ("mm", "sum"):
        monkeypatch.setattr(torch, name, lambda *args, name=name, **kwargs: made.update([name]))
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *args: made.update(["copy"]))
    for name in ("barrier", "reduce_scatter", "all_gather"):
        monkeypatch.setattr(collectives.api, name, lambda *args, name=name, **kwargs: made.update([name]))
    comm.barrier_plan = lambda: made.update(["barrier_plan"])
    a, b = torch.zeros(world * 8, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    calls = {"gemm_reduce_scatter": lambda: overlap._gemm_reduce_scatter_on(comm, a, b, None, None),
             "all_gather_gemm": lambda: overlap._all_gather_gemm_on(comm, a[:8], b, None, None)}
    for call in calls.values():
        call()  # (the first call makes the communicator's events)
    edges = (world - 1) + 2  # one per block, the fork and the join
    switches = {"switch side": world + 1, "switch main": world + 1}  # (the barriers' and each push's)
    expect = {("blocks", "gemm_reduce_scatter"): {"mm": world, "copy": world - 1, "barrier": 2, "sum": 1,
                                                  "record": edges, "wait": edges, **switches},
              ("blocks", "all_gather_gemm"): {"mm": world, "copy": world, "barrier": 2, "record": edges,
                                              "wait": edges, "switch side": 1, "switch main": 1},
              ("one", "gemm_reduce_scatter"): {"mm": 1, "reduce_scatter": 1, "barrier_plan": 1},
              ("one", "all_gather_gemm"): {"mm": 1, "all_gather": 1, "barrier_plan": 1}}
    for name, call in calls.items():
        made.clear()
        call()
        assert dict(made) == expect[path, name], (name, dict(made))
        assert _STREAMS.current is _STREAMS.main


@pytest.mark.parametrize("start", ["side", "first"])
def test_the_all_gather_start_goes_where_the_knob_says_before_any_gemm(on_cpu, monkeypatch, start: str) -> None:
    """``OVERLAP_START``: the start (barrier, shard copy, barrier) on the side stream or the
    current one, before the own GEMM either way; the pulls on the side stream (the ``"comm"``
    schedule's); another value is refused before anything is launched."""
    from collectives import config

    events: list[str] = []
    comm = _recorded(monkeypatch, events, 2, rank=0)
    a, b = torch.zeros(8, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", "comm")
    monkeypatch.setattr(config, "OVERLAP_START", start)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS["blocks"])
    overlap._all_gather_gemm_on(comm, a, b, None, None)
    stream = "side" if start == "side" else "main"
    assert [e for e in events if e != "meet"][:4] == [f"launch@{stream}", f"copy@{stream}", f"launch@{stream}",
                                                       "copy@side"], events
    monkeypatch.setattr(config, "OVERLAP_START", "sideways")
    events.clear()
    with pytest.raises(CollectiveError, match="OVERLAP_START"):
        overlap._all_gather_gemm_on(comm, a, b, None, None)
    assert events == []


@pytest.mark.parametrize("algorithm, knob, value, expect", [
    ("one_shot", "BLOCKS_PER_SM", 1, 132), ("tma", "TMA_SM_DIVISOR", 2, 66), ("tma", "TMA_SM_DIVISOR", 1, 132)])
def test_grid_knobs_set_the_grid_of_plans_made_after_them(monkeypatch, algorithm: str, knob: str, value: int,
                                                          expect: int) -> None:
    """The benchmark's grid variants (``collectives.tools.bench.VARIANTS``) set these knobs."""
    from collectives import config
    from collectives.algorithms import KernelKey, grid

    comm = _grid_communicator(132)
    key = KernelKey("reduce_scatter", algorithm, "peer", "bf16", 2)
    monkeypatch.setattr(config, knob, value)
    assert grid(comm, key, 1 << 24) == expect


def test_eager_calls_run_blocks_only_where_the_gemm_outlasts_the_host_and_captures_always() -> None:
    """The eager choice (:func:`collectives.overlap.eager_blocks`, the knobs' defaults): the bench's
    4 x H200 shapes where eager blocks lost to torch.mm + NCCL (M = N = K = 4096: 572 against
    304 us) run one GEMM, those where they won (4096 x 8192, 16384 rows) run blocks."""
    assert not overlap.eager_blocks(4, 4096, 4096, 4096)
    assert not overlap.eager_blocks(2, 4096, 4096, 4096)
    assert overlap.eager_blocks(4, 4096, 8192, 8192)
    assert overlap.eager_blocks(4, 16384, 4096, 4096)
    assert not overlap.eager_blocks(4, 64, 64, 128)


@pytest.mark.parametrize("why", ["captured", "timeline"])
def test_captured_or_timed_calls_run_blocks_whatever_their_size(on_cpu, monkeypatch, why: str) -> None:
    """A call being captured (a replay costs no host time) or given a timeline (of the blocks)
    runs the blocks even where an eager call would not."""
    from collectives import config

    events: list[str] = []
    world = 2
    comm = _recorded(monkeypatch, events, world, rank=0)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS["one"])
    if why == "captured":
        monkeypatch.setattr(overlap, "capturing", lambda: True)
    monkeypatch.setattr(overlap, "_marks", lambda timeline, kind, chunk, stream: None)
    timeline = [] if why == "timeline" else None
    a, b = torch.zeros(world * 8, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    overlap._gemm_reduce_scatter_on(comm, a, b, None, timeline)
    overlap._all_gather_gemm_on(comm, a[:8], b, None, timeline)
    events[:] = [e.split("@")[0] for e in events]
    assert events.count("gemm") == (world + 1) + world and events.count("launch") == 2 * 2


def test_copy_engine_copies_are_eager_only_and_another_copy_is_refused(on_cpu, monkeypatch) -> None:
    """``OVERLAP_COPY = "engine"``: a captured call copies with torch's copy_ (the driver has no
    graph node for a batched copy); a value that is not a choice is refused before anything is
    grown or launched."""
    from collectives import config

    events: list[str] = []
    comm = _recorded(monkeypatch, events, 2, rank=0)
    monkeypatch.setattr(overlap, "_engine_copy", lambda dst, src, stream: events.append("engine"))
    monkeypatch.setattr(overlap, "capturing", lambda: True)
    monkeypatch.setattr(config, "OVERLAP_COPY", "engine")
    a, b = torch.zeros(16, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    overlap._gemm_reduce_scatter_on(comm, a, b, None, None)
    overlap._all_gather_gemm_on(comm, a[:8], b, None, None)
    assert "engine" not in events and events.count("copy@side") == 2
    monkeypatch.setattr(config, "OVERLAP_COPY", "dma")
    events.clear()
    comm.staging = lambda nbytes, slot: events.append("grown")
    for call in (lambda: overlap._gemm_reduce_scatter_on(comm, a, b, None, None),
                 lambda: overlap._all_gather_gemm_on(comm, a[:8], b, None, None)):
        with pytest.raises(CollectiveError, match="OVERLAP_COPY"):
            call()
    assert events == []


class _Order:
    """One rank's GPU work as a call enqueues it, on the CPU: a node per operation on its stream
    (``_STREAMS``), after the stream's previous node and the records of the events waited on; what
    each node reads and writes (byte ranges); whether one node happens before another."""

    def __init__(self, monkeypatch, comm: _Rank) -> None:
        import types

        import collectives.api

        self.nodes: list[tuple[str, str, set[int], list, list]] = []  # (name, stream, preds, reads, writes)
        self.last: dict[str, int] = {}
        order = self

        def event():
            made = types.SimpleNamespace(at=None)
            made.record = lambda stream: setattr(made, "at", order.last.get(stream.name))
            made.wait = lambda stream: order.add("wait", stream.name, deps=[made.at] if made.at is not None else [])
            return made

        def mm(x, y, *, out):
            order.add("mm", reads=[x, y], writes=[out])

        def total(x, dim, *, out):
            order.add("sum", reads=[x], writes=[out])

        monkeypatch.setattr(torch.cuda, "Event", event)
        monkeypatch.setattr(torch, "mm", mm)
        monkeypatch.setattr(torch, "sum", total)
        monkeypatch.setattr(torch.Tensor, "copy_", lambda dst, src: order.add("copy", reads=[src], writes=[dst]))
        monkeypatch.setattr(collectives.api, "barrier", lambda group: order.add("barrier"))
        self.comm = comm

    def add(self, name: str, stream: str | None = None, deps=(), reads=(), writes=()) -> int:
        stream = stream or _STREAMS.current.name
        preds = set(deps) | ({self.last[stream]} if stream in self.last else set())
        self.nodes.append((name, stream, preds, [_span(t) for t in reads], [_span(t) for t in writes]))
        self.last[stream] = len(self.nodes) - 1
        return self.last[stream]

    def before(self, first: int, then: int) -> bool:
        """Whether node ``first`` happens before node ``then`` (stream order and event waits)."""
        seen, todo = set(), [then]
        while todo:
            node = todo.pop()
            if node == first:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(self.nodes[node][2])
        return False

    def on_peer(self, node: int) -> bool:
        """Whether the node reads or writes a peer's workspace."""
        _, _, _, reads, writes = self.nodes[node]
        peers = [w for r, held in enumerate(self.comm.workspaces) if r != self.comm.rank for w in held.values()]
        return any(_overlap(span, _span(w)) for span in reads + writes for w in peers)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _overlap(x: tuple[int, int], y: tuple[int, int]) -> bool:
    return x[0] < y[1] and y[0] < x[1]


@pytest.mark.parametrize("schedule", ["comm", "alternate"])
@pytest.mark.parametrize("start", ["side", "first"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_block_is_ordered_after_what_it_needs_on_either_schedule(on_cpu, monkeypatch, world: int,
                                                                      start: str, schedule: str) -> None:
    """What the streams and events order, per rank, as blocks (``OVERLAP_SCHEDULE`` "comm": GEMMs
    on the current stream, copies on the side one; "alternate": a block's copy and GEMM on one
    stream, the streams alternating): a node that reads or writes memory an earlier node wrote
    (or writes what it read) happens after it; a node that reads or writes a peer's workspace
    happens after the last barrier enqueued before it and before the next one (the call's end:
    a node the caller enqueues next on the current stream); every node before that end."""
    from collectives import config

    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)
    monkeypatch.setattr(config, "OVERLAP_START", start)
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS["blocks"])
    m, k, n = 4, 8, 16
    comm = _Rank(world, 1, [{} for _ in range(world)])
    a, b = torch.zeros(world * m, k, dtype=torch.float16), torch.zeros(k, n, dtype=torch.float16)
    order = _Order(monkeypatch, comm)
    for call in (lambda: overlap._gemm_reduce_scatter_on(comm, a, b, None, None),
                 lambda: overlap._all_gather_gemm_on(comm, a[:m], b, None, None)):
        call()  # (grows the workspace and makes the events)
        order.nodes.clear()
        order.last.clear()
        call()
        end = order.add("next", "main")
        nodes = order.nodes
        streams = {s for _, s, _, _, _ in nodes}
        assert streams == {"main", "side"}, streams
        barriers = [i for i, node in enumerate(nodes) if node[0] == "barrier"] + [end]
        for j, (name, _, _, reads, writes) in enumerate(nodes):
            assert order.before(j, end) or j == end, (j, name)
            for i in range(j):
                earlier = nodes[i]
                if any(_overlap(x, y) for x in earlier[4] for y in reads + writes) or \
                        any(_overlap(x, y) for x in earlier[3] for y in writes):
                    assert order.before(i, j), f"{earlier[0]} {i} ({earlier[1]}) and {name} {j} unordered: {nodes}"
            if order.on_peer(j):
                after = max(i for i in barriers if i < j)
                until = min(i for i in barriers if i > j)
                assert order.before(after, j) and order.before(j, until), (j, name, after, until, nodes)


@pytest.mark.parametrize("world", [2, 4])
def test_the_auto_schedule_alternates_all_gather_gemms_up_to_the_measured_size(on_cpu, monkeypatch,
                                                                               world: int) -> None:
    """``OVERLAP_SCHEDULE = "auto"`` (the default): the all-gather GEMM's blocks in the
    ``"alternate"`` schedule up to :data:`~collectives.algorithms.tuning.OVERLAP_ALTERNATE_MAX_MNK`
    of ``M x N x K`` (M: the gathered rows, as the call computes them), ``"comm"`` past it and
    for every GEMM reduce-scatter; the forced schedules as set; another value refused."""
    from collectives import config
    from collectives.algorithms import tuning

    assert config.OVERLAP_SCHEDULE == "auto"
    limit = tuning.OVERLAP_ALTERNATE_MAX_MNK
    assert overlap._alternate("all_gather_gemm", limit) and not overlap._alternate("all_gather_gemm", limit + 1)
    assert not overlap._alternate("gemm_reduce_scatter", 1)
    for schedule in ("comm", "alternate"):
        monkeypatch.setattr(config, "OVERLAP_SCHEDULE", schedule)
        assert overlap._alternate("all_gather_gemm", 1) == overlap._alternate("gemm_reduce_scatter", 1) == (
            schedule == "alternate")
    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", "both")
    with pytest.raises(CollectiveError, match="OVERLAP_SCHEDULE"):
        overlap._alternate("all_gather_gemm", 1)
    monkeypatch.setattr(config, "OVERLAP_SCHEDULE", "auto")
    monkeypatch.setattr(config, "OVERLAP_EAGER_HOST_US_PER_BLOCK", EAGER_PATHS["blocks"])
    asked, alternate = [], overlap._alternate
    monkeypatch.setattr(overlap, "_alternate", lambda name, mnk: (asked.append((name, mnk)), alternate(name, mnk))[1])
    m, k, n = 4, 8, 16
    comm = _Rank(world, 1, [{} for _ in range(world)])
    a, b = torch.zeros(world * m, k, dtype=torch.float16), torch.zeros(k, n, dtype=torch.float16)
    _Order(monkeypatch, comm)
    overlap._gemm_reduce_scatter_on(comm, a, b, None, None)
    overlap._all_gather_gemm_on(comm, a[:m], b, None, None)
    assert asked == [("gemm_reduce_scatter", world * m * n * k), ("all_gather_gemm", world * m * n * k)]
