"""Compiling with KeepPTX / KeepCUBIN leaves no files behind: every test and tool that keeps PTX
or a cubin has CuTeDSL write it into a temporary directory.  Without one CuTeDSL writes into the
directory the process started in (the repository root, where pytest and the tools run)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cutlass")
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from tests.support.cute_support import compile_ptx, global_tensor  # noqa: E402

import ptxops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _artifacts(*dirs: Path) -> set[tuple[Path, int]]:
    """The PTX and cubin files in ``dirs``, with their modification times."""
    return {(p, p.stat().st_mtime_ns) for d in dirs for pattern in ("*.ptx", "*.cubin") for p in d.glob(pattern)}


@cute.kernel
def _store(x: cute.Tensor):
    ptxops.st(x.iterator + cute.arch.thread_idx()[0], cutlass.Int32(0))


@cute.jit
def _launch(x: cute.Tensor):
    _store(x).launch(grid=[1, 1, 1], block=[32, 1, 1])


def test_kept_ptx_goes_to_temporary_directories() -> None:
    from collectives.algorithms import KernelKey
    from collectives.runtime.kernels import kernel_ptx

    before = _artifacts(ROOT, Path.cwd())
    assert "st.global" in compile_ptx(_launch, global_tensor())
    assert ".version" in kernel_ptx(KernelKey("barrier", "one_shot", "peer", "bf16", 2))
    assert _artifacts(ROOT, Path.cwd()) == before


def test_kept_cubin_goes_to_a_temporary_directory() -> None:
    pytest.importorskip("torch")  # the launch benchmark is a torch program
    from collectives.tools.bench_launch import idle_cubin

    before = _artifacts(ROOT, Path.cwd())
    assert idle_cubin("sm_90a")
    assert _artifacts(ROOT, Path.cwd()) == before
