"""all_gather on real GPUs (peer backend), bit-exact against the reference model.

Run under torchrun on 2 or 4 GPUs:
    torchrun --nproc-per-node 4 -m pytest -q tests/collectives/gpu/ranks/test_all_gather.py
Never launches a multimem kernel: NVLink multicast stays off (the backend resolves to peer).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.collectives.gpu.ranks.collectives_cases import TORCH, comm, device_values, values  # noqa: F401 (comm: the fixture)
from collectives.testing import capture  # noqa: E402
from tests.support.world_support import warmup_stream  # noqa: E402

from collectives import reference

pytestmark = pytest.mark.multigpu
torch = pytest.importorskip("torch")

SIZES = [1, 7, 1000, 12293, 1048579]
ALIGNED_SIZES = [16, 4096, 65536 + 16, (1 << 20) + 64]  # TMA: every block 16-byte aligned in every dtype


def gathered(world: int, n: int, dtype: str) -> torch.Tensor:
    """The bytes of every rank's input concatenated in rank order, computed on this GPU
    (as bytes: fp8 tensors have few torch ops)."""
    return torch.cat([device_values(r, n, dtype).view(torch.uint8) for r in range(world)])


def check(out: torch.Tensor, world: int, n: int, dtype: str) -> None:
    """``out`` equals the reference bit for bit (compared as bytes: -0.0 and NaN payloads too)."""
    want = reference.all_gather([reference.round_to(values(r, n), dtype) for r in range(world)])
    got = out.float().cpu().numpy()
    assert np.array_equal(got, want), (n, np.flatnonzero(got != want)[:5])
    assert torch.equal(out.view(torch.uint8), gathered(world, n, dtype)), n


def tensors(comm, n: int, dtype: str, placement: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, inp) for ``placement``: both symmetric, both plain, or both plain at an element
    offset (not 16-byte aligned)."""
    import collectives

    kind = TORCH[dtype]
    if placement == "symmetric":
        out, inp = collectives.empty(comm.world * n, kind), collectives.empty(n, kind)
    elif placement == "offset":
        out = torch.empty(comm.world * n + 1, dtype=kind, device="cuda")[1:]
        inp = torch.empty(n + 1, dtype=kind, device="cuda")[1:]
    else:
        out, inp = torch.empty(comm.world * n, dtype=kind, device="cuda"), torch.empty(n, dtype=kind, device="cuda")
    inp.copy_(device_values(comm.rank, n, dtype))
    out.view(torch.uint8).fill_(0xAB)  # garbage the gather must overwrite
    return out, inp


@pytest.mark.parametrize("placement", ["symmetric", "plain", "offset"])
@pytest.mark.parametrize("algorithm", ["one_shot", "tma", "push", "lamport", "auto"])
@pytest.mark.parametrize("dtype", list(TORCH))
def test_all_gather_matches_reference(comm, dtype: str, algorithm: str, placement: str) -> None:
    import collectives
    from collectives.config import LAMPORT_GATHER_MAX_BYTES

    if algorithm == "tma" and placement == "offset":
        out, inp = tensors(comm, 64, dtype, placement)
        with pytest.raises(collectives.CollectiveError, match="16-byte"):
            collectives.all_gather(out, inp, algorithm="tma", backend="peer")
        return
    # (auto: also an aligned size whose f32 output on 4 ranks, 16 MB, takes TMA: tuning.AG_TMA_WINDOW)
    for n in ALIGNED_SIZES if algorithm == "tma" else SIZES + ALIGNED_SIZES[-1:] if algorithm == "auto" else SIZES:
        if algorithm == "lamport" and n * TORCH[dtype].itemsize > LAMPORT_GATHER_MAX_BYTES:
            continue
        out, inp = tensors(comm, n, dtype, placement)
        before = inp.view(torch.uint8).clone()
        assert collectives.all_gather(out, inp, algorithm=algorithm, backend="peer") is out
        collectives.synchronize()
        check(out, comm.world, n, dtype)
        assert torch.equal(inp.view(torch.uint8), before), "all_gather changed its input"


#: Bit patterns of each element size an all-gather must carry: -0.0 (the -0.0 Lamport format's
#: empty lane), NaNs with payloads (quiet, signalling, negative), all ones, +0.0, and the -0.0
#: of narrower lanes.
SPECIAL_BITS = {1: [0x80, 0x7F, 0xFF, 0xFE, 0x00, 0x01],
                2: [0x8000, 0x7FC1, 0x7F81, 0xFFFF, 0xFFA5, 0x0000, 0x8080],
                4: [0x80000000, 0x7FC12345, 0x7F800001, 0xFFFFFFFF, 0xFFA5A5A5, 0x80008000, 0x80808080]}


def special_input(rank: int, n: int, dtype: str) -> torch.Tensor:
    """Rank ``rank``'s input of ``n`` elements: every other element one of :data:`SPECIAL_BITS`."""
    size = TORCH[dtype].itemsize
    unsigned, signed = {1: (np.uint8, np.uint8), 2: (np.uint16, np.int16), 4: (np.uint32, np.int32)}[size]
    bits = device_values(rank, n, dtype).cpu().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[size])
    bits = bits.numpy().view(unsigned).copy()
    specials = np.array(SPECIAL_BITS[size], dtype=unsigned)
    bits[::2] = specials[(np.arange(len(bits[::2])) + rank) % len(specials)]
    return torch.from_numpy(bits.view(signed)).to("cuda").view(TORCH[dtype])


@pytest.mark.parametrize("placement", ["symmetric", "plain", "offset"])
@pytest.mark.parametrize("dtype", list(TORCH))
def test_lamport_all_gather_delivers_every_bit(comm, dtype: str, placement: str) -> None:
    """-0.0, NaN payloads and all-ones elements arrive bit for bit from the Lamport all-gather
    (tagged words; the -0.0 format delivered a -0.0 as +0.0), by name and as ``auto`` picks it,
    eagerly and replayed from a CUDA graph."""
    import collectives

    for n in (1, 7, 1000, 4096 + 3):
        want = torch.cat([special_input(r, n, dtype).view(torch.uint8) for r in range(comm.world)])
        for algorithm in ("lamport", "auto"):
            out, inp = tensors(comm, n, dtype, placement)
            inp.copy_(special_input(comm.rank, n, dtype))
            collectives.all_gather(out, inp, algorithm=algorithm, backend="peer")
            collectives.synchronize()
            assert torch.equal(out.view(torch.uint8), want), (n, algorithm)
    out, inp = tensors(comm, 1000, dtype, placement)
    source = special_input(comm.rank, 1000, dtype)
    stream = warmup_stream()
    with torch.cuda.stream(stream):  # compile and plan outside the capture
        collectives.all_gather(out, inp, algorithm="lamport", backend="peer")
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        inp.copy_(source)
        collectives.all_gather(out, inp, algorithm="lamport", backend="peer")
    want = torch.cat([special_input(r, 1000, dtype).view(torch.uint8) for r in range(comm.world)])
    for _ in range(4):  # every buffer of the rotation
        out.view(torch.uint8).fill_(0xAB)
        graph.replay()
        collectives.synchronize()
        assert torch.equal(out.view(torch.uint8), want)


def test_in_place_input_is_a_block_of_out(comm) -> None:
    import collectives

    n = 1000
    plain = torch.empty(comm.world * n, dtype=torch.bfloat16, device="cuda")
    for out in (collectives.empty(comm.world * n, torch.bfloat16), plain):
        inp = out[comm.rank * n:(comm.rank + 1) * n]
        inp.copy_(device_values(comm.rank, n, "bf16"))
        collectives.all_gather(out, inp, backend="peer")
        collectives.synchronize()
        check(out, comm.world, n, "bf16")


def test_unaligned_block_size_refuses_tma(comm) -> None:
    import collectives

    inp = torch.ones(5, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(5 * comm.world, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(collectives.CollectiveError, match="16-byte"):
        collectives.all_gather(out, inp, algorithm="tma", backend="peer")


def test_wrong_out_is_refused(comm) -> None:
    import collectives

    inp = torch.ones(16, dtype=torch.float16, device="cuda")
    with pytest.raises(collectives.CollectiveError, match="world_size"):
        collectives.all_gather(torch.empty(16 * comm.world + 1, dtype=torch.float16, device="cuda"), inp)
    with pytest.raises(collectives.CollectiveError, match="out is"):
        collectives.all_gather(torch.empty(16 * comm.world, dtype=torch.float32, device="cuda"), inp)


def test_cuda_graph_replay_matches_eager(comm) -> None:
    import collectives

    n = 12293
    plain_in = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    plain_out = torch.empty(comm.world * n, dtype=torch.bfloat16, device="cuda")
    sym_in = collectives.empty(1 << 18, torch.float16)
    sym_out = collectives.empty(comm.world << 18, torch.float16)
    source = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    stream = warmup_stream()
    calls = [(plain_out, plain_in, "one_shot"), (sym_out, sym_in, "tma"), (sym_out, sym_in, "one_shot"),
             (plain_out, plain_in, "lamport"), (sym_out, sym_in, "lamport")]
    with torch.cuda.stream(stream):  # warm up the same calls: compile and plan outside the capture
        for out, inp, algorithm in calls:
            collectives.all_gather(out, inp, algorithm=algorithm, backend="peer")
        collectives.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        plain_in.copy_(source)
        for out, inp, algorithm in calls:
            collectives.all_gather(out, inp, algorithm=algorithm, backend="peer")
    for round_ in range(5):
        source.copy_(device_values(comm.rank + round_, n, "bf16"))
        sym_in.fill_(comm.rank + round_)
        sym_out.zero_()
        graph.replay()
        collectives.synchronize()
        want = torch.cat([device_values(r + round_, n, "bf16") for r in range(comm.world)])
        assert torch.equal(plain_out.view(torch.int16), want.view(torch.int16)), round_
        blocks = sym_out.view(comm.world, -1)
        for r in range(comm.world):
            assert torch.all(blocks[r] == r + round_), (round_, r)


@pytest.mark.parametrize("algorithm", ["one_shot", "lamport"])
def test_different_sizes_across_ranks_raise_and_the_communicator_recovers(comm, algorithm: str) -> None:
    """Recorded at once (a Lamport all-gather's buffer is cleaned on the GPU two calls later)."""
    import collectives

    n = 512 + 8 * comm.rank
    with pytest.raises(collectives.CollectiveError, match="different sizes"):
        collectives.all_gather(torch.empty(comm.world * n, device="cuda"), torch.ones(n, device="cuda"),
                               algorithm=algorithm, backend="peer")
        collectives.synchronize()
    for _ in range(3):  # every buffer of the rotation, the failed call's too
        out, inp = tensors(comm, 520, "f32", "plain")
        collectives.all_gather(out, inp, algorithm=algorithm, backend="peer")
        collectives.synchronize()
        check(out, comm.world, 520, "f32")
    out, inp = tensors(comm, 512, "f32", "plain")
    collectives.all_gather(out, inp, backend="peer")
    collectives.synchronize()
    check(out, comm.world, 512, "f32")


def test_back_to_back_calls_reuse_buffers_safely(comm) -> None:
    """Consecutive gathers through the same staging buffer, each read back only at the end:
    a rank racing ahead must not overwrite a block another rank has not yet copied out."""
    import collectives

    n = 4096 + 3
    outs = [torch.empty(comm.world * n, dtype=torch.float32, device="cuda") for _ in range(50)]
    for i, out in enumerate(outs):
        inp = torch.full((n,), float(comm.rank * 1000 + i), device="cuda")
        collectives.all_gather(out, inp, backend="peer")
    collectives.synchronize()
    for i, out in enumerate(outs):
        blocks = out.view(comm.world, n)
        for r in range(comm.world):
            assert torch.all(blocks[r] == r * 1000 + i), (i, r)
