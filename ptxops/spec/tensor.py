"""``cp.async.bulk.tensor``, ``cp.reduce.async.bulk.tensor`` and
``cp.async.bulk.prefetch.tensor``: tensor copies, reductions and L2 prefetches by the Tensor
Memory Accelerator (TMA), addressed through a tensor map.

PTX ISA 9.0, Data Movement and Conversion Instructions: cp.async.bulk.tensor,
cp.reduce.async.bulk.tensor and cp.async.bulk.prefetch.tensor.  The tensor operand
``[tensorMap, tensorCoords]`` names a tensor map (a 128-byte ``CUtensorMap`` in global,
constant or parameter memory, addressed generically) and one signed 32-bit coordinate per
dimension (``.1d`` .. ``.5d``); the map holds the tensor's shape, strides, element type, box
size and swizzle.  ``.tile`` (the default load mode) moves one box; ``.im2col`` loads the box
that im2col offsets (one 16-bit value per spatial dimension: dimensions less two) select, and
a store or reduction in ``.im2col_no_offs`` writes one back.  A load completes on an mbarrier
(``.mbarrier::complete_tx::bytes``), optionally into the same shared-memory offset of every
CTA of a 16-bit ``ctaMask`` (``.multicast::cluster``); a store or reduction completes in the
bulk async-group.  ``.L2::cache_hint`` adds a 64-bit cache-policy operand.

The element type of a tensor reduction is the tensor map's, not the instruction's: which
types each redOp takes is a rule on the map at run time (the PTX ISA's table), which neither
ptxas nor ptxops can check.
Not wrapped: the sm_100 additions (``.cta_group``, ``.tile::gather4``, ``.tile::scatter4``,
``.im2col::w``, ``.im2col::w::128``).
"""

from __future__ import annotations

from .bulk import MBARRIER, REDUCE_OPS
from .engine import Family, Qualifier, implied, rule

SECTION = "Data Movement and Conversion Instructions: {} (PTX ISA 9.0)"
DIMS = ("1d", "2d", "3d", "4d", "5d")
SHARED = ("shared::cta", "shared::cluster")
#: Load modes that need at least three dimensions (the ptxas message names each).
IM2COL = ("im2col", "im2col_no_offs")

_DIM = Qualifier("dim", DIMS, "tensor rank: the number of coordinates (and of the map's dimensions)")
_CACHE_HINT = Qualifier(
    "cache_hint", (None, "cache_hint"),
    "L2 cache hint: adds a 64-bit cache-policy operand (createpolicy)", prefix=".L2::",
)


def _load_mode(modes: tuple[str, ...]) -> Qualifier:
    return Qualifier(
        "load_mode", (None, "tile", *modes),
        "how coordinates select the box: tile (absent: tile) or im2col", absent="tile",
    )


def _im2col_rank(family: str) -> object:
    return rule(
        "im2col-3d-or-more",
        "The im2col modes need a tensor of 3 to 5 dimensions (ptxas: \"Modifier '.2d' "
        f"cannot be combined with modifier '.im2col'\" for {family}).",
        when={"load_mode": IM2COL},
        allow={"dim": DIMS[2:]},
    )


CP_ASYNC_BULK_TENSOR = Family(
    name="cp.async.bulk.tensor",
    summary="Copy a box of a tensor described by a tensor map between global and shared memory "
    "asynchronously (TMA), optionally to every CTA of a cluster mask.",
    qualifiers=(
        _DIM,
        Qualifier("dst", ("shared::cta", "shared::cluster", "global"), "state space of the destination"),
        Qualifier("src", ("global", "shared::cta"), "state space of the source"),
        _load_mode(IM2COL),
        Qualifier(
            "completion", (MBARRIER, "bulk_group"),
            "completion mechanism: the mbarrier's transaction count (loads into shared memory) "
            "or the bulk async-group (stores to global memory)",
        ),
        Qualifier(
            "multicast", (None, "multicast::cluster"),
            "copy into every CTA of the 16-bit ctaMask operand (same shared-memory offset, each "
            "CTA's mbarrier at the same offset)",
        ),
        _CACHE_HINT,
    ),
    rules=(
        rule(
            "global-source-to-shared",
            "A tensor load from .global goes to .shared::cta or .shared::cluster (ptxas: "
            "\"State space incorrect for instruction 'cp.async.bulk.tensor'\").",
            when={"src": "global"},
            allow={"dst": SHARED},
        ),
        rule(
            "shared-source-to-global",
            "A tensor store from .shared::cta goes to .global (ptxas: \"State space incorrect "
            "for instruction 'cp.async.bulk.tensor'\").",
            when={"src": "shared::cta"},
            allow={"dst": "global"},
        ),
        rule(
            "shared-destination-completes-on-mbarrier",
            "A tensor load into shared memory completes on an mbarrier: "
            ".mbarrier::complete_tx::bytes.",
            when={"dst": SHARED},
            allow={"completion": MBARRIER},
        ),
        rule(
            "global-destination-bulk-group",
            "A tensor store to .global completes in a bulk async-group: .bulk_group.",
            when={"dst": "global"},
            allow={"completion": "bulk_group"},
        ),
        rule(
            "multicast-into-cluster",
            "Only a load into .shared::cluster may be .multicast::cluster (ptxas: \"Illegal "
            "modifier '.multicast::cluster'\").",
            when={"multicast": "multicast::cluster"},
            allow={"dst": "shared::cluster"},
        ),
        rule(
            "im2col-loads",
            "A load (from .global) takes .tile or .im2col; a store (to .global) takes .tile or "
            ".im2col_no_offs (ptxas: \"Illegal modifier '.im2col' for instruction "
            "'cp.async.bulk.tensor'\").",
            when={"src": "global"},
            allow={"load_mode": (None, "tile", "im2col")},
        ),
        rule(
            "im2col-no-offs-stores",
            "A store (to .global) takes .tile or .im2col_no_offs, never .im2col.",
            when={"dst": "global"},
            allow={"load_mode": (None, "tile", "im2col_no_offs")},
        ),
        _im2col_rank("cp.async.bulk.tensor"),
    ),
    operands=(
        "dst", "tmap", "coords", "mbar", "im2col?load_mode=im2col", "mask?multicast",
        "policy?cache_hint",
    ),
    operand_variants={"completion=bulk_group": ("tmap", "coords", "src", "policy?cache_hint")},
    device_function="cp_async_bulk_tensor",
    section=SECTION.format("cp.async.bulk.tensor"),
)

CP_REDUCE_ASYNC_BULK_TENSOR = Family(
    name="cp.reduce.async.bulk.tensor",
    summary="Reduce a box of this CTA's shared memory element-wise into a tensor described by "
    "a tensor map in global memory, asynchronously (TMA).",
    qualifiers=(
        _DIM,
        implied("dst", "global", "state space of the destination: the tensor in global memory", by={}),
        implied("src", "shared::cta", "state space of the source: this CTA's shared memory", by={}),
        Qualifier("op", REDUCE_OPS, "reduction applied to each element (of the map's element type)"),
        _load_mode(("im2col_no_offs",)),
        implied("completion", "bulk_group", "completion mechanism: the bulk async-group", by={}),
        _CACHE_HINT,
    ),
    rules=(_im2col_rank("cp.reduce.async.bulk.tensor"),),
    operands=("tmap", "coords", "src", "policy?cache_hint"),
    device_function="cp_reduce_async_bulk_tensor",
    section=SECTION.format("cp.reduce.async.bulk.tensor"),
)

CP_ASYNC_BULK_PREFETCH_TENSOR = Family(
    name="cp.async.bulk.prefetch.tensor",
    summary="Prefetch a box of a tensor described by a tensor map from global memory into the "
    "L2 cache, asynchronously (TMA); no completion to wait for.",
    qualifiers=(
        _DIM,
        implied("level", "L2", "the cache prefetched into: L2", by={}),
        implied("src", "global", "state space of the source tensor", by={}),
        _load_mode(("im2col",)),
        _CACHE_HINT,
    ),
    rules=(_im2col_rank("cp.async.bulk.prefetch.tensor"),),
    operands=("tmap", "coords", "im2col?load_mode=im2col", "policy?cache_hint"),
    device_function="cp_async_bulk_prefetch_tensor",
    section=SECTION.format("cp.async.bulk.prefetch.tensor"),
)

FAMILIES = (CP_ASYNC_BULK_TENSOR, CP_REDUCE_ASYNC_BULK_TENSOR, CP_ASYNC_BULK_PREFETCH_TENSOR)
__all__ = [
    "CP_ASYNC_BULK_PREFETCH_TENSOR", "CP_ASYNC_BULK_TENSOR", "CP_REDUCE_ASYNC_BULK_TENSOR",
    "FAMILIES",
]
