"""The NVSHMEM device calls ptxops wraps (:mod:`ptxops.nvshmem`), as data: their operands, the
memory each operand must be in, the dtypes they take, the ordering each call gives, and the
rules a call is validated against at trace time.

NVSHMEM (the OpenSHMEM model on GPUs; nvshmem4py's ``nvshmem.core.device.cute`` binds its
device library for CuTeDSL) moves data between *symmetric* buffers: memory allocated
collectively from the NVSHMEM heap, at the same offset on every PE, so that a local address
names the same buffer on any PE.  A remote operand must be symmetric; a peer's mapped address
(reach ``"peer"``) is not, and an NVSHMEM call given one writes the wrong memory or faults.
Pointers say what they are with :func:`ptxops.reach`: ``reach(t.iterator, "symmetric")``.

Pure data and pure functions (no CuTeDSL, no nvshmem4py): :func:`check_operand`,
:func:`check_count` and :func:`check_choice` raise :class:`~ptxops.QualifierError` naming the
rule; the device functions call them, the reference page and the tests read :data:`CALLS`
and :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import QualifierError

#: CuTeDSL dtype name -> nvshmem4py's binding prefix (``float_put`` for Float32): the element
#: types its RMA calls (put, get, put_signal) take.
RMA_TYPES: dict[str, str] = {
    "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64",
    "Uint8": "uint8", "Uint16": "uint16", "Uint32": "uint32", "Uint64": "uint64",
    "Float16": "half", "BFloat16": "bfloat16", "Float32": "float", "Float64": "double",
}
#: The element types of a fetch-add (``nvshmem_<type>_atomic_fetch_add``) ptxops wraps.
AMO_TYPES: dict[str, str] = {"Int32": "int32", "Uint32": "uint32", "Uint64": "uint64"}
#: A signal word is always a 64-bit unsigned integer (NVSHMEM's ``uint64_t *sig_addr``).
SIGNAL_TYPES: dict[str, str] = {"Uint64": "uint64"}
#: Signal updates: ``set`` overwrites, ``add`` adds atomically (NVSHMEM_SIGNAL_SET/ADD).
SIGNAL_OPS: tuple[str, ...] = ("set", "add")
#: Who issues a put or put-with-signal: one thread, or every thread of its warp or of its CTA
#: together (nvshmem4py's ``_warp`` and ``_block`` bindings; ``{scope}`` in a binding).
SCOPES: dict[str, str] = {"thread": "", "warp": "_warp", "block": "_block"}
#: What a scope means for the caller and for the ordering (the entries of :data:`CALLS` state a
#: thread's call; a warp's or a CTA's call gives the same ordering for the group's call as a whole).
SCOPE_ORDERS: dict[str, str] = {
    "thread": "one thread issues the call; its fence and quiet order and complete it",
    "warp": "every thread of the warp calls it, converged, with the same arguments; the warp's threads "
            "move the data (NVLink) or one of them posts it to the NIC (IBGDA); a put_signal updates "
            "the signal after all of the warp's data",
    "block": "every thread of the CTA calls it with the same arguments (the call synchronizes the CTA: "
             "never from divergent code); the CTA's threads move the data (NVLink) or one posts it "
             "(IBGDA); a put_signal updates the signal after all of the CTA's data, so a receiver "
             "whose acquire sees the signal sees every element; on return (blocking call) src may "
             "be reused by every thread of the CTA",
}
#: Comparisons a signal wait takes, with their meaning on (seen, value).
COMPARISONS: dict[str, str] = {
    "eq": "seen == value", "ne": "seen != value", "gt": "seen > value",
    "ge": "seen >= value", "lt": "seen < value", "le": "seen <= value",
}
#: Why ``IntN`` passes where only ``UintN`` is legal (a signal's Uint64): CuTeDSL pointers carry
#: MLIR's signless integers, so a Uint64 tensor's ``.iterator`` (and a tensor made on it) reads
#: back as Int64; the bits and the binding are the same.
SIGNLESS = "CuTeDSL pointers carry no integer signedness"
#: Memory an operand may be in: ``symmetric`` (tagged ``ptxops.reach(ptr, "symmetric")``), or
#: ``local`` (this PE's memory read or written by this thread: untagged, ``gpu`` or
#: ``symmetric``; a peer's or a multicast address is not local).
LOCAL_REACHES: tuple[str | None, ...] = (None, "gpu", "symmetric")


@dataclass(frozen=True)
class Operand:
    """One pointer operand: ``name``, the ``memory`` it must be in (``"symmetric"`` or
    ``"local"``) and its element types (``"data"``: :data:`RMA_TYPES`, ``"amo"``,
    ``"signal"``)."""

    name: str
    memory: str
    types: str


@dataclass(frozen=True)
class Call:
    """One device call of :mod:`ptxops.nvshmem`: its nvshmem4py binding (``{type}`` stands for
    the element type's prefix, ``{scope}`` for a :data:`SCOPES` suffix), operands, and the
    ordering it gives, in words: ``orders`` (what
    it guarantees to whom), ``returns`` (what is complete when it returns) and ``reuse`` (what a
    caller must do before reusing or reading the buffers it names)."""

    name: str
    binding: str
    operands: tuple[Operand, ...]
    orders: str
    returns: str
    reuse: str


_DST, _SRC = Operand("dst", "symmetric", "data"), Operand("src", "local", "data")
_SIGNAL = Operand("signal", "symmetric", "signal")

CALLS: dict[str, Call] = {c.name: c for c in (
    Call("put", "{type}_put{scope}", (_DST, _SRC),
         "nothing with later puts to the same PE (use fence)",
         "src may be reused; the data may not have arrived at the PE yet",
         "the receiver may read dst only after a signal ordered after it: fence, then a "
         "signal_op or put_signal (a put_signal orders only its own data)"),
    Call("put_nbi", "{type}_put_nbi{scope}", (_DST, _SRC),
         "nothing with later puts to the same PE (use fence)",
         "nothing: the copy may still read src",
         "quiet before reusing src; as put for the receiver"),
    Call("get", "{type}_get", (Operand("dst", "local", "data"), Operand("src", "symmetric", "data")),
         "nothing with other PEs' writes to src: the owner must have published src first",
         "dst holds the data",
         "none on this side; the owner may overwrite src once told (a signal back)"),
    Call("put_signal", "{type}_put_signal{scope}", (_DST, _SRC, _SIGNAL),
         "the signal update after the data: a PE whose acquire (signal_wait) sees the update "
         "sees all of dst",
         "src may be reused; dst and the signal may not have arrived yet",
         "the sender overwrites dst again only after the receiver says it has read it (a "
         "signal back, with a monotonic epoch value, never a reset to 0)"),
    Call("put_signal_nbi", "{type}_put_signal_nbi{scope}", (_DST, _SRC, _SIGNAL),
         "the signal update after the data, as put_signal",
         "nothing: the copy may still read src",
         "quiet before reusing src; as put_signal for dst"),
    Call("signal_op", "signal_op", (_SIGNAL,),
         "nothing with this thread's earlier puts: fence before it to signal after them",
         "nothing: the update may not have arrived",
         "none"),
    Call("signal_wait", "ld.acquire.sys (bounded, %globaltimer deadline)", (_SIGNAL,),
         "an acquire at .sys: once it returns true, this thread sees every write a put_signal "
         "published with the update it saw",
         "true if the comparison held before the deadline, false on a timeout",
         "other threads of the CTA read dst after a barrier (bar.sync) following the wait"),
    Call("fetch_add", "{type}_atomic_fetch_add", (Operand("ptr", "symmetric", "amo"),),
         "nothing with other memory operations (an NVSHMEM AMO is relaxed): fence or quiet",
         "the value before the add",
         "none"),
    Call("fence", "fence", (),
         "this thread's puts, AMOs and signals to each PE are delivered in issue order",
         "nothing completes",
         "not enough to reuse a nbi source: that needs quiet"),
    Call("quiet", "quiet", (),
         "every put, get, AMO and signal this thread issued is complete and delivered",
         "all of them are complete",
         "after quiet every nbi source may be reused"),
)}


@dataclass(frozen=True)
class NvRule:
    """A rule of :mod:`ptxops.nvshmem` calls: ``name`` (in errors) and its ``text``."""

    name: str
    text: str


RULES: dict[str, NvRule] = {r.name: r for r in (
    NvRule("nvshmem-symmetric", "A remote operand (a put's dst, a get's src, a signal, an AMO's "
           "address) must be symmetric memory from the NVSHMEM heap, tagged "
           "ptxops.reach(ptr, 'symmetric'): a peer's mapped address or an untagged pointer is "
           "not known to be at the same offset on every PE."),
    NvRule("nvshmem-local", "A local operand (a put's src, a get's dst) is this PE's memory: a "
           "peer's mapped address or a multicast address is refused (the NIC of an IBGDA "
           "transfer cannot read it)."),
    NvRule("nvshmem-global", "NVSHMEM operands are in global memory (a pointer in shared or "
           "register memory is refused)."),
    NvRule("nvshmem-contiguous", "A tensor operand is compact: NVSHMEM copies count elements "
           "from its first address, so a strided tensor would move the wrong elements."),
    NvRule("nvshmem-type", "The element type must be one NVSHMEM binds for the call: "
           "data: " + ", ".join(RMA_TYPES) + "; fetch-add: " + ", ".join(AMO_TYPES)
           + "; a signal: Uint64."),
    NvRule("nvshmem-same-type", "dst and src have the same element type (no conversion)."),
    NvRule("nvshmem-count", "The element count is dst's size and src's size, which must be equal, "
           "or count=, which must not exceed either when they are known; a dynamic size needs "
           "count= (never a silent min)."),
    NvRule("nvshmem-signal-op", "A signal update is one of " + ", ".join(SIGNAL_OPS) + "."),
    NvRule("nvshmem-scope", "A put or put-with-signal is issued by one of " + ", ".join(SCOPES)
           + " (a warp's or a CTA's call is made by each of its threads with the same arguments)."),
    NvRule("nvshmem-compare", "A signal wait compares with one of " + ", ".join(COMPARISONS) + "."),
)}


def _error(call: str, rule: str, what: str, target: str, offending: dict, legal: dict) -> QualifierError:
    return QualifierError(
        f"nvshmem.{call}",
        f"nvshmem.{call}: {what} (target {target}).\n  rule [{rule}]: {RULES[rule].text}",
        offending=offending, rule=rule, legal=legal, target=target,
    )


def types_of(kind: str) -> dict[str, str]:
    """The element types (name -> binding prefix) of an operand kind of :class:`Operand`."""
    return {"data": RMA_TYPES, "amo": AMO_TYPES, "signal": SIGNAL_TYPES}[kind]


def check_operand(call: str, op: Operand, reach: str | None, origin: str, memspace: str, dtype: str, target: str) -> str:
    """Check operand ``op`` of ``call``: its pointer's ``reach`` (None: untagged; ``origin``:
    who tagged it), address space (``"gmem"`` or ``"generic"`` pass) and element type name
    (``IntN`` passes as ``UintN`` where only that is legal: :data:`SIGNLESS`); return the
    element type's name, read so."""
    if memspace not in ("gmem", "generic"):
        raise _error(call, "nvshmem-global", f"{op.name} is a pointer in {memspace} memory", target,
                     {op.name: memspace}, {op.name: ["gmem", "generic"]})
    if op.memory == "symmetric" and reach != "symmetric":
        had = "an untagged pointer (tag it)" if reach is None else f"a pointer of reach {reach!r} (set by {origin})"
        raise _error(call, "nvshmem-symmetric", f"{op.name} must be symmetric; it is {had}", target,
                     {op.name: reach}, {op.name: ["symmetric"]})
    if op.memory == "local" and reach not in LOCAL_REACHES:
        raise _error(call, "nvshmem-local", f"{op.name} must be this PE's memory; it is a pointer of "
                     f"reach {reach!r} (set by {origin})", target, {op.name: reach},
                     {op.name: list(LOCAL_REACHES)})
    types = types_of(op.types)
    if dtype not in types and dtype.startswith("Int") and f"U{dtype[0].lower()}{dtype[1:]}" in types:
        dtype = f"U{dtype[0].lower()}{dtype[1:]}"  # a signless pointer: see SIGNLESS
    if dtype not in types:
        raise _error(call, "nvshmem-type", f"{op.name} has element type {dtype}", target,
                     {op.name: dtype}, {op.name: list(types)})
    return dtype


def check_contiguous(call: str, name: str, size: int, cosize: int, target: str) -> None:
    """Tensor operand ``name`` of ``call`` (``size`` elements over ``cosize``) is compact."""
    if size != cosize:
        raise _error(call, "nvshmem-contiguous", f"{name} has {size} elements spread over {cosize}",
                     target, {name: (size, cosize)}, {name: ["a compact tensor"]})


def check_same_type(call: str, dst: str, src: str, target: str) -> None:
    """dst and src of ``call`` have one element type."""
    if dst != src:
        raise _error(call, "nvshmem-same-type", f"dst is {dst} and src is {src}", target,
                     {"dst": dst, "src": src}, {"src": [dst]})


def check_count(call: str, dst: int | None, src: int | None, count: int | None, target: str) -> None:
    """The element count of ``call``: ``dst`` and ``src`` are the operands' static sizes (None
    when dynamic or a bare pointer), ``count`` the caller's (None: not given)."""
    if count is None:
        if dst is None or src is None:
            raise _error(call, "nvshmem-count", "a size is not known at trace time and no count= is given",
                         target, {"dst": dst, "src": src}, {"count": ["an element count"]})
        if dst != src:
            raise _error(call, "nvshmem-count", f"dst has {dst} elements and src {src}", target,
                         {"dst": dst, "src": src}, {"count": [f"at most {min(dst, src)}"]})
        return
    if isinstance(count, int):
        too_big = [(n, s) for n, s in (("dst", dst), ("src", src)) if s is not None and count > s]
        if count < 0 or too_big:
            what = f"count={count} is negative" if count < 0 else \
                f"count={count} exceeds {', '.join(f'{n} ({s} elements)' for n, s in too_big)}"
            bound = min(s for s in (dst, src) if s is not None) if (dst, src) != (None, None) else None
            raise _error(call, "nvshmem-count", what, target, {"count": count},
                         {"count": [f"0..{bound}" if bound is not None else "a count >= 0"]})


def check_choice(call: str, rule: str, name: str, value: str, legal: Sequence[str], target: str) -> None:
    """``value`` of argument ``name`` is one of ``legal`` (rule ``rule``)."""
    if value not in legal:
        raise _error(call, rule, f"{name}={value!r}", target, {name: value}, {name: list(legal)})


__all__ = [
    "AMO_TYPES", "CALLS", "COMPARISONS", "LOCAL_REACHES", "RMA_TYPES", "RULES", "SCOPES", "SCOPE_ORDERS",
    "SIGNAL_OPS", "SIGNLESS",
    "SIGNAL_TYPES", "Call", "NvRule", "Operand", "check_choice", "check_contiguous", "check_count", "check_operand",
    "check_same_type", "types_of",
]
