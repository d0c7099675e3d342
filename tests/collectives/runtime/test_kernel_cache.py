"""The compiled-kernel cache and ``python -m collectives ptx`` share one compile
(:func:`collectives.runtime.kernels.compile_kernel`), a key compiles once per process whichever
communicator or thread asks, each communicator's cache refuses multimem PTX on a context
without NVLink multicast, and a kernel handed out for a GPU has been loaded onto it once, its
occupancy measured then (no GPU: the compile and the load are faked, except where the
placeholder arguments of the load are checked against compiled launchers; test_kernel_loading
on a GPU)."""

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
    """Compiles faked (recorded), and the load's two steps: the throwaway-capture call and the
    occupancy probe (recorded in ``loads``)."""
    calls: list[tuple] = []

    def compile_kernel(key, target, *, ptx_only=False):  # (the PTX alone or a launchable kernel: one build)
        calls.append((key, target))
        time.sleep(0.01)  # a compile takes a while: other threads ask meanwhile
        return SimpleNamespace(__ptx__=text, __tvm_ffi_object__=lambda: ("launch", key, target))

    monkeypatch.setattr(kernels, "compile_kernel", compile_kernel)
    monkeypatch.setattr(kernels, "_COMPILED", {})  # the process-wide store, empty for this test
    monkeypatch.setattr(kernels, "_LOADED", set())
    monkeypatch.setattr(kernels, "_OCCUPANCY", {})
    monkeypatch.setattr(kernels, "_call_in_throwaway_capture",
                        lambda fn, key, device: loads.append(("call", fn, key, device)))
    monkeypatch.setattr(kernels, "_measure",
                        lambda kernel, key, target, device: loads.append(("measure", key, device)) or f"occ {key}")
    return calls


loads: list[tuple] = []


@pytest.fixture(autouse=True)
def _no_loads():
    loads.clear()


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


def test_a_kernel_handed_out_for_a_gpu_was_loaded_there_once_with_its_occupancy(monkeypatch) -> None:
    _fake_compile(monkeypatch, "st.global.u32")
    mine, another_ranks = kernels.KernelCache("peer"), kernels.KernelCache("peer")
    fn = mine.get(KEY, "sm_90a", 0)
    assert loads == [("call", fn, KEY, 0), ("measure", KEY, 0)]
    for _ in range(2):
        mine.get(KEY, "sm_90a", 0)
        another_ranks.get(KEY, "sm_90a", 0)
    assert kernels.occupancy(KEY, "sm_90a", 0) == f"occ {KEY}"  # measured at the load, not again
    post = mine.get("post", "sm_90a", 0)  # a stream-flag kernel: loaded, no occupancy
    another_ranks.get(KEY, "sm_90a", 1)  # (one device per communicator: its cache does not load again)
    assert loads == [("call", fn, KEY, 0), ("measure", KEY, 0), ("call", post, "post", 0)]


def test_no_load_without_a_device_and_none_of_a_refused_kernel(monkeypatch) -> None:
    _fake_compile(monkeypatch, "multimem.st.relaxed.sys.global.v4.f32 ...")
    kernels.KernelCache("multicast").get(KEY, "sm_90a")  # tools and tests: compiled only
    with pytest.raises(CollectiveError, match="no NVLink multicast"):
        kernels.KernelCache("peer").get(KEY, "sm_90a", 0)
    assert loads == []
    kernels.KernelCache("multicast").get("wait", "sm_90a", 0)
    assert [what for what, *_ in loads] == ["call"]


def test_ranks_asking_at_once_load_each_kernel_once(monkeypatch) -> None:
    _fake_compile(monkeypatch, "st.global.u32")
    caches = [kernels.KernelCache("peer") for _ in range(8)]
    start = threading.Barrier(len(caches))

    def rank(r: int) -> None:
        start.wait()
        for key in (KEY, "post", KEY):
            caches[r].get(key, "sm_90a", 0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(caches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted((what, str(key)) for what, *rest in loads for key in rest[-2:-1]) == sorted(
        [("call", str(KEY)), ("measure", str(KEY)), ("call", "post")])


@pytest.mark.parametrize("key", ["post", KernelKey("all_reduce", "one_shot", "peer", "f32", 2),
                                 "all_to_all"], ids=["flags", "collective", "all_to_all"])
def test_the_loads_placeholder_arguments_fit_the_compiled_launcher(key) -> None:
    """The throwaway call passes one placeholder per runtime argument, then the stream: as many
    as the TVM-FFI function takes (a call with none names the count; no GPU needed)."""
    pytest.importorskip("cutlass")
    import re

    from collectives.algorithms.all_to_all import AllToAllKey

    if key == "all_to_all":
        key = AllToAllKey("bf16", 2)
    fn = kernels.compile_kernel(key, "sm_90a").__tvm_ffi_object__()
    with pytest.raises(TypeError, match="Expects") as raised:
        fn()
    assert int(re.search(r"Expects (\d+) parameters", str(raised.value)).group(1)) == len(kernels.example_arguments(key))
