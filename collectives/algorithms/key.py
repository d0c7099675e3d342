"""What a compiled collective kernel is specialised on: :class:`KernelKey`.

A kernel is compiled once per key; everything else (addresses, element counts, rank, timeout)
is a runtime argument (:mod:`collectives.device.launch`), so one compile serves every tensor of a
shape class.  The key checks what holds for every algorithm here and asks its algorithm
(:data:`~collectives.algorithms.base.REGISTRY`) for the rest.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .. import config
from ..config import BACKENDS, COLLECTIVES, MAX_WORLD, OPS, TMA_SMEM_BYTES, TMA_STAGES, VECTOR_BYTES
from ..dtypes import dtype
from ..layouts import COLLECTIVE
from .base import REGISTRY, Algorithm, algorithms
from .family import Family, register
from .rules import key_backend_refusal
from .tuning import default_unroll


@dataclass(frozen=True)
class KernelKey:
    """The compile-time choices of one collective kernel.

    ``vector`` is the elements each thread moves at once (16 bytes' worth, or 1 for data that
    is not 16-byte aligned); ``gather_out`` makes the kernel copy the result from the
    symmetric buffer to a separate output (two-shot and TMA all-reduce, all-gather);
    ``stage_in`` makes the kernel copy a non-symmetric input into this rank's symmetric buffer
    before the start barrier (instead of a separate copy); ``end_barrier=False`` drops the end
    barrier of a one-shot collective whose symmetric buffers the caller alternates between two
    (a rank cannot reuse a buffer before every rank has started the next collective, and so
    finished reading it).  ``pdl`` launches the kernel with programmatic stream serialization
    (it may start while the kernel before it drains) and makes it wait
    (``griddepcontrol.wait``) before its first global access, then let a kernel launched after
    it so start (``griddepcontrol.launch_dependents``); default :data:`~collectives.config.PDL`.
    ``unroll``: the vectors a thread of a 16-byte register-path loop has in flight (a reduction
    ``unroll`` vectors of every rank, a copy ``unroll // 2``, at least one); default
    :data:`~collectives.config.UNROLL` where set, else :data:`~collectives.config.DEFAULT_UNROLL`
    (:func:`~collectives.algorithms.tuning.default_unroll`).
    Which choices an algorithm takes is its own (:meth:`Algorithm.check`).
    """

    collective: str
    algorithm: str
    backend: str
    dtype: str
    world: int
    op: str = "sum"
    vector: int = 0
    threads: int = 512
    gather_out: bool = False
    stage_in: bool = False
    end_barrier: bool = True
    pdl: bool = field(default_factory=lambda: config.PDL)
    unroll: int = field(default_factory=default_unroll)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {COLLECTIVES}, not {self.collective!r}")
        names = algorithms(self.collective)
        if self.algorithm not in names:
            raise ValueError(f"{self.collective} algorithms: {names}, not {self.algorithm!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {self.backend!r}")
        dtype(self.dtype)  # ValueError naming the registered dtypes
        if not 2 <= self.world <= MAX_WORLD:
            raise ValueError(f"world size must be 2..{MAX_WORLD}, not {self.world}")
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {self.op!r}")
        refusal = key_backend_refusal(self.collective, self.backend, self.dtype, self.op)
        if refusal is not None:
            raise ValueError(refusal)
        if self.unroll not in (1, 2, 4, 8):
            raise ValueError(f"unroll must be 1, 2, 4 or 8, not {self.unroll!r}")
        if self.vector not in (0, 1, self.full_vector):
            raise ValueError(f"vector must be 1 or {self.full_vector} for {self.dtype}")
        self.impl.check(self)

    @property
    def impl(self) -> Algorithm:
        """The algorithm that builds this kernel."""
        return REGISTRY[self.collective, self.algorithm]

    @property
    def full_vector(self) -> int:
        return dtype(self.dtype).elements(VECTOR_BYTES)

    @property
    def elements_per_access(self) -> int:
        return self.vector or self.full_vector

    @property
    def barriers(self) -> int:
        """Cross-GPU barriers the kernel passes (start and end, one, or none)."""
        if not self.impl.barriered:
            return 0
        return 1 if self.collective == "barrier" or not self.end_barrier else 2

    @property
    def element_bytes(self) -> int:
        return dtype(self.dtype).bytes

    @property
    def tile_bytes(self) -> int:
        """Bytes per rank of one TMA tile: the largest power of two (at most 32 KB) for which
        every stage's ``world`` input tiles plus two output tiles fit
        :data:`~collectives.config.TMA_SMEM_BYTES`."""
        tile = 32 << 10
        while tile > 1024 and tile * (TMA_STAGES * self.world + 2) > TMA_SMEM_BYTES:
            tile //= 2
        return tile



# -- the collective family (collectives.algorithms.family): key ids and the gates' keys ----------
#
# An id: ``collective/algorithm/backend/dtype/w<world>/<op>/v<vector>/t<threads>/g<gather_out>s<stage_in>e<end_barrier>``,
# then ``/u<unroll>`` for a key whose unroll is not :func:`~.tuning.default_unroll` (a bench variant's, the tuned
# push all-reduce's: :func:`~collectives.algorithms.tuning.push_unroll`).


def collective_id(collective: str, algorithm: str, backend: str, dtype: str, world: int, op: str = "sum",
                  vector: int = 0, threads: int = 512, gather_out: bool = False, stage_in: bool = False,
                  end_barrier: bool = True) -> str:
    """The id of a collective kernel key of these fields (the key itself may be refused)."""
    return (f"{collective}/{algorithm}/{backend}/{dtype}/w{world}/{op}/v{vector}/t{threads}/"
            f"g{int(gather_out)}s{int(stage_in)}e{int(end_barrier)}")


def _to_text(key: KernelKey) -> str:
    kid = collective_id(key.collective, key.algorithm, key.backend, key.dtype, key.world, key.op, key.vector,
                        key.threads, key.gather_out, key.stage_in, key.end_barrier)
    return kid if key.unroll == default_unroll() else f"{kid}/u{key.unroll}"


def fields(kid: str) -> dict:
    """The fields of a collective key id, by name (``unroll`` only where the id names one)."""
    collective, algorithm, backend, dtype, world, op, vector, threads, flags, *unroll = kid.split("/")
    named = dict(collective=collective, algorithm=algorithm, backend=backend, dtype=dtype, world=int(world[1:]),
                 op=op, vector=int(vector[1:]), threads=int(threads[1:]), gather_out=flags[1] == "1",
                 stage_in=flags[3] == "1", end_barrier=flags[5] == "1")
    return {**named, "unroll": int(unroll[0][1:])} if unroll else named


def _from_text(kid: str) -> KernelKey:
    return KernelKey(**fields(kid))


def _legal(kid: str) -> bool:
    try:
        _from_text(kid)
    except ValueError:
        return False
    return True


def _snapshot() -> list[str]:
    """Every key ``python -m collectives ptx`` builds (collective x algorithm x backend x dtype x
    world 2/4/8, sum, aligned), at world 4 every variant the API builds (staging, gather,
    end barrier, unaligned, min/max, the Lamport's 256 threads) for bf16, f32 and e4m3, and the push
    all-reduce unrolled 4 that :func:`~collectives.algorithms.tuning.push_unroll` picks at world 4."""
    from ..dtypes import DTYPES
    from .family import SNAPSHOT_WORLDS

    ids: list[str] = []
    for collective in COLLECTIVES:
        for algorithm, backend in itertools.product(algorithms(collective), BACKENDS):
            threads = 32 if collective == "barrier" else 512
            for dtype, world in itertools.product(("bf16",) if collective == "barrier" else DTYPES, SNAPSHOT_WORLDS):
                kid = collective_id(collective, algorithm, backend, dtype, world, threads=threads,
                                    stage_in=algorithm == "push")
                if _legal(kid):  # (the push all-gather: peer backend only)
                    ids.append(kid)
            if collective == "barrier":
                continue
            variants = itertools.chain(
                itertools.product(("bf16", "f32"), ("sum",), (0, 1), (False, True), (False, True), (False, True),
                                  (512, 256) if algorithm == "lamport" else (512,)),
                itertools.product(("bf16", "f32", "e4m3"), ("min", "max"), (0, 1), (False,),
                                  (algorithm == "push",), (True,), (512,)))
            for dtype, op, vector, g, s, e, t in variants:
                kid = collective_id(collective, algorithm, backend, dtype, 4, op, vector, t, g, s, e)
                if kid not in ids and _legal(kid):
                    ids.append(kid)
    # the push all-reduce unrolled 4, as tuning.push_unroll makes it at world 4 (peer), for every
    # dtype, op and vector width the API sends it
    for dtype, op, vector in itertools.chain(itertools.product(DTYPES, ("sum",), (0, 1)),
                                             itertools.product(("bf16", "f32", "e4m3"), ("min", "max"), (0, 1))):
        kid = collective_id("all_reduce", "push", "peer", dtype, 4, op, vector, stage_in=True) + "/u4"
        if _legal(kid):
            ids.append(kid)
    return ids


def _facets(kid: str) -> tuple[tuple, ...]:
    f = fields(kid)
    return ((f["collective"], f["algorithm"], f["backend"]),
            (f["collective"], f["algorithm"], f["gather_out"], f["stage_in"], f["end_barrier"], f["vector"],
             f["threads"]),
            (f["world"], f["algorithm"]), (f["dtype"], f["op"], f["collective"]))


COLLECTIVE_FAMILY = register(Family(
    "collective", KernelKey, COLLECTIVES, COLLECTIVE, lambda key: key.impl.build(key), _snapshot, _to_text,
    _from_text, _facets))


__all__ = ["COLLECTIVE_FAMILY", "KernelKey", "collective_id", "fields"]
