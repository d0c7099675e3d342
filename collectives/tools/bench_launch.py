"""Host cost of one kernel launch: CuTeDSL's TVM-FFI call vs ``cuLaunchKernel`` with
pre-packed parameters (the floor of any eager collective call), a torch op for scale, four
launches against one replay of a CUDA graph of them (:func:`grouped`), and the forms of making
a tensor that an eager call can take (an allocation, a view: the MoE layer's).

    python -m collectives.tools.bench_launch        # one GPU

Launches a kernel with the collectives' launch signature (11 parameters) that does nothing.
"""

from __future__ import annotations

import ctypes
import re
import tempfile
import time
from collections.abc import Callable

import cutlass.cute as cute
import torch
from cuda.bindings import driver
from cutlass import Int32, Int64
from cutlass.base_dsl.compiler import DumpDir


#: Placeholder launch arguments (addresses and counts, the block count, the stream).
ARGS = (*[Int64(0)] * 9, Int32(0), Int64(0), Int32(1), driver.CUstream(0))


@cute.kernel
def _idle(a: Int64, b: Int64, c: Int64, d: Int64, e: Int64, f: Int64, g: Int64, h: Int64, i: Int64,
          j: Int32, k: Int64):
    if cute.arch.thread_idx()[0] == 1024:  # never: blocks have 256 threads
        cute.printf("unreachable")


@cute.jit
def _launch(a: Int64, b: Int64, c: Int64, d: Int64, e: Int64, f: Int64, g: Int64, h: Int64, i: Int64,
            j: Int32, k: Int64, blocks: Int32, stream: driver.CUstream):
    _idle(a, b, c, d, e, f, g, h, i, j, k).launch(grid=[blocks, 1, 1], block=[256, 1, 1], stream=stream)


def idle_cubin(arch: str) -> bytes:
    """The idle kernel's cubin for ``arch`` (CuTeDSL writes the file into a temporary directory)."""
    with tempfile.TemporaryDirectory() as dump:
        return cute.compile[cute.GPUArch(arch), cute.KeepCUBIN, DumpDir(dump)](_launch, *ARGS).__cubin__


def host_us(fn: Callable[[], object], n: int = 20000) -> float:
    """Host microseconds per call of ``fn`` (after warm-up; the GPU drains afterwards)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / n


def main() -> None:
    from ..runtime.kernels import compile_target

    torch.zeros(1, device="cuda")
    arch = compile_target()
    fn = cute.compile[cute.GPUArch(arch)](_launch, *ARGS, options="--enable-tvm-ffi").__tvm_ffi_object__()
    cubin = idle_cubin(arch)
    _, module = driver.cuModuleLoadData(cubin)
    _, kernel = driver.cuModuleGetFunction(module, re.search(rb"kernel_cutlass__idle\w*", cubin).group(0))
    values = [ctypes.c_uint64(v) for v in range(1, 10)] + [ctypes.c_uint32(10), ctypes.c_uint64(11)]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.zeros(1, device="cuda")
    print(f"{torch.cuda.get_device_name()}: host microseconds per launch")
    print(f"  CuTeDSL TVM-FFI call        {host_us(lambda: fn(*range(1, 12), 1, stream)):.2f}")
    print(f"  cuLaunchKernel, pre-packed  "
          f"{host_us(lambda: driver.cuLaunchKernel(kernel, 1, 1, 1, 256, 1, 1, 0, stream, ctypes.addressof(params), 0)):.2f}")
    print(f"  torch x.add_(1)             {host_us(lambda: x.add_(1)):.2f}")
    print(f"host microseconds per {GROUP} launches (an eager MoE dispatch launches 4 kernels)")
    for name, us in grouped(lambda s: fn(*range(1, 12), 1, s)):
        print(f"  {name:40s} {us:6.2f}")
    print("host microseconds per tensor made (two rounds: a host's speed drifts)")
    for _ in range(2):
        for name, us in tensor_forms():
            print(f"  {name:40s} {us:6.2f}")


#: Kernels a group launches (:func:`grouped`): an eager MoE dispatch's.
GROUP = 4


def grouped(launch: Callable[[int], object], n: int = 5000) -> list[tuple[str, float]]:
    """Host microseconds of :data:`GROUP` launches of ``launch(stream)`` back to back, against one
    replay of a CUDA graph captured from the same launches (what an eager call would pay if it
    replayed a graph of its kernels instead of launching each)."""
    stream = torch.cuda.current_stream()
    graph, capture = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    capture.wait_stream(stream)
    with torch.cuda.graph(graph, stream=capture):
        for _ in range(GROUP):
            launch(capture.cuda_stream)
    stream.wait_stream(capture)
    torch.cuda.synchronize()

    def each() -> None:
        for _ in range(GROUP):
            launch(stream.cuda_stream)

    return [(f"{GROUP} launches", host_us(each, n)), (f"a CUDA graph of {GROUP}: replay()", host_us(graph.replay, n))]


def tensor_forms(n: int = 20000) -> list[tuple[str, float]]:
    """Host microseconds of each way to make an MoE dispatch's tensors on the current GPU: its
    rows' allocation ([128, 2, 7168] bf16: top-8 of 256 experts, 1 token, 2 ranks), its small
    outputs' (600 int64 words) and the counts' view of them."""
    device = torch.device("cuda", torch.cuda.current_device())
    shape, strides = (128, 2, 7168), (2 * 7168, 7168, 1)
    words = torch.empty(600, dtype=torch.int64, device=device)
    forms = {
        "torch.empty(shape, dtype, device)": lambda: torch.empty(shape, dtype=torch.bfloat16, device=device),
        "torch.empty_strided(shape, strides, ...)": lambda: torch.empty_strided(shape, strides, dtype=torch.bfloat16,
                                                                                device=device),
        "torch.empty(600 int64 words)": lambda: torch.empty(600, dtype=torch.int64, device=device),
        "torch.empty_strided((600,), (1,), int64)": lambda: torch.empty_strided((600,), (1,), dtype=torch.int64,
                                                                                device=device),
        "words.as_strided((2, 64), (64, 1), 8)": lambda: words.as_strided((2, 64), (64, 1), 8),
        "torch.as_strided(words, ...)": lambda: torch.as_strided(words, (2, 64), (64, 1), 8),
    }
    return [(name, host_us(fn, n)) for name, fn in forms.items()]


if __name__ == "__main__":
    main()
