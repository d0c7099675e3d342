"""What the CPU device simulation cannot see, pinned in the PTX: the ``bar.sync`` that carries a
block's accesses into a release or ticket made by one of its threads.

The simulation (``tests/collectives/device/test_*_source.py``) is sequentially consistent: a
signal published by thread 0 there makes every other thread's earlier stores visible, with or
without the block's sync.  On the GPU only the ``bar.sync`` before thread 0's release puts the
other threads' stores before it (the barrier's arrival words, the all-to-all's ``arrived``), and
the one before the ticket's ``atom.acq_rel`` puts every thread's read of the call count before
the count can advance.  So: walking back from each such instruction in the PTX, a ``bar.sync``
comes before any access of the kind it orders.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass")
from collectives.algorithms import KernelKey  # noqa: E402
from collectives.algorithms.all_to_all import AllToAllKey  # noqa: E402
from collectives.config import BARRIER_THREADS  # noqa: E402
from collectives.runtime.kernels import kernel_ptx  # noqa: E402

RELEASE = re.compile(r"^\s*st\.release\.sys\.global\.b64\b")
TICKET = re.compile(r"^\s*atom\.acq_rel\.gpu\.global\.add\.u32\b")
WEAK_STORE = re.compile(r"^\s*st\.global\.")  # a block's data stores (the releases and records are ordered)
LOAD = re.compile(r"^\s*ld\.global\.")
SYNC = re.compile(r"^\s*bar\.sync\b")


def synced(ptx: str, at: re.Pattern, before: re.Pattern) -> list[bool]:
    """For each line matching ``at``: whether the nearest line above it that matches ``before``
    or is a ``bar.sync`` is a ``bar.sync`` (no ``before`` above at all counts as synced)."""
    lines = ptx.splitlines()
    found = []
    for i, line in enumerate(lines):
        if at.search(line):
            above = next((x for x in reversed(lines[:i]) if SYNC.search(x) or before.search(x)), "bar.sync")
            found.append(bool(SYNC.search(above) or above == "bar.sync"))
    return found


def test_the_all_to_alls_arrived_release_follows_a_block_sync_after_its_stores() -> None:
    """The second release (``ready``, ``arrived``, the gave-up ``ready``, in program order)
    announces the block's part: every thread's stores of it before a ``bar.sync`` before it; so
    the ticket."""
    ptx = kernel_ptx(AllToAllKey("f32", 2, direct=False), "sm_90a")
    ready, arrived, gave_up = synced(ptx, RELEASE, WEAK_STORE)
    assert arrived, "the all-to-all's arrived release is not behind a bar.sync after the block's stores"
    assert synced(ptx, TICKET, LOAD) == [True]


@pytest.mark.parametrize("collective", ["all_reduce", "barrier"])
def test_every_barrier_release_and_ticket_follows_a_block_sync(collective: str) -> None:
    """Every arrival (and gave-up) word a barrier releases, after the block's stores, and the
    ticket after the block's reads of the call count (a one-shot all-reduce: both barriers)."""
    threads = dict(threads=BARRIER_THREADS) if collective == "barrier" else {}
    ptx = kernel_ptx(KernelKey(collective, "one_shot", "peer", "f32", 2, **threads), "sm_90a")
    releases = synced(ptx, RELEASE, WEAK_STORE)
    assert releases and all(releases), releases
    assert all(synced(ptx, TICKET, LOAD))
