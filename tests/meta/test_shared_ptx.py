"""tests/support/shared_ptx.py: a kernel key's PTX compiled once a run, whichever process asks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from collectives.runtime import kernels
from tests.support import shared_ptx


def test_a_key_and_target_compile_once_and_a_launchable_kernel_always(tmp_path, monkeypatch) -> None:
    calls: list[tuple] = []

    def compile_kernel(key, target, *, ptx_only=False):
        calls.append((key, target, ptx_only))
        return SimpleNamespace(__ptx__=f"// {key} on {target}")

    monkeypatch.setattr(kernels, "compile_kernel", compile_kernel)
    shared_ptx.install(tmp_path)
    assert kernels.kernel_ptx("post", "sm_90a") == "// post on sm_90a"
    assert kernels.kernel_ptx("post", "sm_90a") == "// post on sm_90a"  # read from the folder
    assert kernels.kernel_ptx("post", "sm_100a") == "// post on sm_100a"
    assert kernels.kernel_ptx("wait", "sm_90a") == "// wait on sm_90a"
    kernels.compile_kernel("post", "sm_90a")  # a launchable kernel: compiled, never read back
    assert calls == [("post", "sm_90a", True), ("post", "sm_100a", True), ("wait", "sm_90a", True),
                     ("post", "sm_90a", False)]
    assert len(list(tmp_path.glob("*.ptx"))) == 3 and not list(tmp_path.glob("*.part"))


def test_a_refused_compile_leaves_nothing_to_read(tmp_path, monkeypatch) -> None:
    def compile_kernel(key, target, *, ptx_only=False):
        raise ValueError(f"{key} refused")

    monkeypatch.setattr(kernels, "compile_kernel", compile_kernel)
    shared_ptx.install(tmp_path)
    for _ in range(2):
        with pytest.raises(ValueError, match="refused"):
            kernels.kernel_ptx("post", "sm_90a")
    assert not list(tmp_path.iterdir())
