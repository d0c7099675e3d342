"""The collectives on real GPUs with the peer backend (NVLink loads and stores), and the cases
that take no backend (:mod:`tests.collectives.gpu.ranks.collectives_cases`).

Run under torchrun on 2 or 4 GPUs:
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_collectives_peer.py
"""

from __future__ import annotations

import pytest

from tests.collectives.gpu.ranks.collectives_cases import (  # noqa: F401  (the fixture and the cases)
    comm,
    test_100000_calls_over_changing_sizes_and_addresses_keep_memory_bounded,
    test_graph_replay_after_its_staging_buffer_was_superseded,
    test_plain_tensor_at_a_reused_address,
    test_push_pipeline_over_many_rounds_and_changing_sizes,
    test_different_sizes_of_a_push_all_reduce_raise_and_the_communicator_recovers,
    test_push_reduce_scatter_in_graphs_at_offsets_and_reused_addresses,
    test_all_reduce_matches_reference,
    test_reduce_scatter_matches_reference,
    test_unaligned_tma_reduce_scatter_is_refused,
    test_256_mb,
    test_lamport_reduces_negative_zero_and_subnormals,
    test_lamport_blocks_move_negative_zero_and_subnormals,
    test_lamport_collectives_back_to_back,
    test_10000_back_to_back_calls_of_mixed_sizes,
    test_cuda_graph_replay_matches_eager,
    test_different_sizes_across_ranks_raise_and_the_communicator_recovers,
    test_different_dtypes_or_collectives_across_ranks_raise_and_the_communicator_recovers,
    test_barrier_back_to_back,
)

pytestmark = pytest.mark.multigpu


@pytest.fixture
def backend() -> str:
    return 'peer'
