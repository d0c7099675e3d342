"""Multicast-shaped litmus tests in emulation: their verdicts (from the PTX model of the
emulated program) and their kernels, which compile for sm_90a without a GPU and hold no
multimem instruction (these GPUs must never run one)."""

from __future__ import annotations

import re

import pytest

from ptxops.litmus.multicast import TESTS

FORBIDDEN_MP = (1, 0)  # the flag seen, the data not


def test_names_say_emulated() -> None:
    assert len(TESTS) >= 3 and all(name.endswith("(emulated)") for name in TESTS)


@pytest.mark.parametrize("name", list(TESTS))
def test_verdicts(name: str) -> None:
    test = TESTS[name]
    verdicts = test.verdicts()
    assert verdicts[(0, 0)] == verdicts[(1, 1)] == "sc"
    ordered = test.writer_sem == "release" and test.reader_sem == "acquire"
    assert verdicts[FORBIDDEN_MP] == ("forbidden" if ordered else "weak")


@pytest.mark.parametrize("name", list(TESTS))
def test_kernel_compiles_without_multimem(name: str) -> None:
    pytest.importorskip("cutlass")
    from tests.support.cute_support import compile_ptx

    from ptxops.litmus.multicast_kernel import example_arguments, make_launcher

    test = TESTS[name]
    ptx = compile_ptx(make_launcher(test), *example_arguments(), arch="sm_90a")
    assert "multimem" not in ptx
    flag = "red" if test.flag == "red" else "st"
    typ = "add.s32" if flag == "red" else "b32"
    assert len(re.findall(rf"\b{flag}\.{test.writer_sem}\.sys\.global\.{typ}\b", ptx)) == 2  # one per copy
    assert re.search(rf"\bld\.{test.reader_sem}\.sys\.global\.b32\b", ptx)
