"""Render a form of an instruction family into PTX text.

Rendering never validates: the oracle tests render illegal forms on purpose to see ptxas reject
them.  :func:`ptxops.spec.instruction` validates first and then renders.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .spec.engine import Family, Value
from .spec.ptxtypes import TYPES
from .spec.targets import PTX_VERSION

#: LLVM inline-asm constraint letter for a register of each width.
CONSTRAINT = {16: "h", 32: "r", 64: "l"}
#: PTX register names used when a form is rendered as a standalone statement.
REGISTER = {1: "%p", 8: "%b", 16: "%h", 32: "%r", 64: "%rd", 128: "%q"}

#: Address tokens of operand signatures, and the qualifier naming each one's state space
#: (a shared space means a 32-bit address, anything else a 64-bit one).  ``mbar``, the
#: address of an mbarrier object, is in the form's ``space`` where it has one (generic when
#: that is absent, as in ``st.async``), else in shared memory.
ADDRESSES: dict[str, str | None] = {"a": "space", "dst": "dst", "src": "src", "mbar": None}
#: Value tokens with a fixed register width whatever the form's type: byte counts, arrival
#: counts, transaction counts, phase parity, an mbarrier phase state, an L2 cache policy, a CTA
#: rank, a sleep time.
FIXED_BITS = {
    "size": 32, "count": 32, "tx": 32, "phase": 32, "state": 64, "policy": 64, "rank": 32, "ns": 32,
    "membermask": 32, "bytes": 64, "response": 128, "tmap": 64, "mask": 16,
}
#: Vector tokens with one register per dimension of the form's ``dim`` (``.1d`` .. ``.5d``) less
#: an offset: the tensor coordinates (32-bit), the im2col offsets (16-bit, two fewer).  The
#: tensor operand of the TMA instructions is ``[tmap, {c0, ...}]``: the 64-bit address of a
#: tensor map (``tmap``) with the ``coords`` that follow it inside its brackets.
PER_DIM = {"coords": (32, 0), "im2col": (16, 2)}
#: Vector tokens of a fixed length: (registers, bits).  ``gather``: the five coordinates of
#: ``.tile::gather4``/``.tile::scatter4`` (the column, then four rows; inside the tensor map's
#: brackets like ``coords``); ``wide``: ``{wHalo, wOffset}`` of ``.im2col::w``.
FIXED_VECTORS = {"gather": (5, 32), "wide": (2, 16)}
#: Tokens written inside the tensor map's brackets.
TENSOR_COORDS = ("coords", "gather")
#: Value tokens whose width follows the form's type and vector (``addr``: an address held in a
#: register as a value, such as the address ``mapa`` maps).
TYPED = ("b", "c", "d", "addr")
#: Destination tokens: ``d`` a value, ``p`` a predicate (carried as a 32-bit 0 or 1).
OUTPUTS = ("d", "p")
#: An integer immediate (``cp.async.bulk.wait_group N``): an ``n`` constraint in inline asm,
#: written as :data:`IMMEDIATE_EXAMPLE` in standalone statements.
IMMEDIATE = "n"
IMMEDIATE_EXAMPLE = "0"
#: What each token means, for messages and the documentation.
ROLE_DOC = {
    "d": "destination", "a": "address", "b": "source", "c": "source",
    "dst": "destination address", "src": "source address", "mbar": "mbarrier address",
    "size": "byte count", "count": "expected arrival count", "tx": "transaction byte count",
    "phase": "phase parity", "state": "mbarrier phase state", "p": "predicate result",
    "policy": "64-bit L2 cache policy (createpolicy)",
    "n": "integer immediate", "addr": "address value", "rank": "CTA rank in the cluster",
    "ns": "sleep time in nanoseconds", "membermask": "32-bit member mask of lanes",
    "bytes": "64-bit byte count", "response": "128-bit try_cancel response",
    "tmap": "64-bit address of a tensor map (CUtensorMap)",
    "coords": "tensor coordinates, one 32-bit value per dimension",
    "im2col": "im2col offsets, one 16-bit value per dimension less two",
    "gather": "five 32-bit tensor coordinates: the column, then the four rows (gather4/scatter4)",
    "wide": "im2col::w information: wHalo and wOffset, two 16-bit values",
    "mask": "16-bit mask (ctaMask: the cluster's CTAs that receive the data; byteMask: the bytes copied)",
}
#: A literal operand that joins its neighbours into one (``elect.sync d|p, mask``).
JOIN = "|"


@dataclass(frozen=True)
class Operand:
    """One PTX operand: ``count`` registers of ``bits`` each (``count > 1`` is a ``{...}`` list).

    ``role`` is the signature token: ``d`` destination, ``a`` address, ``b``/``c`` sources,
    another token of :data:`ROLE_DOC` (``dst``/``src``/``mbar`` addresses, ``size``/``tx``/...
    32-bit sources, ``p`` a predicate, ``n`` an immediate), or a literal such as ``128``.
    """

    role: str
    count: int = 1
    bits: int = 0

    @property
    def is_output(self) -> bool:
        return self.role in OUTPUTS

    @property
    def is_address(self) -> bool:
        return self.role in ADDRESSES

    @property
    def is_immediate(self) -> bool:
        return self.role == IMMEDIATE

    @property
    def carriers(self) -> tuple[int, ...]:
        """Widths of the LLVM values that carry this operand through inline asm.

        LLVM has no 8- or 128-bit NVPTX registers: four ``.b8`` lanes travel packed in one
        32-bit value, a ``.b128`` value as two 64-bit halves (low first), a predicate as a
        32-bit 0 or 1.
        """
        if self.is_literal or self.is_address or self.is_immediate:
            return () if self.is_literal else (self.bits,)
        if self.bits == 1:
            return (32,) * self.count
        if self.bits == 8:
            return (32,) * (self.count // 4)
        if self.bits == 128:
            return (64, 64) * self.count
        return (self.bits,) * self.count

    @property
    def is_literal(self) -> bool:
        return self.role not in ROLE_DOC


@dataclass(frozen=True)
class Instruction:
    """A validated instruction form and everything needed to emit it.

    ``template`` is an LLVM inline-asm string whose ``$n`` operands follow ``constraints``:
    outputs first, then the address, then sources, with a ``~{memory}`` clobber.  A 128-bit
    value travels as two 64-bit halves (low first) and is joined in a scoped ``.b128`` register.
    """

    family: str
    target: str
    qualifiers: Mapping[str, Value]
    opcode: str
    operands: tuple[Operand, ...]
    template: str
    constraints: str
    effective: Mapping[str, Value] = field(default_factory=dict)

    @property
    def statement(self) -> str:
        """The instruction in PTX syntax with symbolic operand names (``d``, ``[a]``, ...)."""
        return symbolic(self.opcode, self.operands)

    @property
    def outputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.is_output)

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if not o.is_output and not o.is_literal)


def opcode(family: Family, q: Mapping[str, Value]) -> str:
    """The dotted opcode: the mnemonic and each qualifier present, in the family's order."""
    return family.name + "".join([slot.render_in(q) for slot in family.qualifiers])


def slot_value(family: Family, q: Mapping[str, Value], key: str) -> Value:
    """The value of slot ``key`` in form ``q``: the one given, or the one an implied slot
    writes (``.b64`` of every ``mbarrier`` form, ``.shared::cta`` of ``tensormap.cp_fenceproxy``,
    ``.v4`` of ``clusterlaunchcontrol.query_cancel.get_first_ctaid``)."""
    if q.get(key) is not None:
        return q[key]
    for slot in family.qualifiers:
        if slot.key == key and not slot.settable and slot.render_in(q):
            return slot.values[0]
    return None


def operands(family: Family, q: Mapping[str, Value]) -> tuple[Operand, ...]:
    """The operand layout of a form, from the family's signature and the form's type/vec/space."""
    ptx_type = TYPES.get(str(slot_value(family, q, "type")))
    vec = slot_value(family, q, "vec")
    count = vec if isinstance(vec, int) and vec > 0 else 1
    bits = ptx_type.reg_bits if ptx_type else 32
    out = []
    for token in family.signature(q):
        if token in ADDRESSES:
            key = ADDRESSES[token] or ("space" if "space" in q else None)
            space = "shared" if key is None else str(slot_value(family, q, key) or "")
            out.append(Operand(token, 1, 32 if space.startswith("shared") else 64))
        elif token in TYPED:
            out.append(Operand(token, count, bits))
        elif token in FIXED_BITS:
            out.append(Operand(token, 1, FIXED_BITS[token]))
        elif token in FIXED_VECTORS:
            out.append(Operand(token, *FIXED_VECTORS[token]))
        elif token in PER_DIM:
            bits, fewer = PER_DIM[token]
            dim = str(q.get("dim"))  # "1d" .. "5d"; an illegal form rendered for ptxas: one
            out.append(Operand(token, max(int(dim[0]) - fewer, 1) if dim[0].isdigit() else 1, bits))
        elif token == "p":
            out.append(Operand(token, 1, 1))
        elif token == IMMEDIATE:
            out.append(Operand(token, 1, 32))
        else:
            out.append(Operand(token))
    return tuple(out)


def symbolic(op_text: str, layout: tuple[Operand, ...]) -> str:
    """The statement of an opcode and layout with symbolic operand names (``d``, ``[a]``, ...):
    :attr:`Instruction.statement`, without rendering the rest of an instruction."""
    return statement(op_text, layout, _symbolic_names(layout))


@functools.cache
def _symbolic_names(layout: tuple[Operand, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(f"{op.role}{i}" for i in range(op.count)) if op.count > 1 else (op.role,) for op in layout)


def statement(op_text: str, layout: Iterable[Operand], names: Iterable[Iterable[str]]) -> str:
    """Join an opcode and per-operand register names into one PTX statement (a :data:`JOIN`
    literal glues its neighbours: ``d|p``)."""
    text = _operand_text(tuple(layout), tuple(tuple(regs) for regs in names))
    return f"{op_text};" if text is None else f"{op_text} {text};"


@functools.cache
def _operand_text(layout: tuple[Operand, ...], names: tuple[tuple[str, ...], ...]) -> str | None:
    """The operands of :func:`statement` (None where there are none), once per layout and names
    (the forms' walks render hundreds of thousands of forms over a few hundred layouts)."""
    parts: list[str] = []
    for op, regs in zip(layout, names):
        regs = list(regs)
        if op.is_literal:
            parts.append(op.role)
        elif op.is_address:
            parts.append(f"[{regs[0]}]")
        elif op.role in TENSOR_COORDS and parts:  # inside the tensor map's brackets
            parts[-1] = f"[{parts[-1]}, {{{', '.join(regs)}}}]"
        elif op.count > 1 or op.role in PER_DIM:
            parts.append("{" + ", ".join(regs) + "}")
        else:
            parts.append(regs[0])
    return ", ".join(parts).replace(f", {JOIN}, ", JOIN) if parts else None


def asm_template(op_text: str, layout: tuple[Operand, ...]) -> tuple[str, str]:
    """The inline-asm template and constraint string for a layout.

    LLVM numbers outputs before inputs, so outputs are numbered first whatever their position
    in the PTX statement.  Operands whose registers LLVM cannot hold (``.b8`` lanes, ``.b128``,
    predicates) go through scoped temporaries that a ``mov`` joins to or splits from their
    carriers (a ``selp`` turns a predicate into 0 or 1).  An immediate takes an ``n``
    constraint: its value must be a constant.
    """
    names, before, after, constraints = _asm_parts(layout)
    body = statement(op_text, layout, names)
    if before or after:
        body = "{ " + " ".join([*before, body, *after]) + " }"
    return body, constraints


@functools.cache
def _asm_parts(layout: tuple[Operand, ...]) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...], tuple[str, ...], str]:
    """What :func:`asm_template` writes around the opcode, which the layout alone decides: each
    operand's register names, the statements before and after it, the constraint string."""
    order = [o for o in layout if o.is_output] + [o for o in layout if not o.is_output]
    names: dict[int, list[str]] = {}
    constraints: list[str] = []
    before: list[str] = []
    after: list[str] = []
    n = 0
    for op in order:
        if op.is_literal:
            continue
        carriers = [f"${n + i}" for i in range(len(op.carriers))]
        if op.is_immediate:
            constraints.append("n")
        else:
            constraints += [("=" if op.is_output else "") + CONSTRAINT[b] for b in op.carriers]
        n += len(carriers)
        if op.bits not in (1, 8, 128):
            names[id(op)] = carriers
            continue
        temps = [f"%ptxops_{op.role}{i}" for i in range(op.count)]
        if op.bits == 1:  # a predicate: 1 or 0 in a 32-bit carrier
            before.append(f".reg .pred {', '.join(temps)};")
            after += [f"selp.u32 {c}, 1, 0, {t};" for c, t in zip(carriers, temps)]
            names[id(op)] = temps
            continue
        before.append(f".reg .b{op.bits} {', '.join(temps)};")
        if op.bits == 8:  # four lanes per 32-bit carrier
            pairs = [(c, temps[4 * i : 4 * i + 4]) for i, c in enumerate(carriers)]
        else:  # two 64-bit carriers per lane
            pairs = [(f"{{{carriers[2 * i]}, {carriers[2 * i + 1]}}}", [t]) for i, t in enumerate(temps)]
        for carrier, regs in pairs:
            joined = regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"
            if op.is_output:
                after.append(f"mov.b{32 if op.bits == 8 else 128} {carrier}, {joined};")
            else:
                before.append(f"mov.b{32 if op.bits == 8 else 128} {joined}, {carrier};")
        names[id(op)] = temps
    return (tuple(tuple(names.get(id(o), ())) for o in layout), tuple(before), tuple(after),
            ",".join(constraints + ["~{memory}"]))


def register_names(layout: Iterable[Operand], counter: dict[int, int]) -> list[list[str]]:
    """Fresh PTX register names for a layout (for standalone modules)."""
    names = []
    for op in layout:
        if op.is_immediate:
            names.append([IMMEDIATE_EXAMPLE])
            continue
        regs = []
        for _ in range(op.count if not op.is_literal else 0):
            counter[op.bits] = counter.get(op.bits, 0) + 1
            regs.append(f"{REGISTER[op.bits]}{counter[op.bits]}")
        names.append(regs)
    return names


def standalone(op_text: str, layout: Sequence[Operand]) -> str:
    """One PTX statement with fresh register names (``%r1``, ``%rd1``, ...), for a module."""
    return statement(op_text, layout, register_names(layout, {}))


def module(
    statements: Iterable[str], target: str, registers: int = 64, version: str = PTX_VERSION
) -> str:
    """A complete PTX module with one kernel holding ``statements``.

    The kernel declares ``registers`` registers of each class; statements use ``%h``, ``%r``,
    ``%rd``, ``%q`` and ``%p`` (predicate) names below that bound.  Statement ``n`` (from 0) is line ``FIRST_BODY_LINE + n`` of the
    module (see :data:`FIRST_BODY_LINE`); ``version`` is its PTX ISA ``.version``.
    """
    head = [
        f".version {version}",
        f".target {target}",
        ".address_size 64",
        ".visible .entry ptxops_forms(.param .u64 p)",
        "{",
        f".reg .b8 %b<{registers}>; .reg .b16 %h<{registers}>; .reg .b32 %r<{registers}>;",
        f".reg .b64 %rd<{registers}>; .reg .pred %p<{registers}>;",
        f".reg .b128 %q<{registers}>;",
    ]
    return "\n".join(head + list(statements) + ["ret;", "}", ""])


#: Line number (1-based) of the first statement in :func:`module`'s output.
FIRST_BODY_LINE = 9


def render(family: Family, q: Mapping[str, Value], effective: Mapping[str, Value]) -> Instruction:
    """Render a normalised form (legal or not) into an :class:`Instruction`."""
    text = opcode(family, q)
    layout = operands(family, q)
    template, constraints = asm_template(text, layout)
    return Instruction(
        family.name, str(q["target"]), dict(q), text, layout, template, constraints,
        dict(effective),
    )
