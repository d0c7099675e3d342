"""The direct launch (issue 50): a plan whose kernel has a
:class:`~collectives.runtime.kernels.DirectLaunch` launches it through ``cuLaunchKernelEx`` with
its arguments packed once, and that launch is the TVM-FFI function's: the same values, each at
the width the kernel reads, in the kernel's order, the same grid, block and stream.  The
function, block and shared memory come from the TVM-FFI function's own launch, recorded at the
kernel's load on the GPU and checked there against probe values (``tests/collectives/gpu``
runs every collective through it)."""

from __future__ import annotations

import ctypes
import re

import pytest

torch = pytest.importorskip("torch")
driver = pytest.importorskip("cuda.bindings.driver")

from collectives.device.kernel_args import COLLECTIVE  # noqa: E402
from collectives.device.launch import example_arguments  # noqa: E402
from collectives.runtime.kernels import DirectLaunch, pack, probe_values, widths  # noqa: E402
from tests.support.fake_comm import FakeComm, FakeHeap, FakeTensor, install  # noqa: E402

#: The collective layout's widths and the grid's (the TVM-FFI function's arguments but the stream).
SIZES = widths(example_arguments()[:-1])


def read(address: int, sizes: tuple[int, ...]) -> list[int]:
    """The values a kernel reads from ``cuLaunchKernelEx``'s ``kernelParams`` at ``address``,
    each at its width (signed, as the kernel's int32 and int64)."""
    pointers = (ctypes.c_void_p * len(sizes)).from_address(address)
    return [(ctypes.c_int32 if w == 4 else ctypes.c_int64).from_address(p).value for p, w in zip(pointers, sizes)]


def test_pack_lays_each_value_at_its_width_in_order() -> None:
    values = [(1 << 47) + 5, -3, 7, (1 << 32) + 9]
    sizes = (8, 4, 8, 4)
    buffer = pack(values, sizes)
    assert read(ctypes.addressof(buffer) + 8 * len(values), sizes) == [(1 << 47) + 5, -3, 7, 9]  # (int32: low bits)


def test_probe_values_differ_at_every_place_and_width() -> None:
    from collectives.runtime import kernels

    probe = probe_values(example_arguments()[:-1])
    assert probe[-1] == kernels.PROBE_GRID and len(set(probe)) == len(probe) == len(SIZES)
    assert all((v >> 32) != 0 for v, w in zip(probe, SIZES) if w == 8)  # an int64 read as int32 differs


@pytest.mark.parametrize("pdl", [False, True])
def test_the_kernel_reads_the_arguments_a_direct_launch_packs(pdl: bool) -> None:
    """The compiled kernel's parameters are the collective layout's, each of the width
    :func:`~collectives.runtime.kernels.widths` packs (the PTX entry's, and the TVM-FFI
    function's signature: then the grid and the stream), its block is the key's, and it waits
    on the kernel before it (what the direct launch's programmatic serialization follows) iff
    it was built to launch with it."""
    from collectives.algorithms.key import KernelKey
    from collectives.runtime.kernels import compile_kernel

    key = KernelKey("all_reduce", "one_shot", "peer", "bf16", 2, pdl=pdl)
    kernel = compile_kernel(key, "sm_90a")
    ptx = kernel.__ptx__
    entry = ptx[ptx.index(".entry"):ptx.index("{", ptx.index(".entry"))]
    assert [int(b) // 8 for b in re.findall(r"\.param \.[usb](\d+)", entry)] == list(SIZES[:-1])
    assert re.search(r"\.reqntid (\d+)", entry).group(1) == str(key.threads)
    host = re.search(r"llvm\.func @cutlass_launch\w*\(([^)]*)\)", str(kernel.ir_module)).group(1)
    assert [int(t) // 8 for t in re.findall(r": i(\d+)", host)] == list(SIZES)
    assert ("griddepcontrol.wait" in ptx) == pdl


CALLS = [("all_reduce", a) for a in ("one_shot", "two_shot", "lamport", "auto")] + \
        [("reduce_scatter", a) for a in ("one_shot", "lamport")] + [("all_gather", "one_shot"), ("barrier", None)]


@pytest.mark.parametrize(("collective", "algorithm"), CALLS)
@pytest.mark.parametrize("capturing", [False, True])
def test_a_direct_launch_launches_what_the_tvm_ffi_function_launches(monkeypatch, collective: str,
                                                                    algorithm: str | None, capturing: bool) -> None:
    """The same calls (twice on the same tensors: a plan of two argument sets alternates; then
    on moved tensors) on a communicator whose kernels launch through their TVM-FFI functions
    and on one whose kernels have a DirectLaunch: the same kernels, arguments, grids, block,
    shared memory and streams."""
    import collectives as api
    from collectives.algorithms import plan as plan_module

    comm = FakeComm(FakeHeap(world_size=4))
    install(monkeypatch, comm, [capturing])
    monkeypatch.setattr(plan_module, "current_stream", lambda device: 0x57)
    seen: list[tuple] = []
    direct: list = []  # (the launches through cuLaunchKernelEx)
    monkeypatch.setattr(comm, "kernel", lambda key: lambda *args: seen.append((key, args[:-1], args[-1])))

    def launch(config, function, params, extra):
        attrs = [(a.id, a.value.programmaticStreamSerializationAllowed) for a in config.attrs]
        assert (config.blockDimX, config.blockDimY, config.blockDimZ, config.sharedMemBytes, extra) == (512, 1, 1, 4, 0)
        assert attrs == [(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)]
        assert (config.gridDimY, config.gridDimZ) == (1, 1)
        seen.append((function[1], tuple(read(params, SIZES[:-1])) + (config.gridDimX,), int(config.hStream)))
        direct.append(function[1])
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuLaunchKernelEx", launch)

    def run() -> list[tuple]:
        """The calls from turn 0 and no plan: twice on the same tensors (a plan of two argument
        sets alternates), then on moved ones."""
        seen.clear()
        comm.plans.clear()
        comm.turn = 0
        n = 4096
        for base in (1 << 40, 1 << 40, 2 << 40):
            block, whole = FakeTensor(base, n), FakeTensor(base + (1 << 30), n * 4)
            if collective == "all_reduce":
                api.all_reduce(block, algorithm=algorithm)
            elif collective == "reduce_scatter":
                api.reduce_scatter(block, whole, algorithm=algorithm)
            elif collective == "all_gather":
                api.all_gather(whole, block, algorithm=algorithm)
            else:
                api.barrier()
        return list(seen)

    run()  # (first-call work: the Lamport buffers' first clearing, staging grown)
    # (the values as the kernel reads them: int32 arguments signed)
    tvm = [(key, tuple(v if w == 8 else ctypes.c_int32(v).value for v, w in zip(args, SIZES)), stream)
           for key, args, stream in run()]
    monkeypatch.setattr(comm, "direct_launch", lambda key: DirectLaunch(("fn", key), (512, 1, 1), 4, True, SIZES[:-1]))
    assert len(tvm) >= 3 and not direct
    assert run() == tvm and len(direct) == len(tvm)


def test_a_failed_direct_launch_raises(monkeypatch) -> None:
    from collectives.errors import CollectiveError

    monkeypatch.setattr(driver, "cuLaunchKernelEx", lambda *args: (driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    launch = DirectLaunch("fn", (128, 1, 1), 0, False, SIZES[:-1]).bind(tuple(range(len(SIZES))))
    with pytest.raises(CollectiveError, match="cuLaunchKernelEx failed"):
        launch(0)
    assert len(COLLECTIVE.args) == len(SIZES) - 1


@pytest.mark.parametrize("fault", [None, "grid", "order", "width", "nodes", "no function"])
def test_the_load_takes_a_direct_launch_only_from_a_recorded_launch_of_the_probe(monkeypatch,
                                                                                 fault: str | None) -> None:
    """:func:`~collectives.runtime.kernels._recorded_launch` on a (faked) captured graph: the
    TVM-FFI function's recorded kernel node gives the DirectLaunch where the node's grid is the
    probe's and its parameters are the probe's values in order, each at its width; anything
    else (a fixed grid, arguments moved or of another width, no single kernel node, no
    function) leaves the kernel to its TVM-FFI function."""
    from collectives.runtime import kernels

    values = example_arguments()[:-1]
    probe = probe_values(values)
    recorded = list(probe[:-1])
    sizes = list(SIZES[:-1])
    if fault == "order":
        recorded[2], recorded[3] = recorded[3], recorded[2]
    if fault == "width":
        sizes[0] = 4
    buffer = pack(recorded, tuple(sizes))
    node = driver.CUDA_KERNEL_NODE_PARAMS()
    node.gridDimX, node.gridDimY, node.gridDimZ = (7 if fault == "grid" else probe[-1]), 1, 1
    node.blockDimX, node.blockDimY, node.blockDimZ = 256, 1, 1
    node.sharedMemBytes = 4
    node.kernelParams = ctypes.addressof(buffer) + 8 * len(recorded)
    node.func = driver.CUfunction(0 if fault == "no function" else 0x1234)
    count = 2 if fault == "nodes" else 1
    monkeypatch.setattr(driver, "cuGraphGetNodes", lambda graph, n=0: (0, ["node"] * n, count))
    monkeypatch.setattr(driver, "cuGraphNodeGetType",
                        lambda n: (0, driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL))
    monkeypatch.setattr(driver, "cuGraphKernelNodeGetParams", lambda n: (0, node))
    got = kernels._recorded_launch("graph", probe, SIZES, "griddepcontrol.wait;")
    if fault is None:
        assert got == DirectLaunch(node.func, (256, 1, 1), 4, True, SIZES[:-1])
        assert int(got.function) == 0x1234
    else:
        assert got is None


@pytest.mark.parametrize("on", [False, True])
def test_plans_take_a_direct_launch_only_where_config_says(monkeypatch, on: bool) -> None:
    from collectives import config
    from collectives.runtime import communicator as communicator_module
    from collectives.runtime.communicator import Communicator

    comm = object.__new__(Communicator)
    comm.kernels = type("Kernels", (), {"direct": lambda self, key, target, device: ("direct", key)})()
    monkeypatch.setattr(Communicator, "device_index", property(lambda self: 0))
    monkeypatch.setattr(communicator_module, "compile_target", lambda device: "sm_90a")
    monkeypatch.setattr(config, "DIRECT_LAUNCH", on)
    assert comm.direct_launch("key") == (("direct", "key") if on else None)
