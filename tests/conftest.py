"""Skip GPU tests cleanly where there is no GPU (or, for multigpu, no torchrun world)."""

from __future__ import annotations

import os

import pytest


def _gpu_count() -> int:
    try:
        from cuda.bindings import driver

        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
    except Exception:  # no cuda-bindings, or no driver library on this machine
        return 0
    return count if err == driver.CUresult.CUDA_SUCCESS else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = None
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            gpus = _gpu_count() if gpus is None else gpus
            if gpus == 0:
                item.add_marker(pytest.mark.skip(reason="needs a GPU"))
            elif "multigpu" in item.keywords and int(os.environ.get("WORLD_SIZE", "1")) < 2:
                item.add_marker(pytest.mark.skip(reason="needs 2+ GPUs under torchrun"))
