"""collectives.tools.nvlink_limit: its arithmetic on CPU (the measurement needs GPUs: see the module)."""

import pytest
import torch

from collectives.tools import nvlink_limit as nl


def test_bus_bandwidth_factors():
    s = 256 << 20
    assert nl.bus_bandwidth("all_reduce", s, 4, 1.0) == pytest.approx(1.5 * s)
    assert nl.bus_bandwidth("reduce_scatter", s, 4, 2.0) == pytest.approx(0.75 * s / 2)
    assert nl.bus_bandwidth("all_gather", s, 8, 1.0) == pytest.approx(7 / 8 * s)
    assert nl.bus_bandwidth("all_reduce", s, 1, 1.0) == 0


def test_bus_bandwidth_target_of_issue_49():
    # 1077 us for a 256 MB all-reduce on 4 GPUs is about 374 GB/s of bus bandwidth.
    assert nl.bus_bandwidth("all_reduce", 256 << 20, 4, 1077e-6) / 1e9 == pytest.approx(373.8, abs=0.5)


def test_bytes_out():
    assert nl.bytes_out("copy_engine", 100, 4) == 300
    assert nl.bytes_out("sm_stores", 100, 2) == 100
    assert nl.bytes_out("local_hbm", 100, 4) == 200


@pytest.mark.parametrize("bad", [("nccl", 1, 2, 1.0), ("all_reduce", 1, 0, 1.0), ("all_reduce", 1, 2, 0.0)])
def test_bus_bandwidth_rejects(bad):
    with pytest.raises(ValueError):
        nl.bus_bandwidth(*bad)
    with pytest.raises(ValueError):
        nl.bytes_out("nvls", 1, 2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs under torchrun")
def test_measure_runs_under_torchrun():  # pragma: no cover - GPU
    import torch.distributed as dist

    if not dist.is_torchelastic_launched():
        pytest.skip("run under torchrun: python -m collectives.tools.nvlink_limit")
    rows = nl.measure((1,), iters=2)
    assert {r["column"] for r in rows} == set(nl.COLUMNS) and all(r["us"] > 0 for r in rows)
