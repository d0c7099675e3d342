"""GPU tests of ``elect.sync``, ``membar`` and ``griddepcontrol`` on one GPU.

Run: ``python -m pytest -q -m gpu tests/ptxops/gpu/one_gpu/test_control.py`` (skipped without a GPU); the
kernels also compile on CPU here (the test without the ``gpu`` mark).

* ``elect_sync``: WARPS warps elect a leader over the whole warp and, in the odd lanes only,
  over the odd-lane mask: exactly one leader per warp and mask, every lane reports the same
  lane, that lane is the leader's own and inside the mask.
* ``membar``: message passing between two CTAs, ROUNDS rounds in one launch: the writer stores
  a weak payload, ``membar.gl``, then a relaxed flag; the reader polls the flag (bounded by a
  globaltimer deadline), ``membar.gl``, and reads the payload: no stale word, no timeout.
* ``griddepcontrol``: a producer kernel calls ``griddepcontrol_launch_dependents`` first, then
  sleeps and writes its output; the consumer, launched with programmatic dependent launch
  (``use_pdl=True``), calls ``griddepcontrol_wait`` before it reads that output: it sees every
  word (without the wait it would start while the producer still sleeps).
"""

from __future__ import annotations

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

from cutlass import Int32  # noqa: E402
from tests.support.cute_support import compile_ptx, global_tensor, opcodes  # noqa: E402
from tests.support.gpu_support import compile_for_device, current_stream, spin_until  # noqa: E402

import ptxops  # noqa: E402

WARPS = 8
#: Int32 slots per thread in the election output: leader (0/1) and lane, for the full mask
#: and for the odd-lane mask (-1 in even lanes).
ELECT_SLOTS = 4
ODD_LANES = 0xAAAAAAAA
#: Payload words and rounds of the membar message passing; flag and status words after them.
WORDS = 8
ROUNDS = 64
#: Per-launch budget of every wait (ns of %globaltimer).
BUDGET_NS = 2_000_000_000
#: PDL: blocks x threads words; the producer sleeps this long (ns, in 1 us naps) before writing.
PDL_BLOCKS, PDL_THREADS = 8, 128
PDL_SLEEP_NS = 200_000


def make_elect_launcher():
    @cute.kernel
    def kernel(out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        row = out.iterator + tidx * ELECT_SLOTS
        leader, elected = ptxops.elect_sync()
        ptxops.st(row, Int32(leader))
        ptxops.st(row + 1, elected)
        ptxops.st(row + 2, Int32(-1))
        ptxops.st(row + 3, Int32(-1))
        if lane % 2 == 1:
            odd_leader, odd_elected = ptxops.elect_sync(ODD_LANES)
            ptxops.st(row + 2, Int32(odd_leader))
            ptxops.st(row + 3, odd_elected)

    @cute.jit
    def launch(out: cute.Tensor, stream):
        kernel(out).launch(grid=[1, 1, 1], block=[32 * WARPS, 1, 1], stream=stream)

    return launch


def make_membar_launcher():
    """Block 0 writes ROUNDS messages, block 1 reads them.  Words: the payload (WORDS), the
    flag, the reader's ack, then per round the words read (WORDS) and a timeout count."""

    @cute.kernel
    def kernel(buf: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        payload, flag, ack = buf.iterator, buf.iterator + WORDS, buf.iterator + WORDS + 1
        seen = buf.iterator + WORDS + 2
        deadline = cute.arch.globaltimer() + BUDGET_NS
        timeouts = Int32(0)
        if tidx == 0:
            for r in cutlass.range(ROUNDS):
                if bidx == 0:
                    timeouts += spin_until(ack, r, deadline, False, "gpu")
                    ptxops.membar("gl")
                    for k in cutlass.range_constexpr(WORDS):
                        ptxops.st(payload + k, r * WORDS + k)
                    ptxops.membar("gl")
                    ptxops.st(flag, r + 1, sem="relaxed", scope="gpu")
                else:
                    timeouts += spin_until(flag, r + 1, deadline, False, "gpu")
                    ptxops.membar("gl")
                    for k in cutlass.range_constexpr(WORDS):
                        ptxops.st(seen + r * WORDS + k, ptxops.ld(payload + k))
                    ptxops.membar("sys")
                    ptxops.st(ack, r + 1, sem="relaxed", scope="gpu")
            ptxops.atom_add(seen + ROUNDS * WORDS, timeouts)

    @cute.jit
    def launch(buf: cute.Tensor, stream):
        kernel(buf).launch(grid=[2, 1, 1], block=[32, 1, 1], stream=stream)

    return launch


MEMBAR_WORDS = WORDS + 2 + ROUNDS * WORDS + 1


def make_pdl_launcher():
    @cute.kernel
    def producer(data: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        ptxops.griddepcontrol_launch_dependents()
        for _ in cutlass.range(PDL_SLEEP_NS // 1000):
            ptxops.nanosleep(1000)
        i = bidx * PDL_THREADS + tidx
        ptxops.st(data.iterator + i, i * 3 + 1)

    @cute.kernel
    def consumer(data: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * PDL_THREADS + tidx
        ptxops.griddepcontrol_wait()
        ptxops.st(out.iterator + i, ptxops.ld(data.iterator + i) + 1)

    @cute.jit
    def launch(data: cute.Tensor, out: cute.Tensor, stream):
        producer(data).launch(grid=[PDL_BLOCKS, 1, 1], block=[PDL_THREADS, 1, 1], stream=stream)
        consumer(data, out).launch(
            grid=[PDL_BLOCKS, 1, 1], block=[PDL_THREADS, 1, 1], stream=stream, use_pdl=True
        )

    return launch


def _stream_arg():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(0)


def test_kernels_compile_for_hopper() -> None:
    table = global_tensor(n=32 * WARPS * ELECT_SLOTS)
    elect = opcodes(compile_ptx(make_elect_launcher(), table, _stream_arg()))
    assert elect["elect.sync"] == 2
    membar = opcodes(compile_ptx(make_membar_launcher(), global_tensor(n=MEMBAR_WORDS), _stream_arg()))
    assert membar["membar.gl"] == 3 and membar["membar.sys"] == 1
    n = PDL_BLOCKS * PDL_THREADS
    pdl = compile_ptx(make_pdl_launcher(), global_tensor(n=n), global_tensor(n=n), _stream_arg())
    found = opcodes(pdl)
    assert found["griddepcontrol.launch_dependents"] == 1 and found["griddepcontrol.wait"] == 1


def elect_failures(rows: list[list[int]]) -> list[str]:
    """What is wrong with an election table (one row per thread: leader, lane, odd leader,
    odd lane): per warp exactly one leader per mask, one elected lane that is the leader's own
    (and odd for the odd-lane mask)."""
    bad = []
    for w in range(len(rows) // 32):
        warp = rows[32 * w : 32 * w + 32]
        for col, lanes in ((0, range(32)), (2, range(1, 32, 2))):
            leaders = [lane for lane in lanes if warp[lane][col] == 1]
            elected = {warp[lane][col + 1] for lane in lanes}
            if len(leaders) != 1 or elected != set(leaders) or leaders[0] not in lanes:
                bad.append(f"warp {w} mask {col // 2}: leaders {leaders}, lanes reported {sorted(elected)}")
    return bad


def test_elect_checks_reject_a_wrong_table() -> None:
    good = [[int(lane == 3), 3, int(lane == 5), 5 if lane % 2 else -1] for lane in range(32)]
    assert elect_failures(good) == []
    two = [row[:] for row in good]
    two[7][0] = 1
    assert len(elect_failures(two)) == 1
    disagree = [row[:] for row in good]
    disagree[9][3] = 7
    assert len(elect_failures(disagree)) == 1


@pytest.mark.gpu
def test_elect_sync_one_leader_per_warp() -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    out = torch.full((32 * WARPS * ELECT_SLOTS,), -2, dtype=torch.int32, device="cuda")
    arg = from_dlpack(out, assumed_align=16)
    compile_for_device(make_elect_launcher(), arg, current_stream())(arg, current_stream())
    torch.cuda.synchronize()
    rows = out.view(32 * WARPS, ELECT_SLOTS).cpu().tolist()
    assert elect_failures(rows) == []


@pytest.mark.gpu
def test_membar_orders_message_passing() -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    buf = torch.zeros(MEMBAR_WORDS, dtype=torch.int32, device="cuda")
    arg = from_dlpack(buf, assumed_align=16)
    compile_for_device(make_membar_launcher(), arg, current_stream())(arg, current_stream())
    torch.cuda.synchronize()
    host = buf.cpu()
    assert host[-1] == 0, f"{int(host[-1])} waits timed out"
    seen = host[WORDS + 2 : WORDS + 2 + ROUNDS * WORDS]
    assert torch.equal(seen, torch.arange(ROUNDS * WORDS, dtype=torch.int32))


@pytest.mark.gpu
def test_griddepcontrol_dependent_sees_the_producers_writes() -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    n = PDL_BLOCKS * PDL_THREADS
    data = torch.zeros(n, dtype=torch.int32, device="cuda")
    out = torch.zeros(n, dtype=torch.int32, device="cuda")
    args = (from_dlpack(data, assumed_align=16), from_dlpack(out, assumed_align=16))
    compile_for_device(make_pdl_launcher(), *args, current_stream())(*args, current_stream())
    torch.cuda.synchronize()
    i = torch.arange(n, dtype=torch.int32)
    assert torch.equal(out.cpu(), i * 3 + 2)
