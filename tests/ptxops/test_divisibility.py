"""The alignment analysis (:mod:`ptxops.divisibility`) on random expression trees: whatever it
proves holds for every input, and it proves what the natural offsets need."""

from __future__ import annotations

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from ptxops.divisibility import OPS, ZERO, BrokenPromise, Const, Op, Var, divisor, evaluate, loop_index, trailing_zeros

NAMES = ("x", "y", "z")
#: Inputs with what is known of them: z is promised (a cute.assume) to be a multiple of 16.
KNOWN = {"x": 0, "y": 0, "z": 4}

constants = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, -4, -16, 1 << 31, -(1 << 31)]),
    st.integers(-(1 << 40), 1 << 40),
)
leaves = st.one_of(st.builds(Const, constants), st.sampled_from([Var(n, KNOWN[n]) for n in NAMES]))


def _op(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(name: str) -> st.SearchStrategy:
        if name == "assume":
            return st.builds(lambda a, d: Op(name, (a, Const(d))), children, st.sampled_from([1, 2, 4, 8, 6, 16]))
        if name in ("shl", "shrs", "shru", "divs", "divu", "rems", "remu"):  # mostly by constants
            right = st.one_of(st.builds(Const, st.integers(-2, 40)), children)
            return st.builds(lambda a, b: Op(name, (a, b)), children, right)
        return st.builds(lambda *a: Op(name, tuple(a)), *[children] * OPS[name])

    return st.sampled_from(sorted(OPS)).flatmap(build)


expressions = st.recursive(leaves, _op, max_leaves=10)


def inputs(bits: int) -> st.SearchStrategy[dict[str, int]]:
    """Values of the inputs, each a multiple of what is known of it."""
    def multiple(name: str) -> st.SearchStrategy[int]:
        small = st.integers(-64, 64)
        wide = st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return st.one_of(small, wide).map(lambda v: v << KNOWN[name])

    return st.fixed_dictionaries({n: multiple(n) for n in NAMES})


@settings(max_examples=500, deadline=None)
@given(expr=expressions, bits=st.sampled_from([32, 64]), data=st.data())
def test_what_the_analysis_proves_holds_for_every_input(expr, bits, data) -> None:
    """If the analysis says "a multiple of 2**k", the value (wrapped to the width) is one."""
    env = data.draw(inputs(bits), label="inputs")
    try:
        value = evaluate(expr, env, bits)
    except BrokenPromise:
        reject()  # the program is undefined: nothing to check
    k = trailing_zeros(expr)
    assert 0 <= k <= ZERO
    assert value % (1 << min(k, bits)) == 0, (expr, env, value, k)


x, y, z = (Var(n, KNOWN[n]) for n in NAMES)


def c(v: int) -> Const:
    return Const(v)


@pytest.mark.parametrize(
    ("expr", "proved"),
    [
        (Op("mul", (x, c(8))), 8),  # ptr + tidx * 8
        (Op("mul", (c(8), x)), 8),
        (Op("add", (Op("shl", (x, c(4))), c(16))), 16),  # (x << 4) + 16
        (Op("add", (Op("mul", (c(8), x)), Op("mul", (c(4), y)))), 4),  # 8*x + 4*y
        (Op("sub", (Op("mul", (x, c(32))), Op("mul", (y, c(64))))), 32),
        (Op("mul", (Op("mul", (x, c(2))), Op("mul", (y, c(4))))), 8),  # products multiply
        (Op("mul", (x, c(24))), 8),  # only the power of two of 24
        (Op("shru", (Op("mul", (x, c(64))), c(2))), 16),
        (Op("divs", (Op("mul", (x, c(64))), c(4))), 16),
        (Op("and", (x, c(-16))), 16),  # x & ~15
        (Op("rems", (Op("mul", (x, c(16))), c(64))), 16),
        (Op("select", (y, Op("mul", (x, c(8))), c(32))), 8),
        (loop_index(c(0), c(8)), 8),  # for i in range(0, n, 8)
        (loop_index(Op("mul", (y, c(16))), c(32)), 16),  # range(16 * bidx, n, 32)
        (Op("assume", (Op("mul", (x, c(3))), c(8))), 8),  # cute.assume(x * 3, divby=8)
        (Op("add", (z, Op("mul", (x, c(32))))), 16),  # an input known to be a multiple of 16
        (Op("mul", (x, c(0))), 1 << ZERO),  # zero
        (Op("mul", (x, c(4))), 4),
        (Op("add", (Op("mul", (x, c(8))), c(2))), 2),
        (Op("shl", (x, y)), 1),
        (Op("shrs", (Op("mul", (x, c(8))), y)), 1),
        (Op("divs", (Op("mul", (x, c(8))), c(3))), 1),
    ],
)
def test_it_proves_the_common_offsets(expr, proved: int) -> None:
    assert divisor(expr) == proved


def test_shared_subexpressions_are_analysed_once() -> None:
    """A chain of n doublings is a DAG of n nodes but a tree of 2**n paths."""
    e = Op("mul", (x, c(2)))
    for _ in range(200):
        e = Op("add", (e, e))
    assert trailing_zeros(e) == 1


def test_unknown_operations_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown operation 'pow'"):
        trailing_zeros(Op("pow", (x, c(2))))
