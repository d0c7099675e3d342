"""Loading a kernel waits for every kernel running on the GPU, and the runtime loads each one
before its first launch (:func:`collectives.runtime.kernels.load`).

An unrelated kernel spins for about a second on a stream of its own while this thread does
what a rank does.  A kernel's first call, into a CUDA-graph capture or a launch, waits for the
spinner (CuTeDSL's TVM-FFI function loads its library then, ``CUDA_MODULE_LOADING=EAGER`` or
not): in a one-GPU world where the spinner is another rank's kernel waiting for this rank,
that is a deadlock until the kernel's timeout.  A kernel the runtime handed out is loaded
already: its capture, instantiation and launch do not wait.

Run: ``python -m pytest -q -m gpu tests/collectives/gpu/one_gpu/test_kernel_loading.py``."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

pytestmark = pytest.mark.gpu

SPIN_S = 1.0
#: GPU clock cycles a second (an H100: 2e9 cycles of torch.cuda._sleep took 1.01 s).
CYCLES_PER_S = 2e9
#: A wait shorter than this did not wait for the spinner.
QUICK_S = 0.25


@pytest.fixture
def spinner():
    """``spin()`` starts a kernel of about ``SPIN_S`` seconds on a stream of its own; ``ended()``
    tells whether it has finished."""
    stream = torch.cuda.Stream()

    class Spinner:
        def spin(self) -> None:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(SPIN_S * CYCLES_PER_S))
            time.sleep(0.02)

        def ended(self) -> bool:
            return stream.query()

    yield Spinner()
    stream.synchronize()


def _first_call_in_capture(fn, key, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """A graph of one call of ``fn`` (placeholder arguments: never replayed), instantiated."""
    from collectives.runtime.kernels import example_arguments

    *values, _ = example_arguments(key)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        fn(*(int(v) for v in values), stream.cuda_stream)
        graph.capture_end()
    graph.instantiate()
    return graph


def test_a_kernels_first_call_waits_for_a_running_kernel(spinner) -> None:
    """What the runtime guards against: the first call of a freshly compiled kernel."""
    from collectives.runtime.kernels import compile_kernel, compile_target

    fn = compile_kernel("post", compile_target()).__tvm_ffi_object__()
    spinner.spin()
    start = time.perf_counter()
    _first_call_in_capture(fn, "post", torch.cuda.Stream())
    waited = time.perf_counter() - start
    assert waited > SPIN_S / 2 and spinner.ended(), f"the first call took {waited:.3f}s"


@pytest.mark.parametrize("key", ["wait", "one_shot"])
def test_a_kernel_from_the_runtime_is_loaded_before_its_first_call(spinner, monkeypatch, key: str) -> None:
    from collectives.algorithms import KernelKey
    from collectives.runtime import kernels

    monkeypatch.setattr(kernels, "_COMPILED", {})  # compiled afresh: a new TVM-FFI function
    monkeypatch.setattr(kernels, "_LOADED", set())
    monkeypatch.setattr(kernels, "_OCCUPANCY", {})
    if key == "one_shot":
        key = KernelKey("all_reduce", "one_shot", "peer", "bf16", 2)
    target = kernels.compile_target()
    fn = kernels.KernelCache("peer").get(key, target, torch.cuda.current_device())
    assert (key, target, torch.cuda.current_device()) in kernels._LOADED
    if not isinstance(key, str):
        assert (key, target, torch.cuda.current_device()) in kernels._OCCUPANCY
    spinner.spin()
    start = time.perf_counter()
    graph = _first_call_in_capture(fn, key, torch.cuda.Stream())
    waited = time.perf_counter() - start
    assert waited < QUICK_S and not spinner.ended(), f"capturing a loaded kernel took {waited:.3f}s"
    del graph
