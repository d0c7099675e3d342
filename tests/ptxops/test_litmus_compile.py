"""Every litmus kernel (one per shape x style; each holds the test at every scope and runs at
every placement) compiles for sm_90a on a machine without a GPU, and its PTX holds each
thread's ptxops instructions, in program order and back to back, at every scope."""

from __future__ import annotations

import re

import pytest
from tests.support.cute_support import compile_ptx
from cutlass.cute.runtime import make_fake_stream

from ptxops.litmus import SCOPES, SHAPES, LitmusTest, kernel_keys
from ptxops.litmus.kernels import example_arguments, make_launcher
from ptxops.litmus.model import Op

ARCH = "sm_90a"
_OPCODE = re.compile(r"^\s*((?:atom|red|ld|st|fence)(?:\.[\w:]+)*)(?=[\s;])", re.MULTILINE)


def opcode(op: Op) -> str:
    """The PTX opcode ptxops emits for a litmus instruction on a global Int32."""
    if op.kind == "fence":
        return f"fence.{op.sem}.{op.scope}"
    if op.kind in ("ld", "st"):
        sem = "" if op.sem == "weak" else ".volatile" if op.sem == "volatile" else f".{op.sem}.{op.scope}"
        return f"{op.kind}{sem}.global.b32"
    t = "b32" if op.rmw == "exch" else "s32"
    return f"{op.kind}.{op.sem}.{op.scope}.global.{op.rmw}.{t}"


def ordered_opcodes(ptx: str) -> list[str]:
    return [m for m in _OPCODE.findall(ptx) if not m.startswith(("ld.param", "st.param"))]


def contains_run(seq: list[str], run: list[str]) -> bool:
    return any(seq[i:i + len(run)] == run for i in range(len(seq) - len(run) + 1))


@pytest.fixture(scope="module")
def ptx() -> dict[tuple[str, str], str]:
    return {key: compile_ptx(make_launcher(*key), *example_arguments(make_fake_stream()), arch=ARCH)
            for key in kernel_keys()}


def test_kernel_count_is_modest() -> None:
    assert len(kernel_keys()) <= 30


@pytest.mark.parametrize("key", kernel_keys(), ids="+".join)
def test_kernel_holds_every_scope_of_its_test(ptx: dict, key: tuple[str, str]) -> None:
    shape, style = key
    text = ptx[key]
    ops = ordered_opcodes(text)
    scopes = (None,) if style in SHAPES[shape].unscoped else SCOPES
    for scope in scopes:
        test = LitmusTest(shape, style, scope)
        for t, thread in enumerate(test.threads):
            run = [opcode(op) for op in thread]
            assert contains_run(ops, run), f"{test.name} thread {t}: {run} not back to back in the PTX"
    assert "%globaltimer" in text  # the rendezvous and the stress loop are bounded
    assert "red.relaxed.sys.global.add.s32" in ops and "ld.relaxed.sys.global.b32" in ops  # rendezvous
    assert not any(o.startswith("multimem") for o in ops)


@pytest.mark.parametrize("name,expect", [
    ("MP+rel_acq@gpu", ["st.global.b32", "st.release.gpu.global.b32", "ld.acquire.gpu.global.b32", "ld.global.b32"]),
    ("MP+fence_sc@sys", ["fence.sc.sys", "st.relaxed.sys.global.b32", "ld.relaxed.sys.global.b32"]),
    ("MP+red_rel_acq@gpu", ["red.release.gpu.global.add.s32", "ld.acquire.gpu.global.b32"]),
    ("MP+atom_rel_acq@sys", ["atom.release.sys.global.exch.b32", "ld.acquire.sys.global.b32"]),
    ("MP+rel_atom_acq@gpu", ["st.release.gpu.global.b32", "atom.acquire.gpu.global.add.s32"]),
    ("MP+volatile", ["st.volatile.global.b32", "ld.volatile.global.b32"]),
    ("SB+fence_sc@gpu", ["st.relaxed.gpu.global.b32", "fence.sc.gpu", "ld.relaxed.gpu.global.b32"]),
    ("SB+atom_exch@gpu", ["atom.acq_rel.gpu.global.exch.b32", "ld.acquire.gpu.global.b32"]),
    ("LB+acq_rel@sys", ["ld.acquire.sys.global.b32", "st.release.sys.global.b32"]),
    ("IRIW+fence_sc@gpu", ["ld.relaxed.gpu.global.b32", "fence.sc.gpu", "ld.relaxed.gpu.global.b32"]),
    ("WRC+fence_acq_rel@gpu", ["fence.acq_rel.gpu", "st.relaxed.gpu.global.b32"]),
    ("2+2W+fence_sc@cta", ["st.relaxed.cta.global.b32", "fence.sc.cta", "st.relaxed.cta.global.b32"]),
])
def test_named_instructions(ptx: dict, name: str, expect: list[str]) -> None:
    from ptxops.litmus import parse

    test = parse(name)
    assert set(expect) <= set(ordered_opcodes(ptx[test.kernel_key()])), name
