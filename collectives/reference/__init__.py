"""The reference models the tests compare with: here each collective's result, accumulation
precision included (numpy); :mod:`collectives.reference.all_to_all` the all-to-all's and
:mod:`collectives.reference.moe` the MoE layer's (torch, on the CPU).

Values are passed as float32 arrays holding exactly representable values of the data dtype
(every bf16/f16/fp8 value is a float32).  The model reduces in rank order 0..W-1:

- ``f32``: float32 additions;
- ``f16``/``bf16``: float32 accumulation, rounded to the dtype once at the end (what
  ``multimem.ld_reduce .acc::f32`` and the peer backend compute);
- ``e4m3``/``e5m2``: float16 accumulation, each partial sum rounded to f16 (``.acc::f16``),
  rounded to the fp8 type at the end;
- ``min``/``max``: exact.

The peer backend reduces in the same order, so its results equal the model bit for bit; the
multicast backend reduces in an order the switch chooses, so compare it with a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..dtypes import dtype as registered


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to ``dtype`` (round to nearest even) and return them as float32."""
    values = np.asarray(values, dtype=np.float32)
    kind = registered(dtype)
    try:
        return values.astype(kind.numpy).astype(np.float32)
    except ImportError:  # no ml_dtypes: the GPU machines have torch instead
        import torch

        return torch.from_numpy(values).to(kind.torch).to(torch.float32).numpy()


def reduce(inputs: Sequence[np.ndarray], dtype: str, op: str = "sum") -> np.ndarray:
    """The reduction of ``inputs`` (one array per rank, in rank order) as the kernels define it."""
    if not inputs:
        raise ValueError("reduce needs at least one rank's input")
    if op in ("min", "max"):
        pick = np.minimum if op == "min" else np.maximum
        out = np.asarray(inputs[0], dtype=np.float32)
        for x in inputs[1:]:
            out = pick(out, np.asarray(x, dtype=np.float32))
        return out
    if op != "sum":
        raise ValueError(f"op must be sum, min or max, not {op!r}")
    acc_type = registered(dtype).accumulator.numpy
    acc = np.asarray(inputs[0], dtype=np.float32).astype(acc_type)
    for x in inputs[1:]:
        acc = (acc + np.asarray(x, dtype=np.float32).astype(acc_type)).astype(acc_type)
    return round_to(acc.astype(np.float32), dtype)


def all_reduce(inputs: Sequence[np.ndarray], dtype: str, op: str = "sum") -> np.ndarray:
    """What every rank holds after ``all_reduce``."""
    return reduce(inputs, dtype, op)


def reduce_scatter(inputs: Sequence[np.ndarray], dtype: str, op: str = "sum") -> list[np.ndarray]:
    """What each rank holds after ``reduce_scatter``: block ``r`` of the reduction."""
    world = len(inputs)
    total = reduce(inputs, dtype, op)
    if total.size % world:
        raise ValueError(f"{total.size} elements do not split into {world} equal blocks")
    return list(total.reshape(world, -1))


def all_gather(inputs: Sequence[np.ndarray]) -> np.ndarray:
    """What every rank holds after ``all_gather``: the inputs concatenated in rank order
    (a copy: bit-exact in every dtype and backend)."""
    if not inputs:
        raise ValueError("all_gather needs at least one rank's input")
    return np.concatenate([np.asarray(x, dtype=np.float32).ravel() for x in inputs])
