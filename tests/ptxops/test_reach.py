"""The reach rules (``ptxops.spec.reach``), without CuTeDSL: which scopes each pointer reach
allows, checked against every scoped family's legal forms (property-tested), and the errors."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ptxops import QualifierError, ScopeError, spec
from ptxops.cli import main
from ptxops.spec import reach

#: The narrowest scope each reach needs, from the PTX memory model (section 8.5): shared memory
#: of this CTA is observed by the CTA, distributed shared memory by the cluster, global memory
#: by the GPU, anything another GPU (a peer, an NVSHMEM PE writing our symmetric memory) or the
#: CPU observes only at .sys.  The oracle of these tests.
NEEDS = {"cta": "cta", "cluster": "cluster", "gpu": "gpu", "peer": "sys", "symmetric": "sys",
         "multicast": "sys", "host": "sys"}
ORDER = ("cta", "cluster", "gpu", "sys")
ORIGIN = "a test at here.py:1"


def test_the_table_is_the_memory_model() -> None:
    assert {k: r.needs for k, r in reach.REACHES.items()} == NEEDS
    assert reach.SCOPE_ORDER == ORDER


def test_every_scoped_family_is_checked_or_says_why_not() -> None:
    scoped = {name for name, fam in spec.FAMILIES.items() if "scope" in fam.keys}
    assert scoped == set(reach.SCOPED_ACCESSES) | set(reach.UNCHECKED_SCOPES)
    assert not set(reach.SCOPED_ACCESSES) & set(reach.UNCHECKED_SCOPES)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_raises_exactly_when_the_scope_is_narrower_than_the_reach(data) -> None:
    fam = spec.FAMILIES[data.draw(st.sampled_from(sorted(reach.SCOPED_ACCESSES)), label="family")]
    fixed = {k: data.draw(st.sampled_from(fam.domain(k)), label=k) for k in ("target", "sem", "scope")
             if k in fam.keys}
    q = fam.complete(**fixed)
    assume(q is not None)
    kind = data.draw(st.sampled_from(list(NEEDS)), label="reach")
    effective = fam.effective(q)
    scope = effective["scope"]
    narrow = scope is not None and ORDER.index(scope) < ORDER.index(NEEDS[kind])
    try:
        reach.check(fam, q, effective, kind, ORIGIN, "op")
    except ScopeError as e:
        assert narrow, f"{fam.name} {q} raised for reach {kind}"
        assert isinstance(e, QualifierError)
        assert e.reach == kind and e.origin == ORIGIN and e.target == q["target"]
        assert e.rule == f"reach-{kind}-needs-{NEEDS[kind]}" and e.rule in str(e)
        assert e.offending == {"scope": scope}
        assert f"needs .{NEEDS[kind]}" in str(e) and f"outside .{scope}" in str(e) and ORIGIN in str(e)
        for legal in e.legal["scope"]:  # every scope offered makes the form legal and wide enough
            assert ORDER.index(legal) >= ORDER.index(NEEDS[kind])
            form = reach.widened(fam, q, effective, legal)
            assert form is not None and fam.is_legal(form)
            assert {k: v for k, v in form.items() if k not in ("scope", "sem")} == {
                k: v for k, v in q.items() if k not in ("scope", "sem")}
            assert fam.effective(form)["sem"] == effective["sem"]
            reach.check(fam, form, fam.effective(form), kind, ORIGIN, "op")
    else:
        assert not narrow, f"{fam.name} {q} at scope {scope} passed for reach {kind}"


def test_weak_forms_pass_every_reach() -> None:
    for name in reach.SCOPED_ACCESSES:
        for inst in spec.forms(name, target="sm_100a"):
            if inst.effective.get("scope") is None:
                for kind in NEEDS:
                    reach.check(spec.family(name), inst.qualifiers, inst.effective, kind, ORIGIN, inst.opcode)


def test_the_message_names_rule_reach_origin_legal_scopes_and_target() -> None:
    inst = spec.instruction("st", sem="release", scope="gpu", space="global", type="b32", target="sm_90a")
    with pytest.raises(ScopeError) as info:
        reach.check(spec.family("st"), inst.qualifiers, inst.effective, "peer", ORIGIN, inst.opcode)
    text = str(info.value)
    assert "st.release.gpu.global.b32: a release store to peer memory needs .sys: other GPUs are outside .gpu" in text
    assert "[reach-peer-needs-sys]" in text and ORIGIN in text and "scope in {sys}" in text and "sm_90a" in text
    assert info.value.legal == {"scope": ["sys"]}


def test_an_implied_scope_is_checked_and_named_as_ptx_default() -> None:
    inst = spec.instruction("atom", op="add", space="global", type="u32")  # PTX: .relaxed.gpu
    with pytest.raises(ScopeError, match=r"a relaxed atomic on peer memory needs \.sys.*PTX's default"):
        reach.check(spec.family("atom"), inst.qualifiers, inst.effective, "peer", ORIGIN, inst.opcode)


def test_no_legal_scope_says_so() -> None:
    inst = spec.instruction("mbarrier.arrive", space="shared::cluster", target="sm_90a")  # .release.cta
    with pytest.raises(ScopeError, match="none: no form of mbarrier.arrive orders at .gpu") as info:
        reach.check(spec.family("mbarrier.arrive"), inst.qualifiers, inst.effective, "gpu", ORIGIN, inst.opcode)
    assert info.value.legal == {"scope": []}
    with pytest.raises(ScopeError, match=r"a release arrive on cluster shared memory needs \.cluster[\s\S]*"
                       r"scope in \{cluster\} \(write sem='release' with it\)") as info:
        reach.check(spec.family("mbarrier.arrive"), inst.qualifiers, inst.effective, "cluster", ORIGIN, inst.opcode)
    assert info.value.legal == {"scope": ["cluster"]}


def test_unknown_reach_and_wrong_space() -> None:
    with pytest.raises(QualifierError, match="the reaches are cta, cluster, gpu, peer, symmetric, multicast, host") as info:
        reach.reach("remote")
    assert info.value.rule == "known-reaches"
    with pytest.raises(ScopeError, match=r"peer memory cannot address the .shared::cta state space") as info:
        reach.check_space("st", "peer", "shared::cta", ORIGIN, "sm_90a")
    assert info.value.rule == "reach-space"
    reach.check_space("st", "cluster", "shared", ORIGIN, "sm_90a")  # .shared is .shared::cta
    reach.check_space("st", "peer", None, ORIGIN, "sm_90a")


def test_rules_command_lists_the_reach_rules(capsys) -> None:
    assert main(["rules", "reach"]) == 0
    out = capsys.readouterr().out
    for kind, needs in NEEDS.items():
        assert f"[reach-{kind}-needs-{needs}]" in out
        assert f"when reach={kind}: scope in {{{', '.join(ORDER[ORDER.index(needs):])}}}" in out
    assert main(["rules", "st"]) == 0
    assert "[reach-peer-needs-sys]" in capsys.readouterr().out
    assert main(["rules", "fence"]) == 0
    assert "reach-" not in capsys.readouterr().out
