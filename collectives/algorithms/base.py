"""What a collective algorithm is: one class per algorithm owning everything that is that
algorithm's (the kernel-key choices it takes, whether it can run a call, its plan: buffers as
named staging slots and grid, its kernel, the error phases its kernel records).

The API (:mod:`collectives.api`) describes a call as a :class:`Call`, resolves the backend, lets
:mod:`collectives.algorithms.tuning` pick the algorithm for ``"auto"`` and then asks the algorithm's
instance, found in :data:`collectives.algorithms.REGISTRY`, for :meth:`Algorithm.refusal` and
:meth:`Algorithm.plan`.  No torch here (kernel keys are made without it); each subclass's
module holds its kernel next to its host logic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Any, ClassVar

from .. import config
from ..config import BACKENDS, KIND_SHIFT, MAX_ELEMENTS, MULTICAST_PATHS, OPS, VECTOR_BYTES, Slot
from ..dtypes import DTYPES
from ..errors import CollectiveError
from ..layouts import COLLECTIVE, Layout
from .protocol import Buffer, Runtime


def ceil_div(a, b):
    """``a / b`` rounded up, for non-negative integers (Python or CuTeDSL: the kernels share
    the formulas below)."""
    return (a + b - 1) // b


#: Every algorithm by (collective, name), filled as the algorithm modules are imported
#: (:mod:`collectives.algorithms` imports them all).
REGISTRY: dict[tuple[str, str], Algorithm] = {}


def algorithms(collective: str) -> tuple[str, ...]:
    """The names of ``collective``'s algorithms, in the order their modules registered them."""
    return tuple(name for c, name in REGISTRY if c == collective)


#: Every collective, dtype and op whose barriers compare size words, as triples; a triple's
#: index is its tag (:func:`signature`).  An all-gather and the barrier pass ``"sum"``.
CALL_TAGS = tuple(product(("barrier", "all_reduce", "reduce_scatter", "all_gather"), DTYPES, OPS))
#: The lowest bit of a tag in the size word (the tags take the bits just below the kinds).
TAG_SHIFT = KIND_SHIFT - (len(CALL_TAGS) - 1).bit_length()
#: What a Lamport kernel brings to its call's arrival word besides ``n`` (``n ^`` this, with the
#: epoch :func:`~collectives.layouts.lamport_epoch`): every tag bit set and no kind, a tag that no
#: call has (:data:`CALL_TAGS` has fewer), so that a barriered kernel meeting a Lamport one in a
#: call (an empty rank's barrier, :func:`collectives.api._launch`) records a size mismatch where
#: both counts are below ``2^TAG_SHIFT`` (a Lamport one always is).
LAMPORT_SIGNATURE = ((1 << (KIND_SHIFT - TAG_SHIFT)) - 1) << TAG_SHIFT
assert len(CALL_TAGS) <= LAMPORT_SIGNATURE >> TAG_SHIFT


def signature(collective: str, dtype: str, op: str, kinds: int) -> int:
    """The word a rank's call brings to its barriers besides its element count ``n`` (the
    kernels' ``kinds`` argument; :func:`collectives.device.signals.size_word` is ``n ^
    signature``): the kinds (:attr:`Call.kinds`) in the top bits and, below them at
    :data:`TAG_SHIFT`, the tag of the collective, dtype and op (:data:`CALL_TAGS`).  Ranks that
    differ in any of them fail the call as a size mismatch: an f32 rank and a bf16 rank of
    equal ``n`` would move different bytes, an all-gather and a reduce-scatter of equal ``n``
    different data.  Exact (as the element counts' compare) while both counts are below
    ``2^TAG_SHIFT``; above, two different calls pair only where their counts differ by exactly
    their tags' XOR.  As an int32 (the kernel argument's type)."""
    word = kinds << KIND_SHIFT ^ CALL_TAGS.index((collective, dtype, op)) << TAG_SHIFT
    return word - (1 << 32) if word >> 31 else word


@dataclass(frozen=True)
class Call:
    """One collective call as the API received it, checked (dtype, devices, shapes) and with
    its backend resolved.

    ``out`` is where the result goes (an in-place all-reduce: the input) and ``inp`` what is
    read; ``n`` the elements each rank's kernel counts (an all-reduce's tensor, a
    reduce-scatter's output, an all-gather's input); ``nbytes`` the size the algorithm
    choice compares (an all-reduce's tensor, a reduce-scatter's input, an all-gather's output).
    ``symmetric`` says whether the tensor an algorithm may use in place lies in symmetric
    memory (the all-reduce's and reduce-scatter's input, the all-gather's output);
    ``in_place``: an all-reduce without ``out``.  ``whole_vectors``: a rank's block fills whole
    16-byte vectors; ``pointers_aligned``: both tensors start on a 16-byte boundary."""

    collective: str
    out: Any
    inp: Any
    dtype: str
    op: str
    backend: str
    world: int
    n: int
    nbytes: int
    symmetric: bool
    in_place: bool
    whole_vectors: bool
    pointers_aligned: bool
    capturing: bool
    max_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.n > MAX_ELEMENTS:
            raise CollectiveError(
                f"{self.collective}: {self.n} elements per rank; the kernels carry a rank's element count in 29 "
                f"bits (the kinds of its tensors above them; sizes that differ by 2^29 would pass as equal): at "
                f"most {MAX_ELEMENTS}, split the tensor")

    @classmethod
    def bare(cls, collective: str, backend: str, world: int) -> Call:
        """A call moving no data (the barrier)."""
        return cls(collective, None, None, "bf16", "sum", backend, world, n=0, nbytes=0, symmetric=False,
                   in_place=False, whole_vectors=True, pointers_aligned=True, capturing=False)

    @property
    def kinds(self) -> int:
        """The facts of this rank's tensors that an algorithm choice reads and other ranks cannot
        see (:func:`~collectives.algorithms.tuning.choose`, the vector width): bit 0 symmetric,
        bit 1 in place, bit 2 16-byte aligned pointers.  The kernels bring them to the barriers
        with the size (:func:`collectives.device.signals.size_word`): ranks that differ fail the
        call as a size mismatch, where they might have planned different kernels."""
        return int(self.symmetric) | int(self.in_place) << 1 | int(self.pointers_aligned) << 2

    @property
    def signature(self) -> int:
        """:func:`signature` of this call: what its kernels bring to their barriers beside ``n``."""
        return signature(self.collective, self.dtype, self.op, self.kinds)

    @property
    def aligned(self) -> bool:
        """16-byte vectors throughout: aligned tensors whose blocks fill whole vectors."""
        return self.whole_vectors and self.pointers_aligned

    @property
    def vector(self) -> int:
        """The key's ``vector``: 16-byte vectors for aligned data, else one element at a time
        (the peer path: multimem has no single-element form of the 16-bit types)."""
        if not self.whole_vectors:
            return 1
        if self.pointers_aligned:
            return DTYPES[self.dtype].elements(VECTOR_BYTES)
        if self.backend in MULTICAST_PATHS:
            raise CollectiveError(f"the {self.backend} backend needs 16-byte aligned tensors; use backend='peer'")
        return 1


class Algorithm:
    """One collective algorithm (subclasses set the class attributes and write :meth:`plan`
    and :meth:`build`).

    Key choices it takes: ``gathers_out`` (the collectives whose result it may copy to a
    separate output), ``stages_in`` (``"never"``, ``"optional"`` or ``"always"``: copies a
    non-symmetric input in itself), ``drops_end_barrier`` (the collectives whose staged variant
    may skip its end barrier: the caller alternates two buffers), ``whole_vectors_only`` (moves
    16-byte tiles: no ``vector=1``).
    ``backends``: the backends it runs on (every one but where its kernel needs another's
    means: the push all-gather's pipeline signals through the peers' pads).
    ``barriered``: its kernels pass the start (and end) barrier of
    :mod:`~collectives.algorithms.design` (not so a Lamport one).  ``phases``: the error-record
    phase codes its kernel writes beyond the start and end barriers, with their names.  A
    subclass registers itself in :data:`REGISTRY` for each of its ``collectives``."""

    collectives: ClassVar[tuple[str, ...]]
    name: ClassVar[str]
    gathers_out: ClassVar[tuple[str, ...]] = ()
    stages_in: ClassVar[str] = "optional"
    drops_end_barrier: ClassVar[tuple[str, ...]] = ()
    whole_vectors_only: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = BACKENDS
    barriered: ClassVar[bool] = True
    phases: ClassVar[dict[int, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        instance = cls()
        for collective in cls.collectives:
            REGISTRY[collective, cls.name] = instance

    def check(self, key: Any) -> None:
        """Raise ValueError for a kernel key whose choices this algorithm does not take."""
        if key.backend not in self.backends:
            raise ValueError(f"{self.name} {key.collective} runs on the {' and '.join(self.backends)} backend only, "
                             f"not {key.backend!r}")
        if key.gather_out and key.collective not in self.gathers_out:
            raise ValueError("gather_out copies a two-shot or TMA all-reduce's or an all-gather's result out: "
                             "not for this algorithm")
        if self.stages_in == "never" and key.stage_in:
            raise ValueError(f"{self.name} {key.collective} reads its input where it lies: no stage_in")
        if self.stages_in == "always" and not key.stage_in:
            raise ValueError(f"{self.name} {key.collective} always copies its input in itself (stage_in=True)")
        if not key.end_barrier and not (key.collective in self.drops_end_barrier and key.stage_in):
            raise ValueError("only a staged one-shot or a push reduce-scatter may drop its end barrier")
        if self.whole_vectors_only and key.vector == 1:
            raise ValueError(f"{self.name} moves 16-byte tiles: it needs 16-byte aligned data (vector 0)")

    def refusal(self, call: Call) -> str | None:
        """Why ``call`` cannot use this algorithm (None: it can)."""
        # (asked of an algorithm that leaves out a backend only: an all-to-all call names a transport)
        if self.backends != BACKENDS and call.backend not in self.backends:
            return (f"{self.name} {call.collective} runs on the {' and '.join(self.backends)} backend only, not "
                    f"{call.backend!r}: use algorithm='one_shot' or backend={self.backends[0]!r}")
        if self.whole_vectors_only and not call.aligned:
            return (f"{self.name} {call.collective} moves 16-byte tiles: its tensors (and a reduce-scatter's "
                    "output or an all-gather's input size) must be 16-byte aligned; use algorithm='auto'")
        return None

    def plan(self, comm: Runtime, call: Call) -> Any:
        """The prepared launch (:class:`~collectives.algorithms.plan.Plan`) of ``call`` on ``comm``;
        a plan whose launch depends on ``call.capturing`` records it in its ``capture`` (a plan
        hit under the other capture state plans anew: the collective's key does not hold it)."""
        raise NotImplementedError

    def build(self, key: Any) -> Any:
        """The ``@cute.jit`` launcher of ``key``'s kernel."""
        raise NotImplementedError

    def blocks(self, comm: Runtime, key: Any, work: int, limit: int | None = None) -> int:
        """Thread blocks for ``work`` vector accesses per rank: enough to cover them, at most
        :data:`~collectives.config.BLOCKS_PER_SM` per SM, never more than the pad has slots
        for, nor than ``limit`` (a caller sharing the GPU with other kernels; every rank must
        pass the same), nor than this rank's share where ranks share the GPU (``comm.block_cap``,
        :mod:`~collectives.algorithms.residency`)."""
        blocks = min(-(-work // key.threads), config.BLOCKS_PER_SM * comm.sms, comm.layout.max_blocks)
        return capped(comm, key, max(1, min(blocks, limit or blocks)))

    # -- the plan's pieces ----------------------------------------------------------------------

    def launch(self, comm: Runtime, call: Call, key: Any, data: Buffer | list[Buffer], src: int, *,
               work: int | None = None, layout: Layout = COLLECTIVE, results: Buffer | None = None) -> Any:
        """The plan (:func:`collectives.algorithms.plan.prepare`) launching ``key`` on the kernel view(s)
        ``data`` (two: alternated), reading ``src`` (0: the data buffer itself) and writing
        ``call.out``, with a grid for ``work`` vector accesses per rank (default: the call's
        ``n`` elements)."""
        from .plan import prepare

        if work is None:
            work = -(-call.n // key.elements_per_access)
        blocks = self.blocks(comm, key, work, call.max_blocks)
        return prepare(comm, key, layout, data, call.out.data_ptr(), src, call.n, call.signature, blocks, results)

    def staging(self, comm: Runtime, call: Call, key: Any, slot: Slot) -> list[Buffer]:
        """The kernel views of the staging ``key`` copies ``call``'s input into: slots
        ``TURN_0`` and ``TURN_1``, alternated, when the key drops its end barrier (then the
        end-barrier variant, which a CUDA-graph capture of the same call uses, is compiled and
        its buffer ``slot`` allocated now: neither may happen during a capture), else ``slot``."""
        if key.end_barrier:
            return [comm.buffer(comm.staging(call.nbytes, slot))]
        data = [comm.buffer(comm.staging(call.nbytes, turn)) for turn in (Slot.TURN_0, Slot.TURN_1)]
        comm.kernel(replace(key, end_barrier=True))
        comm.buffer(comm.staging(call.nbytes, slot))
        return data

    def __repr__(self) -> str:
        return f"<{self.name} {'/'.join(self.collectives)}>"


def capped(comm: Runtime, key: Any, blocks: int) -> int:
    """``blocks``, at most ``comm``'s co-residency cap of ``key``'s kernel (none where the rank
    has its GPU alone)."""
    cap = comm.block_cap(key)
    return blocks if cap is None else min(blocks, cap)
