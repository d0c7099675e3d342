"""The element types collectives reduce and move: one registry from which the torch, CuTeDSL,
PTX and reference (numpy / ml_dtypes) forms all derive (pure Python: importable without torch,
CuTeDSL or numpy; those forms are resolved on first use).

Accumulation is the same on both backends: ``multimem.ld_reduce`` adds the 16-bit floats
with ``.acc::f32`` and fp8 with ``.acc::f16`` (f32 in its own precision), and the peer backend
converts every rank's values to that same precision, combines them in rank order and rounds
once to the data type.  ``min``/``max`` are exact and take no ``.acc``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from ptxops.spec.ptxtypes import TYPES

from .errors import CollectiveError


@dataclass(frozen=True)
class DType:
    """One element type.

    Attributes:
        name: the collectives name, which is also the PTX scalar type (``"bf16"``); kernel keys
            and the PTX-identity record carry this name.
        acc: the ``.acc::`` qualifier of a ``multimem.ld_reduce`` add of this type (``"f32"``
            for the 16-bit floats, ``"f16"`` for fp8), or None where the type adds in its own
            precision; :attr:`accumulator` is the type both backends accumulate in.
        array_name: the name torch, numpy and ml_dtypes give the type (``"bfloat16"``).
        cute_name: the CuTeDSL numeric type's name in ``cutlass`` (``"BFloat16"``).
    """

    name: str
    acc: str | None
    array_name: str
    cute_name: str

    @property
    def ptx(self) -> str:
        """The PTX scalar type (``.bf16``)."""
        return self.name

    @property
    def bytes(self) -> int:
        """Bytes of one element, as ptxops' PTX type table gives its width."""
        return TYPES[self.ptx].bits // 8

    @property
    def fp8(self) -> bool:
        """Whether this is an fp8 type (its multimem forms need sm_100a or newer; add only)."""
        return TYPES[self.ptx].kind == "fp8"

    @property
    def packed(self) -> str | None:
        """The PTX type packing two of these in one register (``bf16x2``), or None (``f32``)."""
        return next((t.name for t in TYPES.values() if t.lane == self.ptx and t.lanes == 2), None)

    @property
    def accumulator(self) -> DType:
        """The type sums of this type accumulate in, on both backends."""
        return DTYPES[self.acc or self.name]

    def elements(self, nbytes: int) -> int:
        """Elements in ``nbytes`` bytes (of a 16-byte vector: the full vector width)."""
        return nbytes // self.bytes

    @property
    def torch(self) -> Any:
        """The ``torch.dtype`` (imports torch)."""
        return getattr(importlib.import_module("torch"), self.array_name)

    @property
    def cute(self) -> Any:
        """The CuTeDSL numeric type (imports CuTeDSL)."""
        return getattr(importlib.import_module("cutlass"), self.cute_name)

    @property
    def numpy(self) -> Any:
        """The numpy scalar type, from ml_dtypes where numpy has none (ImportError without it)."""
        numpy = importlib.import_module("numpy")
        if hasattr(numpy, self.array_name):
            return getattr(numpy, self.array_name)
        return getattr(importlib.import_module("ml_dtypes"), self.array_name)


#: Every dtype the collectives take, by name.
DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("f32", None, "float32", "Float32"),
        DType("f16", "f32", "float16", "Float16"),
        DType("bf16", "f32", "bfloat16", "BFloat16"),
        DType("e4m3", "f16", "float8_e4m3fn", "Float8E4M3FN"),
        DType("e5m2", "f16", "float8_e5m2", "Float8E5M2"),
    )
}


def dtype(name: str) -> DType:
    """The registered dtype ``name``; ValueError naming the choices otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, not {name!r}") from None


@functools.cache
def _by_torch() -> dict[Any, DType]:
    return {d.torch: d for d in DTYPES.values()}


def from_torch(torch_dtype: Any) -> DType:
    """The registered dtype of a ``torch.dtype``; :class:`CollectiveError` for any other."""
    found = _by_torch().get(torch_dtype)
    if found is None:
        raise CollectiveError(f"dtype {torch_dtype} is not supported; use one of {list(_by_torch())}")
    return found
