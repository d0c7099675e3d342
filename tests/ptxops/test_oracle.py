"""The spec accepts exactly what ptxas accepts.

The oracle is ptxas itself: forms are rendered into PTX modules and assembled (see
``ptxops.ptxas``) by the first assembler that reads the family's PTX ISA version
(``multimem.cp.async.bulk`` needs 9.1: the ``ptxas`` extra installs one; with an older ptxas
only, the tests of those families skip, naming the assemblers found).  The sanctioned
differences are a rule marked ``ptxas_enforced=False`` (there ptxas lets through a form the PTX
ISA forbids, and ptxops follows the documentation) and each rule's records of one ptxas release
(:class:`~ptxops.spec.engine.PtxasRecord`): the tests judge the assembler they run with by the
spec's record of its release (:meth:`~ptxops.spec.engine.Family.ptxas_verdict`), and skip with a
release the spec has no record of.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptxops import QualifierError, ptxas, render, spec
from ptxops.ptxas import PtxasUnavailable, assemble, ptxas_path, release
from ptxops.spec.engine import Family
from tests.support.spec_groups import ORACLE_GROUPS, domain, groups, legal_forms

try:
    ptxas_path()
except PtxasUnavailable as err:  # pragma: no cover - every CI machine has ptxas
    pytest.skip(str(err), allow_module_level=True)


def machine_assemblers() -> dict[str, str]:
    """The assembler of each PTX ISA version the spec uses, where the machine has one."""
    found = {}
    for version in sorted({f.ptx_version for f in spec.FAMILIES.values()}):
        try:
            found[version] = ptxas_path(version)
        except PtxasUnavailable:
            pass
    return found


#: Before any test narrows the candidates (:func:`assembler`).
MACHINE = machine_assemblers()


@pytest.fixture(params=["machine", "extra"])
def assembler(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Whose assemblers a test asks: the machine's (every candidate, each PTX ISA version by
    the oldest that reads it), then the ``ptxas`` extra's alone, as a user without a CUDA
    toolkit has it (skipped where the machine's are the extra's already).  Every form on every
    target and the recorded quirks are asked of both; the drawn and whole-domain comparisons
    of the machine's only."""
    if request.param == "extra":
        extra = ptxas.wheel_ptxas()
        if not extra:
            pytest.skip(f"no ptxas extra installed ({ptxas.INSTALL})")
        if set(MACHINE.values()) <= set(extra):
            pytest.skip("the machine's assemblers are the ptxas extra's")
        monkeypatch.setattr(ptxas, "candidates", lambda: list(extra))
        assert {ptxas_path(v) for v in MACHINE} <= set(extra), "another ptxas is still asked"
    return request.param


def isa(family: Family) -> tuple[str, str]:
    """The family's PTX ISA version and the release of the ptxas that assembles it; skips the
    test where no ptxas reads it, or where the spec records no verdicts of its release."""
    try:
        path = ptxas_path(family.ptx_version)
    except PtxasUnavailable as err:
        pytest.skip(f"{family.name}: {err}")
    found = release(path)
    if found not in spec.PTXAS_RELEASES:
        pytest.skip(f"{family.name}: {path} is ptxas {found}; the spec records the verdicts of ptxas "
                    f"{', '.join(spec.PTXAS_RELEASES)} (name one in PTXOPS_PTXAS)")
    return family.ptx_version, found


def line(family: Family, q: Mapping) -> str:
    layout = render.operands(family, q)
    return render.standalone(render.opcode(family, q), layout)


def broken_rules(family: Family, q: Mapping) -> list:
    return [r for r in family.rules if r.broken_keys(q)]


@pytest.mark.parametrize("name", list(ORACLE_GROUPS))
def test_oracle_groups_hold_every_rule(name: str) -> None:
    """The factored oracle is exhaustive only if every rule reads one group's keys (the
    target aside) and every key is in a group."""
    family = spec.FAMILIES[name]
    keys = {q.key for q in family.settable}
    assert set().union(*groups(family)) == keys
    for r in family.rules:
        assert any(r.keys - {"target"} <= set(g) for g in groups(family)), r.name


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", list(spec.FAMILIES))
def test_spec_agrees_with_ptxas_on_the_whole_domain(name: str, target: str) -> None:
    """Every combination of the family's qualifier domains (for ld and st: of each group's
    domains, see :data:`ORACLE_GROUPS`): ptxas assembles it exactly where the spec's record of
    this ptxas release says (legal forms, docs-only rules and legal PTX that ptxops does not wrap,
    but where a rule records this release's departure); forms it records as crashing ptxas are
    not asked."""
    family = spec.FAMILIES[name]
    version, found = isa(family)
    forms, expected = [], []
    for q in domain(family, target):
        verdict = family.ptxas_verdict(q, found)
        if verdict != "crashes":
            forms.append(q)
            expected.append(verdict == "assembles")
    verdicts = assemble([line(family, q) for q in forms], target, version)
    wrong = [
        (line(family, q), verdict, [r.name for r in broken_rules(family, q)])
        for q, verdict, ok in zip(forms, verdicts, expected)
        if (verdict is None) != ok
    ]
    assert not wrong, f"{len(wrong)} disagreements with ptxas {found}, first: {wrong[:5]}"
    legal = (sum(family.ptxas_verdict(q, found) == "assembles" for q in family.enumerate(target=target))
             if name not in ORACLE_GROUPS else 1)
    assert sum(expected) >= legal
    assert legal > 0 or not_on(family, target), f"{name} has no forms on {target}"


def not_on(family: Family, target: str) -> bool:
    """True where a rule that always applies excludes the target (``st.bulk`` on sm_90a)."""
    return any(not r.when and target not in r.allow.get("target", {target}) for r in family.rules)


@pytest.mark.parametrize("version", sorted({f.ptx_version for f in spec.FAMILIES.values()}))
@pytest.mark.parametrize("target", spec.TARGETS)
def test_every_form_of_every_family_assembles(target: str, version: str, assembler: str) -> None:
    """Every legal form (for ld and st: every legal form of the oracle groups) of the families
    of one PTX ISA version assembles, but those the spec records this ptxas release rejecting."""
    families = [f for f in spec.FAMILIES.values() if f.ptx_version == version]
    _, found = isa(families[0])
    if assembler == "extra" and ptxas_path(version) == MACHINE.get(version):
        pytest.skip(f"PTX ISA {version}: the machine's assembler is the extra's, asked already")
    statements = [
        line(family, inst.qualifiers)
        for family in families
        for inst in legal_forms(family.name, target)
        if family.ptxas_verdict(inst.qualifiers, found) == "assembles"
    ]
    verdicts = assemble(statements, target, version)
    rejected = [(s, v) for s, v in zip(statements, verdicts) if v]
    assert not rejected, rejected[:5]


@pytest.mark.usefixtures("assembler")
def test_a_docs_only_rule_really_is_lenient_in_ptxas() -> None:
    """st.v8 of a 16-bit type: ptxas assembles it, the PTX ISA forbids it, ptxops rejects it."""
    with pytest.raises(QualifierError, match="v8-32bit-only"):
        spec.instruction("st", space="global", vec=8, type="b16", target="sm_100a")
    q = spec.FAMILIES["st"].normalise(dict(space="global", vec=8, type="b16", target="sm_100a"))
    assert assemble([line(spec.FAMILIES["st"], q)], "sm_100a") == [None]


@pytest.mark.usefixtures("assembler")
def test_prefetch_eviction_priority_follows_the_isa_where_ptxas_is_lenient() -> None:
    """prefetch.L2::evict_last on a generic address: ptxas assembles it, the ISA's syntax writes
    .global, ptxops refuses it and takes prefetch.global.L2::evict_last."""
    fam = spec.FAMILIES["prefetch"]
    with pytest.raises(QualifierError, match="eviction-priority-names-global"):
        spec.instruction("prefetch", level="L2::evict_last")
    q = fam.normalise(dict(level="L2::evict_last"))
    assert assemble([line(fam, q)], "sm_90") == [None]
    assert spec.instruction("prefetch", space="global", level="L2::evict_last").opcode == "prefetch.global.L2::evict_last"


@pytest.mark.usefixtures("assembler")
def test_membar_proxy_async_follows_the_isa_and_ptxas_13_5() -> None:
    """membar.proxy.async: the ISA lists it and ptxas 13.5 assembles it, so ptxops emits it;
    ptxas 13.0 rejects it, as the rule records."""
    fam = spec.FAMILIES["membar"]
    q = spec.instruction("membar", proxy="async", target="sm_90a").qualifiers
    _, found = isa(fam)
    verdict = assemble([line(fam, q)], "sm_90a")[0]
    assert (verdict is None) == (fam.ptxas_verdict(q, found) == "assembles")
    assert [fam.ptxas_verdict(q, r) for r in spec.PTXAS_RELEASES] == ["rejects", "assembles"]


@pytest.mark.parametrize("name", [n for n, f in spec.FAMILIES.items()
                                  if any(p.verdict == "crashes" for r in f.rules for p in r.ptxas)])
@pytest.mark.usefixtures("assembler")
def test_the_crashes_the_spec_records_happen(name: str) -> None:
    """Each record of a crash of this ptxas release: a form it covers, alone in a module, stops
    ptxas with an error that names no line (so the oracle leaves out no form it could ask about)."""
    family = spec.FAMILIES[name]
    version, found = isa(family)
    records = [(r, p) for r in family.rules for p in r.ptxas if p.verdict == "crashes" and found in p.releases]
    if not records:
        pytest.skip(f"{name}: no crash of ptxas {found} recorded")
    for r, p in records:
        covered = [q for t in spec.TARGETS for q in domain(family, t) if r.applies(q) and p.matches(q, found)]
        assert covered, (r.name, p)
        for q in covered[:24]:
            try:
                assemble([line(family, q)], q["target"], version)
            except RuntimeError as err:
                assert "outside any statement" in str(err)
                break
        else:
            pytest.fail(f"{name}: rule {r.name} records ptxas {found} crashing on {dict(p.when)}, but "
                        f"none of {len(covered[:24])} of its forms crashed it")


@pytest.mark.usefixtures("assembler")
def test_a_rule_where_the_isa_lists_forms_ptxas_rejects() -> None:
    """membar.proxy.async.global: the ISA lists it, ptxas rejects it, so ptxops refuses it."""
    fam = spec.FAMILIES["membar"]
    (r,) = [r for r in fam.rules if r.isa_allows]
    q = fam.normalise(dict(proxy="async.global"))
    assert r.broken_keys(q) and assemble([line(fam, q)], "sm_90a") != [None]


# -- arbitrary qualifier dictionaries, legal and illegal values mixed ---------------------------

#: Misspellings and values of other families, to mix into each family's domains (no PTX
#: spelling that is legal but outside the spec, such as `.unified`, and no qualifier
#: ptxas 13.0 silently ignores where it does not belong, such as `ld.acc::f32.b8`).
STRAY = ("relax", ".relaxed", "acq_rel", "weak", "release", "acquire", "volatile", "shared",
         "v4", 3, 16, "f8", "e4m3", "b16", "s64", "f16", "cas", "inc", "sc")
#: Values that are no PTX qualifier at all, for keys a family does not have.
MISSPELLED = ("relax", ".relaxed", "f8", 3, 16, "glob", "acc::f31", "v3")


def _values(family: Family, key: str) -> list:
    """The key's own values, other families' values for it, and strays; never a value that
    another slot of this family takes (``sem="inc"`` on ``red`` spells the legal ``red.inc``).
    A key the family does not have gets misspellings only: any real PTX word could be a
    qualifier of this family's instruction (``proxy="async"`` on ``st`` spells the legal
    ``st.async``, ``acc="acq_rel"`` on ``atom`` the legal ``atom.acq_rel``)."""
    if key not in family.keys:
        return list(MISSPELLED)
    own = list(family.domain(key))
    others = {v for f in spec.FAMILIES.values() for k in f.keys if k == key for v in f.domain(k)}
    taken = {str(v) for k in family.keys if k not in (key, "target") for v in family.domain(k)}
    foreign = [v for v in sorted(others - set(own), key=str) + list(STRAY) if str(v) not in taken]
    return own + foreign


@st.composite
def qualifier_dicts(draw, family: Family) -> dict:
    keys = [k for k in family.keys if k != "target"] + ["acc", "op", "vec", "proxy"]
    chosen = draw(st.lists(st.sampled_from(sorted(set(keys))), unique=True, max_size=len(keys)))
    q = {
        k: draw(st.sampled_from([v for v in _values(family, k) if v is not None or k in family.keys]))
        for k in chosen
    }
    q["target"] = draw(st.sampled_from(spec.TARGETS))
    return q


def raw_line(family: Family, q: Mapping) -> str:
    """Render a dictionary the spec may reject: known slots in their place, anything else
    appended before the type, as a user mistyping an opcode would."""
    known = {k: v for k, v in q.items() if k in family.keys}
    text = render.opcode(family, known)
    extra = "".join(f".{v}" for k, v in q.items() if k not in family.keys and v is not None)
    if extra and "type" in known and known["type"] is not None:
        head, _, tail = text.rpartition(f".{known['type']}")
        text = f"{head}{extra}.{known['type']}{tail}"
    else:
        text += extra
    layout = render.operands(family, known)
    return render.standalone(text, layout)


@pytest.mark.parametrize("name", list(spec.FAMILIES))
def test_instruction_accepts_exactly_what_ptxas_accepts(name: str) -> None:
    """120 qualifier dictionaries drawn by hypothesis, legal and illegal values mixed: where the
    spec accepts one, ptxas assembles it as the spec records of this release; where the spec
    rejects one that ptxas should reject too, ptxas rejects it.  The draws are asked of ptxas
    together, one module per target (:func:`verdicts`: each statement's verdict is the one it
    gets alone)."""
    family = spec.FAMILIES[name]
    version, found = isa(family)
    asked: list[tuple[str, str, bool, str]] = []  # (statement, target, assembles, what the spec says)

    @settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def draw(data) -> None:
        q = data.draw(qualifier_dicts(family))
        try:
            inst = spec.instruction(name, **q)
        except QualifierError as err:
            accepted, rule = False, err.rule
        else:
            accepted, rule = True, None
        if accepted:
            recorded = family.ptxas_verdict(inst.qualifiers, found)
            if recorded != "crashes":
                asked.append((line(family, inst.qualifiers), q["target"], recorded == "assembles",
                              f"spec accepts {inst.opcode} and records ptxas {found} {recorded} it"))
            return
        normal = None
        try:
            normal = family.normalise(q)
        except QualifierError:
            pass
        if normal is not None and family.ptxas_verdict(normal, found) != "rejects":
            return  # a docs-only rule, legal PTX that ptxops does not wrap, or a recorded crash
        asked.append((raw_line(family, normal or q), q["target"], False, f"spec rejects {q} (rule {rule})"))

    draw()
    wrong = [f"{what}, ptxas says {verdict}"
             for (_, _, assembles, what), verdict in zip(asked, verdicts(asked, version))
             if (verdict is None) != assembles]
    assert not wrong, f"{len(wrong)} disagreements with ptxas {found}: {wrong[:5]}"


def verdicts(asked: list[tuple[str, str, bool, str]], version: str) -> list[str | None]:
    """ptxas's verdict on each (statement, target, ...) of ``asked``, as if assembled alone: the
    statements of each target in one module (:func:`~ptxops.ptxas.assemble`: an error names its
    line, and statements that pass are assembled again until a module assembles cleanly), then
    each verdict the test would fail on asked again alone, so that no neighbour decides it."""
    found: list[str | None] = [None] * len(asked)
    for target in dict.fromkeys(t for _, t, _, _ in asked):
        at = [i for i, (_, t, _, _) in enumerate(asked) if t == target]
        for i, verdict in zip(at, assemble([asked[i][0] for i in at], target, version)):
            found[i] = verdict
    for i, (statement, target, assembles, _) in enumerate(asked):
        if (found[i] is None) != assembles:
            found[i] = assemble([statement], target, version)[0]
    return found
