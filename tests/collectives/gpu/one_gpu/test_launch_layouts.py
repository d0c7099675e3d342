"""The kernel-argument layouts on one GPU: the stream-flag kernels compiled and launched through
:data:`collectives.layouts.FLAGS` (the launcher's generated signature, the kernel's
:class:`~collectives.device.kernel_args.KernelArgs`), no communicator.  A post is taken by its wait;
a wait nobody posts times out and writes the recoverable record.

Run: ``python -m pytest -q -m gpu tests/collectives/gpu/one_gpu/test_launch_layouts.py``."""

from __future__ import annotations

import pytest

from collectives.config import FLAG_SLOTS
from collectives.layouts import ERROR_FIELDS, FLAG_WAIT, RECOVERABLE_RECORD, TIMEOUT

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    from collectives.runtime.kernels import compile_kernel, compile_target

    return {kind: compile_kernel(kind, compile_target()).__tvm_ffi_object__() for kind in ("post", "wait")}


def test_posts_are_taken_and_an_unposted_wait_records_its_timeout(kernels) -> None:
    from collectives.layouts import FLAGS

    flags = torch.zeros((2, FLAG_SLOTS), dtype=torch.int32, device="cuda")
    err = torch.zeros((2, len(ERROR_FIELDS)), dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def args(index: int, timeout_ns: int) -> tuple:
        return FLAGS.pack(flags=flags.data_ptr(), consumed=flags.data_ptr() + 4 * FLAG_SLOTS, index=index,
                          err=err.data_ptr(), rank=0, timeout_ns=timeout_ns)

    for _ in range(3):
        kernels["post"](*args(3, 10**9), stream)
        kernels["wait"](*args(3, 10**9), stream)
    torch.cuda.synchronize()
    assert flags[:, 3].tolist() == [3, 3] and not err.any()
    kernels["wait"](*args(4, 10**7), stream)  # nobody posts slot 4: 10 ms, then the record
    torch.cuda.synchronize()
    assert err[RECOVERABLE_RECORD].tolist() == [TIMEOUT, FLAG_WAIT, -1, 4, 0]
    assert flags[:, 4].tolist() == [0, 0] and not err[1 - RECOVERABLE_RECORD].any()
