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

The sm_100 additions (PTX ISA 8.6): ``.tile::gather4`` loads (and ``.tile::scatter4`` stores or
reduces) four rows of a 2-D tensor at once, named by five coordinates (the column, then the
four rows); ``.im2col::w`` and ``.im2col::w::128`` load an im2col box along W, with two 16-bit
values (``wHalo``, ``wOffset``) instead of the im2col offsets; ``.cta_group::1`` /
``.cta_group::2`` let a load signal the mbarrier of either CTA of a CTA pair.  ptxas (CUDA 13.0
and 13.5 agree) takes them on the sm_100 family, and gather4 and im2col::w into ``.shared::cta``
on sm_120a too.

The element type of a tensor reduction is the tensor map's, not the instruction's: which
types each redOp takes is a rule on the map at run time (the PTX ISA's table), which neither
ptxas nor ptxops can check.
"""

from __future__ import annotations

from .bulk import MBARRIER, REDUCE_OPS
from .engine import Family, Qualifier, Rule, implied, rule
from .targets import SM100_FAMILY, SM100_ON

SECTION = "Data Movement and Conversion Instructions: {} (PTX ISA 9.0)"
DIMS = ("1d", "2d", "3d", "4d", "5d")
SHARED = ("shared::cta", "shared::cluster")
#: Load modes that need at least three dimensions (the ptxas message names each).
IM2COL = ("im2col", "im2col_no_offs", "im2col::w", "im2col::w::128")
#: Load modes of four rows of a 2-D tensor, named by five coordinates (the ``gather`` operand).
ROWS = ("tile::gather4", "tile::scatter4")
#: Load modes whose im2col information is ``{wHalo, wOffset}`` (the ``wide`` operand).
WIDE = ("im2col::w", "im2col::w::128")
#: The modes sm_120a has too (into ``.shared::cta``); the other sm_100 modes are the family's.
SM120_MODES = ("tile::gather4", "im2col::w")
CTA_GROUPS = ("cta_group::1", "cta_group::2")

_DIM = Qualifier("dim", DIMS, "tensor rank: the number of coordinates (and of the map's dimensions)")
_CACHE_HINT = Qualifier(
    "cache_hint", (None, "cache_hint"),
    "L2 cache hint: adds a 64-bit cache-policy operand (createpolicy)", prefix=".L2::",
)


def _load_mode(modes: tuple[str, ...]) -> Qualifier:
    return Qualifier(
        "load_mode", (None, "tile", *modes),
        "how coordinates select the box: tile (absent: tile), four rows (tile::gather4, "
        "tile::scatter4) or im2col", absent="tile",
    )


def _im2col_rank(family: str) -> Rule:
    return rule(
        "im2col-3d-or-more",
        "The im2col modes need a tensor of 3 to 5 dimensions (ptxas: \"Modifier '.2d' "
        f"cannot be combined with modifier '.im2col'\" for {family}).",
        when={"load_mode": IM2COL},
        allow={"dim": DIMS[2:]},
    )


def _sm100_modes(family: str, modes: tuple[str, ...], *, sm120: tuple[str, ...] = ()) -> tuple[Rule, ...]:
    """gather4/scatter4 take a 2-D tensor; the sm_100 modes need the sm_100 family, those in
    ``sm120`` sm_100 or later."""
    rows = tuple(m for m in modes if m in ROWS)
    family_only = tuple(m for m in modes if m not in sm120)
    return (
        *([rule(
            "rows-2d",
            f".tile::gather4 and .tile::scatter4 move four rows of a 2-D tensor: .2d only, with "
            f"five coordinates (ptxas: \"Modifier '.3d' cannot be combined with modifier "
            f"'.tile::gather4'\" for {family}).",
            when={"load_mode": rows},
            allow={"dim": "2d"},
        )] if rows else []),
        *([rule(
            "sm100-modes-target",
            f"{', '.join('.' + m for m in sm120)} need sm_100 or later (PTX ISA 8.6; ptxas: "
            "\"Feature ... requires .target sm_100 or higher\").",
            when={"load_mode": sm120},
            allow={"target": SM100_ON},
        )] if sm120 else []),
        rule(
            "sm100-family-modes",
            f"{', '.join('.' + m for m in family_only)} need the sm_100 family: sm_100a, sm_100f "
            f"or sm_103a (ptxas: \"Feature '.{family_only[0]}' not supported on .target "
            "'sm_120a'\").",
            when={"load_mode": family_only},
            allow={"target": SM100_FAMILY},
        ),
    )


CP_ASYNC_BULK_TENSOR = Family(
    name="cp.async.bulk.tensor",
    summary="Copy a box of a tensor described by a tensor map between global and shared memory "
    "asynchronously (TMA), optionally to every CTA of a cluster mask.",
    qualifiers=(
        _DIM,
        Qualifier("dst", ("shared::cta", "shared::cluster", "global"), "state space of the destination"),
        Qualifier("src", ("global", "shared::cta"), "state space of the source"),
        _load_mode(("tile::gather4", "tile::scatter4", "im2col", "im2col::w", "im2col::w::128", "im2col_no_offs")),
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
        Qualifier(
            "cta_group", (None, *CTA_GROUPS),
            "a load's CTA group: with ::2 the mbarrier may be in either CTA of the CTA pair "
            "(sm_100 family)",
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
            "A load (from .global) takes .tile, .tile::gather4, .im2col, .im2col::w or "
            ".im2col::w::128 (ptxas: \"Illegal modifier '.tile::scatter4' for instruction "
            "'cp.async.bulk.tensor'\").",
            when={"src": "global"},
            allow={"load_mode": (None, "tile", "tile::gather4", "im2col", *WIDE)},
        ),
        rule(
            "im2col-no-offs-stores",
            "A store (to .global) takes .tile, .tile::scatter4 or .im2col_no_offs (ptxas: "
            "\"Illegal modifier '.im2col' for instruction 'cp.async.bulk.tensor'\").",
            when={"dst": "global"},
            allow={"load_mode": (None, "tile", "tile::scatter4", "im2col_no_offs")},
        ),
        _im2col_rank("cp.async.bulk.tensor"),
        *_sm100_modes(
            "cp.async.bulk.tensor", ("tile::gather4", "tile::scatter4", *WIDE), sm120=SM120_MODES,
        ),
        rule(
            "sm120-modes-shared-cta",
            "On sm_120a, .tile::gather4 and .im2col::w load into .shared::cta only (ptxas: "
            "\"Feature '.tile::gather4 with destination state space as .shared::cluster' "
            "requires ...\"); the sm_100 family also loads them into .shared::cluster.",
            when={"load_mode": SM120_MODES, "dst": "shared::cluster"},
            allow={"target": SM100_FAMILY},
        ),
        rule(
            "cta-group-loads",
            "Only a load (into shared memory) takes .cta_group (ptxas: \"Arguments mismatch for "
            "instruction 'cp.async.bulk.tensor'\" for a store).",
            when={"dst": "global"},
            allow={"cta_group": None},
        ),
        rule(
            "cta-group-target",
            ".cta_group::1 and .cta_group::2 need the sm_100 family: sm_100a, sm_100f or sm_103a "
            "(ptxas: \"Feature '.cta_group::1' not supported on .target 'sm_120a'\").",
            when={"cta_group": CTA_GROUPS},
            allow={"target": SM100_FAMILY},
        ),
    ),
    operands=(
        "dst", "tmap", "coords", "mbar", "im2col?load_mode=im2col", "wide?load_mode=im2col::w",
        "wide?load_mode=im2col::w::128", "mask?multicast", "policy?cache_hint",
    ),
    operand_variants={
        "completion=bulk_group,load_mode=tile::scatter4": ("tmap", "gather", "src", "policy?cache_hint"),
        "completion=bulk_group": ("tmap", "coords", "src", "policy?cache_hint"),
        "load_mode=tile::gather4": ("dst", "tmap", "gather", "mbar", "mask?multicast", "policy?cache_hint"),
    },
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
        _load_mode(("tile::scatter4", "im2col_no_offs")),
        implied("completion", "bulk_group", "completion mechanism: the bulk async-group", by={}),
        _CACHE_HINT,
    ),
    rules=(
        _im2col_rank("cp.reduce.async.bulk.tensor"),
        *_sm100_modes("cp.reduce.async.bulk.tensor", ("tile::scatter4",)),
    ),
    operands=("tmap", "coords", "src", "policy?cache_hint"),
    operand_variants={"load_mode=tile::scatter4": ("tmap", "gather", "src", "policy?cache_hint")},
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
        _load_mode(("tile::gather4", "im2col", *WIDE)),
        _CACHE_HINT,
    ),
    rules=(
        _im2col_rank("cp.async.bulk.prefetch.tensor"),
        *_sm100_modes("cp.async.bulk.prefetch.tensor", ("tile::gather4", *WIDE)),
    ),
    operands=(
        "tmap", "coords", "im2col?load_mode=im2col", "wide?load_mode=im2col::w",
        "wide?load_mode=im2col::w::128", "policy?cache_hint",
    ),
    operand_variants={"load_mode=tile::gather4": ("tmap", "gather", "policy?cache_hint")},
    device_function="cp_async_bulk_prefetch_tensor",
    section=SECTION.format("cp.async.bulk.prefetch.tensor"),
)

FAMILIES = (CP_ASYNC_BULK_TENSOR, CP_REDUCE_ASYNC_BULK_TENSOR, CP_ASYNC_BULK_PREFETCH_TENSOR)
__all__ = [
    "CP_ASYNC_BULK_PREFETCH_TENSOR", "CP_ASYNC_BULK_TENSOR", "CP_REDUCE_ASYNC_BULK_TENSOR",
    "CTA_GROUPS", "FAMILIES", "ROWS", "WIDE",
]
