"""The row chunking of the GEMM-overlap functions (pure host logic)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from collectives.overlap import _bounds  # noqa: E402


@pytest.mark.parametrize("rows", [0, 1, 3, 7, 1024, 1027])
@pytest.mark.parametrize("chunks", [1, 4, 8])
def test_chunks_cover_every_row_once_and_none_is_empty(rows: int, chunks: int) -> None:
    bounds = _bounds(rows, chunks)
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) == max(1, min(chunks, rows))
    assert rows == 0 or all(r1 > r0 for r0, r1 in bounds)
