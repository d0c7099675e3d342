"""MoE dispatch and combine (collectives.moe) in a simulated world on the CPU: ``world`` threads,
one per rank, whose all-to-alls meet at a barrier and move rows with the reference
(:mod:`collectives.reference.all_to_all`), checked bit for bit against the reference MoE layer
(:mod:`collectives.reference.moe`)."""

from __future__ import annotations

import functools

import random
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
from collectives import moe  # noqa: E402
from collectives.reference.all_to_all import all_to_all as reference_all_to_all  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402
from collectives.reference.moe import expert_fn, reference, routing  # noqa: E402


class World:
    """``world`` ranks as threads; :meth:`exchange` is rank ``r``'s all-to-all."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.calls: list = [None] * world

    def exchange(self, rank: int):
        """Rank ``rank``'s all-to-all; ``bounded``: ``out`` cut in a slot per source, each source's
        rows at the head of its slot and their count written into ``out_splits`` (a chunk past
        its slot raises, as collectives.all_to_all(..., bounded=True) fails its pair)."""
        def run(out, inp, out_splits, in_splits, bounded=False):
            as_list = (lambda s: None if s is None else [int(v) for v in s])
            self.calls[rank] = (inp.clone(), as_list(in_splits), None if bounded else as_list(out_splits))
            self.barrier.wait()
            inputs = [c[0] for c in self.calls]
            ins = [c[1] for c in self.calls]
            rows = [sum(s) if s is not None else inputs[q].shape[0] for q, s in enumerate(ins)]
            ins = [s if s is not None else [rows[q] // self.world] * self.world for q, s in enumerate(ins)]
            outs = [c[2] if c[2] is not None else [ins[q][r] for q in range(self.world)]
                    for r, c in enumerate(self.calls)]
            got = reference_all_to_all([x[:n] for x, n in zip(inputs, rows)], ins, outs)[rank]
            self.barrier.wait()
            if not bounded:
                out[:got.shape[0]] = got
                return
            slot = out.shape[0] // self.world
            sent = outs[rank]
            if max(sent) > slot:
                raise ValueError(f"a rank sends rank {rank} {max(sent)} rows, past its slot of {slot}")
            for q, (chunk, n) in enumerate(zip(torch.split(got, sent), sent)):
                out[q * slot:q * slot + n] = chunk
            out_splits.copy_(torch.tensor(sent))
        return run

    def run(self, body) -> list:
        results: list = [None] * self.world
        errors: list = []

        def rank_main(r: int) -> None:
            try:
                results[r] = body(r)
            except BaseException as e:  # noqa: BLE001  (re-raised below)
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def kernel_sum(handle, entries, slots, valid, weights, tokens, topk):
    """:func:`entry_sum` as a :data:`collectives.moe.WeightedSum` with ``handle``: ``slots`` and
    ``valid`` are the addresses of its tensors."""
    assert (slots, valid) == (handle.slots.data_ptr(), handle.valid.data_ptr())
    return entry_sum(entries, handle.slots, handle.valid, weights, tokens, topk)


def entry_sum(entries, slots, valid, weights, tokens, topk):
    """:mod:`collectives.algorithms.moe_combine`'s kernel step for step in torch: entry ``(t, k)``
    is row ``slots[t * topk + k]`` of ``entries``, zeros where not ``valid`` (whatever the row
    holds), times its f32 weight (0 where not ``valid``, whatever it holds), summed in ``k``
    order in f32 (each step rounded: torch's CPU ``mul`` and ``add``), then rounded."""
    weights = weights.float().reshape(-1)
    total = None
    for k in range(topk):
        f = torch.arange(tokens) * topk + k
        e = torch.where(valid[f][:, None], entries[slots[f]].float(), 0.0)
        term = e * torch.where(valid[f], weights[f], 0.0)[:, None]
        total = term if k == 0 else total + term
    if total is None:
        return entries.new_zeros((tokens, entries.shape[1]))
    return total.to(entries.dtype)


def nan_filled(name, shape, dtype, device):
    """A receive buffer whose rows read NaN (or all ones bits) until written: a row the combine
    was not sent must never reach an output."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def run_layer(world, experts, topk, tokens, max_tokens, seed, hidden=8, dtype=torch.bfloat16, bad=0,
              weighted_sum=None):
    xs, ids, ws = routing(world, experts, topk, tokens, seed, hidden, dtype, bad)
    sim = World(world)
    local = experts // world
    empty = moe.plain if weighted_sum is None else nan_filled

    def body(r):
        ex, counts, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, max_tokens,
                                               empty=empty)
        out_rows = torch.empty_like(ex)
        for le in range(local):
            out_rows[le] = expert_fn(ex[le], r * local + le)
        fused = weighted_sum and functools.partial(weighted_sum, handle)
        return ex, counts, handle, moe.combine_with(sim.exchange(r), out_rows, handle, empty,
                                                    kernels=lambda: (fused, None, None))

    results = sim.run(body)
    per_expert, outs = reference(world, experts, xs, ids, ws)
    for r, (ex, counts, handle, out) in enumerate(results):
        for le in range(local):
            want = per_expert[r * local + le]
            assert int(counts[le]) == want.shape[0]
            assert torch.equal(ex[le][:want.shape[0]].view(torch.uint8), want.view(torch.uint8)), (r, le)
        assert torch.equal(out.view(torch.uint8), outs[r].view(torch.uint8)), r
    return results


@pytest.mark.parametrize(("world", "local", "topk"), [(2, 1, 1), (2, 2, 2), (3, 2, 4), (4, 2, 8), (4, 1, 1)])
def test_random_routings_bit_for_bit(world: int, local: int, topk: int) -> None:
    rng = random.Random(world * 100 + topk)
    for seed in range(3):
        tokens = [rng.randrange(0, 6) for _ in range(world)]
        run_layer(world, world * local, min(topk, world * local), tokens, max_tokens=6, seed=seed)


@pytest.mark.parametrize(("world", "local", "topk", "dtype"), [(2, 1, 1, torch.float32), (3, 2, 4, torch.bfloat16),
                                                             (4, 2, 8, torch.float16), (2, 4, 8, torch.bfloat16)])
def test_combine_through_the_kernels_steps_is_bit_for_bit_and_reads_no_unsent_row(world, local, topk, dtype) -> None:
    """The combine as the fused kernel does it (collectives.algorithms.moe_combine: each entry
    read through its slot, the inverse of the dispatch's sort; unsent entries masked, not
    zeroed in the receive buffer, which here holds NaN) gives the reference's bits, with
    out-of-range ids on rank 0 and ranks without tokens."""
    rng = random.Random(world * 7 + topk)
    for seed in range(3):
        tokens = [rng.randrange(0, 6) for _ in range(world)]
        tokens[0] = max(tokens[0], 3)
        run_layer(world, world * local, min(topk, world * local), tokens, max_tokens=6, seed=seed, hidden=16,
                  dtype=dtype, bad=2, weighted_sum=kernel_sum)


@pytest.mark.parametrize("mode", moe.MODES)
@pytest.mark.parametrize("wrong", ["short", "hidden", "dtype"])
def test_combine_refuses_an_expert_out_unlike_the_dispatch(mode: str, wrong: str) -> None:
    """A short ``expert_out`` (rows clamped onto its last row: silently wrong sums), another
    hidden size or dtype: a CollectiveError naming the expected ones, before any exchange
    (issue 48 item 6)."""
    world, experts = 2, 4
    xs, ids, ws = routing(world, experts, 2, [3, 3], 0, 8, torch.float32)
    sim = World(world)

    def body(r):
        ex, _, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, 3, mode)
        out = {"short": ex[..., :-1, :], "hidden": ex[..., :-1], "dtype": ex.to(torch.bfloat16)}[wrong]
        with pytest.raises(CollectiveError, match=r"moe\.combine: expert_out must be .*torch\.float32 of shape"):
            moe.combine_with(pytest.fail, out.contiguous(), handle)
        return moe.combine_with(sim.exchange(r), ex.clone(), handle)  # the right one still combines

    sim.run(body)


def test_a_receive_buffer_a_rank_lacks_is_agreed_before_its_collective_allocation(monkeypatch) -> None:
    """Issue 48 item 5: with ``max_tokens=None`` a rank with fewer tokens (or another top-k or
    hidden) asks for a shape its peers have cached: it must agree the allocation first (bounded:
    the communicator's agree_growth raises CollectiveError for a rank alone) and never enter the
    collective allocation alone; a cached shape costs neither."""
    from types import SimpleNamespace

    from collectives.runtime import communicator as communicators

    steps = []

    class Comm:
        """The communicator's receive buffers (its own method) over a recording agreement and heap."""

        alone = False
        receive_buffer = communicators.Communicator.receive_buffer

        def __init__(self) -> None:
            self.receive_buffers = {}
            self.ctx = SimpleNamespace(empty=lambda shape, dtype: steps.append(("allocate", shape))
                                       or torch.empty(shape, dtype=dtype))

        def agree_growth(self, what, nbytes):
            steps.append(("agree", what, nbytes))
            if self.alone:
                raise CollectiveError("ranks called collectives with different sizes")

    comm = Comm()
    monkeypatch.setattr(communicators, "communicator", lambda group=None: comm)
    empty = moe._symmetric(None)
    empty("dispatch", (12, 8), torch.bfloat16, "cpu")
    empty("dispatch", (12, 8), torch.bfloat16, "cpu")  # cached: no host step at all
    empty("combine", (6, 8), torch.float32, "cpu")
    assert steps == [("agree", -8, 12 * 8 * 2), ("allocate", (12, 8)), ("agree", -9, 6 * 8 * 4), ("allocate", (6, 8))]
    comm.alone, steps[:] = True, []
    with pytest.raises(CollectiveError, match="different sizes"):
        empty("dispatch", (8, 8), torch.bfloat16, "cpu")  # 2 tokens here, 3 on the peers
    assert steps == [("agree", -8, 8 * 8 * 2)], "a rank entered the collective allocation alone"


def test_f32_every_token_to_one_expert_and_one_token() -> None:
    world, experts = 3, 6
    xs_tokens = [4, 1, 0]
    results = run_layer(world, experts, 1, xs_tokens, 4, seed=7, dtype=torch.float32)
    assert all(int(h.dropped) == 0 for _, _, h, _ in results)


def test_f32_top_8_sums_in_k_order() -> None:
    run_layer(2, 8, 8, [5, 4], 5, seed=11, hidden=64, dtype=torch.float32)


@pytest.mark.parametrize("mode", moe.MODES)
def test_a_low_latency_dispatch_makes_one_exchange_its_counts_heading_its_rows(mode: str) -> None:
    """Low latency: one all-to-all a dispatch, bounded (each rank's chunk its counts' rows, then
    its rows; a rank with no tokens sends its counts alone), into NaN-filled regions (no row a
    source did not send is read), bit for bit; throughput keeps its three (counts, sizes, rows)."""
    world, experts, topk, tokens = 3, 6, 2, [4, 0, 3]
    xs, ids, ws = routing(world, experts, topk, tokens, 5, 8, torch.bfloat16)
    sim = World(world)
    calls: list = [[] for _ in range(world)]

    def body(r):
        exchange = sim.exchange(r)

        def spy(out, inp, out_splits, in_splits, **kw):
            calls[r].append(kw.get("bounded", False))
            return exchange(out, inp, out_splits, in_splits, **kw)
        return moe.dispatch_with(spy, world, xs[r], ids[r], ws[r], experts, 4, mode, empty=nan_filled)

    results = sim.run(body)
    assert calls == ([[True]] if mode == "low_latency" else [[False] * 3]) * world
    per_expert, _ = reference(world, experts, xs, ids, ws)
    local = experts // world
    for r, (ex, counts, _) in enumerate(results):
        starts = torch.cumsum(counts, 0) - counts
        for le in range(local):
            want = per_expert[r * local + le]
            got = ex[le][:want.shape[0]] if mode == "low_latency" else ex[int(starts[le]):int(starts[le] + counts[le])]
            assert int(counts[le]) == want.shape[0]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (r, le)


def test_out_of_range_ids_are_dropped_and_counted() -> None:
    results = run_layer(2, 4, 2, [5, 3], 5, seed=3, bad=3)
    assert [int(h.dropped) for _, _, h, _ in results] == [3, 0]


def test_validate_raises_on_out_of_range_ids() -> None:
    xs, ids, ws = routing(2, 4, 2, [3, 3], 0, 8, torch.bfloat16, bad=1)
    with pytest.raises(CollectiveError, match=r"expert ids must be in 0..3, found \d..7"):
        moe.dispatch_with(None, 2, xs[0], ids[0], ws[0], 4, 3, validate=True)


def test_bad_arguments() -> None:
    xs, ids, ws = routing(2, 4, 2, [3, 3], 0, 8, torch.bfloat16)
    with pytest.raises(CollectiveError, match="multiple of the world size"):
        moe.dispatch_with(None, 2, xs[0], ids[0], ws[0], 5, 3)
    with pytest.raises(CollectiveError, match="exceed max_tokens=2"):
        moe.dispatch_with(None, 2, xs[0], ids[0], ws[0], 4, 2)
    with pytest.raises(CollectiveError, match="mode must be one of"):
        moe.dispatch_with(None, 2, xs[0], ids[0], ws[0], 4, 3, mode="fast")


def test_a_planned_layer_still_checks_every_call_whose_facts_it_has_not_seen() -> None:
    """With the plans kept (a communicator's layer), the checks run on a plan miss only: each
    fact they check is in the key, so arguments that differ from a planned call's in any of
    them (the weights' dtype, shape or device, the ids', x's, the sizes) still raise, after a
    good call of the same shape; ``validate`` reads the ids at every call; a combine's
    ``expert_out`` unlike the handle's still raises on a planned layer."""
    xs, ids, ws = routing(2, 4, 2, [3, 3], 0, 8, torch.bfloat16)
    kept: dict = {}

    def plans(key, make):
        return kept[key] if key in kept else kept.setdefault(key, make())

    def zeros(name, shape, dtype, device, fill=None):  # the exchange below delivers nothing: no garbage to place
        return torch.full(shape, 0 if fill is None else fill, dtype=dtype, device=device)

    def dispatch(x=xs[0], i=ids[0], w=ws[0], experts=4, most=3, **kw):
        return moe.dispatch_with(lambda *a, **k: None, 2, x, i, w, experts, most, plans=plans, empty=zeros, **kw)

    _, _, handle = dispatch()
    dispatch()  # a hit
    planned = len(kept)
    for wrong, match in [(dict(w=ws[0].to(torch.int64)), "topk_weights floating"),
                         (dict(w=ws[0][:, :1]), "topk_weights"), (dict(w=ws[0].to("meta")), "one device"),
                         (dict(i=ids[0].float()), "int32/int64"), (dict(i=ids[0][:2]), r"\[tokens, k\]"),
                         (dict(x=xs[0][:, None]), r"\[tokens, hidden\]"), (dict(most=2), "exceed max_tokens"),
                         (dict(experts=5), "multiple of the world size"), (dict(mode="fast"), "mode must be one of")]:
        with pytest.raises(CollectiveError, match=match):
            dispatch(**wrong)
    assert len(kept) == planned, "a call that fails its checks is never planned"
    bad = ids[0].clone()
    bad[0, 0] = 9
    dispatch(validate=True)
    with pytest.raises(CollectiveError, match="expert ids must be in 0..3"):
        dispatch(i=bad, validate=True)
    rows = torch.zeros(handle.shape, dtype=xs[0].dtype)
    with pytest.raises(CollectiveError, match="expert_out must be"):
        moe.combine_with(lambda *a, **k: None, rows.float(), handle, plans=plans)
    with pytest.raises(CollectiveError, match="expert_out must be"):
        moe.combine_with(lambda *a, **k: None, rows[:, :-1], handle, plans=plans)


@pytest.mark.parametrize(("dtype", "fp8", "mode", "row_bytes"), [
    (torch.bfloat16, False, "low_latency", 80), (torch.float32, False, "throughput", 144),
    (torch.bfloat16, True, "low_latency", 48)])  # values, (fp8: the scale's 4), the header's 2 x 4, zeros to 16 x n
def test_the_placement_is_asked_for_the_rows_as_they_travel(dtype, fp8, mode, row_bytes) -> None:
    """A dispatch asks ``placement_for`` once, after its checks, with its local experts, the
    bytes of a row as it travels, the layout and the bytes it places (fp8: the values, the
    scale placed apart); None places with the torch steps."""
    world, experts = 2, 4
    xs, ids, ws = routing(world, experts, 2, [3, 3], 5, 32, dtype)
    sim = World(world)
    asked: list = [[] for _ in range(world)]

    def body(r):
        def placement_for(*args):
            asked[r].append(args)
            return None

        return moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, 3, mode, fp8=fp8,
                                 empty=lambda name, shape, dt, device: torch.empty(shape, dtype=dt),
                                 placement_for=placement_for)

    sim.run(body)
    layout = moe.wire(32, xs[0].element_size(), fp8, 2)
    assert asked == [[(experts // world, layout, mode == "throughput", torch.float8_e4m3fn if fp8 else dtype)]] * world
    assert layout.bytes == row_bytes
    with pytest.raises(CollectiveError, match="num_experts"):  # checked before it is asked
        moe.dispatch_with(None, 2, xs[0], ids[0], ws[0], 5, 3, placement_for=lambda *a: pytest.fail("asked"))


@pytest.mark.parametrize("hidden", [16, 28, 32, 100, 7168])
def test_fp8_dispatch_moves_each_token_quantized_with_its_scale(hidden) -> None:
    """fp8: every expert row is its token's e4m3 quantization bit for bit, with its scale; the
    round trip is within e4m3's half step (2^-4 of the token's largest magnitude).  The rows
    travel padded to a multiple of 16 bytes (the all-to-all moves single bytes where a chunk's
    source and destination disagree modulo 16), the scale's bytes right after the values."""
    world, experts, topk, tokens = 3, 6, 2, [5, 2, 4]
    xs, ids, ws = routing(world, experts, topk, tokens, 21, hidden, torch.bfloat16)
    xs[1][0] = 0  # a zero row: scale 1
    sim = World(world)
    local = experts // world
    widths: list = [None] * world  # the bytes of a row sent and received

    def body(r):
        exchange = sim.exchange(r)

        def spy(out, inp, out_splits, in_splits, **kw):
            if inp.dtype == torch.float8_e4m3fn:
                widths[r] = (inp.shape[1], out.shape[1])
            exchange(out, inp, out_splits, in_splits, **kw)
        return moe.dispatch_with(spy, world, xs[r], ids[r], ws[r], experts, 5, fp8=True)

    results = sim.run(body)
    layout = moe.wire(hidden, 2, True, topk)
    assert widths == [(layout.bytes,) * 2] * world and layout.values == hidden
    assert layout.bytes % 16 == 0 and hidden + 4 + 4 * topk <= layout.bytes < hidden + 4 * topk + 20
    qs = [moe.quantize(x) for x in xs]
    rows, _ = reference(world, experts, [q.view(torch.uint8) for q, _ in qs], ids, ws)
    scales, _ = reference(world, experts, [s[:, None] for _, s in qs], ids, ws)
    for r, (ex, counts, handle) in enumerate(results):
        assert ex.dtype == torch.float8_e4m3fn and handle.scales.shape == ex.shape[:2] == (local, world * 5)
        assert ex.is_contiguous() and handle.scales.is_contiguous()  # a grouped GEMM's operands as they are
        for le in range(local):
            n = int(counts[le])
            want = rows[r * local + le]
            assert n == want.shape[0]
            assert torch.equal(ex[le, :n].view(torch.uint8), want)
            assert torch.equal(handle.scales[le, :n], scales[r * local + le][:, 0])
    for x in xs:
        q, s = moe.quantize(x)
        back = q.float() * s[:, None]
        amax = x.float().abs().amax(1, keepdim=True)
        assert torch.all((back - x.float()).abs() <= amax * 2.0**-4)


def run_throughput_layer(world, experts, topk, tokens, seed, hidden=8, dtype=torch.bfloat16, bad=0, fp8=False):
    """A layer in throughput mode: ``expert_x`` packed and exact, checked bit for bit."""
    xs, ids, ws = routing(world, experts, topk, tokens, seed, hidden, dtype, bad)
    sim = World(world)
    local = experts // world
    allocations: list = [[] for _ in range(world)]

    def body(r):
        def empty(name, shape, dt, device):  # every rank must ask for the same shape (symmetric buffers)
            allocations[r].append((name, shape))
            return torch.empty(shape, dtype=dt, device=device)

        ex, counts, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, tokens[r],
                                               mode="throughput", empty=empty, fp8=fp8)
        starts = [int(v) for v in torch.cumsum(counts, 0) - counts]
        out_rows = torch.cat([expert_fn(ex[starts[le]:starts[le] + int(counts[le])], r * local + le)
                              for le in range(local)]) if not fp8 else None
        out = moe.combine_with(sim.exchange(r), out_rows, handle, empty) if not fp8 else None
        return ex, counts, handle, out

    results = sim.run(body)
    assert all(a == allocations[0] for a in allocations), "ranks asked for receive buffers of different shapes"
    if fp8:
        qs = [moe.quantize(x) for x in xs]
        rows, _ = reference(world, experts, [q.view(torch.uint8) for q, _ in qs], ids, ws)
    else:
        rows, outs = reference(world, experts, xs, ids, ws)
    for r, (ex, counts, handle, out) in enumerate(results):
        want = torch.cat([rows[r * local + le] for le in range(local)])
        assert ex.shape[0] == want.shape[0] == int(counts.sum()), "throughput output is not exact"
        assert [int(c) for c in counts] == [rows[r * local + le].shape[0] for le in range(local)]
        assert torch.equal(ex.view(torch.uint8), want.view(torch.uint8)), r
        if not fp8:
            assert torch.equal(out.view(torch.uint8), outs[r].view(torch.uint8)), r
        assert int(handle.dropped) == (bad if r == 0 else 0)
    return results


@pytest.mark.parametrize(("world", "local", "topk"), [(2, 1, 1), (2, 2, 2), (3, 2, 4), (4, 2, 8)])
def test_throughput_mode_is_exact_and_packed(world: int, local: int, topk: int) -> None:
    """Uneven token counts (a rank with none among them), packed exact outputs, bit for bit."""
    rng = random.Random(world * 10 + topk)
    for seed in range(3):
        tokens = [rng.randrange(0, 40) for _ in range(world)]
        tokens[seed % world] = 0 if seed == 1 else tokens[seed % world]
        run_throughput_layer(world, world * local, min(topk, world * local), tokens, seed)


def test_throughput_mode_drops_only_out_of_range_ids_and_carries_fp8() -> None:
    run_throughput_layer(2, 4, 2, [9, 5], seed=3, bad=3)
    run_throughput_layer(3, 6, 2, [4, 0, 7], seed=4, hidden=16, fp8=True)


def test_throughput_buffers_are_powers_of_two_of_the_largest_rank() -> None:
    """Receive buffers sized from every rank's needs (the same shape everywhere, a few sizes over
    many routings): rank 1 receives far more than rank 0 here."""
    world, experts = 2, 2
    xs, ids, ws = routing(world, experts, 1, [3, 50], 5, 8, torch.bfloat16)
    ids = [torch.ones_like(i) for i in ids]  # every token to expert 1, on rank 1
    sim = World(world)
    shapes: list = [None] * world

    def body(r):
        seen = []

        def empty(name, shape, dt, device):
            seen.append((name, shape))
            return torch.empty(shape, dtype=dt, device=device)

        ex, counts, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, 50,
                                               mode="throughput", empty=empty)
        moe.combine_with(sim.exchange(r), ex, handle, empty)
        shapes[r] = seen
        return ex.shape[0]

    assert sim.run(body) == [0, 53]
    row = moe.wire(8, 2, False, 1).bytes // 2  # bf16 values, then the header
    assert shapes[0] == shapes[1] == [("dispatch", (64, row)), ("combine", (64, 8))]


def test_a_throughput_dispatch_copies_no_host_value_to_the_device_once_it_has_launched(monkeypatch) -> None:
    """A copy from the host waits for the rank's stream, its all-to-all that spins for the other
    ranks' launches included, and where ranks share a GPU it held another rank's copy behind it
    (its upload of a new buffer's table) until both timed out (the MoE soak at W = 6 to 8 on
    one H200): past its first all-to-all a dispatch makes no tensor of host values (its token
    count is the plan's, on the GPU from the start)."""
    world, experts = 3, 6
    xs, ids, ws = routing(world, experts, 2, [4, 0, 7], 6, 8, torch.bfloat16)
    sim = World(world)
    launched = [False] * world
    late: list = []
    make = torch.tensor

    def tensor(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        rank = int(threading.current_thread().name.rpartition("-")[2])
        if caller.endswith("collectives/moe.py") and launched[rank]:
            late.append((rank, args, kwargs))
        return make(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)

    def body(r):
        threading.current_thread().name = f"rank-{r}"
        exchange = sim.exchange(r)

        def first(*args, **kwargs):
            launched[r] = True
            return exchange(*args, **kwargs)

        for _ in range(2):  # the plan made, then a plan hit
            launched[r] = False
            moe.dispatch_with(first, world, xs[r], ids[r], ws[r], experts, 7, mode="throughput")
        return launched[r]

    assert sim.run(body) == [True] * world
    assert not late, f"host values made into tensors after the first all-to-all: {late[:3]}"


def test_throughput_mode_with_no_tokens_anywhere_or_one_token() -> None:
    run_throughput_layer(2, 4, 2, [0, 0], seed=1)
    run_throughput_layer(3, 3, 1, [1, 0, 0], seed=2, hidden=4, dtype=torch.float32)


@pytest.mark.parametrize(("hidden", "max_tokens", "topk"), [((8, 16), (3, 3), (2, 2)), ((8, 8), (3, 4), (2, 2)),
                                                           ((8, 8), (3, 3), (2, 1))])
def test_ranks_that_differ_in_hidden_max_tokens_or_topk_are_refused_before_any_launch(hidden, max_tokens,
                                                                                     topk) -> None:
    """Low latency: the receive buffers are asked for before the first all-to-all, and a symmetric
    allocation agrees on its shape (collectives.empty), so a shape's first call refuses ranks
    whose hidden size, max_tokens or top-k differ, on every rank, with no all-to-all launched."""
    world, experts = 2, 4
    sim = World(world)
    asked: list = [None] * world
    launched: list = []

    def agreed_empty(r):
        def empty(name, shape, dtype, device):  # a symmetric allocation: every rank's shape agreed first
            asked[r] = (name, shape)
            sim.barrier.wait()
            disagree = asked[0] != asked[1]
            sim.barrier.wait()  # (both ranks compared before either asks for its next buffer)
            if disagree:
                raise CollectiveError(f"ranks disagree on {name}'s shape: {asked}")
            return torch.empty(shape, dtype=dtype)
        return empty

    def body(r):
        xs, ids, ws = routing(world, experts, topk[r], [3, 3], 0, hidden[r], torch.bfloat16)
        exchange = sim.exchange(r)

        def counted(*args):
            launched.append(r)
            return exchange(*args)

        moe.dispatch_with(counted, world, xs[r], ids[r], ws[r], experts, max_tokens[r], empty=agreed_empty(r))

    # (top-k: the dispatch's rows, one per token and rank, may agree; the combine's, asked for with
    # them, do not)
    with pytest.raises(CollectiveError, match=f"ranks disagree on {'combine' if topk[0] != topk[1] else 'dispatch'}'s"):
        sim.run(body)
    assert launched == []


def test_scratch_buffers_reused_by_every_call_and_two_dispatches_in_flight(monkeypatch) -> None:
    """Each rank's scratch buffers are a communicator's :class:`~collectives.runtime.moe.Layer`'s,
    reused by every call of the shape and filled with garbage at each ask (what an earlier call
    left there), two dispatches in flight before their combines, in the reverse order: the
    reference's bits, so that no result reads a scratch buffer's old contents and no handle
    holds one (the next dispatch rewrites it)."""
    from types import SimpleNamespace

    from collectives.runtime import moe as runtime_moe

    monkeypatch.setattr(runtime_moe, "capturing", lambda: False)
    world, experts, topk, hidden = 3, 6, 4, 8
    sim = World(world)
    layers = [runtime_moe.Layer(SimpleNamespace(device_index=0), None, None) for _ in range(world)]

    def poisoned(r: int):
        def scratch(name, shape, dtype, device, fill=None):
            t = layers[r].scratch(name, shape, dtype, device, fill)
            if fill is None:
                t.view(torch.uint8).fill_(0x7F)  # NaN or a huge count, whatever the dtype
            return t
        return scratch

    layer = [routing(world, experts, topk, [5, 2, 6], seed, hidden, torch.bfloat16, 1) for seed in (1, 2)]

    def body(r):
        handles = []
        for xs, ids, ws in layer:
            ex, _, handle = moe.dispatch_with(sim.exchange(r), world, xs[r], ids[r], ws[r], experts, 6,
                                              scratch=poisoned(r))
            out_rows = torch.stack([expert_fn(ex[le], r * (experts // world) + le) for le in range(ex.shape[0])])
            handles.append((out_rows, handle))
        return [moe.combine_with(sim.exchange(r), rows, h, scratch=poisoned(r)) for rows, h in reversed(handles)]

    results = sim.run(body)
    for i, (xs, ids, ws) in enumerate(reversed(layer)):
        _, outs = reference(world, experts, xs, ids, ws)
        for r in range(world):
            assert torch.equal(results[r][i].view(torch.uint8), outs[r].view(torch.uint8)), (i, r)
    assert all(layers[r]._scratch for r in range(world))
