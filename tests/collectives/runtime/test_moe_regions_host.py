"""The two-kernel combine's host side (``COLLECTIVES_MOE_REGIONS=1``,
:func:`collectives.runtime.moe.regions_combine`) on the stubbed world of
:mod:`tests.support.host_path` (the public ``collectives.moe`` calls, kernels recorded, no GPU):
a low-latency combine launches the sending kernel, then the receiving one, and nothing else (no
gather, all-to-all or weighted sum); their arguments are the handle's fields, the layer's receive
regions and word region (seeded from the test hook's count), one ``facts`` word for both; a call
like the one before plans and allocates nothing again; regions come in powers of two.  Off (the default), the combine keeps its
three steps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tests.support import host_path  # noqa: E402

from collectives import moe  # noqa: E402
from collectives.algorithms.moe_send_back import MOE_SEND_BACK, MoeSendBackKey  # noqa: E402
from collectives.algorithms.moe_sum_back import MOE_SUM_BACK, MoeSumBackKey  # noqa: E402
from collectives.config import CALL_EPOCHS  # noqa: E402
from collectives.dtypes import DTYPES  # noqa: E402
from collectives.layouts import RegionLayout, region_facts  # noqa: E402
from collectives.runtime import moe as runtime_moe  # noqa: E402

U32 = 1 << 32


def layer_calls(monkeypatch, regions: bool, seed: int = 0) -> tuple:
    """One dispatch and two combines of :data:`host_path.MOE`'s layer; every launch recorded as
    (key, arguments)."""
    monkeypatch.setattr(runtime_moe, "REGIONS", regions)
    monkeypatch.setenv("COLLECTIVES_TEST_SEED_EPOCH", str(seed))
    launched: list = []
    with host_path.moe_world() as comm:
        class Recording:
            def has(self, key, target):
                return True

            def get(self, key, target, device=None):
                return lambda *args: launched.append((key, args))

        comm.kernels = Recording()
        m = host_path.MOE
        gen = torch.Generator().manual_seed(0)
        x = torch.randn((m["tokens"], m["hidden"]), generator=gen).bfloat16()
        ids = torch.stack([torch.randperm(m["experts"], generator=gen)[:m["topk"]] for _ in range(m["tokens"])])
        w = torch.rand((m["tokens"], m["topk"]), generator=gen)
        expert_x, _, handle = moe.dispatch(x, ids, w, m["experts"], max_tokens=m["tokens"])
        before = len(launched)
        out = moe.combine(expert_x, handle)
        first = launched[before:]
        logged = len(comm.ctx.log)
        before = len(launched)
        again = moe.combine(expert_x, handle)
        second = launched[before:]
        return comm, expert_x, handle, out, again, first, second, comm.ctx.log[logged:]


def test_a_low_latency_combine_is_two_kernels_on_the_handles_fields_and_the_layers_regions(monkeypatch) -> None:
    seed = U32 - 2 * CALL_EPOCHS
    comm, expert_x, h, out, again, first, second, log = layer_calls(monkeypatch, True, seed)
    m = host_path.MOE
    world, hidden, most = m["world"], m["hidden"], m["tokens"] * m["topk"]  # (a row back per entry)
    assert [type(k) for k, _ in first] == [MoeSendBackKey, MoeSumBackKey]
    assert [type(k) for k, _ in second] == [MoeSendBackKey, MoeSumBackKey] and not log  # planned: nothing made
    (send_key, send), (sum_key, total) = first
    assert send_key == MoeSendBackKey(world, 16) and sum_key == MoeSumBackKey(world, "bf16", m["topk"], 8)
    send, total = dict(zip(MOE_SEND_BACK.index, send)), dict(zip(MOE_SUM_BACK.index, total))
    layout = RegionLayout(world, runtime_moe.region_bytes(most, hidden * 2))
    assert layout.region_bytes == 1 << 17  # 8 rows of 14,336 bytes: 114,688, to the next power of two
    layer = comm.moe_layer
    received = layer.empty("regions", (layout.bytes,), torch.uint8, expert_x.device)
    words = layer._region_words
    assert send["rows"] == expert_x.data_ptr() and send["row_words"] == hidden * 2 // 16
    assert (send["place"], send["kept"], send["splits"]) == (h.place.data_ptr(), h.kept.data_ptr(),
                                                             h.recv_splits.data_ptr())
    assert (total["slots"], total["valid"], total["send_splits"]) == (h.slots.data_ptr(), h.valid.data_ptr(),
                                                                      h.send_splits.data_ptr())
    assert total["regions"] == received.data_ptr() and send["regions_table"] == comm.buffer(received).table.data_ptr()
    assert send["words"] == total["words"] == words.pad.data_ptr()
    assert send["words_table"] == words.view.table.data_ptr()
    assert send["region_bytes"] == total["region_bytes"] == layout.region_bytes
    assert send["facts"] == total["facts"] == region_facts(hidden * 2, list(DTYPES).index("bf16") + 256 * 18)
    assert total["out"] == out.data_ptr() and out.shape == (m["tokens"], hidden) and out.dtype == torch.bfloat16
    assert total["tokens"] == m["tokens"] and total["weights"] == h.weights.data_ptr()
    assert again is not out  # a fresh output per call
    seeded = RegionLayout(world, 16).seeded(seed)
    pad = words.pad
    for offset, value in seeded.items():  # as the kernels read them: 32-bit count, 64-bit words
        low = int(pad[offset]) % U32
        if offset == layout.counter[0]:
            assert low == value
        else:
            assert low | (int(pad[offset + 1]) % U32) << 32 == value


def test_off_the_combine_keeps_its_three_steps(monkeypatch) -> None:
    *_, first, second, _ = layer_calls(monkeypatch, False)
    kinds = {type(k).__name__ for k, _ in first}
    assert "MoeSendBackKey" not in kinds and "MoeSumBackKey" not in kinds
    assert {"MoeGatherKey", "MoeCombineKey"} <= kinds


def test_regions_come_in_powers_of_two_that_hold_the_rows() -> None:
    for rows, row_bytes in [(1, 16), (8, 14336), (1024, 14336), (3, 48), (0, 16)]:
        size = runtime_moe.region_bytes(rows, row_bytes)
        assert size >= max(16, rows * row_bytes) and size & (size - 1) == 0 and size < max(32, 2 * rows * row_bytes)


def test_a_two_kernel_combine_like_the_one_before_stays_under_its_ceiling(monkeypatch) -> None:
    """The guard of ``test_host_path`` for the two-kernel combine (measured: raise only with a
    reason): 7 Python calls into collectives (the three-step combine's ceiling is 12: its gather
    and weighted sum's launches and the all-to-all's plan hit), one torch operator (the output's
    allocation), no torch launch, nothing prepared again."""
    monkeypatch.setattr(runtime_moe, "REGIONS", True)
    with host_path.moe_world():
        fn = host_path.moe_calls()["moe.combine"]
        seen = host_path.profile(fn)
        ops = host_path.torch_ops(fn)
        launches = host_path.torch_launches(fn)
    mine = {name: n for (path, name), n in seen.items() if "/collectives/" in path}
    assert sum(mine.values()) <= 7, sorted(mine.items())
    assert not {"regions_for", "regions_combine", "kernel_together", "agree_growth"} & set(mine)
    assert sum(ops.values()) <= 1 and launches == 0, dict(ops)
