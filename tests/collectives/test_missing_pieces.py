"""A machine missing a piece collectives needs gets one sentence saying what is missing and what
installs it: PyTorch or CuTeDSL (``collectives.<feature>``, ``python -m collectives ptx``), a GPU
(``collectives.init``: a CPU build of torch, no NVIDIA driver, no GPU visible)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(("package", "feature", "extra"), [
    ("torch", "all_reduce", "ptxops[torch]"),
    ("torch", "init", "ptxops[torch]"),
    ("cutlass", "all_reduce", "ptxops[dsl]"),
    ("cutlass", "gemm_reduce_scatter", "ptxops[dsl]"),
])
def test_a_missing_package_names_its_extra(package: str, feature: str, extra: str) -> None:
    """``sys.modules[package] = None`` makes the package unimportable, as where it is not installed."""
    proc = python(f"import sys\nsys.modules[{package!r}] = None\nimport collectives\n"
                  "try:\n"
                  f"    collectives.{feature}\n"
                  "except ImportError as e:\n"
                  "    print(type(e).__name__, e.name, e)\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"MissingDependency {package} collectives.{feature} needs "), proc.stdout
    assert f"'{extra}'" in proc.stdout


def test_the_ptx_command_without_cutedsl_says_so() -> None:
    proc = python("import sys\nsys.modules['cutlass'] = None\nfrom collectives.__main__ import main\n"
                  "sys.exit(main(['ptx', '--collective', 'all_reduce', '--backend', 'peer']))")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: python -m collectives ptx needs CuTeDSL, and 'cutlass' cannot be "
                                   "imported: pip install 'ptxops[dsl]'")


torch = pytest.importorskip("torch")

from collectives.errors import CollectiveError  # noqa: E402
from collectives.symmetric import bootstrap, capability, context  # noqa: E402


@pytest.fixture
def cuda_build(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CUDA build of torch that sees no GPU (what a CPU build or a GPU machine says is faked)."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    return monkeypatch


def test_what_is_missing_for_a_gpu(cuda_build: pytest.MonkeyPatch) -> None:
    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    cuda_build.setattr(capability.ctypes, "CDLL", no_library)
    assert capability.cuda_missing() == "no NVIDIA driver: libcuda.so.1 cannot be loaded"
    cuda_build.setattr(capability.ctypes, "CDLL", lambda name: object())
    cuda_build.setenv("CUDA_VISIBLE_DEVICES", "")
    assert capability.cuda_missing() == "the NVIDIA driver sees no GPU (CUDA_VISIBLE_DEVICES='')"
    cuda_build.setattr(torch.cuda, "device_count", lambda: 2)
    assert capability.cuda_missing() is None
    cuda_build.setattr(torch.version, "cuda", None)
    assert "is a CPU build" in capability.cuda_missing() and "ptxops[cu13]" in capability.cuda_missing()


def test_init_under_torchrun_without_a_driver_raises_one_error(cuda_build: pytest.MonkeyPatch) -> None:
    """Before any process group or device is touched (they are what dumped 40 lines per rank)."""
    if context.current() is not None or torch.distributed.is_initialized():
        pytest.skip("a context or process group is already open")
    cuda_build.setenv("WORLD_SIZE", "2")
    cuda_build.setattr(capability.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    touched = []
    cuda_build.setattr(bootstrap.dist, "init_process_group", lambda *a, **k: touched.append("pg"))
    cuda_build.setattr(torch.cuda, "set_device", lambda *a: touched.append("device"))
    with pytest.raises(CollectiveError) as err:
        bootstrap.init()
    assert str(err.value) == "collectives.init needs a GPU: no NVIDIA driver: libcuda.so.1 cannot be loaded"
    assert touched == []


@pytest.mark.parametrize(("module", "package", "extra"), [
    ("collectives.testing", "torch", "ptxops[torch]"),
    ("collectives.device", "cutlass", "ptxops[dsl]"),
])
def test_importing_a_module_without_its_package_names_the_extra(module: str, package: str, extra: str) -> None:
    proc = python(f"import sys\nsys.modules[{package!r}] = None\nimport {module}")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"collectives.errors.MissingDependency: {module} needs "), proc.stderr
    assert f"'{extra}'" in last and "During handling" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 5, proc.stderr  # the import's traceback, then the sentence


def test_the_command_line_help_works_without_cutedsl() -> None:
    proc = python("import sys\nsys.modules['cutlass'] = None\nfrom collectives.__main__ import main\n"
                  "main(['ptx', '--help'])")
    assert proc.returncode == 0 and "--collective" in proc.stdout and "where CuTeDSL is installed" in proc.stdout, \
        proc.stderr


def test_testing_is_an_attribute_of_the_package() -> None:
    proc = python("import collectives\nprint(collectives.testing.run_world.__name__)")
    assert proc.returncode == 0 and proc.stdout.strip() == "run_world", proc.stderr


@pytest.fixture
def no_driver(cuda_build: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    cuda_build.setattr(capability.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    return cuda_build


def test_a_world_without_a_gpu_says_so_in_one_sentence(no_driver: pytest.MonkeyPatch) -> None:
    from collectives.testing import World, run_world

    for start in (lambda: run_world(2, lambda rank: rank), lambda: World(2)):
        with pytest.raises(CollectiveError) as err:
            start()
        assert str(err.value) == "a one-GPU world needs a CUDA GPU: no NVIDIA driver: libcuda.so.1 cannot be loaded"
        assert err.value.__cause__ is None and err.value.__context__ is None


def test_the_world_bench_without_a_gpu_says_so_in_one_line(no_driver: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from collectives.tools import bench

    assert bench.main(["--world", "2"]) == 2
    assert capsys.readouterr().err == ("python -m collectives.tools.bench --world 2: needs a CUDA GPU: "
                                       "no NVIDIA driver: libcuda.so.1 cannot be loaded\n")


def test_init_outside_torchrun_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    if context.current() is not None or torch.distributed.is_initialized():
        pytest.skip("a context or process group is already open")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(CollectiveError, match=r"not a torchrun launch: launch one process per GPU, e\.g\. "
                                              r"torchrun --nproc-per-node=2 your_script\.py"):
        bootstrap.init()
