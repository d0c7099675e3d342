"""The rules of ptxops's NVSHMEM calls (``ptxops.spec.nvshmem``), without CuTeDSL or nvshmem4py:
every rule raised by the check it belongs to, with its name, the legal values and the target;
the counts property-tested against the rule's words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptxops import QualifierError
from ptxops.spec import nvshmem as nv
from ptxops.spec import reach

ROOT = Path(__file__).resolve().parents[2]
T = "sm_90a"
ORIGIN = "ptxops.reach at here.py:1"
PUT_DST, PUT_SRC = nv.CALLS["put"].operands
SIGNAL = nv.CALLS["put_signal"].operands[2]
#: Every reach and whether it is local memory of this PE (None: an untagged pointer).
LOCAL = {None: True, "gpu": True, "symmetric": True, "cta": False, "cluster": False, "peer": False,
         "multicast": False, "host": False}


def raised(fn, *args) -> QualifierError:
    with pytest.raises(QualifierError) as info:
        fn(*args)
    e = info.value
    assert e.rule in nv.RULES and f"[{e.rule}]" in str(e) and nv.RULES[e.rule].text in str(e)
    assert e.target == T and T in str(e) and e.family.startswith("nvshmem.")
    return e


def test_every_rule_is_raised_by_a_test_of_this_file() -> None:
    """The rule names below are each asserted in a test; a rule added without one fails here."""
    tested = {"nvshmem-symmetric", "nvshmem-local", "nvshmem-global", "nvshmem-type", "nvshmem-same-type",
              "nvshmem-count", "nvshmem-signal-op", "nvshmem-compare", "nvshmem-contiguous",
              "nvshmem-scope"}
    assert set(nv.RULES) == tested


def test_the_symmetric_reach_is_a_reach_at_sys() -> None:
    assert reach.REACHES["symmetric"].needs == "sys"
    assert set(LOCAL) - {None} == set(reach.REACHES)


@pytest.mark.parametrize("kind", [None, *reach.REACHES], ids=lambda k: f"reach-{k}")  # "gpu" alone marks GPU tests
def test_a_remote_operand_must_be_symmetric(kind: str | None) -> None:
    for call in nv.CALLS.values():
        for op in (o for o in call.operands if o.memory == "symmetric"):
            dtype = next(iter(nv.types_of(op.types)))
            if kind == "symmetric":
                assert nv.check_operand(call.name, op, kind, ORIGIN, "gmem", dtype, T) == dtype
                continue
            e = raised(nv.check_operand, call.name, op, kind, ORIGIN, "gmem", dtype, T)
            assert e.rule == "nvshmem-symmetric" and e.legal == {op.name: ["symmetric"]}
            assert e.offending == {op.name: kind}
            assert ("an untagged pointer (" in str(e)) == (kind is None) and (ORIGIN in str(e)) == (kind is not None)


@pytest.mark.parametrize("kind", list(LOCAL), ids=lambda k: f"reach-{k}")
def test_a_local_operand_is_not_a_peer_or_multicast_address(kind: str | None) -> None:
    if LOCAL[kind]:
        assert nv.check_operand("put", PUT_SRC, kind, ORIGIN, "gmem", "Float32", T) == "Float32"
        return
    e = raised(nv.check_operand, "put", PUT_SRC, kind, ORIGIN, "gmem", "Float32", T)
    assert e.rule == "nvshmem-local" and e.legal == {"src": list(nv.LOCAL_REACHES)}


@pytest.mark.parametrize("space", ["smem", "rmem", "dsmem"])
def test_operands_are_in_global_memory(space: str) -> None:
    e = raised(nv.check_operand, "put", PUT_DST, "symmetric", ORIGIN, space, "Float32", T)
    assert e.rule == "nvshmem-global" and e.offending == {"dst": space}
    assert nv.check_operand("put", PUT_DST, "symmetric", ORIGIN, "generic", "Float32", T) == "Float32"


@pytest.mark.parametrize("dtype", ["Float8E4M3FN", "Boolean", "Int4", "TFloat32", "Float32", "Int32", "Int64", "Uint64"])
def test_element_types_are_the_bound_ones(dtype: str) -> None:
    for call in nv.CALLS.values():
        for op in call.operands:
            types = nv.types_of(op.types)
            unsigned = f"U{dtype[0].lower()}{dtype[1:]}"
            read = dtype if dtype in types else unsigned if dtype.startswith("Int") and unsigned in types else None
            if read is not None:
                assert nv.check_operand(call.name, op, "symmetric", ORIGIN, "gmem", dtype, T) == read
                continue
            e = raised(nv.check_operand, call.name, op, "symmetric", ORIGIN, "gmem", dtype, T)
            assert e.rule == "nvshmem-type" and e.legal == {op.name: list(types)}


def test_a_signal_is_64_bit_unsigned_and_signless_pointers_read_so() -> None:
    assert nv.check_operand("put_signal", SIGNAL, "symmetric", ORIGIN, "gmem", "Int64", T) == "Uint64"
    for dtype in ("Int32", "Uint32", "Float64"):
        assert raised(nv.check_operand, "put_signal", SIGNAL, "symmetric", ORIGIN, "gmem", dtype, T).rule == "nvshmem-type"


def test_dst_and_src_have_one_type() -> None:
    nv.check_same_type("put", "BFloat16", "BFloat16", T)
    e = raised(nv.check_same_type, "put", "BFloat16", "Float16", T)
    assert e.rule == "nvshmem-same-type" and e.legal == {"src": ["BFloat16"]}


def test_a_strided_tensor_is_refused() -> None:
    nv.check_contiguous("put", "dst", 64, 64, T)
    e = raised(nv.check_contiguous, "put", "src", 64, 127, T)
    assert e.rule == "nvshmem-contiguous" and "64 elements spread over 127" in str(e)


sizes = st.one_of(st.none(), st.integers(0, 1 << 20))


@settings(max_examples=300, deadline=None)
@given(dst=sizes, src=sizes, count=st.one_of(st.none(), st.integers(-4, 1 << 20)))
def test_counts_match_or_are_given_never_a_silent_min(dst: int | None, src: int | None, count: int | None) -> None:
    if count is None:
        legal = dst is not None and src is not None and dst == src
    else:
        legal = count >= 0 and all(s is None or count <= s for s in (dst, src))
    if legal:
        nv.check_count("put", dst, src, count, T)
    else:
        e = raised(nv.check_count, "put", dst, src, count, T)
        assert e.rule == "nvshmem-count"


@pytest.mark.parametrize(("rule", "name", "legal"), [
    ("nvshmem-signal-op", "op", nv.SIGNAL_OPS), ("nvshmem-compare", "cmp", list(nv.COMPARISONS)),
    ("nvshmem-scope", "scope", list(nv.SCOPES))])
def test_choices(rule: str, name: str, legal) -> None:
    for value in legal:
        nv.check_choice("put_signal", rule, name, value, legal, T)
    for value in ("or", "SET", "geq", ""):
        e = raised(nv.check_choice, "put_signal", rule, name, value, legal, T)
        assert e.rule == rule and e.legal == {name: list(legal)}


def test_every_call_states_its_ordering() -> None:
    for call in nv.CALLS.values():
        assert call.orders and call.returns and call.reuse, call.name
    assert "after the data" in nv.CALLS["put_signal"].orders
    assert "acquire at .sys" in nv.CALLS["signal_wait"].orders
    assert "quiet" in nv.CALLS["put_nbi"].reuse and "quiet" in nv.CALLS["put_signal_nbi"].reuse


_WITHOUT_NVSHMEM = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):  # as if nvshmem4py were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] == 'nvshmem':
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
try:
    import ptxops.nvshmem
except ModuleNotFoundError as e:
    print(type(e).__name__, e.name, e, sep='|')
"""


def test_without_nvshmem4py_the_module_says_how_to_install_it() -> None:
    pytest.importorskip("cutlass")
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_NVSHMEM], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    kind, name, message = proc.stdout.strip().split("|")
    assert kind == "NvshmemMissing" and name.startswith("nvshmem") and "\n" not in message
    assert "pip install nvshmem4py-cu13 nvidia-nvshmem-cu13" in message
