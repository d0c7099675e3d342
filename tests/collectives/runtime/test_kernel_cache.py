"""The compiled-kernel cache and ``python -m collectives ptx`` share one compile
(:func:`collectives.runtime.kernels.compile_kernel`), and the cache refuses multimem PTX on a context
without NVLink multicast (no GPU: the compile is faked; test_collectives_compile compiles)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from collectives.algorithms import KernelKey
from collectives.errors import CollectiveError
from collectives.runtime import kernels

KEY = KernelKey("all_reduce", "one_shot", "multicast_emulated", "bf16", 2)


def _fake_compile(monkeypatch, text: str) -> list[tuple]:
    calls: list[tuple] = []

    def compile_kernel(key, target):
        calls.append((key, target))
        return SimpleNamespace(__ptx__=text, __tvm_ffi_object__=lambda: ("launch", key, target))

    monkeypatch.setattr(kernels, "compile_kernel", compile_kernel)
    return calls


def test_the_printed_ptx_is_the_compiled_kernels(monkeypatch) -> None:
    calls = _fake_compile(monkeypatch, "// ptx of the launched kernel")
    assert kernels.kernel_ptx(KEY, "sm_100a") == "// ptx of the launched kernel"
    assert kernels.KernelCache("peer").get(KEY, "sm_100a") == ("launch", KEY, "sm_100a")
    assert calls == [(KEY, "sm_100a")] * 2


def test_a_kernel_compiles_once_per_key_and_target(monkeypatch) -> None:
    calls = _fake_compile(monkeypatch, "st.global.u32")
    cache = kernels.KernelCache("peer")
    for _ in range(3):
        cache.get(KEY, "sm_90a")
    cache.get("post", "sm_90a")
    cache.get(KEY, "sm_100a")
    assert calls == [(KEY, "sm_90a"), ("post", "sm_90a"), (KEY, "sm_100a")]


@pytest.mark.parametrize("backend", ["peer", "multicast_emulated"])
def test_multimem_ptx_is_refused_without_multicast(monkeypatch, backend: str) -> None:
    _fake_compile(monkeypatch, "multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2 ...")
    with pytest.raises(CollectiveError, match="no NVLink multicast"):
        kernels.KernelCache(backend).get(KEY, "sm_90a")
    assert kernels.KernelCache("multicast").get(KEY, "sm_90a")[0] == "launch"


def test_a_kernel_without_ptx_is_refused(monkeypatch) -> None:
    _fake_compile(monkeypatch, "")
    with pytest.raises(CollectiveError, match="no PTX"):
        kernels.KernelCache("peer").get(KEY, "sm_90a")
