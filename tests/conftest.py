"""Skip GPU tests cleanly where there is no GPU (or, for multigpu, no torchrun world), and run the
multigpu tests as rank threads on one GPU where ``COLLECTIVES_TEST_WORLD=W`` asks for a world
(tests/support/world_support.py)."""

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
    from tests.support.world_support import WORLD

    gpus = None
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            gpus = _gpu_count() if gpus is None else gpus
            if gpus == 0:
                item.add_marker(pytest.mark.skip(reason="needs a GPU"))
            elif "multigpu" in item.keywords and WORLD:
                marker = item.get_closest_marker("no_world")
                if marker is not None:
                    item.add_marker(pytest.mark.skip(reason=f"not in the one-GPU world: {marker.args[0]}"))
            elif "multigpu" in item.keywords and int(os.environ.get("WORLD_SIZE", "1")) < 2:
                item.add_marker(pytest.mark.skip(reason="needs 2+ GPUs under torchrun"))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """In the one-GPU world, a multigpu test's function runs in every rank's thread."""
    from tests.support.world_support import WORLD, run_test

    if not WORLD or "multigpu" not in pyfuncitem.keywords:
        return None
    names = pyfuncitem._fixtureinfo.argnames
    run_test(pyfuncitem.obj, {name: pyfuncitem.funcargs[name] for name in names})
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.support.world_support import WORLD, close_session_world

    if WORLD:
        close_session_world()
