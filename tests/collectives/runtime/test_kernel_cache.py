"""The compiled-kernel cache and ``python -m collectives ptx`` share one compile
(:func:`collectives.runtime.kernels.compile_kernel`), a key compiles once per process whichever
communicator or thread asks, and each communicator's cache refuses multimem PTX on a context
without NVLink multicast (no GPU: the compile is faked; test_collectives_compile compiles)."""

from __future__ import annotations

import threading
import time
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
        time.sleep(0.01)  # a compile takes a while: other threads ask meanwhile
        return SimpleNamespace(__ptx__=text, __tvm_ffi_object__=lambda: ("launch", key, target))

    monkeypatch.setattr(kernels, "compile_kernel", compile_kernel)
    monkeypatch.setattr(kernels, "_COMPILED", {})  # the process-wide store, empty for this test
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


def test_a_key_compiles_once_per_process_whichever_communicator_or_thread_asks(monkeypatch) -> None:
    """Eight ranks' caches (threads of a one-GPU world) ask for the same keys at once: one
    compile per key, every cache gets the same function."""
    calls = _fake_compile(monkeypatch, "st.global.u32")
    caches = [kernels.KernelCache("peer") for _ in range(8)]
    got: list[list] = [[] for _ in caches]
    start = threading.Barrier(len(caches))

    def rank(r: int) -> None:
        start.wait()
        for key in (KEY, "post", KEY, "wait"):
            got[r].append(caches[r].get(key, "sm_90a"))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(caches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(calls, key=str) == sorted([(KEY, "sm_90a"), ("post", "sm_90a"), ("wait", "sm_90a")], key=str)
    assert all(g == got[0] for g in got) and len(got[0]) == 4
