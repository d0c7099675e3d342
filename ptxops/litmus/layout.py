"""Where each instance's locations and registers live (pure Python; shared by the kernels and
the host, which must agree on it).

Per launch of ``iters`` iterations with ``n`` instances per iteration and ``nloc`` locations:

* location ``v`` of instance ``i`` in iteration ``k`` is the Int32 word
  ``(k * n * nloc + v * n + slot(i, k)) * stride`` of location buffer ``v % 2`` (``mem0`` for
  x, ``mem1`` for y; one buffer on one GPU), where ``slot`` shuffles instances;
* register ``j`` of instance ``i`` in iteration ``k`` is word ``(k * n + i) * nreg + j`` of
  the register buffer.
"""

from __future__ import annotations

from typing import Any

THREADS = 128
SHUFFLE_MUL = 40503  # odd: i -> i * MUL + k * ADD (mod n) is a bijection for n a power of 2
SHUFFLE_ADD = 7919
PLACEMENT_CODE = {"cta": 0, "warp": 1, "gpu": 2}
#: Largest location buffer one launch may use (Int32 words; word indices stay below 2**31).
MAX_WORDS = 1 << 26


def slot(i: Any, k: Any, n: int, shuffle: bool) -> Any:
    """The slot of instance ``i`` (int or integer array) in iteration ``k``."""
    if not shuffle:
        return i
    return (i * SHUFFLE_MUL + k * SHUFFLE_ADD) & (n - 1)


def word(k: Any, i: Any, v: int, n: int, nloc: int, stride: int, shuffle: bool) -> Any:
    """Word index of location ``v`` of instance ``i`` in iteration ``k`` (in buffer v % 2)."""
    return (k * n * nloc + v * n + slot(i, k, n, shuffle)) * stride


def words_per_launch(iters: int, n: int, nloc: int, stride: int) -> int:
    return iters * n * nloc * stride


def max_iters(n: int, nloc: int, stride: int, cap: int = 4096) -> int:
    """The most iterations one launch may run (its location buffer within MAX_WORDS)."""
    return max(1, min(cap, MAX_WORDS // (n * nloc * stride)))


__all__ = ["MAX_WORDS", "PLACEMENT_CODE", "SHUFFLE_ADD", "SHUFFLE_MUL", "THREADS", "max_iters",
           "slot", "word", "words_per_launch"]
