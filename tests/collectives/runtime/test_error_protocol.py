"""Ranks that read a kernel's size-mismatch record at different calls still make the same
launches (pure Python, no GPU): the real API and communicator (:mod:`fake_comm`).

The host reads the record from host-mapped memory without a sync, so each rank sees it at the
first call after its own kernel wrote it: ranks see it at different calls.  A rank must neither
skip a call that the others make nor launch anything they do not (a reset), or their kernels
wait for it in vain.  The Lamport buffer the mismatch left dirty is emptied by the kernel itself
two calls later on every rank (tests/collectives/algorithms/test_lamport_model.py), so nothing on the host depends on
when a rank noticed.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from collectives import api  # noqa: E402
from collectives.layouts import (  # noqa: E402
    LAMPORT_EXCHANGE,
    PLACE_MISMATCH,
    READY_WAIT,
    RECOVERABLE_RECORD,
    SIZE_MISMATCH,
)
from collectives.errors import CollectiveError  # noqa: E402
from collectives.runtime.communicator import Communicator  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

WORLD = 4
#: The program every rank runs (the sizes are equal: the mismatch is the record of call MISMATCH).
PROGRAM = ["lamport", "one_shot", "lamport", "all_gather", "barrier", "lamport", "lamport", "one_shot", "lamport"]
MISMATCH = 2


def _run(monkeypatch, rank: int, notice: int, barrier_phase: int = LAMPORT_EXCHANGE,
         old: bool = False) -> tuple[list, list[int]]:
    """Rank ``rank`` runs :data:`PROGRAM`, catching errors and going on (as a server does); the
    record of call :data:`MISMATCH` becomes visible to its host before call ``notice``.
    Returns its launches' kernel keys and the calls that raised.  ``old``: the call starts with
    :func:`_old_check` instead of the record's ``poll``."""
    comm = FakeComm(FakeHeap(world_size=WORLD, rank=rank))
    if old:
        monkeypatch.setattr(comm.errors, "poll", lambda: _old_check(comm))
    install(monkeypatch, comm, [False])
    t, out = FakeTensor(0x10_0000_0000, 4096), FakeTensor(0x20_0000_0000, WORLD * 4096)
    raised = []
    for call, kind in enumerate(PROGRAM):
        if call == notice:
            comm.error[RECOVERABLE_RECORD] = torch.tensor([SIZE_MISMATCH, barrier_phase, (rank + 1) % WORLD, 0, rank])
        try:
            if kind == "barrier":
                api.barrier(backend="peer")
            elif kind == "all_gather":
                api.all_gather(out, t, algorithm="one_shot", backend="peer")
            else:
                api.all_reduce(t, algorithm=kind, backend="peer")
        except CollectiveError as e:
            assert "different sizes" in str(e)
            raised.append(call)
    return [key for key, _ in comm.launches], raised


@pytest.mark.parametrize("phase", [LAMPORT_EXCHANGE, 0])
def test_ranks_noticing_at_different_calls_make_the_same_launches(monkeypatch, phase: int) -> None:
    for seed in range(20):
        rng = random.Random(seed)
        notices = [MISMATCH + 1 + rng.randrange(4) for _ in range(WORLD)]
        runs = [_run(monkeypatch, r, notices[r], phase) for r in range(WORLD)]
        assert all(launches == runs[0][0] for launches, _ in runs), notices
        assert len(runs[0][0]) == len(PROGRAM) + 1  # one launch per call, and the Lamport buffers' barrier
        assert [raised for _, raised in runs] == [[n] for n in notices]  # once, by the call that saw it


def test_the_error_is_raised_after_the_call_launched(monkeypatch) -> None:
    launches, raised = _run(monkeypatch, 0, MISMATCH + 1)
    clean, _ = _run(monkeypatch, 0, len(PROGRAM))
    assert raised == [MISMATCH + 1] and launches == clean


def _old_check(self: Communicator) -> None:
    """Before the fix: the record raised at the start of a call, before its launch, and a Lamport
    mismatch made this rank's next call reset the Lamport buffers (two barriers around a refill)."""
    if getattr(self, "old_dirty", False):
        self.old_dirty = False
        self.barrier("auto", False)
        self.barrier("auto", False)
    record = self.error[RECOVERABLE_RECORD]
    if int(record[0]):
        lamport = int(record[1]) == LAMPORT_EXCHANGE
        record.zero_()
        self.old_dirty = lamport
        raise CollectiveError("ranks called the collective with different sizes")


def test_the_old_per_rank_reset_desynchronises_the_ranks(monkeypatch) -> None:
    runs = [_run(monkeypatch, r, MISMATCH + 1 + r, old=True) for r in range(2)]
    assert runs[0][0] != runs[1][0]


@pytest.mark.parametrize(("phase", "rule"), [(0, "every rank must make the same call \\(collective, dtype, op\\) with "
                                                  "the same shape, and tensors of the same kind"),
                                              (READY_WAIT, "in_splits\\[r\\] must equal its receiver's out_splits"),
                                              (PLACE_MISMATCH, "different allocations.*in_splits\\[r\\] must equal")])
def test_a_size_mismatch_names_the_rule_of_its_collective(phase: int, rule: str) -> None:
    """An all-to-all's mismatch (its phases: collectives.layouts.PHASES) names the splits' rule,
    a barrier's the shapes'."""
    from collectives.runtime.error_record import PHASE_NAMES, ErrorRecord

    errors = ErrorRecord(30.0, lambda: None, pin_memory=False)
    errors.error[RECOVERABLE_RECORD] = torch.tensor([SIZE_MISMATCH, phase, 1, 0, 0])
    with pytest.raises(CollectiveError, match=rule):
        errors.check()


def test_a_failure_report_describes_both_records_as_the_kernels_left_them() -> None:
    """:meth:`ErrorRecord.describe` (a one-GPU world's failure note names every rank's): read
    whatever the host raised or cleared, with the phase's name and the peer."""
    from collectives.layouts import ERROR_FIELDS, FATAL_RECORD, TIMEOUT
    from collectives.runtime.error_record import PHASE_NAMES, ErrorRecord

    errors = ErrorRecord(30.0, lambda: None, pin_memory=False)
    assert errors.describe() == "fatal: none; recoverable: none"
    fields = dict(status=TIMEOUT, barrier=READY_WAIT, peer=2, block=4, rank=6)
    errors.error[FATAL_RECORD] = torch.tensor([fields[f] for f in ERROR_FIELDS], dtype=torch.int32)
    fields.update(status=SIZE_MISMATCH, barrier=PLACE_MISMATCH, peer=1, block=0)
    errors.error[RECOVERABLE_RECORD] = torch.tensor([fields[f] for f in ERROR_FIELDS], dtype=torch.int32)
    assert errors.describe() == ("fatal: timeout in all-to-all ready wait, thread block 4, peer 2; recoverable: size "
                                 f"mismatch in {PHASE_NAMES[PLACE_MISMATCH]}, thread block 0, peer 1")
