"""Generate the instruction reference (MyST Markdown) from ``ptxops.spec`` at build time.

``docs/conf.py`` calls :func:`generate` before Sphinx reads the sources; it writes
``docs/instructions/`` (git-ignored: generated, never committed, so it cannot drift from the
spec).  Run by hand with ``python docs/gen_reference.py [OUTDIR]``.

Per family: the summary, PTX ISA section, device function, qualifiers (domain, what absence
means, which values only some targets have), rules (name, text, condition, whether ptxas
enforces them), legal-form counts per target, and every legal form's PTX statement with the
targets it is legal on (one collapsible block per ``op`` or ``sem`` value).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout's ptxops, installed or not

from ptxops import render, spec  # noqa: E402
from ptxops.render import ROLE_DOC  # noqa: E402
from ptxops.spec import nvshmem, reach  # noqa: E402
from ptxops.spec.engine import Family, Rule, Value  # noqa: E402

OUT = HERE / "instructions"


def page_name(family: str) -> str:
    return family.replace(".", "-")


def show(value: Value) -> str:
    return "(absent)" if value is None else f"`{value}`"


def show_targets(targets: Iterable[str]) -> str:
    targets = [t for t in spec.TARGETS if t in set(targets)]
    return "all targets" if len(targets) == len(spec.TARGETS) else ", ".join(targets)


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def condition(values: dict) -> str:
    if not values:
        return "always"
    parts = []
    for key, vs in values.items():
        vs = sorted(vs, key=lambda v: (v is not None, str(v)))
        parts.append(f"{key} ∈ {{{', '.join(show(v) for v in vs)}}}" if vs else f"{key}: nothing")
    return "; ".join(parts)


#: Families with more distinct statements than this list only those with every qualifier
#: outside :data:`CORE_KEYS` (the cache hints of ld/st) left out.
MAX_LISTED = 10000
CORE_KEYS = ("sem", "scope", "space", "op", "vec", "type")


class Forms:
    """Every legal form of a family on every target, enumerated once: the forms of
    ``spec.forms`` (its walk, :meth:`Family.enumerate`), each with its statement as
    :attr:`Instruction.statement` writes it (:func:`ptxops.render.symbolic`; the rest of an
    instruction, its inline-asm template, is not needed here)."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.counts: dict[str, int] = {}
        # statement -> (qualifiers without target, targets it is legal on), in first-seen order
        self.by_statement: dict[str, tuple[dict, list[str]]] = {}
        # qualifier key -> value -> targets where some legal form uses it
        self.values: dict[str, dict[Value, set[str]]] = defaultdict(lambda: defaultdict(set))
        statements: dict[tuple, str] = {}  # rendered once per form, whatever the target (opcode and operands read none)
        for target in spec.TARGETS:
            n = 0
            for form in family.enumerate(target=target):
                n += 1
                q = {k: v for k, v in form.items() if k != "target"}
                key = tuple(q.items())
                statement = statements.get(key)
                if statement is None:
                    statement = statements[key] = render.symbolic(render.opcode(family, form),
                                                                  render.operands(family, form))
                entry = self.by_statement.setdefault(statement, (q, []))
                entry[1].append(target)
                for k, v in q.items():
                    self.values[k][v].add(target)
            self.counts[target] = n

    @property
    def group_key(self) -> str | None:
        keys = [q.key for q in self.family.settable]
        return next((k for k in ("op", "sem", "proxy") if k in keys), None)


def qualifier_table(family: Family, forms: Forms) -> list[str]:
    if not family.qualifiers:
        return [f"`{family.name}` takes no qualifiers."]
    lines = [
        "| key | opcode slot | values | absent means | only on some targets |",
        "| --- | --- | --- | --- | --- |",
    ]
    for q in family.qualifiers:
        if not q.settable:
            by = condition(dict(q.implied_by or {}))
            lines.append(
                f"| {q.key} | `{q.render(q.values[0])}` | implied, not settable | "
                f"— | written whenever {cell(by)} |"
            )
            continue
        values = ", ".join(show(v) for v in q.values)
        absent = show(q.absent) if None in q.values and q.absent is not None else (
            "left out of the opcode" if None in q.values else "required"
        )
        partial = [
            f"{show(v)}: {show_targets(ts)}"
            for v, ts in forms.values[q.key].items()
            if len(ts) < len(spec.TARGETS)
        ]
        unused = [show(v) for v in q.values if v not in forms.values[q.key]]
        if unused:
            partial.append(f"never legal: {', '.join(unused)}")
        slot = f"`{q.prefix}<{q.key}>`"
        lines.append(
            f"| {q.key} | {slot} | {cell(values)} | {cell(absent)} | "
            f"{cell('; '.join(partial)) or '—'} |"
        )
    lines.append("")
    lines.append("What each key means:")
    lines.append("")
    for q in family.qualifiers:
        lines.append(f"- **{q.key}**: {q.doc}")
    return lines


def rule_table(rules: Iterable[Rule]) -> list[str]:
    rules = list(rules)
    if not rules:
        return ["No rules: every combination of the qualifiers is legal."]
    lines = [
        "| rule | when | must hold | ptxas enforces | what the PTX ISA says |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rules:
        enforced = (
            "**no** (ptxops follows the ISA)" if not r.ptxas_enforced
            else "yes, **though the ISA lists these forms** (ptxops follows ptxas)" if r.isa_allows
            else "yes"
        ) + "".join(f"; {p.text}" for p in r.ptxas)
        lines.append(
            f"| `{r.name}` | {cell(condition(dict(r.when)))} | {cell(condition(dict(r.allow)))} | "
            f"{enforced} | {cell(r.text)} |"
        )
    return lines


def reach_section(family: Family) -> list[str]:
    """The scope each pointer reach needs, for a family whose ordered forms are checked."""
    if family.name not in reach.SCOPED_ACCESSES:
        return []
    lines = [
        "## Scope against the pointer's reach",
        "",
        f"An ordered form (one with a scope, given or PTX's default) whose address was tagged with "
        f"{{py:func}}`ptxops.reach` must order at a scope that contains every observer of that memory, "
        f"or it raises {{py:class}}`ptxops.ScopeError` at trace time (`python -m ptxops rules reach`).",
        "",
        "| rule | reach | legal scopes | why |",
        "| --- | --- | --- | --- |",
    ]
    for r in reach.REACHES.values():
        legal = reach.SCOPE_ORDER[reach.SCOPE_ORDER.index(r.needs):]
        lines.append(f"| `{reach.rule_name(r)}` | `{r.kind}` | {', '.join(legal)} | {cell(reach.rule_text(r))} |")
    return [*lines, ""]


def operand_legend(family: Family) -> str:
    """What the family's operand tokens mean (`d` destination, `a` address, ...)."""
    signatures = (family.operands, *family.operand_variants.values())
    tokens = dict.fromkeys(t.partition("?")[0] for sig in signatures for t in sig)
    named = [f"`{t}` {ROLE_DOC[t]}" for t in tokens if t in ROLE_DOC]
    if any("?" in t for sig in signatures for t in sig):
        named.append("`t?k` operand `t` only in forms that give `k`, `t?k=v` where `k` is `v`")
    if "_" in tokens:
        named.append("`_` the sink (no result)")
    return f" ({', '.join(named)})" if named else ""


def family_page(family: Family, forms: Forms) -> str:
    fn = family.device_function
    out = [
        f"(instr-{page_name(family.name)})=",
        f"# `{family.name}`",
        "",
        family.summary,
        "",
        f"- **PTX ISA section:** {family.section}",
        f"- **Device function:** {{py:func}}`ptxops.{fn}` (`from ptxops import {fn}`)",
        f"- **Operands:** `{' '.join(family.operands) or '(none)'}`"
        + "".join(
            f"; `{' '.join(v)}` when {c.replace(',', ', ')}" for c, v in family.operand_variants.items()
        )
        + operand_legend(family),
        f"- **Explain one form:** `python -m ptxops explain {family.name} --target sm_90a ...`",
        "",
        "## Legal forms per target",
        "",
        "| " + " | ".join(spec.TARGETS) + " |",
        "|" + " --- |" * len(spec.TARGETS),
        "| " + " | ".join(str(forms.counts[t]) for t in spec.TARGETS) + " |",
        "",
        "## Qualifiers",
        "",
        "In opcode order. Values are spelled as in PTX without the dot; *absent* means the "
        "qualifier is left out, and the column says what PTX assumes then.",
        "",
        *qualifier_table(family, forms),
        "",
        "## Rules",
        "",
        "A rule reads: when the qualifiers match *when*, they must satisfy *must hold*. A form "
        f"that breaks one raises {{py:class}}`ptxops.QualifierError` naming the rule, at trace "
        "time in a kernel or from {py:func}`ptxops.spec.instruction`.",
        "",
        *rule_table(family.rules),
        "",
        *reach_section(family),
        "## Every legal form",
        "",
        f"{len(forms.by_statement)} distinct statements over all targets, each with the targets "
        "it is legal on (the opcode a combination of qualifiers renders to, then its operands). "
        f"The same list, per target: `python -m ptxops list {family.name} --target sm_90a`.",
        "",
    ]
    listed = forms.by_statement
    hints = [k.key for k in family.settable if k.key not in CORE_KEYS]
    if len(listed) > MAX_LISTED and hints:  # ld, st: the forms with every cache hint left out
        listed = {s: e for s, e in listed.items() if all(e[0].get(k) is None for k in hints)}
        out += [
            f"Listed here: the {len(listed)} statements with {', '.join(hints)} left out; each "
            "combines with those qualifiers as the rules allow (for example "
            f"`python -m ptxops list {family.name} --where {hints[0]}=... --target sm_90a`).",
            "",
        ]
    groups: dict[Value, list[tuple[str, list[str]]]] = defaultdict(list)
    key = forms.group_key
    for statement, (q, targets) in listed.items():
        groups[q.get(key) if key else None].append((statement, targets))
    width = max(len(s) for s in listed) + 2
    for value, rows in groups.items():
        label = f"{key} = {value if value is not None else '(absent)'}" if key else "all forms"
        out += [
            "<details>",
            f"<summary>{label}: {len(rows)} forms</summary>",
            "",
            "```text",
            *(f"{s.ljust(width)}{show_targets(ts)}" for s, ts in rows),
            "```",
            "",
            "</details>",
            "",
        ]
    return "\n".join(out)


def index_page(families: dict[str, Forms]) -> str:
    out = [
        "(instructions)=",
        "# Instruction reference",
        "",
        "Generated from {py:mod}`ptxops.spec` when the documentation is built: every table here "
        "is the spec itself, so it cannot drift from what the device functions accept. "
        "Targets: " + ", ".join(f"`{t}`" for t in spec.TARGETS)
        + f" (default `{spec.DEFAULT_TARGET}`).",
        "",
        "| family | summary | device function | " + " | ".join(spec.TARGETS) + " |",
        "| --- | --- | --- |" + " --- |" * len(spec.TARGETS),
    ]
    for name, forms in families.items():
        fam = forms.family
        out.append(
            f"| [`{name}`]({page_name(name)}.md) | {cell(fam.summary)} | "
            f"{{py:func}}`ptxops.{fam.device_function}` | "
            + " | ".join(str(forms.counts[t]) for t in spec.TARGETS) + " |"
        )
    out += [
        "",
        "The counts are legal forms per target (the same as `python -m ptxops list`). "
        "`python -m ptxops check` assembles every legal form with `ptxas`; the oracle tests "
        "check that the spec accepts exactly what `ptxas` accepts.",
        "",
        "The NVSHMEM calls of {py:mod}`ptxops.nvshmem` (not PTX instructions: calls into NVSHMEM's "
        "device library) have [their own page](nvshmem.md): operands, ordering and rules.",
        "",
        *disagreements(families),
        "```{toctree}",
        ":maxdepth: 1",
        ":hidden:",
        "",
        *(page_name(name) for name in families),
        "nvshmem",
        "```",
        "",
    ]
    return "\n".join(out)


def disagreements(families: dict[str, Forms]) -> list[str]:
    """The rules where ptxas and the PTX ISA's text differ, each with the ISA sentence that
    decides it (the rule's text): forms the ISA forbids that ptxas assembles (ptxops follows the
    ISA), and forms the ISA lists that ptxas rejects (ptxops follows ptxas)."""
    rows = [
        (name, r) for name, forms in families.items() for r in forms.family.rules
        if (not r.ptxas_enforced and r.wrapped) or r.isa_allows
    ]
    lines = [
        "## Where ptxas and the PTX ISA disagree",
        "",
        "The oracle tests hold the spec to ptxas (CUDA " + " and ".join(spec.PTXAS_RELEASES) + ", each "
        "by the spec's record of it) except for these rules: forms the ISA forbids that ptxas "
        "assembles, which ptxops refuses, and forms the ISA lists that ptxas rejects, which ptxops "
        "refuses too, since what it emits must assemble.",
        "",
        "| family | rule | ptxops follows | the rule |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in rows:
        follows = "ptxas (the ISA lists these forms)" if r.isa_allows else "the ISA (ptxas assembles these forms)"
        lines.append(f"| [`{name}`]({page_name(name)}.md) | `{r.name}` | {follows} | {cell(r.text)} |")
    records = [(name, r, p) for name, forms in families.items() for r in forms.family.rules for p in r.ptxas]
    lines += [
        "",
        "### Where ptxas releases differ",
        "",
        "Each rule records where one ptxas release departs from what the rule says of ptxas (the "
        "oracle tests judge the assembler they run with by it, and `python -m ptxops check` does "
        "not ask an assembler about legal forms recorded as rejected by it):",
        "",
        "| family | rule | as recorded |",
        "| --- | --- | --- |",
        *(f"| [`{name}`]({page_name(name)}.md) | `{r.name}` | {cell(p.text)} |" for name, r, p in records),
    ]
    return [*lines, ""]


def nvshmem_page() -> str:
    """The NVSHMEM calls of :mod:`ptxops.nvshmem`: operands, ordering and rules
    (:mod:`ptxops.spec.nvshmem`)."""
    out = [
        "# NVSHMEM device calls",
        "",
        "Generated from {py:mod}`ptxops.spec.nvshmem`, the tables {py:mod}`ptxops.nvshmem` validates "
        "every call against while a kernel is traced. Operands: *symmetric* memory is tagged "
        "`ptxops.reach(ptr, \"symmetric\")`; *local* memory is this PE's (untagged, `gpu` or "
        "`symmetric`).",
        "",
        "| call | operands | orders | on return | before reusing a buffer | nvshmem4py binding |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in nvshmem.CALLS.values():
        ops = ", ".join(f"`{o.name}` ({o.memory}, {o.types})" for o in c.operands) or "none"
        out.append(f"| `{c.name}` | {ops} | {cell(c.orders)} | {cell(c.returns)} | {cell(c.reuse)} | "
                   f"`{c.binding}` |")
    out += ["", "## Who issues a put", "", "`{scope}` in a binding: the suffix of `scope=` "
            "(`put`, `put_signal`).", "", "| scope | suffix | what it means |", "| --- | --- | --- |"]
    out += [f"| `{s}` | `{nvshmem.SCOPES[s] or '(none)'}` | {cell(text)} |" for s, text in nvshmem.SCOPE_ORDERS.items()]
    out += ["", "## Rules", "", "| rule | the rule |", "| --- | --- |"]
    out += [f"| `{r.name}` | {cell(r.text)} |" for r in nvshmem.RULES.values()]
    return "\n".join([*out, ""])


def write(path: Path, text: str) -> None:
    """Write only when the text changed, so Sphinx re-reads only what changed."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    families = {name: Forms(fam) for name, fam in spec.FAMILIES.items()}
    written = []
    for name, forms in families.items():
        path = out / f"{page_name(name)}.md"
        write(path, family_page(forms.family, forms))
        written.append(path)
    write(out / "index.md", index_page(families))
    write(out / "nvshmem.md", nvshmem_page())
    written += [out / "index.md", out / "nvshmem.md"]
    expected = {p.name for p in written}
    for stale in out.glob("*.md"):
        if stale.name not in expected:
            stale.unlink()
    return written


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(p)
