"""Groups of a one-GPU world's ranks (collectives.testing.new_group) on the host, without a GPU:
contexts of CPU groups (loopback heaps, thread agreement) made by every rank of the world in
the same order, members numbered in the order asked, groups allocating on their own, refusals
of bad or differing ranks, a failing rank releasing the ranks that wait in its groups, and
every member closing the groups they share in the same order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import CollectiveError  # noqa: E402
from collectives.symmetric import context  # noqa: E402
from collectives.symmetric.capability import Capabilities  # noqa: E402
from collectives.symmetric.loopback import LoopbackHeap, Meeting, ThreadAgreement, WorldError  # noqa: E402
from collectives.testing import Groups, group_members, new_group  # noqa: E402
from tests.collectives.symmetric.test_loopback import Stream, threads  # noqa: E402

WORLD = 4


def cpu_group_context(member: int, size: int, meeting: Meeting, table: dict) -> context.Context:
    """A CPU context of group rank ``member`` of ``size`` (every rank of the world counts for the GPU)."""
    caps = Capabilities(device=0, world_size=size, multicast=False, multicast_reason="a CPU world",
                        peer_access=True, peer_reason=None, nvlink_mesh=True)
    return context.Context(heap=LoopbackHeap(meeting, table, member, "cpu", stream=Stream), group=None, rank=member,
                           world_size=size, device=0, caps=caps, backend="peer",
                           agreement=ThreadAgreement(meeting, member), ranks_on_device=WORLD)


@pytest.mark.parametrize(("ranks", "why"), [([], "at least one"), ([0, 0], "distinct"), ([1, WORLD], "0..3"),
                                            ([-1], "0..3")])
def test_bad_ranks_are_refused(ranks: list[int], why: str) -> None:
    with pytest.raises(CollectiveError, match="distinct ranks of the world"):
        group_members(ranks, WORLD)


def test_outside_a_world_new_group_says_where_to_call_it() -> None:
    with pytest.raises(CollectiveError, match="in a rank of an open world"):
        new_group([0, 1])


def test_groups_number_their_members_as_asked_and_allocate_among_themselves() -> None:
    """Two groups of two ({2, 0} and {1, 3}) and one of all: each member's context has its group
    rank and size; a group's allocation meets only its members, and maps their tensors."""
    groups = Groups(Meeting(WORLD, timeout_s=10))

    def body(rank: int):
        pairs = [groups.make(rank, ranks, cpu_group_context) for ranks in ([2, 0], [1, 3])]
        everyone = groups.make(rank, [3, 2, 1, 0], cpu_group_context)
        mine = next(c for c in pairs if c is not None)
        assert [c is None for c in pairs] == ([False, True] if rank in (0, 2) else [True, False])
        t = mine.empty(4, torch.float32)
        t.fill_(rank)
        mine.host_barrier()
        peer = mine.peer_tensors(t)[1 - mine.rank]
        return mine.rank, mine.world_size, everyone.rank, everyone.world_size, float(peer[0])

    got = threads(WORLD, body)
    assert got == [(1, 2, 3, 4, 2.0), (0, 2, 2, 4, 3.0), (0, 2, 1, 4, 0.0), (1, 2, 0, 4, 1.0)]


def test_ranks_that_ask_for_different_groups_all_raise() -> None:
    groups = Groups(Meeting(WORLD, timeout_s=10))
    got = threads(WORLD, lambda rank: groups.make(rank, [0, 1] if rank else [0, 2], cpu_group_context))
    assert all(isinstance(e, CollectiveError) and "same group" in str(e) for e in got)


def test_a_rank_that_fails_releases_the_ranks_waiting_in_its_group() -> None:
    """Rank 1 fails after the group is made (the world's meeting is aborted, as a rank thread's
    failure does): rank 0, waiting in the group's first allocation, is released naming it."""
    meeting = Meeting(WORLD, timeout_s=30)
    groups = Groups(meeting)

    def body(rank: int):
        ctx = groups.make(rank, [0, 1], cpu_group_context)
        if rank == 1:
            meeting.abort(1, RuntimeError("boom"))
            return "failed"
        if rank == 0:
            ctx.empty(4, torch.float32)  # rank 1 never comes
        return "done"

    got = threads(WORLD, body, bound=20)
    assert isinstance(got[0], WorldError) and "rank 1 failed" in str(got[0])
    assert got[1:] == ["failed", "done", "done"]


def test_every_member_closes_the_groups_it_shares_in_the_same_order() -> None:
    """Overlapping groups ({0, 1}, {2, 3}, {0, 2}, all): each rank closes its own, the last made
    first, with no member waiting for another that closes a different group."""
    groups = Groups(Meeting(WORLD, timeout_s=10))

    def body(rank: int):
        made = [groups.make(rank, ranks, cpu_group_context) for ranks in ([0, 1], [2, 3], [0, 2], [0, 1, 2, 3])]
        for ctx in made:
            if ctx is not None:
                ctx.empty(8, torch.uint8)
        groups.close(rank)
        return [ctx.closed for ctx in made if ctx is not None]

    got = threads(WORLD, body)
    assert got == [[True, True, True], [True, True], [True, True, True], [True, True]]
    assert len(groups.contexts()) == 10
