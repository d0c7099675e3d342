"""Where nothing chose a target (no ``cute.GPUArch``, no ``CUTE_DSL_ARCH``) and no GPU is visible,
CuTeDSL compiles for its default without a word; ptxops names that target once per process."""

from __future__ import annotations

import warnings

import pytest

from tests.support.cute_support import cute, cutlass, global_tensor

import ptxops
from ptxops.errors import DefaultTargetWarning
from ptxops.ops import emit


def fence_kernel():
    @cute.kernel
    def kernel(g: cute.Tensor):
        ptxops.fence(sem="acq_rel", scope="gpu")

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return launch, global_tensor(cutlass.Int32)


def compile_twice(*options) -> list[str]:
    """The DefaultTargetWarning messages of two compiles of a kernel calling a ptxops function,
    each checked to point at the kernel's line (this file), not at ptxops or CuTeDSL."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            cute.compile[options](*fence_kernel())
    found = [w for w in seen if issubclass(w.category, DefaultTargetWarning)]
    assert all(w.filename == __file__ for w in found), [w.filename for w in found]
    return [str(w.message) for w in found]


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU visible (as here; faked so that the test says the same on a GPU machine), and a
    fresh process's state: the target not yet named."""
    monkeypatch.setattr(emit, "get_compute_capability_major_minor", lambda: (None, None))
    emit._say_default_target.cache_clear()
    yield
    emit._say_default_target.cache_clear()


def test_default_target_is_named_once(no_gpu, monkeypatch):
    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    target = emit.normalise_target(emit.BaseDSL._get_dsl().get_arch_enum().name)
    (message,) = compile_twice()
    assert f"compiling for {target}" in message and "CUTE_DSL_ARCH" in message


def test_a_chosen_target_is_not_named(no_gpu, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    assert compile_twice() == []
    monkeypatch.delenv("CUTE_DSL_ARCH")
    assert compile_twice(cute.GPUArch("sm_90a")) == []


def test_a_visible_gpu_is_not_named(monkeypatch):
    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    monkeypatch.setattr(emit, "get_compute_capability_major_minor", lambda: (9, 0))
    emit._say_default_target.cache_clear()
    try:
        assert compile_twice() == []
    finally:
        emit._say_default_target.cache_clear()
