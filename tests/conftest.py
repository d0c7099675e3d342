"""Skip GPU tests cleanly where there is no GPU (or, for multigpu, no torchrun world), and run the
multigpu tests as rank threads on one GPU where ``COLLECTIVES_TEST_WORLD=W`` asks for a world
(tests/support/world_support.py); ``--shard I/N`` keeps the I-th of N parts of about equal
weight (``.ci/gpu``'s ``SHARD``: a group that outgrows one device call runs in N calls); fail a run
that leaves a PTX or cubin file in the repository root; name each failure the moment it happens;
compile each kernel key's PTX once a run (tests/support/shared_ptx.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", metavar="I/N", default=None,
                     help="run the I-th of N parts of about equal weight of the collected tests (I = 0 .. N-1)")


def shard(items: list, spec: str, weight=lambda item: 1) -> tuple[list, list]:
    """(kept, deselected) of ``items`` for ``--shard I/N``, both in collection order.

    The heaviest items are placed first, each in the part that holds the least weight so far
    (the lowest I on a tie): items of weight 1 interleave (every N-th from the I-th on, so that
    the N parts share every file's slow and fast tests alike), and an item of weight k
    (``@pytest.mark.shard_weight(k)``: it takes about k ordinary tests' time) fills its part
    as k of them would."""
    try:
        index, count = (int(v) for v in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes I/N, not {spec!r}") from None
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {spec}: I must be 0 .. N-1")
    weights = [weight(item) for item in items]
    loads, part = [0] * count, [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: -weights[i]):  # (sorted is stable)
        part[i] = min(range(count), key=loads.__getitem__)
        loads[part[i]] += weights[i]
    return ([item for item, p in zip(items, part) if p == index],
            [item for item, p in zip(items, part) if p != index])


def _shard_weight(item: pytest.Item) -> int:
    marker = item.get_closest_marker("shard_weight")
    return 1 if marker is None else int(marker.args[0])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.support.world_support import WORLD

    if config.getoption("--shard"):
        items[:], deselected = shard(items, config.getoption("--shard"), _shard_weight)
        config.hook.pytest_deselected(items=deselected)

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


#: The repository root, where CuTeDSL writes a kept PTX or cubin that no DumpDir redirects
#: (the directory the process started in; xdist's workers start there too).
ROOT = Path(__file__).resolve().parents[1]
_ARTIFACTS = pytest.StashKey[set]()


def _root_artifacts() -> set[str]:
    return {p.name for pattern in ("*.ptx", "*.cubin") for p in ROOT.glob(pattern)}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_ARTIFACTS] = _root_artifacts()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run (in the process that started it, not in an xdist worker) if a test left a
    PTX or cubin file in the repository root: every compile that keeps one names a temporary
    directory (tests/meta/test_no_artifacts.py checks the tools' own)."""
    from tests.support.world_support import WORLD, close_session_world

    if WORLD:
        close_session_world()
    if hasattr(session.config, "workerinput"):
        return
    left = sorted(_root_artifacts() - session.config.stash.get(_ARTIFACTS, set()))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"tests left files in the repository root (compile with a DumpDir): {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def failure_line(report: pytest.TestReport) -> str | None:
    """The line that names a failed test phase and the first line of its error (None for any
    other report)."""
    if not report.failed:
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message.splitlines()[0] if crash is not None and crash.message else ""
    return f"FAILED {report.nodeid} ({report.when}): {message}".rstrip(": ")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's node id at once, not only in the summary: a run stopped by a time bound
    (a device call's, ``.ci/gpu``'s) ends before the summary, and a one-GPU world run at W = 8
    lost the name of its one failure that way."""
    line = failure_line(report)
    reporter = _reporter()
    if line is not None and reporter is not None:
        reporter.write("\n")  # (after the progress letter this report printed)
        reporter.write_line(line, red=True)


#: This process's pytest config (the terminal reporter is looked up when a report arrives: it
#: registers after this file's pytest_configure).
_CONFIG: list[pytest.Config] = []


def _reporter():
    """The terminal reporter, None in an xdist worker (its controller prints) or before configure."""
    if not _CONFIG or hasattr(_CONFIG[0], "workerinput"):
        return None
    return _CONFIG[0].pluginmanager.get_plugin("terminalreporter")


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]
    from tests.support import shared_ptx

    if not hasattr(config, "workerinput"):  # the run's first process: its workers inherit the folder
        os.environ[shared_ptx.FOLDER_ENV] = tempfile.mkdtemp(prefix="ptxops-test-ptx-")
    shared_ptx.install(Path(os.environ[shared_ptx.FOLDER_ENV]))


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.support import shared_ptx

    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(shared_ptx.FOLDER_ENV, ""), ignore_errors=True)
