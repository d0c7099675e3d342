"""A small checker of the PTX memory consistency model (PTX ISA section 8) for litmus tests.

Pure Python, no GPU.  Given a litmus test (threads of :class:`Op`) and where its threads run
(which GPU, which CTA), :func:`allowed_outcomes` enumerates every candidate execution (which
write each read reads from, a coherence order per location, an order of the ``fence.sc``
operations), keeps those that satisfy the model's axioms, and returns the outcomes they
produce.  :func:`sc_outcomes` gives the outcomes of sequentially consistent interleavings: an
outcome the model allows but SC does not is a *weak* outcome.

What is modelled (PTX ISA 9.0 sections 8.4-8.10): strong and weak operations, scopes
(``cta``/``gpu``/``sys``; ``.volatile`` as ``.relaxed.sys``), morally strong pairs, observation
order through atomics, release patterns (release operation; release/acq_rel/sc fence followed
by a strong write), acquire patterns (acquire operation; strong read followed by an
acquire/acq_rel/sc fence; never a ``red``), ``fence.sc`` synchronisation, base causality,
causality order, and the axioms Coherence, Fence-SC, Atomicity (RMW), Sequential Consistency
Per Location and Causality.  Left out: No-Thin-Air (the shipped tests store constants or
``old + constant``; the PTX ISA lets constant-store load buffering through), proxies other
than generic, mixed-size accesses, barriers.  Racy pairs of weak writes may stay unordered in
coherence order, as the ISA says, so the checker errs towards *allowed*.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Scopes a litmus test may use, narrowest first.
SCOPES = ("cta", "gpu", "sys")

READS = ("ld", "atom", "red")
WRITES = ("st", "atom", "red")
RELEASE_FENCES = ("release", "acq_rel", "sc")
ACQUIRE_FENCES = ("acquire", "acq_rel", "sc")


@dataclass(frozen=True)
class Op:
    """One instruction of a litmus thread.

    ``kind``: ``ld``, ``st``, ``atom``, ``red`` or ``fence``.  ``sem``: for ld/st ``weak``,
    ``relaxed``, ``acquire`` (ld), ``release`` (st) or ``volatile``; for atom ``relaxed``,
    ``acquire``, ``release`` or ``acq_rel``; for red ``relaxed`` or ``release``; for a fence
    ``sc``, ``acq_rel``, ``acquire`` or ``release``.  ``scope`` is required for every strong
    operation but volatile.  ``rmw`` (atom/red): ``exch`` or ``add``; ``value``: what a store
    writes, or the atom/red operand.  ``reg``: the register a load or atom returns into
    (None: not observed).
    """

    kind: str
    loc: str | None = None
    value: int = 0
    sem: str = "weak"
    scope: str | None = None
    reg: str | None = None
    rmw: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("ld", "st", "atom", "red", "fence"):
            raise ValueError(f"unknown op kind {self.kind!r}")
        if (self.kind == "fence") != (self.loc is None):
            raise ValueError(f"{self.kind}: a fence has no location, a memory op needs one")
        if self.kind in ("atom", "red") and self.rmw not in ("exch", "add"):
            raise ValueError(f"{self.kind} needs rmw='exch' or 'add'")
        if self.kind == "red" and self.rmw != "add":
            raise ValueError("red: only rmw='add' (exch has no reduction form)")
        if self.strong and self.sem != "volatile" and self.scope not in SCOPES:
            raise ValueError(f"{self.kind}.{self.sem} needs a scope in {SCOPES}")
        if not self.strong and self.scope is not None:
            raise ValueError(f"{self.kind}.{self.sem} takes no scope")

    # -- classification -----------------------------------------------------------------
    @property
    def is_read(self) -> bool:
        return self.kind in READS

    @property
    def is_write(self) -> bool:
        return self.kind in WRITES

    @property
    def strong(self) -> bool:
        """Strong (relaxed, acquire, release, acq_rel, volatile, any atomic, any fence)."""
        return self.kind in ("atom", "red", "fence") or self.sem != "weak"

    @property
    def effective_scope(self) -> str | None:
        """``.volatile`` has the memory-synchronisation semantics of ``.relaxed.sys``."""
        return "sys" if self.sem == "volatile" else self.scope

    @property
    def is_release(self) -> bool:
        """A release operation (on its location) of itself."""
        return self.kind in ("st", "atom", "red") and self.sem in ("release", "acq_rel")

    @property
    def is_acquire(self) -> bool:
        """An acquire operation (a ``red`` never forms an acquire pattern)."""
        return self.kind in ("ld", "atom") and self.sem in ("acquire", "acq_rel")

    def label(self) -> str:
        """PTX-like text: ``st.release.gpu [y], 1``, ``r0 = ld.acquire.gpu [y]``."""
        parts = [self.kind]
        if self.kind == "fence" or self.sem != "weak" or self.kind in ("atom", "red"):
            parts.append(self.sem)
        if self.effective_scope and self.sem != "volatile":
            parts.append(self.scope)
        if self.rmw:
            parts.append(self.rmw)
        text = ".".join(parts)
        if self.kind == "fence":
            return text
        if self.kind == "ld":
            return f"{self.reg or '_'} = {text} [{self.loc}]"
        if self.kind == "st" or self.kind == "red":
            return f"{text} [{self.loc}], {self.value}"
        return f"{self.reg or '_'} = {text} [{self.loc}], {self.value}"


@dataclass(frozen=True)
class Where:
    """Where one thread runs: GPU index and CTA (global id on that GPU)."""

    gpu: int
    cta: int


def contains(scope: str | None, a: Where, b: Where) -> bool:
    """Whether ``scope`` seen from thread ``a`` contains thread ``b``.  A CTA runs in a
    cluster of one here (no cluster launches), so ``cluster`` counts as ``cta``."""
    if scope in ("cta", "cluster"):
        return a.gpu == b.gpu and a.cta == b.cta
    if scope == "gpu":
        return a.gpu == b.gpu
    return scope == "sys"


# ---------------------------------------------------------------------------------------
# Events and relations
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Event:
    eid: int
    thread: int  # -1: the initial write of a location
    index: int  # position in the thread
    op: Op


def _events(threads: Sequence[Sequence[Op]], locations: Sequence[str]) -> list[_Event]:
    events = [_Event(i, -1, -1, Op("st", loc, 0)) for i, loc in enumerate(locations)]
    for t, ops in enumerate(threads):
        for k, op in enumerate(ops):
            events.append(_Event(len(events), t, k, op))
    return events


def locations_of(threads: Sequence[Sequence[Op]]) -> list[str]:
    return sorted({op.loc for ops in threads for op in ops if op.loc is not None})


class _Context:
    """Static relations of one test at one placement."""

    def __init__(self, threads: Sequence[Sequence[Op]], where: Sequence[Where]) -> None:
        if len(where) != len(threads):
            raise ValueError(f"{len(threads)} threads but {len(where)} placements")
        self.threads = threads
        self.where = list(where)
        self.locations = locations_of(threads)
        self.events = _events(threads, self.locations)
        self.init = {e.op.loc: e for e in self.events if e.thread < 0}
        self.real = [e for e in self.events if e.thread >= 0]
        self.reads = [e for e in self.real if e.op.is_read]
        self.writes = {loc: [e for e in self.real if e.op.is_write and e.op.loc == loc] for loc in self.locations}
        self.fences_sc = [e for e in self.real if e.op.kind == "fence" and e.op.sem == "sc"]
        n = len(self.events)
        self.po = [[False] * n for _ in range(n)]
        for a in self.real:
            for b in self.real:
                if a.thread == b.thread and a.index < b.index:
                    self.po[a.eid][b.eid] = True
        self.ms = [[self._morally_strong(a, b) for b in self.events] for a in self.events]

    def _morally_strong(self, a: _Event, b: _Event) -> bool:
        if a.thread < 0 or b.thread < 0:
            return False
        if a.op.loc is not None and b.op.loc is not None and a.op.loc != b.op.loc:
            return False
        if a.thread == b.thread:
            return True
        if not (a.op.strong and b.op.strong):
            return False
        wa, wb = self.where[a.thread], self.where[b.thread]
        return contains(a.op.effective_scope, wa, wb) and contains(b.op.effective_scope, wb, wa)

    # release patterns: (first op, write); acquire patterns: (read, last op)
    def release_patterns(self) -> list[tuple[_Event, _Event]]:
        out = []
        for w in self.real:
            if not (w.op.is_write and w.op.strong):
                continue
            if w.op.is_release:
                out.append((w, w))
            for f in self.real:
                if f.op.kind == "fence" and f.op.sem in RELEASE_FENCES and self.po[f.eid][w.eid]:
                    out.append((f, w))
        return out

    def acquire_patterns(self) -> list[tuple[_Event, _Event]]:
        out = []
        for r in self.real:
            if not (r.op.is_read and r.op.strong) or r.op.kind == "red":
                continue
            if r.op.is_acquire:
                out.append((r, r))
            for f in self.real:
                if f.op.kind == "fence" and f.op.sem in ACQUIRE_FENCES and self.po[r.eid][f.eid]:
                    out.append((r, f))
        return out


def _closure(rel: list[list[bool]]) -> list[list[bool]]:
    n = len(rel)
    c = [row[:] for row in rel]
    for k in range(n):
        ck = c[k]
        for i in range(n):
            if c[i][k]:
                ci = c[i]
                for j in range(n):
                    if ck[j]:
                        ci[j] = True
    return c


def _partial_orders(items: list[_Event], ms: list[list[bool]]) -> Iterable[frozenset[tuple[int, int]]]:
    """Every strict partial order on ``items`` that orders each morally strong pair (racy
    pairs may stay unordered), as sets of (earlier eid, later eid)."""
    pairs = list(itertools.combinations(items, 2))
    seen: set[frozenset[tuple[int, int]]] = set()
    for choice in itertools.product((0, 1, 2), repeat=len(pairs)):
        edges: set[tuple[int, int]] = set()
        ok = True
        for (a, b), c in zip(pairs, choice):
            if c == 0:
                if ms[a.eid][b.eid]:
                    ok = False
                    break
            elif c == 1:
                edges.add((a.eid, b.eid))
            else:
                edges.add((b.eid, a.eid))
        if not ok:
            continue
        changed = True  # transitive closure
        while changed:
            changed = False
            for (p, q), (r, s) in itertools.product(list(edges), list(edges)):
                if q == r and (p, s) not in edges:
                    edges.add((p, s))
                    changed = True
        if any((q, p) in edges for p, q in edges) or any(p == q for p, q in edges):
            continue
        key = frozenset(edges)
        if key not in seen:
            seen.add(key)
            yield key


# ---------------------------------------------------------------------------------------
# The check of one candidate execution
# ---------------------------------------------------------------------------------------
def _values(cx: _Context, rf: dict[int, int]) -> dict[int, int] | None:
    """The value each event writes (eid -> value), resolving atomics through what they read;
    None if atomics read from each other in a cycle."""
    out: dict[int, int] = {e.eid: 0 for e in cx.init.values()}
    pending = [e for e in cx.real if e.op.is_write]
    while pending:
        progress = False
        for e in list(pending):
            if e.op.kind == "st" or e.op.rmw == "exch":
                out[e.eid] = e.op.value
            elif rf[e.eid] in out:
                out[e.eid] = out[rf[e.eid]] + e.op.value
            else:
                continue
            pending.remove(e)
            progress = True
        if not progress:
            return None
    return out


def _consistent(cx: _Context, rf: dict[int, int], co: list[list[bool]], sc_rank: dict[int, int]) -> bool:
    n, po, ms = len(cx.events), cx.po, cx.ms
    # observation order: rf between morally strong pairs, extended through atomics
    obs = [[False] * n for _ in range(n)]
    for r, w in rf.items():
        if ms[w][r]:
            obs[w][r] = True
    changed = True
    while changed:
        changed = False
        for z in cx.real:
            if z.op.kind not in ("atom", "red"):
                continue
            for w in range(n):
                if obs[w][z.eid]:
                    for r in range(n):
                        if obs[z.eid][r] and not obs[w][r]:
                            obs[w][r] = True
                            changed = True
    # synchronizes-with: fence.sc pairs in Fence-SC order, release -> acquire patterns
    bc = [row[:] for row in po]
    for a, b in itertools.permutations(cx.fences_sc, 2):
        if ms[a.eid][b.eid] and sc_rank[a.eid] < sc_rank[b.eid]:
            bc[a.eid][b.eid] = True
    for first, w in cx.release_patterns():
        for r, last in cx.acquire_patterns():
            if obs[w.eid][r.eid] and ms[first.eid][last.eid]:
                bc[first.eid][last.eid] = True
    for i in cx.init.values():  # the initial writes precede the kernel
        for e in cx.real:
            bc[i.eid][e.eid] = True
    bc = _closure(bc)
    if any(bc[i][i] for i in range(n)):
        return False
    # Fence-SC: fence-SC order cannot contradict causality (base causality between fences)
    for a, b in itertools.permutations(cx.fences_sc, 2):
        if ms[a.eid][b.eid] and bc[a.eid][b.eid] and sc_rank[a.eid] > sc_rank[b.eid]:
            return False

    def causal(x: _Event, y: _Event) -> bool:  # same-location memory operations only
        if x.op.loc != y.op.loc:
            return False
        if bc[x.eid][y.eid]:
            return True
        return any(obs[x.eid][z] and bc[z][y.eid] for z in range(n))

    for loc in cx.locations:
        init = cx.init[loc]
        same = [init] + [e for e in cx.real if e.op.loc == loc]
        writes = [init] + cx.writes[loc]
        reads = [e for e in same if e.op.is_read]
        # Coherence: causality between writes implies coherence order
        for w1, w2 in itertools.permutations(writes, 2):
            if causal(w1, w2) and not co[w1.eid][w2.eid]:
                return False
        # Causality
        for r in reads:
            src = rf[r.eid]
            for w in writes:
                if w.eid == src and causal(r, w):
                    return False
                if causal(w, r) and co[src][w.eid]:
                    return False
        # Atomicity of RMWs against morally strong writes
        for a in reads:
            if a.op.kind not in ("atom", "red"):
                continue
            src = rf[a.eid]
            if ms[src][a.eid] and not co[src][a.eid]:
                return False
            for w in writes:
                if w.eid not in (a.eid, src) and ms[a.eid][w.eid] and co[src][w.eid] and co[w.eid][a.eid]:
                    return False
        # Sequential consistency per location over morally strong pairs
        edges = [[False] * n for _ in range(n)]
        for x, y in itertools.permutations(same, 2):
            if x.thread >= 0 and y.thread == x.thread and po[x.eid][y.eid]:
                edges[x.eid][y.eid] = True
            if not ms[x.eid][y.eid]:
                continue
            if x.op.is_write and y.op.is_read and rf[y.eid] == x.eid:
                edges[x.eid][y.eid] = True
            if x.op.is_write and y.op.is_write and co[x.eid][y.eid]:
                edges[x.eid][y.eid] = True
            if x.op.is_read and y.op.is_write and x.eid != y.eid and co[rf[x.eid]][y.eid]:
                edges[x.eid][y.eid] = True
        cl = _closure(edges)
        if any(cl[e.eid][e.eid] for e in same):
            return False
    return True


def _executions(cx: _Context):
    """Yield (rf, co, values) of every consistent candidate execution."""
    n = len(cx.events)
    rf_choices = []
    for r in cx.reads:
        srcs = [cx.init[r.op.loc].eid] + [w.eid for w in cx.writes[r.op.loc] if w.eid != r.eid]
        rf_choices.append(srcs)
    co_choices = [list(_partial_orders(cx.writes[loc], cx.ms)) for loc in cx.locations]
    sc_orders = list(itertools.permutations([f.eid for f in cx.fences_sc])) or [()]
    for co_pick in itertools.product(*co_choices):
        co = [[False] * n for _ in range(n)]
        for loc, edges in zip(cx.locations, co_pick):
            i = cx.init[loc].eid
            for w in cx.writes[loc]:
                co[i][w.eid] = True
            for a, b in edges:
                co[a][b] = True
        for srcs in itertools.product(*rf_choices):
            rf = {r.eid: s for r, s in zip(cx.reads, srcs)}
            vals = _values(cx, rf)
            if vals is None:
                continue
            for order in sc_orders:
                rank = {eid: k for k, eid in enumerate(order)}
                if _consistent(cx, rf, co, rank):
                    yield rf, co, vals
                    break


def _finals(cx: _Context, co: list[list[bool]], vals: dict[int, int], loc: str) -> set[int]:
    """Possible final values of ``loc``: values of its coherence-maximal writes."""
    writes = [cx.init[loc]] + cx.writes[loc]
    top = [w for w in writes if not any(co[w.eid][v.eid] for v in writes)]
    return {vals[w.eid] for w in top}


def observe(threads: Sequence[Sequence[Op]], registers: Sequence[str], finals: Sequence[str],
            rf: dict[int, int], co, vals, cx: _Context) -> set[tuple[int, ...]]:
    by_reg = {}
    for e in cx.reads:
        if e.op.reg is not None:
            by_reg[e.op.reg] = vals[rf[e.eid]]
    base = tuple(by_reg[r] for r in registers)
    options = [sorted(_finals(cx, co, vals, loc)) for loc in finals]
    return {base + tuple(f) for f in itertools.product(*options)}


def allowed_outcomes(threads: Sequence[Sequence[Op]], where: Sequence[Where], registers: Sequence[str],
                     finals: Sequence[str] = ()) -> set[tuple[int, ...]]:
    """Outcomes (register values in ``registers`` order, then final values of ``finals``)
    of every execution the PTX memory model allows for ``threads`` placed at ``where``."""
    cx = _Context(threads, where)
    out: set[tuple[int, ...]] = set()
    for rf, co, vals in _executions(cx):
        out |= observe(threads, registers, finals, rf, co, vals, cx)
    return out


def sc_outcomes(threads: Sequence[Sequence[Op]], registers: Sequence[str],
                finals: Sequence[str] = ()) -> set[tuple[int, ...]]:
    """Outcomes of every sequentially consistent interleaving of ``threads``."""
    out: set[tuple[int, ...]] = set()
    tags = [t for t, ops in enumerate(threads) for _ in ops]
    for order in set(itertools.permutations(tags)):
        mem: dict[str, int] = {}
        regs: dict[str, int] = {}
        pos = [0] * len(threads)
        for t in order:
            op = threads[t][pos[t]]
            pos[t] += 1
            if op.kind == "fence":
                continue
            old = mem.get(op.loc, 0)
            if op.kind == "ld":
                if op.reg:
                    regs[op.reg] = old
            elif op.kind == "st":
                mem[op.loc] = op.value
            else:
                if op.reg:
                    regs[op.reg] = old
                mem[op.loc] = op.value if op.rmw == "exch" else old + op.value
        out.add(tuple(regs[r] for r in registers) + tuple(mem.get(loc, 0) for loc in finals))
    return out


__all__ = ["SCOPES", "Op", "Where", "allowed_outcomes", "contains", "locations_of", "sc_outcomes"]
