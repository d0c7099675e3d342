"""The staging turn (:meth:`collectives.algorithms.plan.Plan.run`): ranks that called different
collectives (a recorded mismatch, the communicator kept) still stage their next one-shot call
into the same slot.  On 2 x H100 the recovery all-reduce of
``test_different_dtypes_or_collectives_across_ranks_raise_and_the_communicator_recovers`` read
stale data on every rank when only alternating plans passed the turn on: rank 0's one-buffer
all-gather left its turn where rank 1's alternating reduce-scatter moved it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from collectives.algorithms import plan as plan_module  # noqa: E402
from collectives.algorithms.plan import Plan  # noqa: E402

STREAM = 7
#: What a rank may launch in one call: an alternating one-shot plan (two staging slots), a
#: barriered plan of one buffer (all-gather, a kept end barrier, the size-0 barrier), a Lamport one
#: (each counts the call and meets every rank in it: issue 48 item 4 pairs an empty rank's
#: barrier with its peers' Lamport kernels).
KINDS = ("alternating", "one_buffer", "lamport")


def launch(comm: SimpleNamespace, kind: str) -> int | None:
    """Run a plan of ``kind`` on ``comm``; the staging slot it used (None: it has none)."""
    used: list[int | None] = []
    args = [(0,), (1,)] if kind == "alternating" else [(None,)]
    Plan(lambda slot, stream: used.append(slot), args, comm, counted=True).run(False)
    return used[0]


@pytest.fixture(autouse=True)
def _one_stream(monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "current_stream", lambda device: STREAM)


def rank() -> SimpleNamespace:
    return SimpleNamespace(device_index=0, turn=0, stream=STREAM, stream_captured=False)


def test_a_mismatched_call_leaves_the_ranks_turns_equal() -> None:
    """Rank 0 all-gathers (one buffer) where rank 1 reduce-scatters (alternating): the next
    one-shot calls stage into the same slot on both."""
    r0, r1 = rank(), rank()
    assert launch(r0, "alternating") == launch(r1, "alternating")
    launch(r0, "one_buffer"), launch(r1, "alternating")  # the mismatched call
    assert launch(r0, "alternating") == launch(r1, "alternating")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(KINDS)), max_size=40))
def test_turns_agree_and_a_slot_waits_for_a_barrier(calls: list[tuple[str, str]]) -> None:
    """Any sequence of calls whose launches pair one to one across 2 ranks (the kinds may
    differ: mismatches, an empty rank's barrier against Lamport): where both ranks alternate
    they use one slot; a rank reuses a slot only after another launch after its last use
    (whose wait for every rank proves every rank done reading it)."""
    ranks = [rank(), rank()]
    last: list[dict[int, int]] = [{}, {}]  # per rank: slot -> index of its last use
    barriers: list[list[int]] = [[], []]  # per rank: indices of launches that meet every rank
    for i, kinds in enumerate(calls):
        slots = [launch(r, k) for r, k in zip(ranks, kinds)]
        if kinds == ("alternating", "alternating"):
            assert slots[0] == slots[1], f"call {i}: ranks stage into slots {slots}"
        for r, (k, slot) in enumerate(zip(kinds, slots)):
            if slot is not None and slot in last[r]:
                assert any(last[r][slot] < b < i for b in barriers[r]), f"rank {r} reuses slot {slot} at call {i}"
            if slot is not None:
                last[r][slot] = i
            barriers[r].append(i)
