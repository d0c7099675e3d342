"""The auto choice follows the measured crossovers."""

import pytest

from collectives.algorithms import tuning
from collectives.config import LAMPORT_GATHER_MAX_BYTES, LAMPORT_MAX_BYTES


def test_sizes_go_lamport_then_one_shot_then_two_shot_or_tma() -> None:
    order = ["lamport", "one_shot", "two_shot", "tma", "push"]
    for world in range(2, 9):
        for backend in ("peer", "multicast"):
            assert tuning.all_reduce_algorithm(world, 4096, backend) == "lamport"
            large = "push" if backend == "peer" and world <= 4 else "tma"  # SYMMETRIC_PUSH_MIN (W = 3 reads W = 4)
            assert tuning.all_reduce_algorithm(world, 256 << 20, backend) == large
            assert tuning.all_reduce_algorithm(world, 256 << 20, backend, aligned=False) == (
                "push" if large == "push" else "two_shot")
            picks = [tuning.all_reduce_algorithm(world, 1 << k, backend) for k in range(10, 30)]
            ranks = [order.index(p) for p in picks]
            assert ranks == sorted(ranks), (world, backend, picks)


def test_lamport_never_exceeds_its_buffers() -> None:
    for world in range(2, 9):
        assert tuning.all_reduce_algorithm(world, LAMPORT_MAX_BYTES + 16, "peer") != "lamport"


def test_large_plain_all_reduce_tensors_are_pushed() -> None:
    """Past one-shot, a tensor outside symmetric memory is pushed (never staged through
    two-shot or TMA); the order by size is Lamport, one-shot, push."""
    order = ["lamport", "one_shot", "push"]
    for world in (2, 4, 8):
        for backend in ("peer", "multicast"):
            picks = [tuning.all_reduce_algorithm(world, 1 << k, backend, symmetric=False) for k in range(10, 31)]
            assert picks[-1] == "push" and set(picks) <= set(order), picks
            assert [order.index(p) for p in picks] == sorted(order.index(p) for p in picks), picks


def test_plain_reduce_scatter_inputs_past_lamport_are_pushed() -> None:
    for world in (2, 4, 8):
        for nbytes in (16, 4096, 1 << 20, 256 << 20):
            lamport = nbytes <= tuning.RS_LAMPORT_MAX["peer", world]
            assert tuning.reduce_scatter_algorithm(world, nbytes, "peer", symmetric=False) == (
                "lamport" if lamport else "push")
            pushed = nbytes >= tuning.RS_SYMMETRIC_PUSH_MIN["peer", world]
            assert (tuning.reduce_scatter_algorithm(world, nbytes, "peer") == "push") == pushed


def test_large_symmetric_reduce_scatters_are_pushed_from_the_table() -> None:
    """Symmetric inputs past the measured crossover (4 GPUs: 16 MB, 2 GPUs: 128 MB) are pushed,
    aligned or not; below it one-shot or TMA; a backend without a measured crossover never
    pushes them."""
    assert tuning.reduce_scatter_algorithm(4, 256 << 20, "peer") == "push"
    assert tuning.reduce_scatter_algorithm(4, 16 << 20, "peer", aligned=False) == "push"
    assert tuning.reduce_scatter_algorithm(4, 8 << 20, "peer") == "one_shot"
    assert tuning.reduce_scatter_algorithm(2, 256 << 20, "peer") == "push"
    assert tuning.reduce_scatter_algorithm(2, 64 << 20, "peer") == "tma"
    assert tuning.reduce_scatter_algorithm(4, 256 << 20, "multicast") == "tma"


def test_unaligned_reduce_scatter_never_picks_tma() -> None:
    assert tuning.reduce_scatter_algorithm(2, 64 << 20, "peer", aligned=False) == "one_shot"
    assert tuning.reduce_scatter_algorithm(8, 1 << 30, "peer", aligned=False) == "one_shot"
    assert tuning.reduce_scatter_algorithm(4, 8 << 20, "peer") == "one_shot"


@pytest.mark.parametrize(("pick", "table"), [(tuning.reduce_scatter_algorithm, tuning.RS_LAMPORT_MAX)])
def test_small_reduce_scatters_go_lamport_up_to_the_table(pick, table) -> None:
    """Lamport from the smallest size up to the table's entry (and never a block past a slot),
    the other algorithms after it; a change of the table moves the crossover."""
    for (backend, world), limit in table.items():
        for aligned in (True, False):
            assert pick(world, 16, backend, aligned) == "lamport"
            assert pick(world, limit, backend, aligned) == "lamport"
            assert pick(world, limit + 16, backend, aligned) != "lamport"
            assert pick(world, world * LAMPORT_MAX_BYTES + 16, backend, aligned) != "lamport"
    assert pick(4, 4096, "peer") == "lamport" and pick(3, 4096, "multicast_emulated") == "lamport"


def test_auto_all_gather_takes_the_exact_lamport_up_to_its_entry_and_half_a_slot() -> None:
    """The Lamport all-gather is bit-exact (tagged words): ``auto`` picks it up to its crossover,
    whose blocks fit half a slot (:data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`)."""
    for (backend, world), limit in tuning.AG_LAMPORT_MAX.items():
        assert 0 < limit <= world * LAMPORT_GATHER_MAX_BYTES
        for nbytes in (16, 4096, 64 << 10, limit):
            assert tuning.all_gather_algorithm(world, nbytes, backend) == "lamport"
        assert tuning.all_gather_algorithm(world, limit + 16, backend) == "one_shot"


def test_lamport_blocks_read_the_table_and_the_slot(monkeypatch) -> None:
    monkeypatch.setitem(tuning.RS_LAMPORT_MAX, ("peer", 4), 0)
    assert tuning.reduce_scatter_algorithm(4, 4096, "peer") == "one_shot"
    monkeypatch.setitem(tuning.AG_LAMPORT_MAX, ("peer", 2), 1 << 40)
    assert tuning.all_gather_algorithm(2, 2 * LAMPORT_GATHER_MAX_BYTES, "peer") == "lamport"
    assert tuning.all_gather_algorithm(2, 2 * LAMPORT_GATHER_MAX_BYTES + 16, "peer") == "one_shot"


def test_crossover_falls_with_world_size() -> None:
    limits = [max(n for n in (1 << k for k in range(10, 30))
                  if tuning.all_reduce_algorithm(w, n, "peer") in ("lamport", "one_shot")) for w in (2, 4, 8)]
    assert limits == sorted(limits, reverse=True) and limits[0] > limits[-1]


def test_all_gather_picks_one_shot_past_lamport_but_tma_or_push_where_measured_ahead() -> None:
    """TMA lost or tied at every measured size on 2 x H200, and on plain outputs everywhere; on 4
    x H200 it led at 16 MB of symmetric output in three runs: TMA there (aligned, symmetric)
    only.  The push all-gather led the one-shot on plain outputs from 64 MB on 2 and 4 x H200,
    aligned or not: push there.  Both on the peer backend only, where measured."""
    for world in (2, 4, 8):
        for backend in ("peer", "multicast"):
            for nbytes in (8 << 20, 16 << 20, 64 << 20, 1 << 30):
                for aligned in (True, False):
                    for symmetric in (True, False):
                        window = (world, backend, aligned, symmetric) == (4, "peer", True, True) and nbytes == 16 << 20
                        push = world in (2, 4) and (backend, symmetric) == ("peer", False) and nbytes >= 64 << 20
                        assert tuning.all_gather_algorithm(world, nbytes, backend, aligned, symmetric) == (
                            "tma" if window else "push" if push else "one_shot"), (world, backend, nbytes, aligned,
                                                                                   symmetric)
    assert tuning.all_gather_algorithm(3, 32 << 20, "peer") == "tma"  # (3 ranks read 4's entry)


def test_the_push_all_reduce_unrolls_4_where_measured_ahead(monkeypatch) -> None:
    """4 vectors of every rank in flight for the push all-reduce from 16 MB on 4 GPUs (peer), where
    its ``_u4`` column led in every 4-GPU run; 2 elsewhere (slower on 2 GPUs; 3, 8 and multicast
    not measured).  A bench variant's ``config.UNROLL`` overrules the table."""
    from collectives import config

    for world in range(2, 9):
        for backend in ("peer", "multicast", "multicast_emulated"):
            for nbytes in (1 << 20, (16 << 20) - 16, 16 << 20, 1 << 30):
                want = 4 if (world, backend) == (4, "peer") and nbytes >= 16 << 20 else 2
                assert tuning.push_unroll(world, nbytes, backend) == want, (world, backend, nbytes)
    monkeypatch.setattr(config, "UNROLL", 8)
    assert tuning.push_unroll(4, 1 << 30, "peer") == tuning.push_unroll(2, 1024, "peer") == 8


def test_three_ranks_keep_their_symmetric_all_reduce_choice() -> None:
    """The 4-GPU push from 16 MB (unrolled 4) does not reach 3 ranks, who read 4's entries
    elsewhere: they keep push from 64 MB."""
    assert tuning.all_reduce_algorithm(4, 16 << 20, "peer") == "push"
    assert tuning.all_reduce_algorithm(3, 16 << 20, "peer") == "tma"
    assert tuning.all_reduce_algorithm(3, 64 << 20, "peer") == "push"


@pytest.mark.parametrize(("world", "nbytes", "unroll"), [(4, 16 << 20, 4), (4, 8 << 20, 2), (2, 64 << 20, 2)])
def test_the_push_plan_makes_the_tuned_key(monkeypatch, world: int, nbytes: int, unroll: int) -> None:
    """``Push.plan`` keys the all-reduce's kernel with :func:`tuning.push_unroll` (the reduce-scatter
    with the default), so the key id names the unroll where it is not the default."""
    torch = pytest.importorskip("torch")
    from collectives.algorithms import key_id
    from collectives.algorithms.base import Call
    from collectives.algorithms.push import Push

    made = []
    monkeypatch.setattr(Push, "launch", lambda self, comm, call, key, *a, **k: made.append(key))

    class Comm:
        @staticmethod
        def staging(n, slot):
            return n

        @staticmethod
        def buffer(n):
            return n

    t = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="meta")
    call = Call("all_reduce", t, t, "bf16", "sum", "peer", world, n=t.numel(), nbytes=nbytes, symmetric=False,
                in_place=True, whole_vectors=True, pointers_aligned=True, capturing=False)
    Push().plan(Comm(), call)
    assert made[-1].unroll == unroll and key_id(made[-1]).endswith("/u4") == (unroll == 4)


def test_gemm_overlap_side_stream_priority_by_world() -> None:
    """Default priority on 2 GPUs (measured faster there in six runs), the higher one elsewhere."""
    assert tuning.overlap_side_priority(2, -1) == 0
    assert [tuning.overlap_side_priority(w, -1) for w in (3, 4, 8)] == [-1, -1, -1]
