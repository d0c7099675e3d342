"""The GEMM-overlap functions' host logic: row chunking, flag slots, and how a flag wait that
timed out is reported (no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from collectives.config import (  # noqa: E402
    CLAIMED,
    FATAL_RECORD,
    FLAG_SLOTS,
    FLAG_WAIT,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
    TIMEOUT,
)
from collectives.runtime.error_record import ErrorRecord  # noqa: E402
from collectives.errors import CollectiveError, CollectiveTimeout  # noqa: E402
from collectives.runtime.stream_flags import StreamFlags  # noqa: E402
from collectives import overlap  # noqa: E402
from collectives.overlap import _FLAG_BASE, MAX_CHUNKS, _bounds  # noqa: E402
from collectives.runtime.communicator import Communicator  # noqa: E402


@pytest.mark.parametrize("rows", [0, 1, 3, 7, 1024, 1027])
@pytest.mark.parametrize("chunks", [1, 4, 8])
def test_chunks_cover_every_row_once_and_none_is_empty(monkeypatch, rows: int, chunks: int) -> None:
    monkeypatch.setattr(overlap, "CHUNKS", chunks)
    bounds = _bounds(rows)
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) == max(1, min(chunks, rows))
    assert rows == 0 or all(r1 > r0 for r0, r1 in bounds)


def test_each_function_has_its_own_flag_slots() -> None:
    """One consumer per slot: the two functions' chunks use disjoint slots of the communicator."""
    slots = [set(range(base, base + MAX_CHUNKS)) for base in _FLAG_BASE.values()]
    assert not set.intersection(*slots)
    assert set.union(*slots) <= set(range(FLAG_SLOTS))


@pytest.mark.parametrize("chunks", [0, MAX_CHUNKS + 1])
def test_chunk_counts_beyond_the_flag_slots_are_refused(monkeypatch, chunks: int) -> None:
    monkeypatch.setattr(overlap, "CHUNKS", chunks)
    with pytest.raises(CollectiveError, match="CHUNKS"):
        _bounds(64)


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
    from collectives.config import PadLayout

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


def test_each_communicator_has_its_own_side_stream(monkeypatch) -> None:
    """The overlap's side stream belongs to a communicator's stream flags (made once, on first
    use), not to the process: two communicators on one device order their calls apart."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: object())
    first, second = (StreamFlags.__new__(StreamFlags) for _ in range(2))
    for flags in (first, second):
        flags.device, flags._side = 0, None
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


class _Recorder:
    """A GEMM-overlap call's host steps, in order: ``gemm`` (cuBLAS), ``launch`` (a collective),
    ``meet`` (the ranks sharing the GPU meet on the host)."""

    def __init__(self, monkeypatch, world: int, rank: int) -> None:
        import types

        import collectives.api

        self.events: list[str] = []
        stream = types.SimpleNamespace(wait_stream=lambda other: None)
        flags = types.SimpleNamespace(side=lambda: stream, post=lambda slot: None, wait=lambda slot: None)
        self.comm = types.SimpleNamespace(
            world=world, rank=rank, stream_flags=flags,
            staging=lambda nbytes, slot: torch.empty(nbytes, dtype=torch.uint8),
            meet_ranks_on_device=lambda what, values: self.events.append("meet"))
        monkeypatch.setattr(overlap, "_check", lambda name, comm, a, b: (a.shape[0], a.shape[1], b.shape[1]))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: __import__("contextlib").nullcontext())
        for gemm in ("mm", "bmm"):
            monkeypatch.setattr(torch, gemm, lambda *args, out: self.events.append("gemm"))
        for collective in ("reduce_scatter", "all_gather"):
            monkeypatch.setattr(collectives.api, collective, lambda *args, **kwargs: self.events.append("launch"))


@pytest.mark.parametrize("chunks", [1, 4])
def test_no_rank_runs_a_gemm_while_another_may_still_launch_a_collective(monkeypatch, chunks: int) -> None:
    """cuBLAS may load kernels at a GEMM (a load waits for every kernel on the GPU and holds the
    other ranks' launches), so where ranks share a GPU a meeting separates every GEMM from the
    collectives launched before it, the previous call's included, and every launch from the GEMMs
    enqueued before it (world_gather 5 on an H200 timed out in the f16 all_gather_gemm after a
    gemm_reduce_scatter, whose last reduce-scatters some ranks had not launched yet)."""
    monkeypatch.setattr(overlap, "CHUNKS", chunks)
    rec = _Recorder(monkeypatch, world=3, rank=1)
    a, b = torch.zeros(3 * 8, 16, dtype=torch.float16), torch.zeros(16, 32, dtype=torch.float16)
    overlap._gemm_reduce_scatter_on(rec.comm, a, b, None, None)
    overlap._all_gather_gemm_on(rec.comm, a[:8], b, None, None)
    overlap._gemm_reduce_scatter_on(rec.comm, a, b, None, None)
    assert rec.events.count("launch") == 3 * chunks and rec.events.count("gemm") == 2 * chunks + 1 + 2 * chunks
    since_meeting: set[str] | None = None  # the steps since the last meeting (None: none yet)
    for at, event in enumerate(rec.events):
        assert event == "meet" or since_meeting is not None, f"step {at}: a {event} before any meeting"
        if event == "meet":
            since_meeting = set()
            continue
        other = {"gemm": "launch", "launch": "gemm"}[event]
        assert other not in since_meeting, f"step {at}: a {event} after a {other} with no meeting between: {rec.events}"
        since_meeting.add(event)


@pytest.mark.parametrize("chunks", [1, 3])
def test_copy_engine_gather_copies_this_ranks_rows_into_every_ranks_workspace_between_barriers(
        monkeypatch, chunks: int) -> None:
    """overlap.GATHER_COPY_ENGINE: chunk c of this rank's shard lands in block ``rank`` of chunk c
    of every rank's workspace (one copy per rank, through its peer mapping), after a start
    barrier and before an end barrier, and no all-gather kernel is launched."""
    import collectives.api

    world, rank, m, k = 3, 1, 5, 4
    monkeypatch.setattr(overlap, "CHUNKS", chunks)
    monkeypatch.setattr(overlap, "GATHER_COPY_ENGINE", True)
    rec = _Recorder(monkeypatch, world=world, rank=rank)
    workspaces = [torch.zeros(world * m * k, dtype=torch.float16) for _ in range(world)]
    rec.comm.staging = lambda nbytes, slot: workspaces[rank].view(torch.uint8)

    def peer_tensors(t: torch.Tensor) -> list[torch.Tensor]:
        offset = t.storage_offset() - workspaces[rank].storage_offset()
        return [w.as_strided(t.shape, t.stride(), offset) for w in workspaces]

    rec.comm.ctx = __import__("types").SimpleNamespace(peer_tensors=peer_tensors)
    monkeypatch.setattr(collectives.api, "barrier", lambda **kwargs: rec.events.append("barrier"))
    copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: (rec.events.append("copy"), copy(self, src))[1])
    shard = torch.arange(m * k, dtype=torch.float16).view(m, k) + 1
    overlap._all_gather_gemm_on(rec.comm, shard, torch.zeros(k, 2, dtype=torch.float16), None, None)
    gathers = [e for e in rec.events if e in ("barrier", "copy", "launch")]
    assert gathers == (["barrier"] + ["copy"] * world + ["barrier"]) * chunks
    at = 0
    for r0, r1 in overlap._bounds(m):
        for q, w in enumerate(workspaces):
            block = w[at:at + world * (r1 - r0) * k].view(world, r1 - r0, k)
            assert torch.equal(block[rank], shard[r0:r1]), (q, r0)
            assert not block[(rank + 1) % world].any()  # the other ranks' blocks are theirs to write
        at += world * (r1 - r0) * k


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
