"""The rule engine behind every instruction family: qualifiers, rules, validation, enumeration.

A family is data: an ordered list of :class:`Qualifier` domains and a list of :class:`Rule`
records.  A rule reads "when these qualifiers take these values, that qualifier must take one of
those values".  Validation finds the first rule a form breaks and explains it; enumeration walks
the cross product of the domains, pruning with the rules.  Nothing here knows about a particular
instruction.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import QualifierError
from .targets import DEFAULT_TARGET, PTX_VERSION, PTXAS_RELEASES, TARGETS

Value = str | int | None


def _fs(values: Value | Iterable[Value]) -> frozenset[Value]:
    if values is None or isinstance(values, (str, int)):
        return frozenset([values])
    return frozenset(values)


def show(value: Value) -> str:
    """How a qualifier value is written in messages and tables."""
    return "(absent)" if value is None else repr(value)


@dataclass(frozen=True)
class Qualifier:
    """One qualifier slot of an opcode.

    ``values`` are the spellings the slot takes (PTX spelling without the dot); ``None`` in
    ``values`` means the slot may be left out, and ``absent`` is what PTX assumes then
    (``"weak"`` for a missing sem of ``ld``, ``"generic"`` for a missing state space).
    ``prefix`` renders a value into the opcode (``".acc::" + "f32"``).
    """

    key: str
    values: tuple[Value, ...]
    doc: str
    absent: Value = None
    prefix: str = "."
    implied_by: Mapping[str, frozenset[Value]] | None = None

    @property
    def settable(self) -> bool:
        """False for slots the form implies, such as ``.noftz`` on 16-bit float atomics."""
        return self.implied_by is None

    def render(self, value: Value) -> str:
        return "" if value is None else f"{self.prefix}{value}"

    def render_in(self, q: Mapping[str, Value]) -> str:
        """This slot's text in the opcode of form ``q``."""
        if self.implied_by is None:
            value = q.get(self.key)
            return "" if value is None else f"{self.prefix}{value}"
        implied = all(q.get(k) in vs for k, vs in self.implied_by.items())
        return self.render(self.values[0]) if implied else ""


def implied(key: str, text: str, doc: str, *, by: Mapping[str, Iterable[Value]]) -> Qualifier:
    """A slot nobody sets: ``text`` appears in the opcode whenever the form matches ``by``."""
    return Qualifier(key, (text,), doc, implied_by={k: _fs(v) for k, v in by.items()})


#: What a ptxas release does with a form: assemble it, reject it (an error naming its line),
#: or crash (an internal error naming no line, which fails the whole module).
VERDICTS = ("assembles", "rejects", "crashes")


@dataclass(frozen=True)
class PtxasRecord:
    """Where ptxas ``releases`` depart from what their rule's flags say of ptxas: their
    ``verdict`` on the forms the rule applies to that also match ``when`` (``target`` included)."""

    releases: frozenset[str]
    verdict: str
    when: Mapping[str, frozenset[Value]]

    def matches(self, q: Mapping[str, Value], release: str) -> bool:
        return release in self.releases and all(q.get(k) in vs for k, vs in self.when.items())

    @property
    def text(self) -> str:
        """``ptxas 13.5 assembles them where sem = 'acq_rel'`` (them: the forms the record covers)."""
        where = " and ".join(f"{k} = {' or '.join(show(v) for v in sorted(vs, key=str))}"
                             for k, vs in self.when.items())
        verb = {"assembles": "assemble", "rejects": "reject", "crashes": "crash on"}[self.verdict]
        verb = self.verdict.replace("crashes", "crashes on") if len(self.releases) == 1 else verb
        return f"ptxas {' and '.join(sorted(self.releases))} {verb} them" + (f" where {where}" if where else "")


def ptxas_record(releases: str | Iterable[str], verdict: str, **when: Value | Iterable[Value]) -> PtxasRecord:
    """A :class:`PtxasRecord` from plain values: ``ptxas_record("13.5", "assembles", sem="acq_rel")``."""
    record = PtxasRecord(frozenset(_fs(releases)), verdict, {k: _fs(v) for k, v in when.items()})
    if verdict not in VERDICTS or not record.releases <= set(PTXAS_RELEASES):
        raise ValueError(f"a ptxas record gives a verdict of {VERDICTS} for releases of {PTXAS_RELEASES}: {record}")
    return record


@dataclass(frozen=True)
class Rule:
    """When every key in ``when`` holds one of its values, each key in ``allow`` must too.

    ``ptxas_enforced`` is False for the few rules where ptxas lets a form through that the PTX
    ISA forbids; ptxops follows the documentation there and the oracle tests know it.
    ``wrapped`` is False for a rule that marks legal PTX ptxops chooses not to wrap (``ld.param``:
    no CuTeDSL pointer addresses the parameter space): its error says so, never that the PTX
    is illegal, and ptxas is not expected to reject what only such rules refuse.
    ``isa_allows`` is True for the opposite disagreement: forms the PTX ISA lists that ptxas
    rejects (ptxops follows ptxas there, since what it emits must assemble).
    The flags hold for every release of :data:`~ptxops.spec.targets.PTXAS_RELEASES` but where
    ``ptxas`` records one's departure (:class:`PtxasRecord`): a release that assembles forms the
    rule refuses, rejects forms it allows, or crashes.
    """

    name: str
    text: str
    when: Mapping[str, frozenset[Value]]
    allow: Mapping[str, frozenset[Value]]
    ptxas_enforced: bool = True
    wrapped: bool = True
    isa_allows: bool = False
    ptxas: tuple[PtxasRecord, ...] = ()

    def ptxas_verdict(self, q: Mapping[str, Value], release: str) -> str:
        """What ptxas ``release`` does with form ``q``, as far as this rule goes (:data:`VERDICTS`)."""
        if self.applies(q):
            for record in self.ptxas:
                if record.matches(q, release):
                    return record.verdict
        return "rejects" if self.broken_keys(q) and not self.legal_ptx else "assembles"

    @property
    def legal_ptx(self) -> bool:
        """True where the forms this rule refuses are legal PTX as ptxas reads it: a
        docs-only rule, or legal PTX that ptxops does not wrap."""
        return not self.ptxas_enforced or not self.wrapped

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.when) | frozenset(self.allow)

    def applies(self, q: Mapping[str, Value]) -> bool:
        for k, vs in self.when.items():  # (a loop, not all() over a generator: the oracle's hot path)
            if q.get(k) not in vs:
                return False
        return True

    def broken_keys(self, q: Mapping[str, Value]) -> list[str]:
        for k, vs in self.when.items():  # (applies, inlined: called millions of times by the walks)
            if q.get(k) not in vs:
                return []
        return [k for k, vs in self.allow.items() if q.get(k) not in vs]


def rule(
    name: str,
    text: str,
    *,
    when: Mapping[str, Value | Iterable[Value]] | None = None,
    allow: Mapping[str, Value | Iterable[Value]],
    ptxas_enforced: bool = True,
    wrapped: bool = True,
    isa_allows: bool = False,
    ptxas: Iterable[PtxasRecord] = (),
) -> Rule:
    """Build a :class:`Rule` from plain values or iterables of values."""
    return Rule(
        name,
        text,
        {k: _fs(v) for k, v in (when or {}).items()},
        {k: _fs(v) for k, v in allow.items()},
        ptxas_enforced,
        wrapped,
        isa_allows,
        tuple(ptxas),
    )


#: An operand token parsed: (name, optional, key, has a value, value) of ``name?key=value``.
Token = tuple[str, bool, str, bool, str]


def _token(token: str) -> Token:
    name, optional, condition = token.partition("?")
    key, eq, value = condition.partition("=")
    return name, bool(optional), key, bool(eq), value


def _present(token: Token, q: Mapping[str, Value]) -> bool:
    """Whether an operand token (``tok``, ``tok?key`` or ``tok?key=value``) is in form ``q``."""
    _, optional, key, eq, value = token
    if not optional:
        return True
    return q.get(key) is not None if not eq else str(q.get(key)) == value


@dataclass(frozen=True)
class Family:
    """One PTX instruction family as data.

    ``qualifiers`` are in opcode order.  ``operands`` is the operand signature, one token per
    operand: ``d`` destination value, ``a`` address, ``b`` and ``c`` source values, or a literal;
    ``operand_variants`` maps conditions such as ``"op=cas"`` or ``"proxy=x,sem=y"`` to the
    signature of the forms that match them.  A token ``tok?key`` is present only in forms that
    give ``key``, ``tok?key=value`` only in forms where ``key`` is ``value`` (``policy?cache_hint``:
    the cache-policy operand that ``.L2::cache_hint`` adds).
    ``device_function`` names the ptxops function that emits the family; ``ptx_version`` the
    PTX ISA version that introduced its newest form (the ``.version`` an assembler must read).
    """

    name: str
    summary: str
    qualifiers: tuple[Qualifier, ...]
    rules: tuple[Rule, ...]
    operands: tuple[str, ...]
    device_function: str
    section: str
    operand_variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ptx_version: str = PTX_VERSION

    @property
    def settable(self) -> tuple[Qualifier, ...]:
        return tuple(q for q in self.qualifiers if q.settable)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(q.key for q in self.settable) + ("target",)

    def qualifier(self, key: str) -> Qualifier:
        return self._by_key[key]

    @functools.cached_property
    def _by_key(self) -> dict[str, Qualifier]:
        """The qualifiers by key (the first of a key)."""
        found: dict[str, Qualifier] = {}
        for q in self.qualifiers:
            found.setdefault(q.key, q)
        return found

    def effective(self, q: Mapping[str, Value]) -> dict[str, Value]:
        """The form with every absent qualifier replaced by what PTX assumes for it."""
        by_key = self._by_key
        return {k: (v if v is not None or k == "target" else by_key[k].absent) for k, v in q.items()}

    def domain(self, key: str) -> tuple[Value, ...]:
        return TARGETS if key == "target" else self.qualifier(key).values

    def signature(self, q: Mapping[str, Value]) -> tuple[str, ...]:
        """Operand tokens for a form (``atom.cas`` takes one more source than ``atom.add``)."""
        tokens, variants = self._signatures
        for pairs, variant in variants:
            if all(str(q.get(key)) == value for key, value in pairs):
                tokens = variant
                break
        return tuple(t[0] for t in tokens if _present(t, q))

    @functools.cached_property
    def _signatures(self) -> tuple[tuple[Token, ...], tuple[tuple[tuple[tuple[str, str], ...], tuple[Token, ...]], ...]]:
        """:attr:`operands` and :attr:`operand_variants` parsed once: the tokens, and each
        variant's (key, value) conditions with its tokens."""
        variants = tuple(
            (tuple((key, value) for key, _, value in (c.partition("=") for c in condition.split(","))),
             tuple(map(_token, variant)))
            for condition, variant in self.operand_variants.items()
        )
        return tuple(map(_token, self.operands)), variants

    # -- validation -------------------------------------------------------------------------

    def normalise(self, given: Mapping[str, object], *, partial: bool = False) -> dict[str, Value]:
        """Check keys and spellings; return every key with its value (``None`` if left out),
        or with ``partial`` only the keys given."""
        unknown = sorted(set(given) - set(self.keys))
        if unknown:
            raise QualifierError(
                self.name,
                f"{self.name}: unknown qualifier key(s) {', '.join(map(repr, unknown))}; "
                f"{self.name} takes {', '.join(self.keys)}",
                offending={k: given[k] for k in unknown},
                rule="known-keys",
                legal={"keys": list(self.keys)},
                target=str(given.get("target", DEFAULT_TARGET)),
            )
        q: dict[str, Value] = {}
        target = given.get("target", DEFAULT_TARGET)
        for key in self.keys:
            if partial and key not in given:
                continue
            value = given.get(key, DEFAULT_TARGET if key == "target" else None)
            if isinstance(value, str) and key == "vec" and value.startswith("v"):
                value = value[1:]
            if key == "vec" and isinstance(value, str) and value.isdigit():
                value = int(value)
            domain = self.domain(key)
            if value not in domain:
                spelled = [str(v) for v in domain if v is not None]
                near = difflib.get_close_matches(str(value), spelled, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                problem = (
                    f"{self.name} needs {key}="
                    if key not in given
                    else f"{key}={value!r} is not a {key} of {self.name}{hint}"
                )
                raise QualifierError(
                    self.name,
                    f"{self.name}: {problem}; legal values: "
                    f"{', '.join(show(v) for v in domain)} (target {target})",
                    offending={key: value},
                    rule="known-values",
                    legal={key: list(domain)},
                    target=str(target),
                )
            q[key] = value
        return q

    def broken(self, q: Mapping[str, Value]) -> tuple[Rule, list[str]] | None:
        """The first rule the form breaks and the keys it breaks, or None."""
        for r in self.rules:
            keys = r.broken_keys(q)
            if keys:
                return r, keys
        return None

    def ptxas_verdict(self, q: Mapping[str, Value], release: str) -> str:
        """What ptxas ``release`` does with form ``q`` by the spec's record (:data:`VERDICTS`):
        it crashes, or rejects it, where any rule says so; else it assembles it."""
        verdicts = {r.ptxas_verdict(q, release) for r in self.rules}
        return next(v for v in reversed(VERDICTS) if v in verdicts or v == "assembles")

    def is_legal(self, q: Mapping[str, Value]) -> bool:
        return self.broken(q) is None

    def alternatives(self, q: Mapping[str, Value], key: str) -> list[Value]:
        """Values of ``key`` that make the form legal with every other qualifier kept."""
        return [v for v in self.domain(key) if self.is_legal({**q, key: v})]

    def check(self, q: Mapping[str, Value]) -> None:
        """Raise :class:`QualifierError` for the first rule the normalised form ``q`` breaks."""
        found = self.broken(q)
        if found is None:
            return
        r, keys = found
        offending = {k: q[k] for k in keys}
        context = {k: q[k] for k in r.when if k not in offending}
        legal = {k: self.alternatives(q, k) for k in [*keys, *r.when] if k in q}
        label = "legal here"
        if not any(legal.values()):  # no one change makes the whole form legal: satisfy the rule
            legal = {
                k: [v for v in self.domain(k) if not r.broken_keys({**q, k: v})]
                for k in [*keys, *r.when] if k in q
            }
            label = "this rule allows (other qualifiers must change too)"
        what = ", ".join(f"{k}={show(v)}" for k, v in offending.items())
        with_ = ", ".join(f"{k}={show(v)}" for k, v in context.items())
        options = "; ".join(
            f"{k} in {{{', '.join(show(v) for v in vs)}}}" for k, vs in legal.items() if vs
        )
        verdict = "is legal PTX that ptxops does not wrap" if not r.wrapped else "is not allowed"
        raise QualifierError(
            self.name,
            f"{self.name}: {what} {verdict}" + (f" with {with_}" if with_ else "")
            + f" (target {q['target']}).\n  rule [{r.name}]: {r.text}\n"
            + f"  {label}: {options}",
            offending=offending,
            rule=r.name,
            legal=legal,
            target=str(q["target"]),
        )

    # -- enumeration ------------------------------------------------------------------------

    def enumerate(self, **fixed: Value) -> Iterator[dict[str, Value]]:
        """Every legal form, with the keys in ``fixed`` held at the given values."""
        return self._walk(fixed, self.rules)

    def count(self, **fixed: Value) -> int:
        """How many forms :meth:`enumerate` yields, without building them.

        The same walk, memoised: the forms below a key depend only on the values of the keys
        before it that a rule still to be checked reads, so each such prefix is counted once.
        """
        keys, ready = self._schedule(fixed, self.rules)
        # keys before i that a rule checked at i or later reads: the state a suffix depends on
        later = [sorted({keys.index(k) for rs in ready[i:] for r in rs for k in r.keys
                         if keys.index(k) < i}) for i in range(len(keys) + 1)]
        memo: dict[tuple[int, tuple[Value, ...]], int] = {}

        def walk(i: int, q: dict[str, Value]) -> int:
            if i == len(keys):
                return 1
            state = (i, tuple(q[keys[j]] for j in later[i]))
            if state not in memo:
                total = 0
                for v in (fixed[keys[i]],) if keys[i] in fixed else self.domain(keys[i]):
                    q[keys[i]] = v
                    if not any(r.broken_keys(q) for r in ready[i]):
                        total += walk(i + 1, q)
                del q[keys[i]]
                memo[state] = total
            return memo[state]

        return walk(0, {})

    def space(self, **fixed: Value) -> Iterator[dict[str, Value]]:
        """The whole cross product of the domains, legal or not (for the oracle tests)."""
        return self._walk(fixed, ())

    def complete(self, rules: Iterable[Rule] | None = None, **fixed: Value) -> dict[str, Value] | None:
        """The first form holding ``fixed`` that keeps ``rules`` (default: every rule), or None.
        The fixed keys are walked first, so a combination that cannot be completed fails fast."""
        chosen = self.rules if rules is None else tuple(rules)
        return next(self._walk(fixed, chosen, fixed_first=True), None)

    def _schedule(
        self, fixed: Mapping[str, Value], rules: Iterable[Rule], *, fixed_first: bool = False
    ) -> tuple[tuple[str, ...], list[list[Rule]]]:
        """The order the walk sets keys in, and the rules checked once each key is set (a rule
        as soon as every key it reads has a value)."""
        keys, ready, _ = self._plan(frozenset(fixed), tuple(rules), fixed_first)
        return keys, [list(rs) for rs in ready]

    @functools.cached_property
    def _plans(self) -> dict[tuple, tuple]:
        """:meth:`_plan`'s results, by (fixed keys, ids of the rules, fixed_first): each value
        holds its rules, so no id is reused while its entry lives."""
        return {}

    def _plan(
        self, fixed: frozenset[str], rules: tuple[Rule, ...], fixed_first: bool
    ) -> tuple[tuple[str, ...], tuple[tuple[Rule, ...], ...], tuple[tuple[str, ...], ...]]:
        """:meth:`_schedule`'s order and rules, and for each key the earlier keys its rules
        read; found once per family and arguments (the oracle's walks complete forms thousands
        of times)."""
        index = (fixed, tuple(map(id, rules)), fixed_first)
        plan = self._plans.get(index)
        if plan is None:
            keys = ("target",) + tuple(q.key for q in self.settable)
            if fixed_first:  # then the free keys from the type back: type and vector decide most
                keys = tuple(k for k in keys if k in fixed) + tuple(k for k in reversed(keys) if k not in fixed)
            ready: list[list[Rule]] = [[] for _ in keys]
            for r in rules:
                ready[max(keys.index(k) for k in r.keys)].append(r)
            reads = tuple(tuple(k for k in keys[:i] if any(k in r.keys for r in rs)) for i, rs in enumerate(ready))
            plan = self._plans[index] = (keys, tuple(map(tuple, ready)), reads)
        return plan

    def _walk(
        self, fixed: Mapping[str, Value], rules: Iterable[Rule], *, fixed_first: bool = False
    ) -> Iterator[dict[str, Value]]:
        """The cross product of the domains (``fixed`` keys held), pruned by ``rules``: each
        rule is checked as soon as every key it reads has a value.  Keys are walked in opcode
        order, or with ``fixed_first`` the fixed ones first and then the free ones from the
        last (the type) back, so that a completion the type and vector rule out fails fast."""
        keys, ready, reads = self._plan(frozenset(fixed), tuple(rules), fixed_first)
        choices = [(fixed[k],) if k in fixed else self.domain(k) for k in keys]
        last = len(keys) - 1
        q: dict[str, Value] = {}
        # The values of key i that keep the rules checked there depend only on the earlier keys
        # those rules read: a whole walk finds them once per combination of those (memo); a
        # completion, after the first form, checks them one at a time as it goes.
        memo: list[dict[tuple[Value, ...], tuple[Value, ...]]] = [{} for _ in keys]

        def kept(i: int) -> Iterator[Value]:
            key, rs = keys[i], ready[i]
            for v in choices[i]:
                q[key] = v
                if not any(r.broken_keys(q) for r in rs):
                    yield v

        def allowed(i: int) -> Iterable[Value]:
            if not ready[i]:
                return choices[i]
            if fixed_first:
                return kept(i)
            state = tuple([q[k] for k in reads[i]])
            found = memo[i].get(state)
            if found is None:
                found = memo[i][state] = tuple(kept(i))
            return found

        # depth-first, each key set in walk order (so each form's dict is in that order)
        stack = [iter(allowed(0))]
        while stack:
            i = len(stack) - 1
            for v in stack[i]:
                q[keys[i]] = v
                if i == last:
                    yield dict(q)
                else:
                    stack.append(iter(allowed(i + 1)))
                    break
            else:
                stack.pop()
