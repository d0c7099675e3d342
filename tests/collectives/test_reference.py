"""The reference model's numerics: accumulation precision and rounding, per dtype."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import reference

pytest.importorskip("ml_dtypes")


def test_bf16_sums_in_f32_and_rounds_once() -> None:
    # 1 + 2^-9 + 2^-9: bf16 steps of 2^-7 at 1.0 would lose both halves one at a time;
    # accumulated in f32 they add to 2^-8, still below half a bf16 step (2^-8): rounds to 1.0,
    # while 4 of them (2^-7) reach the next bf16 value.
    tiny = np.float32(2.0**-9)
    two = reference.reduce([np.ones(1), np.full(1, tiny), np.full(1, tiny)], "bf16")
    assert two[0] == 1.0
    five = reference.reduce([np.ones(1)] + [np.full(1, tiny)] * 4, "bf16")
    assert five[0] == np.float32(1 + 2.0**-7)


def test_bf16_result_is_representable() -> None:
    rng = np.random.default_rng(0)
    xs = [reference.round_to(rng.standard_normal(1000), "bf16") for _ in range(4)]
    out = reference.all_reduce(xs, "bf16")
    assert np.array_equal(reference.round_to(out, "bf16"), out)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    assert np.allclose(out, exact, rtol=2**-7, atol=1e-6)


def test_f32_adds_in_rank_order() -> None:
    big, small = np.float32(2**24), np.float32(1)
    # (2^24 + 1) + 1 in f32 rounds twice to 2^24; in another order it would be 2^24 + 2.
    out = reference.reduce([np.full(1, big), np.full(1, small), np.full(1, small)], "f32")
    assert out[0] == big
    out = reference.reduce([np.full(1, small), np.full(1, small), np.full(1, big)], "f32")
    assert out[0] == big + 2


def test_fp8_accumulates_in_f16() -> None:
    # e4m3 has 3 mantissa bits: 16 + 1 + 1 in f16 is 18 (exact), which rounds to 18 in e4m3
    # (representable: 16, 18, 20); accumulated in e4m3 it would stay at 16.
    out = reference.reduce([np.full(1, 16.0), np.ones(1), np.ones(1)], "e4m3")
    assert out[0] == 18.0


def test_min_max_are_exact_and_reduce_scatter_splits() -> None:
    xs = [np.array([3.0, -1.0, 7.0, 0.5]), np.array([2.0, 4.0, -9.0, 0.25])]
    assert reference.reduce(xs, "f16", "min").tolist() == [2.0, -1.0, -9.0, 0.25]
    assert reference.reduce(xs, "bf16", "max").tolist() == [3.0, 4.0, 7.0, 0.5]
    blocks = reference.reduce_scatter(xs, "f32")
    assert [b.tolist() for b in blocks] == [[5.0, 3.0], [-2.0, 0.75]]
    with pytest.raises(ValueError, match="equal blocks"):
        reference.reduce_scatter([np.ones(3), np.ones(3)], "f32")


def test_all_gather_concatenates_in_rank_order() -> None:
    xs = [np.full(3, r, dtype=np.float32) for r in range(4)]
    out = reference.all_gather(xs)
    assert out.tolist() == [0.0] * 3 + [1.0] * 3 + [2.0] * 3 + [3.0] * 3
