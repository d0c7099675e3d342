"""``python -m ptxops``: browse, explain and check the PTX instruction spec from a shell.

Needs no GPU and no CuTeDSL: it imports only :mod:`ptxops.spec`, :mod:`ptxops.render` and
:mod:`ptxops.ptxas` (the last one only runs ptxas for ``check``).

Exit status: 0 on success, 1 when ``check`` finds forms ptxas rejects, 2 for an illegal form or
bad arguments (the :class:`~ptxops.QualifierError` message goes to stderr), 3 when ``check``
has no ptxas for some families (those that one reads are still checked).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterable, Sequence

from . import ptxas, render, spec
from .errors import QualifierError
from .render import Instruction
from .spec import reach
from .spec.engine import Family, Rule, Value
from .spec.targets import normalise_target

EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_NO_PTXAS = 0, 1, 2, 3

#: ``explain`` options: (flag, qualifier key, help).  Only the flags the user gives are passed.
QUALIFIER_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--sem", "sem", "memory-ordering semantics: weak, relaxed, acquire, release, acq_rel, sc, ..."),
    ("--scope", "scope", "scope: cta, cluster, gpu or sys"),
    ("--space", "space", "state space: global, shared, shared::cta, shared::cluster, local, const, param"),
    ("--op", "op", "operation: add, min, max, and, or, xor, inc, dec, exch, cas"),
    ("--type", "type", "element type in PTX spelling: bf16x2, f32, u64, e4m3, ..."),
    ("--vec", "vec", "vector width: 2, 4, 8 (or v2, v4, v8)"),
    ("--cache", "cache", "ld/st only: cache operator (ld: ca, cg, cs, lu, cv; st: wb, cg, cs, wt)"),
    ("--nc", "nc", "ld only: nc (ld.global.nc, the non-coherent read-only load)"),
    ("--l1-eviction", "l1_eviction", "ld/st only: evict_normal, evict_unchanged, evict_first, evict_last, no_allocate"),
    ("--l2-eviction", "l2_eviction", "ld/st only: evict_normal, evict_first, evict_last (256-bit accesses)"),
    ("--cache-hint", "cache_hint", "ld/st, cp.async.bulk.prefetch: cache_hint (.L2::cache_hint; adds a 64-bit cache-policy operand)"),
    ("--prefetch", "prefetch", "ld only: L2 prefetch size 64B, 128B or 256B"),
    ("--acc", "acc", "accumulation precision of multimem.ld_reduce: f32 or f16"),
    ("--proxy", "proxy", "fence: alias, async, async.global, tensormap::generic, ...; membar: alias (membar.proxy.alias)"),
    ("--op-restrict", "op_restrict", "fence only: mbarrier_init"),
    ("--sync-restrict", "sync_restrict", "fence only: shared::cta or shared::cluster"),
    ("--dst", "dst", "cp.{reduce.}async.bulk only: destination state space (shared::cta, shared::cluster, global)"),
    ("--src", "src", "cp.{reduce.}async.bulk only: source state space (global, shared::cta)"),
    ("--completion", "completion", "bulk copies and reductions, st.async, red.async: mbarrier::complete_tx::bytes or bulk_group"),
    ("--dim", "dim", "tensor (TMA) instructions: 1d, 2d, 3d, 4d or 5d"),
    ("--load-mode", "load_mode", "tensor (TMA) instructions: tile, tile::gather4, tile::scatter4, im2col, im2col::w, im2col::w::128 or im2col_no_offs"),
    ("--multicast", "multicast", "cp.async.bulk.tensor: multicast::cluster (adds a ctaMask operand); clusterlaunchcontrol.try_cancel: multicast::cluster::all"),
    ("--cta-group", "cta_group", "cp.async.bulk.tensor only: cta_group::1 or cta_group::2 (sm_100 family)"),
    ("--mode", "mode", "tensormap.replace only: tile"),
    ("--field", "field", "tensormap.replace only: global_address, rank, box_dim, global_dim, ..., fill_mode"),
    ("--cp-mask", "cp_mask", "multimem.cp.async.bulk only: cp_mask (adds a 16-bit byte mask operand)"),
    ("--expect-tx", "expect_tx", "mbarrier.arrive only: expect_tx"),
    ("--parity", "parity", "mbarrier.try_wait only: parity"),
    ("--read", "read", "cp.async.bulk.wait_group only: read"),
    ("--level", "level", "membar: cta, gl, sys; prefetch: L1, L2, L2::evict_last, L2::evict_normal, tensormap"),
    ("--query", "query", "clusterlaunchcontrol.query_cancel only: is_canceled, get_first_ctaid, get_first_ctaid::x, ::y, ::z"),
)

#: Spellings ``--where`` accepts for "this qualifier is left out".
ABSENT = ("", "-", "none", "absent")


# -- formatting ------------------------------------------------------------------------------


def cell(value: Value) -> str:
    """A qualifier value as a table cell: ``-`` for a qualifier that is left out."""
    return "-" if value is None else str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a header line."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    lines = [list(headers)] + body
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)


def wrap(text: str, indent: str = "    ") -> str:
    return textwrap.fill(text, width=96, initial_indent=indent, subsequent_indent=indent)


def condition(fam: Family, key: str, values: frozenset[Value]) -> str:
    """``key in {a, b}`` with the values in the family's domain order (``forbidden`` if none)."""
    if not values:
        return f"{key} forbidden"
    order = list(fam.domain(key))
    ordered = sorted(values, key=lambda v: order.index(v) if v in order else len(order))
    return f"{key} in {{" + ", ".join("(absent)" if v is None else str(v) for v in ordered) + "}"


def standalone(inst: Instruction) -> str:
    """The form as one PTX statement with real register names (``%r1``, ``%rd1``, ...)."""
    return render.standalone(inst.opcode, inst.operands)


# -- argument helpers ------------------------------------------------------------------------


def target_arg(text: str) -> str:
    """``sm_90a`` from ``sm_90a``/``90a``/``SM_90A``; must be one of :data:`spec.TARGETS`."""
    target = normalise_target(text)
    if target not in spec.TARGETS:
        raise argparse.ArgumentTypeError(
            f"unknown target {text!r}; ptxops knows {', '.join(spec.TARGETS)}"
        )
    return target


def families_under(name: str, *, exact_first: bool = False) -> list[str]:
    """The families ``name`` selects: itself and every family below it in dot-separated
    mnemonic parts (``multimem`` selects ``multimem.st``, ``multimem.red``, ...;
    ``cp.async.bulk`` selects itself and ``cp.async.bulk.wait_group``, ...).  With
    ``exact_first`` a name that is a family selects only that family.  An unknown name raises
    the :func:`ptxops.spec.family` error, which lists the known families."""
    if exact_first and name in spec.FAMILIES:
        return [name]
    found = [f for f in spec.FAMILIES if f == name or f.startswith(name + ".")]
    return found or [spec.family(name).name]


def where_arg(text: str) -> tuple[str, Value]:
    """``key=value`` for ``--where``; an empty value or ``-``/``none`` means left out."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key = key.strip().replace("-", "_")
    value = value.strip()
    return key, (None if value.lower() in ABSENT else value)


# -- subcommands -----------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """Legal forms of one family as a table, or form counts of every family (or every family
    under a prefix such as ``multimem``) per target (or on ``--target`` only)."""
    if args.family is None or args.family not in spec.FAMILIES:
        names = families_under(args.family) if args.family else list(spec.FAMILIES)
        if args.where:
            raise QualifierError(names[0], "--where needs one FAMILY, not a prefix", rule="cli-usage")
        targets = [args.target] if args.target else list(spec.TARGETS)
        rows = [[name, *(spec.FAMILIES[name].count(target=t) for t in targets)] for name in names]
        print(table(["family", *targets], rows))
        print(f"{len(rows)} families, {len(targets)} target{'s' if len(targets) != 1 else ''}"
              " (legal forms per target)")
        return EXIT_OK
    fam = spec.family(args.family)
    fixed = dict(args.where or [])
    if "target" in fixed:
        raise QualifierError(fam.name, "use --target, not --where target=...", rule="cli-usage")
    target = args.target or spec.DEFAULT_TARGET
    keys = [q.key for q in fam.settable]
    rows = [
        [*(cell(inst.qualifiers.get(k)) for k in keys), inst.opcode]
        for inst in spec.forms(fam.name, target=target, **fixed)
    ]
    if rows:
        print(table([*keys, "opcode"], rows))
    where = "".join(f", {k}={cell(v)}" for k, v in fixed.items())
    print(f"{len(rows)} form{'s' if len(rows) != 1 else ''} of {fam.name} on {target}{where}"
          " (- : qualifier left out)")
    return EXIT_OK


def origin(key: str, effective: Value, given: dict[str, Value]) -> str:
    """Where an effective qualifier value comes from, for ``explain``."""
    if key in given:
        return "given"
    if key == "target":
        return "ptxops default"
    return "left out" if effective is None else "PTX default"


def applicable_rules(fam: Family, inst: Instruction) -> list[Rule]:
    """The family's rules whose ``when`` matches the form (so they constrain it)."""
    return [r for r in fam.rules if r.applies(inst.qualifiers)]


def cmd_explain(args: argparse.Namespace) -> int:
    """Everything ptxops knows about one form, or why it is illegal."""
    given = {key: getattr(args, key) for _, key, _ in QUALIFIER_OPTIONS if getattr(args, key) is not None}
    if args.target is not None:
        given["target"] = args.target
    fam = spec.family(args.family)
    inst = spec.instruction(fam.name, **given)
    print(table(["", ""], [
        ["family", f"{fam.name}  ({fam.summary})"],
        ["section", fam.section],
        ["target", inst.target],
        ["opcode", inst.opcode],
        ["statement", inst.statement],
        ["example", standalone(inst)],
        ["asm", inst.template],
        ["constraints", inst.constraints],
        ["device fn", f"ptxops.{fam.device_function}"],
    ]).split("\n", 1)[1])
    print("\noperands (in PTX order)")
    print(textwrap.indent(table(
        ["role", "registers", "bits", "carriers"],
        [
            [o.role, o.count if not o.is_literal else "literal", o.bits or "-",
             ",".join(map(str, o.carriers)) or "-"]
            for o in inst.operands
        ],
    ), "  ") if inst.operands else "  (none)")
    print("\nqualifiers (effective: PTX defaults filled in)")
    print(textwrap.indent(table(
        ["key", "value", "from"],
        [[k, cell(v), origin(k, v, given)] for k, v in inst.effective.items()],
    ), "  "))
    rules = applicable_rules(fam, inst)
    print(f"\nrules that apply ({len(rules)} of {len(fam.rules)})")
    for r in rules:
        note = "  (legal PTX ptxops does not wrap)" if not r.wrapped else (
            "" if r.ptxas_enforced else "  (not enforced by ptxas)")
        print(f"  [{r.name}]{note}")
        print(wrap(r.text))
    return EXIT_OK


#: The ``rules`` argument that lists the reach rules (:mod:`ptxops.spec.reach`) alone.
REACH_RULES = "reach"


def cmd_rules(args: argparse.Namespace) -> int:
    """Every rule of a family: name, whether ptxas enforces it, condition and text; with
    ``reach``, the scope each pointer reach needs."""
    if args.family == REACH_RULES:
        print_reach_rules()
        return EXIT_OK
    for i, name in enumerate(families_under(args.family, exact_first=True)):
        if i:
            print()
        print_rules(spec.FAMILIES[name])
    return EXIT_OK


def print_reach_rules(fam: Family | None = None) -> None:
    """The scope each reach needs (for ``fam``: the ordered accesses of that family)."""
    what = f"ordered {fam.name} forms" if fam else "ordered accesses (" + ", ".join(reach.SCOPED_ACCESSES) + ")"
    print(f"reach rules: the scope of {what} against the pointer's reach (ptxops.reach)\n")
    for r in reach.REACHES.values():
        print(f"[{reach.rule_name(r)}]  ptxas enforces: no (legal PTX; ptxops checks it at trace time)")
        legal = reach.SCOPE_ORDER[reach.SCOPE_ORDER.index(r.needs):]
        print(wrap(f"when reach={r.kind}: scope in {{{', '.join(legal)}}}"))
        print(wrap(reach.rule_text(r)))
        print()
    if fam is None:
        print(f"{len(reach.REACHES)} reach rules")


def print_rules(fam: Family) -> None:
    """``rules`` output for one family."""
    print(f"{fam.name}: {fam.summary}\n{fam.section}\n")
    for r in fam.rules:
        note = ("  (legal PTX that ptxops does not wrap)" if not r.wrapped
                else "  (the PTX ISA lists these forms; ptxas rejects them)" if r.isa_allows else "")
        print(f"[{r.name}]  ptxas enforces: {'yes' if r.ptxas_enforced else 'no'}{note}")
        when = " and ".join(condition(fam, k, vs) for k, vs in r.when.items()) or "always"
        allow = " and ".join(condition(fam, k, vs) for k, vs in r.allow.items())
        print(wrap(f"when {when}: {allow}"))
        print(wrap(r.text))
        for record in r.ptxas:
            print(wrap(f"as recorded: {record.text}"))
        print()
    checked = fam.name in reach.SCOPED_ACCESSES
    if checked:
        print_reach_rules(fam)
    enforced = sum(r.ptxas_enforced for r in fam.rules)
    print(f"{len(fam.rules)} rules of {fam.name} ({enforced} enforced by ptxas)"
          + (f"; {len(reach.REACHES)} reach rules" if checked else ""))


def cmd_check(args: argparse.Namespace) -> int:
    """Assemble every legal form with ptxas; report forms/accepted/rejected per family x target."""
    selected = [f for name in args.families for f in families_under(name)] or list(spec.FAMILIES)
    families = list(dict.fromkeys(selected))
    targets = args.target or list(spec.TARGETS)
    assemblers: dict[str, str] = {}  # PTX ISA version -> its ptxas, one per version the families need
    missing: dict[str, str] = {}  # PTX ISA version -> why no ptxas reads it
    for isa in dict.fromkeys(spec.FAMILIES[name].ptx_version for name in families):
        try:
            assemblers[isa] = ptxas.ptxas_path(isa)
        except ptxas.PtxasUnavailable as e:
            missing[isa] = str(e)
            continue
        print(f"ptxas for PTX ISA {isa}: {assemblers[isa]} ({ptxas.ptxas_version(isa)})")
    if not assemblers:
        print(f"ptxops check: {next(iter(missing.values()))}", file=sys.stderr)
        return EXIT_NO_PTXAS
    unchecked = {isa: [name for name in families if spec.FAMILIES[name].ptx_version == isa] for isa in missing}
    families = [name for name in families if spec.FAMILIES[name].ptx_version in assemblers]
    rows, failures, recorded = [], [], []
    for name in families:
        isa = spec.FAMILIES[name].ptx_version
        release = ptxas.release(assemblers[isa])
        for target in targets:
            forms = list(spec.forms(name, target=target))
            if release in spec.PTXAS_RELEASES:  # legal forms this release rejects, by the spec's record
                fam = spec.FAMILIES[name]
                recorded += [(release, i.opcode) for i in forms if fam.ptxas_verdict(i.qualifiers, release) != "assembles"]
                forms = [i for i in forms if fam.ptxas_verdict(i.qualifiers, release) == "assembles"]
            lines = [standalone(inst) for inst in forms]
            verdicts = ptxas.assemble(lines, target, isa) if lines else []
            bad = [(line, v) for line, v in zip(lines, verdicts) if v is not None]
            rows.append([name, target, len(lines), len(lines) - len(bad), len(bad)])
            failures += [(name, target, line, v) for line, v in bad]
    print(table(["family", "target", "forms", "accepted", "rejected"], rows))
    total = sum(r[2] for r in rows)
    print(f"{total} forms, {total - len(failures)} accepted, {len(failures)} rejected")
    if recorded:
        shown = ", ".join(sorted({f"{op} (ptxas {rel})" for rel, op in recorded}))
        print(f"ptxops check: not asked, {len(recorded)} legal forms the spec records ptxas rejecting: {shown}",
              file=sys.stderr)
    for isa, names in unchecked.items():
        print(f"ptxops check: not checked, PTX ISA {isa}: {', '.join(names)}: {missing[isa]}", file=sys.stderr)
    if failures:
        shown = failures if args.verbose else failures[:20]
        print("\nrejected by ptxas:", file=sys.stderr)
        for name, target, line, why in shown:
            print(f"  {target}  {line}\n      {why}", file=sys.stderr)
        if len(shown) < len(failures):
            print(f"  ... and {len(failures) - len(shown)} more (--verbose shows all)",
                  file=sys.stderr)
        return EXIT_REJECTED
    return EXIT_NO_PTXAS if missing else EXIT_OK


# -- parser ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The ``python -m ptxops`` argument parser."""
    families = ", ".join(spec.FAMILIES)
    targets = ", ".join(spec.TARGETS)
    p = argparse.ArgumentParser(
        prog="python -m ptxops",
        description="Browse, explain and check the PTX instruction forms ptxops knows. "
        "No GPU or CuTeDSL needed.",
        epilog=f"families: {families}\ntargets: {targets} (default {spec.DEFAULT_TARGET})\n"
        "exit status: 0 ok, 1 ptxas rejected forms, 2 illegal form or bad arguments, "
        "3 no ptxas for some families checked",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser(
        "list",
        help="legal forms of a family (or form counts of every family)",
        description="Print the legal forms of FAMILY on a target as a table: the qualifier "
        "values (- for left out) and the opcode.  Without FAMILY, or with a prefix such as "
        "multimem, print the number of legal forms of every family (under the prefix) on "
        "every target, or on --target.",
        epilog="example: python -m ptxops list multimem.ld_reduce --target sm_90a "
        "--where op=add --where type=bf16x2",
    )
    ls.add_argument("family", nargs="?", metavar="FAMILY", help=f"one of: {families}; or a prefix")
    ls.add_argument("--target", type=target_arg, help=f"compile target (default {spec.DEFAULT_TARGET})")
    ls.add_argument(
        "--where", type=where_arg, action="append", metavar="KEY=VALUE",
        help="keep only forms with this qualifier value (repeatable; KEY= or KEY=- means left out)",
    )
    ls.set_defaults(run=cmd_list)

    ex = sub.add_parser(
        "explain",
        help="opcode, asm template, operands and rules of one form",
        description="Validate one form and print its opcode, PTX statement, inline-asm template, "
        "LLVM constraints, operand layout, effective qualifiers (PTX defaults filled in), the "
        "device function that emits it and the rules that apply.  Only the options given are "
        "passed: an option left out means what PTX means when the qualifier is left out.  "
        "An illegal form prints the rule it breaks and the legal alternatives to stderr "
        "and exits 2.",
        epilog="example: python -m ptxops explain multimem.ld_reduce --sem relaxed --scope sys "
        "--space global --op add --acc f32 --vec 4 --type bf16x2 --target sm_90a",
    )
    ex.add_argument("family", metavar="FAMILY", help=f"one of: {families}")
    for flag, key, text in QUALIFIER_OPTIONS:
        ex.add_argument(flag, dest=key, metavar=key.upper(), help=text)
    ex.add_argument("--target", type=target_arg, help=f"compile target (default {spec.DEFAULT_TARGET})")
    ex.set_defaults(run=cmd_explain)

    ru = sub.add_parser(
        "rules",
        help="every rule of a family",
        description="Print every rule of FAMILY (or of every family under a prefix): its name, "
        "whether ptxas enforces it, the condition it checks and its text; for the families "
        "with ordered accesses, the reach rules too (the scope a pointer's reach needs).  "
        f"`rules {REACH_RULES}` prints the reach rules alone.",
    )
    ru.add_argument(
        "family", metavar="FAMILY",
        help=f"one of: {families}; or a prefix (every family under it); or {REACH_RULES}",
    )
    ru.set_defaults(run=cmd_rules)

    ck = sub.add_parser(
        "check",
        help="assemble every legal form with ptxas",
        description="Render every legal form of the families as a PTX statement, assemble them "
        "with ptxas (an installed nvidia-cuda-nvcc wheel, $PTXOPS_PTXAS, or PATH; see ptxops.ptxas) "
        "and print forms/accepted/rejected per family and target.  Exits 1 if ptxas rejects any "
        "legal form, else 3 if some families have no ptxas that reads their PTX ISA version (the "
        "others are checked).",
        epilog="example: python -m ptxops check fence multimem --target sm_90a",
    )
    ck.add_argument(
        "families", nargs="*", metavar="FAMILY",
        help="families to check, or prefixes: multimem checks every multimem.* family (default: all)",
    )
    ck.add_argument(
        "--target", type=target_arg, action="extend", nargs="+", metavar="T",
        help="targets to check (repeatable; default: all)",
    )
    ck.add_argument("-v", "--verbose", action="store_true", help="list every rejected form")
    ck.set_defaults(run=cmd_check)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (see the module docstring)."""
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except QualifierError as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
