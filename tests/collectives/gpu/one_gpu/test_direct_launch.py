"""On a GPU, every collective kernel the runtime loads has a
:class:`~collectives.runtime.kernels.DirectLaunch` (its load recorded the TVM-FFI function's
launch of probe values and took it), and a plan's direct launch records the same kernel node
as the TVM-FFI function's launch of the same arguments: function, grid, block, shared memory
and every parameter's bytes.  Both launches only go into captures that are never run.

Run: ``python -m pytest -q -m gpu tests/collectives/gpu/one_gpu/test_direct_launch.py``."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

pytestmark = pytest.mark.gpu

KEYS = [("all_reduce", a, {}) for a in ("one_shot", "two_shot", "lamport", "tma")] + [
    ("all_reduce", "push", {"stage_in": True}), ("all_reduce", "one_shot", {"pdl": False}),
    ("reduce_scatter", "lamport", {}), ("all_gather", "one_shot", {}), ("barrier", "one_shot", {})]


def recorded(launch, sizes: tuple[int, ...]) -> tuple:
    """(function (else library kernel), grid, block, shared bytes, parameter bytes: ``sizes`` of
    them) of the kernel node ``launch(stream)`` records in a capture on a private stream (ended and
    destroyed: nothing runs)."""
    from cuda.bindings import driver

    stream = torch.cuda.Stream()
    mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    assert driver.cuStreamBeginCapture(stream.cuda_stream, mode)[0] == 0
    try:
        launch(stream.cuda_stream)
    finally:
        err, graph = driver.cuStreamEndCapture(stream.cuda_stream)
    assert err == 0
    try:
        _, nodes, _ = driver.cuGraphGetNodes(graph, 1)
        _, node = driver.cuGraphKernelNodeGetParams(nodes[0])
        params = [ctypes.string_at(ctypes.c_void_p.from_address(node.kernelParams + 8 * i).value, w)
                  for i, w in enumerate(sizes)]
        return (int(node.func) or int(node.kern), (node.gridDimX, node.gridDimY, node.gridDimZ),
                (node.blockDimX, node.blockDimY, node.blockDimZ), node.sharedMemBytes, params)
    finally:
        driver.cuGraphDestroy(graph)


@pytest.mark.parametrize(("collective", "algorithm", "options"), KEYS)
def test_a_loaded_kernels_direct_launch_records_what_its_tvm_ffi_function_records(collective, algorithm,
                                                                                  options) -> None:
    from collectives.algorithms.key import KernelKey
    from collectives.runtime.kernels import KernelCache, compile_target, direct_launch, example_arguments, widths

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    torch.cuda.set_device(0)
    key = KernelKey(collective, algorithm, "peer", "bf16", 2, **options)
    target = compile_target(0)
    fn = KernelCache("peer").get(key, target, 0)
    direct = direct_launch(key, target, 0)
    assert direct is not None, f"{key}: the load found no direct launch"
    assert direct.block == (key.threads, 1, 1) and direct.pdl == key.pdl
    sizes = widths(example_arguments(key)[:-2])
    args = tuple((0x7F00_0000_0000 + 64 * i) if w == 8 else i + 1 for i, w in enumerate(sizes)) + (5,)  # 5 blocks
    assert recorded(direct.bind(args), sizes) == recorded(lambda stream: fn(*args, stream), sizes)
