"""A short soak (collectives.tools.soak): mixed collectives, algorithms, backends, dtypes,
sizes, eager and graph calls, with injected size mismatches, all checked against the reference.

    torchrun --nproc-per-node 2 -m pytest -q tests/collectives/gpu/ranks/test_soak.py
The long run: ``torchrun --nproc-per-node N -m collectives.tools.soak`` (100,000 calls).
"""

from __future__ import annotations

import argparse

import pytest

from collectives.symmetric.capability import force_multicast_off

force_multicast_off()

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")


def test_short_soak_is_right_and_recovers_from_every_mismatch() -> None:
    from tests.support.world_support import close_rank_context

    from collectives.tools.soak import Soak

    args = argparse.Namespace(calls=600, seconds=300.0, seed=1, mismatch_every=40, graph_fraction=0.3, graph_calls=1)
    soak = Soak(args)
    assert soak.run() == 0
    assert soak.stats["mismatch"] == 600 // 40 and soak.stats["graph"] > 0 and soak.stats["eager"] > 0
    torch.cuda.current_stream().synchronize()
    close_rank_context()
