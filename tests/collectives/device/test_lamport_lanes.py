"""The Lamport sentinel: -0.0 in every lane of a word, for each element width."""

import numpy as np
import pytest

from collectives.device.lamport import lanes, negative_zero


@pytest.mark.parametrize(("bits", "dtype"), [(32, np.float32), (16, np.float16)])
def test_negative_zero_word_is_negative_zero_in_every_lane(bits: int, dtype) -> None:
    word = np.array([negative_zero(32, bits)], dtype=np.uint32)
    values = word.view(dtype)
    assert all(v == 0 and np.signbit(v) for v in values)


def test_lanes_cover_the_word_without_overlap() -> None:
    for bits in (8, 16, 32):
        masks = [m for m, _ in lanes(32, bits)]
        assert sum(masks) == 0xFFFFFFFF and len(masks) == 32 // bits
        assert all(a & b == 0 for i, a in enumerate(masks) for b in masks[i + 1:])
    assert negative_zero(32, 8) == 0x80808080 and negative_zero(16, 16) == 0x8000
