"""The litmus tests as data: shapes, the ptxops orderings on each side, placements, scopes,
and the expected verdict of every outcome under the PTX memory model.

A :class:`LitmusTest` is one shape (MP, SB, LB, 2+2W, IRIW, WRC) with one *style* (which
ptxops operations each thread uses: weak/relaxed/volatile/release/acquire ``st``/``ld``,
``atom``/``red`` with a sem, fences of a sem) at one *scope* (``cta``/``gpu``/``sys``; None for
the styles without scoped operations).  Its threads are lists of :class:`~.model.Op`.  Where
the threads run is the *placement*:

* ``warp``: every thread a different warp of one CTA (32 instances per warp group),
* ``cta``: every thread in a different CTA of one GPU,
* ``gpu``: thread ``t`` on GPU ``t % 2``, through peer memory (location ``x`` in GPU 0's
  memory, ``y`` in GPU 1's).

:meth:`LitmusTest.verdicts` gives every outcome of the test's outcome space (the tuple of its
registers, then final values of the locations it observes) with its verdict at a placement:
``"sc"`` (a sequentially consistent interleaving gives it), ``"weak"`` (not SC, but the PTX
memory model allows it) or ``"forbidden"`` (the model forbids it: seeing it is a violation).
The verdicts come from :mod:`.model`, a checker of the PTX ISA's axioms, and the classic
ones are pinned by hand in :data:`EXPECTED_FORBIDDEN` (tests/ptxops/test_litmus_model.py checks
that both agree).  Pure Python: importable without CuTeDSL, torch or a GPU.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .model import SCOPES, Op, Where, allowed_outcomes, locations_of, sc_outcomes

PLACEMENTS = ("cta", "warp", "gpu")
#: Lanes (instances per role) of one group: a CTA of 128 threads, or one warp.
LANES = {"cta": 128, "warp": 32, "gpu": 128}
#: Verdicts of one outcome.
SC, WEAK, FORBIDDEN = "sc", "weak", "forbidden"


def where(placement: str, nthreads: int, world: int = 2) -> tuple[Where, ...]:
    """Where each thread of a test runs under ``placement`` (GPU, CTA)."""
    if placement == "warp":
        return tuple(Where(0, 0) for _ in range(nthreads))
    if placement == "cta":
        return tuple(Where(0, t) for t in range(nthreads))
    if placement == "gpu":
        return tuple(Where(t % world, t) for t in range(nthreads))
    raise ValueError(f"placement {placement!r} is not one of {PLACEMENTS}")


# ---------------------------------------------------------------------------------------
# Op constructors
# ---------------------------------------------------------------------------------------
def st(loc: str, value: int = 1, sem: str = "weak", scope: str | None = None) -> Op:
    return Op("st", loc, value, sem, scope if sem not in ("weak", "volatile") else None)


def ld(loc: str, reg: str, sem: str = "weak", scope: str | None = None) -> Op:
    return Op("ld", loc, 0, sem, scope if sem not in ("weak", "volatile") else None, reg)


def fence(sem: str, scope: str) -> Op:
    return Op("fence", None, 0, sem, scope)


def atom(loc: str, rmw: str, value: int, sem: str, scope: str, reg: str | None = None) -> Op:
    return Op("atom", loc, value, sem, scope, reg, rmw)


def red(loc: str, value: int, sem: str, scope: str) -> Op:
    return Op("red", loc, value, sem, scope, None, "add")


Thread = tuple[Op, ...]


@dataclass(frozen=True)
class Shape:
    """A litmus shape: its threads per style (``build(style, scope)``), registers and the
    final locations it observes, the outcome it is about, and its styles."""

    name: str
    doc: str
    registers: tuple[str, ...]
    finals: tuple[str, ...]
    interesting: tuple[int, ...]  # the classic relaxed outcome of the shape
    styles: dict[str, Callable[[str | None], tuple[Thread, ...]]]
    unscoped: frozenset[str] = frozenset()  # styles without scoped operations

    @property
    def nthreads(self) -> int:
        first = next(iter(self.styles.values()))
        return len(first("gpu"))


def _mp(writer: str, reader: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """MP: T0 stores data x (weak) then publishes flag y; T1 reads y into r0, then x into r1."""

    def build(s: str | None) -> tuple[Thread, ...]:
        w = {
            "weak": lambda: [st("y")],
            "relaxed": lambda: [st("y", 1, "relaxed", s)],
            "volatile": lambda: [st("y", 1, "volatile")],
            "release": lambda: [st("y", 1, "release", s)],
            "fence_acq_rel": lambda: [fence("acq_rel", s), st("y", 1, "relaxed", s)],
            "fence_sc": lambda: [fence("sc", s), st("y", 1, "relaxed", s)],
            "red_release": lambda: [red("y", 1, "release", s)],
            "atom_release": lambda: [atom("y", "exch", 1, "release", s)],
        }[writer]()
        r = {
            "weak": lambda: [ld("y", "r0")],
            "relaxed": lambda: [ld("y", "r0", "relaxed", s)],
            "volatile": lambda: [ld("y", "r0", "volatile")],
            "acquire": lambda: [ld("y", "r0", "acquire", s)],
            "fence_acq_rel": lambda: [ld("y", "r0", "relaxed", s), fence("acq_rel", s)],
            "fence_sc": lambda: [ld("y", "r0", "relaxed", s), fence("sc", s)],
            "atom_acquire": lambda: [atom("y", "add", 0, "acquire", s, "r0")],
        }[reader]()
        return (tuple([st("x")] + w), tuple(r + [ld("x", "r1")]))

    return build


MP_STYLES = {
    "weak": ("weak", "weak"),
    "volatile": ("volatile", "volatile"),
    "relaxed": ("relaxed", "relaxed"),
    "rel_acq": ("release", "acquire"),
    "rel_rlx": ("release", "relaxed"),
    "rlx_acq": ("relaxed", "acquire"),
    "fence_acq_rel": ("fence_acq_rel", "fence_acq_rel"),
    "fence_sc": ("fence_sc", "fence_sc"),
    "red_rel_acq": ("red_release", "acquire"),
    "atom_rel_acq": ("atom_release", "acquire"),
    "rel_atom_acq": ("release", "atom_acquire"),
}


def _sb(style: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """SB: T0 stores x then reads y into r0; T1 stores y then reads x into r1."""

    def side(a: str, b: str, reg: str, s: str | None) -> Thread:
        return tuple({
            "weak": lambda: [st(a), ld(b, reg)],
            "relaxed": lambda: [st(a, 1, "relaxed", s), ld(b, reg, "relaxed", s)],
            "rel_acq": lambda: [st(a, 1, "release", s), ld(b, reg, "acquire", s)],
            "fence_acq_rel": lambda: [st(a, 1, "relaxed", s), fence("acq_rel", s), ld(b, reg, "relaxed", s)],
            "fence_sc": lambda: [st(a, 1, "relaxed", s), fence("sc", s), ld(b, reg, "relaxed", s)],
            "atom_exch": lambda: [atom(a, "exch", 1, "acq_rel", s), ld(b, reg, "acquire", s)],
        }[style]())

    return lambda s: (side("x", "y", "r0", s), side("y", "x", "r1", s))


def _lb(style: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """LB: T0 reads x into r0 then stores y; T1 reads y into r1 then stores x."""

    def side(a: str, b: str, reg: str, s: str | None) -> Thread:
        return tuple({
            "weak": lambda: [ld(a, reg), st(b)],
            "relaxed": lambda: [ld(a, reg, "relaxed", s), st(b, 1, "relaxed", s)],
            "acq_rel": lambda: [ld(a, reg, "acquire", s), st(b, 1, "release", s)],
            "fence_acq_rel": lambda: [ld(a, reg, "relaxed", s), fence("acq_rel", s), st(b, 1, "relaxed", s)],
        }[style]())

    return lambda s: (side("x", "y", "r0", s), side("y", "x", "r1", s))


def _2p2w(style: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """2+2W: T0 stores x=1 then y=2; T1 stores y=1 then x=2; observes final x and y."""

    def side(a: str, b: str, s: str | None) -> Thread:
        return tuple({
            "relaxed": lambda: [st(a, 1, "relaxed", s), st(b, 2, "relaxed", s)],
            "release": lambda: [st(a, 1, "relaxed", s), st(b, 2, "release", s)],
            "fence_sc": lambda: [st(a, 1, "relaxed", s), fence("sc", s), st(b, 2, "relaxed", s)],
        }[style]())

    return lambda s: (side("x", "y", s), side("y", "x", s))


def _iriw(style: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """IRIW: T0 stores x, T1 stores y; T2 reads x then y (r0, r1), T3 reads y then x (r2, r3)."""

    def build(s: str | None) -> tuple[Thread, ...]:
        wsem, rsem = ("release", "acquire") if style == "rel_acq" else ("relaxed", "relaxed")
        mid = [fence("sc", s)] if style == "fence_sc" else []
        return (
            (st("x", 1, wsem, s),),
            (st("y", 1, wsem, s),),
            tuple([ld("x", "r0", rsem, s)] + mid + [ld("y", "r1", rsem, s)]),
            tuple([ld("y", "r2", rsem, s)] + mid + [ld("x", "r3", rsem, s)]),
        )

    return build


def _wrc(style: str) -> Callable[[str | None], tuple[Thread, ...]]:
    """WRC: T0 stores x; T1 reads x into r0 then stores y; T2 reads y into r1 then x into r2."""

    def build(s: str | None) -> tuple[Thread, ...]:
        t0 = (st("x", 1, "relaxed", s),)
        if style == "relaxed":
            t1 = (ld("x", "r0", "relaxed", s), st("y", 1, "relaxed", s))
            t2 = (ld("y", "r1", "relaxed", s), ld("x", "r2", "relaxed", s))
        elif style == "rel_acq":
            t1 = (ld("x", "r0", "relaxed", s), st("y", 1, "release", s))
            t2 = (ld("y", "r1", "acquire", s), ld("x", "r2", "relaxed", s))
        else:  # fence_acq_rel
            t1 = (ld("x", "r0", "relaxed", s), fence("acq_rel", s), st("y", 1, "relaxed", s))
            t2 = (ld("y", "r1", "relaxed", s), fence("acq_rel", s), ld("x", "r2", "relaxed", s))
        return (t0, t1, t2)

    return build


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("MP", "message passing: data x (weak), then flag y; read y, then x",
              ("r0", "r1"), (), (1, 0),
              {k: _mp(*v) for k, v in MP_STYLES.items()}, frozenset({"weak", "volatile"})),
        Shape("SB", "store buffering: store own, read the other's",
              ("r0", "r1"), (), (0, 0),
              {k: _sb(k) for k in ("weak", "relaxed", "rel_acq", "fence_acq_rel", "fence_sc", "atom_exch")},
              frozenset({"weak"})),
        Shape("LB", "load buffering: read the other's, then store own",
              ("r0", "r1"), (), (1, 1),
              {k: _lb(k) for k in ("weak", "relaxed", "acq_rel", "fence_acq_rel")}, frozenset({"weak"})),
        Shape("2+2W", "two writers, two locations in opposite orders; final x, y",
              (), ("x", "y"), (1, 1),
              {k: _2p2w(k) for k in ("relaxed", "release", "fence_sc")}),
        Shape("IRIW", "independent reads of independent writes (4 threads)",
              ("r0", "r1", "r2", "r3"), (), (1, 0, 1, 0),
              {k: _iriw(k) for k in ("relaxed", "rel_acq", "fence_sc")}),
        Shape("WRC", "write-to-read causality (3 threads)",
              ("r0", "r1", "r2"), (), (1, 1, 0),
              {k: _wrc(k) for k in ("relaxed", "rel_acq", "fence_acq_rel")}),
    )
}


@dataclass(frozen=True)
class LitmusTest:
    """One shape x style x scope: the unit the harness compiles (per shape x style) and runs."""

    shape: str
    style: str
    scope: str | None

    def __post_init__(self) -> None:
        sh = SHAPES.get(self.shape)
        if sh is None:
            raise ValueError(f"unknown shape {self.shape!r}; shapes: {', '.join(SHAPES)}")
        if self.style not in sh.styles:
            raise ValueError(f"{self.shape}: unknown style {self.style!r}; styles: {', '.join(sh.styles)}")
        if (self.scope is None) != (self.style in sh.unscoped):
            want = "no scope" if self.style in sh.unscoped else f"a scope in {SCOPES}"
            raise ValueError(f"{self.shape}+{self.style} takes {want}, not {self.scope!r}")
        if self.scope is not None and self.scope not in SCOPES:
            raise ValueError(f"scope {self.scope!r} is not one of {SCOPES}")

    @property
    def name(self) -> str:
        """``MP+rel_acq@gpu``; ``MP+weak`` for unscoped styles."""
        return f"{self.shape}+{self.style}" + (f"@{self.scope}" if self.scope else "")

    @property
    def spec(self) -> Shape:
        return SHAPES[self.shape]

    @property
    def threads(self) -> tuple[Thread, ...]:
        return self.spec.styles[self.style](self.scope)

    @property
    def registers(self) -> tuple[str, ...]:
        return self.spec.registers

    @property
    def finals(self) -> tuple[str, ...]:
        return self.spec.finals

    @property
    def observables(self) -> tuple[str, ...]:
        """Names of the outcome's fields: registers, then ``[x]`` for a final value of x."""
        return self.registers + tuple(f"[{loc}]" for loc in self.finals)

    @property
    def locations(self) -> list[str]:
        return locations_of(self.threads)

    @property
    def nthreads(self) -> int:
        return len(self.threads)

    def outcome_space(self) -> list[tuple[int, ...]]:
        """Every combination of values the observables can take (each register: 0 or a
        value written to its location; each final: a value written there)."""
        written: dict[str, set[int]] = {}
        for ops in self.threads:
            for op in ops:
                if op.kind == "st" or op.rmw == "exch":
                    written.setdefault(op.loc, set()).add(op.value)
        # atom add / red add write old + operand: add what they can produce
        for ops in self.threads:
            for op in ops:
                if op.rmw == "add":
                    base = written.get(op.loc, set()) | {0}
                    written.setdefault(op.loc, set()).update(v + op.value for v in base)
        fields = []
        for ops in self.threads:
            for op in ops:
                if op.reg is not None:
                    fields.append((op.reg, sorted(written.get(op.loc, set()) | {0})))
        by_reg = dict(fields)
        options = [by_reg[r] for r in self.registers]
        options += [sorted(written.get(loc, {0})) for loc in self.finals]
        return list(itertools.product(*options))

    def verdicts(self, placement: str) -> dict[tuple[int, ...], str]:
        """Outcome -> ``"sc"``, ``"weak"`` or ``"forbidden"`` at ``placement``."""
        return dict(_verdicts(self, placement))

    def forbidden(self, placement: str) -> list[tuple[int, ...]]:
        return [o for o, v in self.verdicts(placement).items() if v == FORBIDDEN]

    def weak(self, placement: str) -> list[tuple[int, ...]]:
        return [o for o, v in self.verdicts(placement).items() if v == WEAK]

    def program(self) -> list[list[str]]:
        """Each thread's instructions as PTX-like text."""
        return [[op.label() for op in ops] for ops in self.threads]

    def kernel_key(self) -> tuple[str, str]:
        """What one compiled kernel covers: every scope and placement of a shape x style."""
        return (self.shape, self.style)


@functools.cache
def _verdicts(test: LitmusTest, placement: str) -> tuple[tuple[tuple[int, ...], str], ...]:
    threads = test.threads
    allowed = allowed_outcomes(threads, where(placement, len(threads)), test.registers, test.finals)
    sc = sc_outcomes(threads, test.registers, test.finals)
    out = []
    for o in test.outcome_space():
        out.append((o, SC if o in sc else WEAK if o in allowed else FORBIDDEN))
    return tuple(out)


def catalogue(shapes: Iterable[str] | None = None, scopes: Iterable[str] = SCOPES) -> list[LitmusTest]:
    """Every shipped test: each shape x style, at each of ``scopes`` (once for unscoped styles)."""
    out = []
    for name in shapes or SHAPES:
        sh = SHAPES[name]
        for style in sh.styles:
            if style in sh.unscoped:
                out.append(LitmusTest(name, style, None))
            else:
                out.extend(LitmusTest(name, style, s) for s in scopes)
    return out


def parse(name: str) -> LitmusTest:
    """``"MP+rel_acq@gpu"`` -> LitmusTest (the inverse of :attr:`LitmusTest.name`)."""
    base, _, scope = name.partition("@")
    shape, _, style = base.partition("+") if not base.startswith("2+2W") else ("2+2W", "+", base[5:])
    return LitmusTest(shape, style, scope or None)


def kernel_keys(tests: Iterable[LitmusTest] | None = None) -> list[tuple[str, str]]:
    """The distinct (shape, style) kernels that ``tests`` (default: all) need."""
    return list(dict.fromkeys(t.kernel_key() for t in (tests or catalogue())))


#: Hand-written expectations for the classic cases (name, placement, forbidden outcomes):
#: the checker of .model must agree (tests/ptxops/test_litmus_model.py).  Only what the PTX ISA's own
#: litmus tests and its definitions state plainly.
EXPECTED_FORBIDDEN: tuple[tuple[str, str, tuple[tuple[int, ...], ...]], ...] = (
    # MP: release/acquire (or fences, or release atomics) at a scope holding both threads
    ("MP+rel_acq@gpu", "cta", ((1, 0),)),
    ("MP+rel_acq@sys", "cta", ((1, 0),)),
    ("MP+rel_acq@sys", "gpu", ((1, 0),)),
    ("MP+rel_acq@cta", "warp", ((1, 0),)),
    ("MP+fence_acq_rel@gpu", "cta", ((1, 0),)),
    ("MP+fence_sc@gpu", "cta", ((1, 0),)),
    ("MP+red_rel_acq@gpu", "cta", ((1, 0),)),
    ("MP+atom_rel_acq@gpu", "cta", ((1, 0),)),
    ("MP+rel_atom_acq@gpu", "cta", ((1, 0),)),
    # ... and nothing is forbidden with a scope too narrow or an ordering missing on a side
    ("MP+rel_acq@cta", "cta", ()),
    ("MP+rel_acq@gpu", "gpu", ()),
    ("MP+relaxed@gpu", "cta", ()),
    ("MP+rel_rlx@gpu", "cta", ()),
    ("MP+rlx_acq@gpu", "cta", ()),
    ("MP+weak", "cta", ()),
    ("MP+volatile", "cta", ()),
    # SB: only fence.sc on both sides at a containing scope
    ("SB+fence_sc@gpu", "cta", ((0, 0),)),
    ("SB+fence_sc@sys", "gpu", ((0, 0),)),
    ("SB+fence_sc@cta", "cta", ()),
    ("SB+relaxed@gpu", "cta", ()),
    ("SB+weak", "cta", ()),
    ("SB+rel_acq@gpu", "cta", ()),
    ("SB+fence_acq_rel@gpu", "cta", ()),
    ("SB+atom_exch@gpu", "cta", ()),
    # LB: allowed when relaxed (the ISA permits it), forbidden with release/acquire
    ("LB+weak", "cta", ()),
    ("LB+relaxed@gpu", "cta", ()),
    ("LB+acq_rel@gpu", "cta", ((1, 1),)),
    ("LB+fence_acq_rel@gpu", "cta", ((1, 1),)),
    # 2+2W: fence.sc orders the writes; release does not
    ("2+2W+fence_sc@gpu", "cta", ((1, 1),)),
    ("2+2W+release@gpu", "cta", ()),
    ("2+2W+relaxed@gpu", "cta", ()),
    # IRIW: fence.sc between the reads; acquire loads are not enough
    ("IRIW+fence_sc@gpu", "cta", ((1, 0, 1, 0),)),
    ("IRIW+rel_acq@gpu", "cta", ()),
    ("IRIW+relaxed@gpu", "cta", ()),
    # WRC: causality is cumulative through release/acquire
    ("WRC+rel_acq@gpu", "cta", ((1, 1, 0),)),
    ("WRC+fence_acq_rel@gpu", "cta", ((1, 1, 0),)),
    ("WRC+relaxed@gpu", "cta", ()),
)


__all__ = [
    "EXPECTED_FORBIDDEN",
    "FORBIDDEN",
    "LANES",
    "PLACEMENTS",
    "SC",
    "SCOPES",
    "SHAPES",
    "WEAK",
    "LitmusTest",
    "Shape",
    "catalogue",
    "kernel_keys",
    "parse",
    "where",
]
