"""The dtype registry agrees with ptxops' spec (PTX types, .acc, fp8 targets) and with the torch,
CuTeDSL and numpy forms it derives; it imports without any of them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.dtypes import DTYPES, DType, dtype, from_torch
from collectives.errors import CollectiveError
from ptxops import spec

ROOT = Path(__file__).resolve().parents[2]
EACH = pytest.mark.parametrize("d", DTYPES.values(), ids=list(DTYPES))
LD_REDUCE = spec.family("multimem.ld_reduce")


def _ptx_types(d: DType) -> list[str]:
    return [d.ptx] + ([d.packed] if d.packed else [])


@EACH
def test_ptx_types_are_multimem_ld_reduce_adds(d: DType) -> None:
    """The scalar and packed PTX types each name an ``.add`` form of ``multimem.ld_reduce``, and
    the packed one carries two of the scalar."""
    for t in _ptx_types(d):
        assert LD_REDUCE.complete(type=t, op="add") is not None, t
    if d.packed:
        packed = spec.ptxtypes.TYPES[d.packed]
        assert (packed.lane, packed.lanes, packed.bits) == (d.ptx, 2, 16 * d.bytes)


@EACH
def test_acc_is_the_one_the_spec_allows(d: DType) -> None:
    """``acc`` is the only ``.acc::`` an add of the type (scalar and packed) may name; None
    where it takes none (f32 adds in its own precision)."""
    for t in _ptx_types(d):
        legal = {a for a in ("f32", "f16") if LD_REDUCE.complete(type=t, op="add", acc=a) is not None}
        assert legal == ({d.acc} if d.acc else set()), t
    assert d.accumulator is d if d.acc is None else d.accumulator.bytes > d.bytes


@EACH
def test_fp8_is_what_needs_sm_100a(d: DType) -> None:
    """The fp8 flag marks exactly the types whose multimem forms sm_90a lacks."""
    assert (LD_REDUCE.complete(type=d.ptx, op="add", target="sm_90a") is None) is d.fp8
    assert LD_REDUCE.complete(type=d.ptx, op="add", target="sm_100a") is not None


def test_unknown_name_names_the_choices() -> None:
    with pytest.raises(ValueError, match=re.escape(f"dtype must be one of {tuple(DTYPES)}, not 'f64'")):
        dtype("f64")


@EACH
def test_cute_form_is_the_one_ptxops_maps_to_the_ptx_types(d: DType) -> None:
    pytest.importorskip("cutlass")
    from ptxops.ops.forms import FLOAT_TYPES

    assert d.cute.width == 8 * d.bytes
    assert FLOAT_TYPES[d.cute.__name__][-1] == d.ptx
    assert d.packed is None or d.packed in FLOAT_TYPES[d.cute.__name__]


@EACH
def test_torch_round_trip(d: DType) -> None:
    pytest.importorskip("torch")
    assert from_torch(d.torch) is d
    assert d.torch.itemsize == d.bytes and d.torch.is_floating_point


def test_unsupported_torch_dtype_is_refused() -> None:
    torch = pytest.importorskip("torch")
    want = f"dtype torch.int32 is not supported; use one of {[d.torch for d in DTYPES.values()]}"
    assert want.startswith("dtype torch.int32 is not supported; use one of [torch.float32, torch.float16")
    with pytest.raises(CollectiveError, match=re.escape(want)):
        from_torch(torch.int32)


@EACH
def test_numpy_form_rounds_as_torch_does(d: DType) -> None:
    """The reference model's numpy/ml_dtypes type and the torch type round alike (the reference
    falls back to torch where ml_dtypes is missing)."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    values = np.linspace(-3, 3, 97, dtype=np.float32) ** 3
    assert np.dtype(d.numpy).itemsize == d.bytes
    by_numpy = values.astype(d.numpy).astype(np.float32)
    assert np.array_equal(by_numpy, torch.from_numpy(values).to(d.torch).float().numpy(), equal_nan=True)


def test_imports_without_torch_cutlass_or_numpy() -> None:
    """The registry is pure Python, and the kernel keys and the compile path need CuTeDSL alone
    (their algorithms' kernels), not torch (CI's fresh venv has no torch)."""
    code = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
blocked = ('torch', 'cutlass', 'numpy', 'ml_dtypes')
from collectives.dtypes import DTYPES
for d in DTYPES.values():
    assert d.elements(16) * d.bytes == 16, d
blocked = ('torch', 'numpy', 'ml_dtypes')
from collectives.algorithms import KernelKey
from collectives.runtime.kernels import kernel_ptx  # python -m collectives ptx, and the compile tests
from collectives.__main__ import main
for d in DTYPES.values():
    key = KernelKey('all_reduce', 'one_shot', 'peer', d.name, 2)
    assert key.full_vector * key.element_bytes == 16, d
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
