"""Run the collectives' device source on the CPU: ``@cute.jit`` functions executed as plain
Python over a simulated memory, one Python thread per GPU thread, one of them running at a
time, a seeded random choice of which at every memory access.

:func:`load` executes a module's own source file with ``cutlass``, ``cutlass.cute``,
``cutlass.memory`` and ``ptxops`` bound to the stand-ins below (and any other import redirected
as the caller says), so an edit of a kernel is an edit of what runs here.  The stand-ins model:

- CuTeDSL's integers (:class:`Num`): their widths, their wrap, and the promotion of mixed
  operands (:func:`promote` restates ``cutlass.base_dsl.typing._promote_integer``; a Python
  int is an ``Int32``, or an ``Int64`` past its range, as ``as_numeric`` makes it); signed
  ``//`` and ``%`` truncate as PTX's ``div``/``rem`` do;
- pointers, loads, stores and atomics of the widths the kernels use, each one step, sequentially
  consistent (this checks the protocol's logic; its orderings are the memory model's business:
  docs/guide-memory-ordering.md and the litmus tests), but for one thing no ordering gives: a
  weak load (``ld`` without ``sem``, PTX's default ``ld.ca``) is served from its block's L1
  once the block has loaded the address, until a store or atomic of that block to it or the
  kernel's end.  "Multiple L1 caches are not coherent for global data" (the PTX ISA's cache
  operators): a weak load never sees another block's (or GPU's) later store, so a wait that
  polls one from before that store spins until its deadline (:class:`Block`'s ``l1``);
- multicast addresses (one store reaches every rank's copy in one step), ``bar.sync``, and
  ``%globaltimer`` (one tick per step of any thread);
- pointers' reaches (``ptxops.reach``), checked as ptxops checks them in a kernel the
  collectives' launchers trace (``ptxops.ops.pointer_reach.required``): every access names its
  PTX form (:func:`ptxops.spec.instruction`: an illegal form fails here too), an access through
  an untagged pointer is refused (rule ``reach-required``) and an ordered one at a scope narrower
  than its reach needs raises :class:`ptxops.ScopeError` (:func:`ptxops.ops.pointer_reach.check_tag`).

Every store remembers who made it (:attr:`Context.label`); every load tells the loading thread
(:attr:`SimThread.seen`), so a check can ask whose value a wait passed on.
"""

from __future__ import annotations

import builtins
import importlib.util
import inspect
import random
import sys
import threading
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ptxops import spec
from ptxops.errors import QualifierError
from ptxops.ops.forms import memory_types
from ptxops.ops.pointer_reach import Tag, check_tag, required
from ptxops.spec import reach as reach_rules


# -- integers ----------------------------------------------------------------------------------


class Num:
    """A CuTeDSL integer value: ``v`` is its value in its type (wrapped, signed or not)."""

    __slots__ = ("v",)
    width = 32
    signed = True

    def __init__(self, x: Any = 0) -> None:
        x = int(x.v if isinstance(x, Num) else x)
        x &= (1 << self.width) - 1
        if self.signed and x >> (self.width - 1):
            x -= 1 << self.width
        self.v = x

    def __bool__(self) -> bool:
        return self.v != 0

    def __index__(self) -> int:
        return self.v

    __int__ = __index__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.v})"

    def __neg__(self):
        return type(self)(-self.v)

    def __invert__(self):
        return type(self)(~self.v)


def _kind(name: str, width: int, signed: bool) -> type:
    return type(name, (Num,), {"__slots__": (), "width": width, "signed": signed})


Int8, Int16, Int32, Int64 = (_kind(f"Int{w}", w, True) for w in (8, 16, 32, 64))
Uint8, Uint16, Uint32, Uint64 = (_kind(f"Uint{w}", w, False) for w in (8, 16, 32, 64))


class Boolean(Num):
    __slots__ = ()
    width, signed = 1, False

    def __init__(self, x: Any = False) -> None:
        self.v = int(bool(x.v if isinstance(x, Num) else x))


class Float32:
    """CuTeDSL's ``Float32`` as a type only: the simulation moves floats as their bits
    (:func:`bits`) and computes nothing on them."""

    width = 32


def is_float(dtype: type) -> bool:
    """Whether ``dtype`` is a float type (CuTeDSL's, or :class:`Float32`): not an integer."""
    return not (isinstance(dtype, type) and issubclass(dtype, Num))


def as_num(x: Any) -> Num:
    """A Python value as CuTeDSL types it (``as_numeric``)."""
    if isinstance(x, Num):
        return x
    if isinstance(x, bool):
        return Boolean(x)
    if isinstance(x, int):
        return Int32(x) if -(1 << 31) <= x < 1 << 31 else Int64(x)
    raise TypeError(f"no CuTeDSL integer for {x!r}")


def promote(a: type, b: type) -> type:
    """The type both operands of a binary operation take (``_promote_integer``)."""
    if a is b:
        return a
    if a.signed != b.signed:
        unsigned, signed = (a, b) if not a.signed else (b, a)
        return unsigned if unsigned.width >= signed.width else signed
    return a if a.width >= b.width else b


def _trunc_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


_ARITH = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y,
    "lshift": lambda x, y: x << y, "rshift": lambda x, y: x >> y,  # signed values: arithmetic shift
}
_COMPARE = {"lt": int.__lt__, "le": int.__le__, "gt": int.__gt__, "ge": int.__ge__, "eq": int.__eq__,
            "ne": int.__ne__}


def _binary(name: str, reflected: bool = False):
    def op(self, other):
        try:
            other = as_num(other)
        except TypeError:
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        kind = promote(type(a), type(b))
        x, y = kind(a).v, kind(b).v
        if name in _COMPARE:
            return Boolean(_COMPARE[name](x, y))
        if name == "floordiv":
            return kind(_trunc_div(x, y) if kind.signed else x // y)
        if name == "mod":
            return kind(x - _trunc_div(x, y) * y if kind.signed else x % y)
        return kind(_ARITH[name](x, y))
    return op


for _name in (*_ARITH, "floordiv", "mod"):
    setattr(Num, f"__{_name}__", _binary(_name))
    setattr(Num, f"__r{_name}__", _binary(_name, reflected=True))
for _name in _COMPARE:
    setattr(Num, f"__{_name}__", _binary(_name))
Num.__hash__ = None  # type: ignore[assignment]


# -- memory ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ptr:
    """A typed global-memory address (``cute.make_ptr``); ``+ k`` moves by ``k`` elements.
    ``moved``: made by ``+``, after which CuTeDSL loads an integer as signed unless told its
    ``dtype`` (``test_dsl_signedness`` pins it).  ``reach``: its ``ptxops.reach`` tag, which
    ``+`` keeps (None: untagged)."""

    dtype: type
    address: int
    moved: bool = False
    reach: Tag | None = None

    def __add__(self, k: Any) -> Ptr:
        return Ptr(self.dtype, self.address + int(k) * (self.dtype.width // 8), True, self.reach)

    def loads(self) -> type:
        """What a load without ``dtype=`` returns."""
        kind = bits(self.dtype)
        if self.moved and kind is not Boolean and not kind.signed:
            return {8: Int8, 16: Int16, 32: Int32, 64: Int64}[kind.width]
        return kind


class Memory:
    """Byte-addressed global memory of every rank, and the multicast ranges over it."""

    BASE = 1 << 20

    def __init__(self) -> None:
        self.bytes = bytearray()
        self.writer: dict[int, Any] = {}  # address -> label of its last store
        self.multicast: list[tuple[int, int, list[int]]] = []  # (mc base, size, each rank's base)
        self._next_mc = 1 << 44

    def alloc(self, nbytes: int) -> int:
        """A zeroed range of ``nbytes``, 256-byte aligned; its address."""
        start = len(self.bytes) + (-len(self.bytes)) % 256
        self.bytes.extend(bytes(start + nbytes - len(self.bytes)))
        return self.BASE + start

    def alloc_multicast(self, bases: list[int], nbytes: int) -> int:
        """A multicast address for the ranges at ``bases``: a store there reaches each of them."""
        mc, self._next_mc = self._next_mc, self._next_mc + (1 << 32)
        self.multicast.append((mc, nbytes, bases))
        return mc

    def _targets(self, address: int) -> list[int]:
        for mc, nbytes, bases in self.multicast:
            if mc <= address < mc + nbytes:
                return [base + address - mc for base in bases]
        return [address]

    def load(self, address: int, dtype: type) -> Num:
        (address,) = self._targets(address)
        at, n = address - self.BASE, dtype.width // 8
        return dtype(int.from_bytes(self.bytes[at:at + n], "little"))

    def store(self, address: int, value: Any, dtype: type, label: Any = None) -> None:
        n = dtype.width // 8
        for target in self._targets(address):
            at = target - self.BASE
            self.bytes[at:at + n] = (int(dtype(value).v) & ((1 << 8 * n) - 1)).to_bytes(n, "little")
            self.writer[target] = label

    def words(self, address: int, count: int, dtype: type = Int32) -> list[int]:
        return [self.load(address + i * dtype.width // 8, dtype).v for i in range(count)]

    def take_records(self, address: int, records: int, fields: int) -> list[tuple[int, list[int]]]:
        """The error records at ``address`` (``records`` of ``fields`` int32 words) a kernel
        filled, as ``(index, words)`` of each whose first word (its status) is set; then every
        record cleared, as the host does after each call."""
        taken = []
        for index in range(records):
            at = address + 4 * fields * index
            found = self.words(at, fields)
            if found[0]:
                taken.append((index, found))
            for i in range(fields):
                self.store(at + 4 * i, 0, Int32)
        return taken


# -- threads -----------------------------------------------------------------------------------


class Abort(BaseException):
    """Unwinds a simulated thread once the simulation has failed."""


@dataclass
class Block:
    """One running thread block: its shared memory, its ``bar.sync`` and its SM's L1 (``l1``:
    ``(address, type)`` -> ``(value, writer)`` of a weak load, kept until the block stores there)."""

    live: int
    arrived: list = field(default_factory=list)
    smem: dict = field(default_factory=dict)
    lanes: dict = field(default_factory=dict)  # each thread's operand of the warp's match or shuffle
    l1: dict = field(default_factory=dict)

    def discard(self, address: int, nbytes: int) -> None:
        """A store of the block to ``nbytes`` at ``address``: its L1 lines there go (stores
        bypass L1 and discard the lines they hit)."""
        for key in [k for k in self.l1 if k[0] < address + nbytes and address < k[0] + k[1].width // 8]:
            del self.l1[key]


@dataclass
class Context:
    """Where a simulated thread runs: rank, the rank's call index, block, thread, grid."""

    rank: int = -1
    call: int = -1
    block: int = 0
    tidx: int = 0
    grid: int = 1
    threads: int = 1
    state: Block | None = None

    @property
    def label(self) -> tuple[int, int]:
        return (self.rank, self.call)


class SimThread:
    def __init__(self, sim: Sim, body: Callable[[], None], ctx: Context, wake_at: int = 0,
                 on_exit: Callable[[], None] | None = None) -> None:
        self.sim, self.body, self.ctx, self.wake_at, self.on_exit = sim, body, ctx, wake_at, on_exit
        self.blocked = False
        self.seen: dict[int, Any] = {}  # address -> label of the store this thread last loaded there
        self.go = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        _local.me = self
        self.go.acquire()
        try:
            if self.sim.failed is None:
                self.body()
        except Abort:
            pass
        except BaseException as e:  # noqa: BLE001  # handed to Sim.run's caller
            self.sim._fail(e)
        finally:
            if self.on_exit is not None and self.sim.failed is None:
                self.on_exit()
            self.sim.exit(self)


_local = threading.local()


def me() -> SimThread:
    return _local.me


class Sim:
    """The machine: memory, the clock, and the threads that run one at a time."""

    def __init__(self, seed: int, max_steps: int = 10**6, speed: dict | None = None) -> None:
        """``speed``: rank, or ``(rank, thread index)``, -> relative chance of its threads (that
        thread of each of the rank's blocks) to run next (default 1 each; a thread's own entry first)."""
        self.speed = speed or {}
        self.rng = random.Random(seed)
        self.memory = Memory()
        self.clock = 0
        self.max_steps = max_steps
        self.threads: list[SimThread] = []
        self.failed: BaseException | None = None
        self.finished = threading.Event()
        self.lock = threading.Lock()

    def spawn(self, body: Callable[[], None], ctx: Context, wake_at: int = 0,
              on_exit: Callable[[], None] | None = None) -> SimThread:
        t = SimThread(self, body, ctx, wake_at, on_exit)
        self.threads.append(t)
        t.thread.start()
        return t

    def _next(self) -> SimThread | None:
        """The thread to run next: a random runnable one (the clock jumps to the first wake-up
        when only sleepers are left); None when every thread is blocked."""
        runnable = [t for t in self.threads if not t.blocked and t.wake_at <= self.clock]
        if not runnable:
            sleeping = [t.wake_at for t in self.threads if not t.blocked]
            if not sleeping:
                return None
            self.clock = min(sleeping)
            return self._next()
        speed = self.speed
        return self.rng.choices(runnable, [speed.get((t.ctx.rank, t.ctx.tidx), speed.get(t.ctx.rank, 1))
                                           for t in runnable])[0]

    def _fail(self, error: BaseException) -> None:
        """Record the first failure and wake every thread (each unwinds with :class:`Abort`)."""
        with self.lock:
            if self.failed is None:
                self.failed = error
            for t in self.threads:
                t.go.release()

    def step(self) -> None:
        """A scheduling point of the calling thread: the clock ticks, any thread may run next."""
        current = me()
        self.clock += 1
        if self.failed is None and self.clock > self.max_steps:
            self._fail(RuntimeError(f"no end after {self.max_steps} steps"))
        if self.failed is None:
            nxt = self._next()
            if nxt is None:
                self._fail(RuntimeError("every simulated thread is blocked: a hang"))
            elif nxt is not current:
                nxt.go.release()
                current.go.acquire()
        if self.failed is not None:
            raise Abort

    def exit(self, t: SimThread) -> None:
        with self.lock:
            self.threads.remove(t)
            if not self.threads:
                self.finished.set()
                return
            if self.failed is not None:
                return
        nxt = self._next()
        if nxt is None:
            self._fail(RuntimeError("every simulated thread is blocked: a hang"))
        else:
            nxt.go.release()

    def block(self) -> None:
        """The calling thread waits until something sets ``blocked`` back (it runs again later)."""
        t = me()
        t.blocked = True
        self.step()

    def run(self) -> None:
        """Run every spawned thread to its end; re-raises the first failure."""
        first = self._next()
        if first is not None:
            first.go.release()
            self.finished.wait()
        if self.failed is not None:
            raise self.failed

    def launch(self, body: Callable[[], None], ctx: Context, grid: int, threads: int,
               delays: list[int] | None = None) -> None:
        """From a simulated host thread: run ``body`` on ``grid`` blocks of ``threads`` threads
        (block ``b`` starting ``delays[b]`` ticks from now) and return once all have ended."""
        host = me()
        left = [grid * threads]

        def done() -> None:
            left[0] -= 1
            if left[0] == 0:
                host.blocked = False

        for b in range(grid):
            state = Block(threads)
            for tidx in range(threads):
                sub = Context(ctx.rank, ctx.call, b, tidx, grid, threads, state)
                self.spawn(body, sub, self.clock + (delays[b] if delays else 0), done)
        self.block()

    def sleep_until(self, tick: int) -> None:
        t = me()
        t.wake_at = tick
        self.step()


# -- the stand-ins for cutlass, cutlass.cute, cutlass.memory and ptxops -------------------------


def _sim() -> Sim:
    return me().sim


def bits(dtype: type) -> type:
    """The integer type a value of ``dtype`` is held in: itself, or for a CuTeDSL float the
    unsigned integer of its width (the simulation moves floats as bits and computes nothing
    on them)."""
    if not is_float(dtype):
        return dtype
    return {8: Uint8, 16: Uint16, 32: Uint32, 64: Uint64}[dtype.width]


#: The target the simulated kernels' PTX forms are checked for (the collectives' H100).
TARGET = "sm_90a"


def _reach(ptr: Ptr, kind: str, *, by: str | None = None) -> Ptr:
    """``ptxops.reach``: ``ptr`` tagged with ``kind`` (an unknown kind raises as there), the
    origin naming ``by`` and the source line that tagged it."""
    caller = sys._getframe(1)
    site = f"{caller.f_code.co_filename}:{caller.f_lineno}"
    return replace(ptr, reach=Tag(reach_rules.reach(kind).kind, f"{by + ' at ' if by else 'ptxops.reach at '}{site}"))


def _ptx_type(family: str, dtype: type, op: str | None = None) -> str:
    """The PTX type of an access of ``dtype`` values: untyped bits, ``u``/``s`` for an
    ``atom.add``, and ``f`` for a float stored by ``multimem.st`` (which has no integer vectors)."""
    width = dtype.width
    if op == "add":
        return f"{'s' if bits(dtype).signed else 'u'}{width}"
    if family == "multimem.st" and is_float(dtype):
        return f"f{width}"
    return f"b{width}"


def _access(family: str, ptr: Ptr, dtype: type, n: int = 1, **qualifiers: Any) -> None:
    """Check an access as ptxops's device function would: its PTX form legal (a plain ``ld``
    or ``st`` of several sub-word values packed into 32-bit words where they fill them, as
    :func:`ptxops.ops.forms.memory_types` packs them), its pointer tagged (the kernels trace
    under ``pointer_reach.required``) and an ordered form's scope wide enough for the pointer's
    reach."""
    with required("a collectives kernel (simulated)"):
        check_tag(_form(family, dtype, n, tuple(qualifiers.items())), ptr.reach)


#: The PTX form of each access the kernels made, by :func:`_form`'s arguments: found once, not
#: at every simulated access (``spec.instruction`` takes tens of microseconds, a third of a
#: Lamport simulation's time).
_FORMS: dict[tuple, Any] = {}


def _form(family: str, dtype: type, n: int, qualifiers: tuple[tuple[str, Any], ...]) -> Any:
    """The form :func:`_access` checks: its first legal candidate (an illegal access raises
    ``spec.instruction``'s error at every attempt: failures are not kept)."""
    key = (family, dtype, n, qualifiers)
    if key in _FORMS:
        return _FORMS[key]
    q = dict(qualifiers)
    candidates = [(_ptx_type(family, dtype, q.get("op")), n)]
    if family in ("ld", "st"):
        candidates = memory_types(dtype, n)
    for i, (ptx_type, registers) in enumerate(candidates):
        try:
            inst = spec.instruction(family, target=TARGET, space="global", type=ptx_type,
                                    vec=registers if registers > 1 else None, **q)
            break
        except QualifierError:
            if i == len(candidates) - 1:
                raise
    _FORMS[key] = inst
    return inst


def _load(ptr: Ptr, dtype: type | None, num_elements: int = 1, **qualifiers: Any) -> Any:
    sim, t = _sim(), me()
    sim.step()
    _access("ld", ptr, dtype or ptr.dtype, num_elements, **qualifiers)
    dtype = bits(dtype) if dtype is not None else ptr.loads()
    l1 = t.ctx.state.l1 if t.ctx.state is not None and qualifiers.get("sem") is None else None
    values = []
    for i in range(num_elements):
        address = ptr.address + i * dtype.width // 8
        if l1 is not None and (address, dtype) in l1:  # a weak load: the block's L1 line, stale or not
            value, writer = l1[address, dtype]
        else:
            value, writer = sim.memory.load(address, dtype), sim.memory.writer.get(sim.memory._targets(address)[0])
            if l1 is not None:
                l1[address, dtype] = (value, writer)
        values.append(value)
        t.seen[address] = writer
    return values[0] if num_elements == 1 else values


def _discard(address: int, nbytes: int) -> None:
    """The calling thread's block discards its L1 lines of a store or atomic at ``address``."""
    state = me().ctx.state
    if state is not None:
        state.discard(address, nbytes)


def _store(ptr: Ptr, value: Any, family: str = "st", **qualifiers: Any) -> None:
    sim = _sim()
    sim.step()
    values = value if isinstance(value, list) else [value]
    _access(family, ptr, ptr.dtype, len(values), **qualifiers)
    for i, v in enumerate(values):
        sim.memory.store(ptr.address + i * ptr.dtype.width // 8, v, bits(ptr.dtype), me().ctx.label)
    _discard(ptr.address, len(values) * ptr.dtype.width // 8)


def _atom(ptr: Ptr, update: Callable[[Num], Num | None], **qualifiers: Any) -> Num:
    sim = _sim()
    sim.step()
    _access("atom", ptr, ptr.dtype, **qualifiers)
    old = sim.memory.load(ptr.address, ptr.dtype)
    new = update(old)
    if new is not None:
        sim.memory.store(ptr.address, new, ptr.dtype, me().ctx.label)
    _discard(ptr.address, ptr.dtype.width // 8)
    return old


def _ptxops() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        reach=_reach,
        ld=lambda ptr, dtype=None, num_elements=1, sem=None, scope=None: _load(ptr, dtype, num_elements, sem=sem,
                                                                             scope=scope),
        ld_acquire=lambda ptr, scope, dtype=None: _load(ptr, dtype, sem="acquire", scope=scope),
        st=lambda ptr, value, sem=None, scope=None: _store(ptr, value, sem=sem, scope=scope),
        st_release=lambda ptr, value, scope: _store(ptr, value, sem="release", scope=scope),
        multimem_st=lambda ptr, value, sem=None, scope=None: _store(ptr, value, "multimem.st", sem=sem, scope=scope),
        atom_add=lambda ptr, value, sem=None, scope=None: _atom(ptr, lambda old: old + value, op="add", sem=sem,
                                                              scope=scope),
        atom_cas=lambda ptr, cmp, new, sem=None, scope=None: _atom(ptr, lambda old: new if old.v == cmp.v else None,
                                                                  op="cas", sem=sem, scope=scope),
        fence=lambda **_: _sim().step(),
    )


def _sync_threads() -> None:
    sim, t = _sim(), me()
    state = t.ctx.state
    state.arrived.append(t)
    if len(state.arrived) == state.live:
        for waiter in state.arrived:
            waiter.blocked = False
        state.arrived.clear()
        sim.step()
    else:
        sim.block()


def _match_sync(mask: Any, value: Any, kind: str = "any") -> Uint32:
    """``match.any.sync`` over the block (the simulated blocks are of one warp at most): the
    lanes whose value is this thread's, every lane of the block taking part."""
    assert kind == "any" and as_num(mask).v & 0xFFFFFFFF == 0xFFFFFFFF, (kind, mask)
    state, tidx = me().ctx.state, me().ctx.tidx
    state.lanes[tidx] = as_num(value).v
    _sync_threads()  # every lane's value in
    peers = sum(1 << lane for lane, v in state.lanes.items() if v == state.lanes[tidx])
    _sync_threads()  # every lane's mask out before a later match overwrites the values
    return Uint32(peers)


def _vote_ballot_sync(pred: Any, mask: Any = -1) -> Int32:
    """``vote.sync.ballot.b32`` over the block (one warp at most): bit ``l`` set where lane
    ``l``'s predicate holds, every lane taking part."""
    assert as_num(mask).v & 0xFFFFFFFF == 0xFFFFFFFF, mask
    state, tidx = me().ctx.state, me().ctx.tidx
    state.lanes[tidx] = bool(pred)
    _sync_threads()
    bits = sum(1 << lane for lane, v in state.lanes.items() if v)
    _sync_threads()
    return Int32(bits)


def _shuffle_sync_up(value: Any, offset: Any) -> Num:
    """``shfl.sync.up`` over the block (one warp at most): lane ``l - offset``'s value, a lane below
    ``offset`` its own."""
    state, tidx = me().ctx.state, me().ctx.tidx
    state.lanes[tidx] = value
    _sync_threads()
    got = state.lanes[tidx - int(offset)] if tidx >= int(offset) else value
    _sync_threads()
    return got


def _shuffle_sync_bfly(value: Any, offset: Any, mask: Any = -1, mask_and_clamp: Any = 31) -> Num:
    """``shfl.sync.bfly`` over the block (every lane taking part): lane ``l ^ offset``'s value
    (``offset`` below the warp's lanes, so the lane is one of this thread's warp)."""
    assert as_num(mask).v & 0xFFFFFFFF == 0xFFFFFFFF, mask
    state, tidx = me().ctx.state, me().ctx.tidx
    state.lanes[tidx] = value
    _sync_threads()
    got = state.lanes[tidx ^ int(offset)]
    _sync_threads()
    return got


def _globaltimer() -> Int64:
    _sim().step()
    return Int64(_sim().clock)


class _Smem:
    """``SmemAllocator``: every thread of a block gets the same tensors, in allocation order."""

    def __init__(self) -> None:
        self.count = 0

    def allocate_tensor(self, dtype: type, layout: Any, byte_alignment: int = 0) -> list:
        smem = me().ctx.state.smem
        self.count += 1
        return smem.setdefault(self.count, [dtype(0)] * int(layout))


class Registers(list):
    """A register tensor (``cute.make_rmem_tensor``) of integer words: ``load()`` and
    ``store()`` the whole, index one."""

    def __init__(self, count: int, dtype: type) -> None:
        super().__init__(dtype(0) for _ in range(count))
        self.element_type = dtype

    def load(self) -> list:
        return list(self)

    def store(self, values: list) -> None:
        self[:] = [self.element_type(v) for v in values]


def _cute() -> types.SimpleNamespace:
    ctx = lambda: me().ctx  # noqa: E731
    arch = types.SimpleNamespace(
        thread_idx=lambda: (Int32(ctx().tidx), Int32(0), Int32(0)),
        block_idx=lambda: (Int32(ctx().block), Int32(0), Int32(0)),
        grid_dim=lambda: (Int32(ctx().grid), Int32(1), Int32(1)),
        block_dim=lambda: (Int32(ctx().threads), Int32(1), Int32(1)),
        sync_threads=_sync_threads,
        sync_warp=_sync_threads,  # the simulated blocks are of one warp at most
        match_sync=_match_sync,
        vote_ballot_sync=_vote_ballot_sync,
        shuffle_sync_up=_shuffle_sync_up,
        shuffle_sync_bfly=_shuffle_sync_bfly,
        popc=lambda value: type(value)(bin(value.v & ((1 << value.width) - 1)).count("1")),
        WARP_SIZE=32,
        globaltimer=_globaltimer,
    )
    return types.SimpleNamespace(
        jit=lambda fn=None, **_: fn if fn is not None else (lambda f: f),
        kernel=lambda fn: fn,
        make_ptr=lambda dtype, address, space=None, assumed_align=None: Ptr(dtype, int(address)),
        AddressSpace=types.SimpleNamespace(gmem="gmem"),
        Pointer=Ptr,
        Tensor=list,
        arch=arch,
        make_layout=lambda shape: shape,
        make_rmem_tensor=lambda count, dtype: Registers(count, dtype),
        recast_tensor=lambda tensor, dtype: tensor,  # floats are moved as bits (see bits)
        size=len,
        assume=lambda value, divby=1: value,
    )


def fakes() -> dict[str, Any]:
    """The stand-in modules by name (``cutlass.cute`` is also ``cutlass.cute`` the attribute;
    ``collectives.device.launch``: a launcher returns the kernel's body, which the simulation
    launches itself, and a key's checks are the real ones)."""
    from collectives.device.launch import BLOCK_THREADS, check_threads

    cute = _cute()
    memory = types.SimpleNamespace(SmemAllocator=_Smem)
    cutlass = types.SimpleNamespace(
        cute=cute, memory=memory, Constexpr=Any, const_expr=lambda x: x, range_constexpr=range,
        range=lambda *bounds, **_: (Int32(i) for i in range(*map(int, bounds))),  # a runtime loop: Int32 indices
        select_=lambda condition, a, b: a if condition else b,
        max=lambda a, b: a if a >= b else b, min=lambda a, b: a if a <= b else b,
        Boolean=Boolean, Int8=Int8, Int16=Int16, Int32=Int32, Int64=Int64,
        Uint8=Uint8, Uint16=Uint16, Uint32=Uint32, Uint64=Uint64, Float32=Float32,
    )
    launch = types.SimpleNamespace(launcher=lambda kernel, threads, *_, **__: kernel, check_threads=check_threads,
                                   BLOCK_THREADS=BLOCK_THREADS)
    return {"cutlass": cutlass, "cutlass.cute": cute, "cutlass.memory": memory, "ptxops": _ptxops(),
            "collectives.device.launch": launch}


def load(module: str, redirect: dict[str, Any], edits: tuple[tuple[str, str], ...] = ()) -> types.ModuleType:
    """A fresh copy of ``module`` (dotted name) executed from its source file, its imports of
    the names in ``redirect`` (absolute, e.g. ``"ptxops"``, ``"collectives.device"``) bound to
    the given objects; every other import is the real one.  ``edits``: (old, new) replacements
    of the source first, each of text found exactly once (a mutation to show a test failing)."""
    spec = importlib.util.find_spec(module)
    path = spec.origin
    package = module.rpartition(".")[0]

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        absolute = importlib.util.resolve_name("." * level + name, package) if level else name
        if fromlist:
            if absolute in redirect:
                return redirect[absolute]
        elif absolute.split(".")[0] in redirect:
            return redirect[absolute.split(".")[0]]
        return builtins.__import__(name, globals, locals, fromlist, level)

    copy = types.ModuleType(f"{module}.__simulated__")  # a dataclass looks its module up by name
    copy.__file__, copy.__package__ = path, package
    copy.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": importer}
    sys.modules[copy.__name__] = copy
    with open(path) as f:
        source = f.read()
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"{module}: the edit's text is found {source.count(old)} times, not once: {old!r}")
        source = source.replace(old, new)
    exec(compile(source, path, "exec"), copy.__dict__)
    return copy


def arguments(function: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``function``'s parameters by name for a call with ``args`` and ``kwargs`` (defaults filled)."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


__all__ = ["TARGET", "Abort", "Boolean", "Context", "Float32", "Int32", "Int64", "Memory", "Num", "Ptr", "Registers",
           "Sim", "Uint32", "Uint64", "arguments", "as_num", "bits", "fakes", "is_float", "load", "me", "promote"]
