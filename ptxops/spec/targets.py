"""Compile targets ptxops knows, and the feature groups the rules refer to."""

from __future__ import annotations

#: Every target the spec covers, in order of introduction.
TARGETS: tuple[str, ...] = ("sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_120a")

#: The target assumed when none is given: the oldest one, so a form legal there is portable.
DEFAULT_TARGET = "sm_90"

#: PTX ISA version written into the header of rendered modules (the newest ptxas 13.0 reads).
PTX_VERSION = "9.0"

#: The ptxas releases whose verdicts the spec records (its rules' ``ptxas_enforced`` and
#: ``isa_allows`` flags, and their per-release records, :class:`~ptxops.spec.engine.PtxasRecord`):
#: CUDA 13.0's, and 13.5's, the ``ptxas`` extra's (``nvidia-cuda-nvcc==13.5.37``).  The oracle
#: tests judge each against the spec's record of it, and skip with an assembler of another release.
PTXAS_RELEASES = ("13.0", "13.5")

#: Targets with the fp8 (e4m3/e5m2) multimem forms and ``.acc::f16``: the PTX ISA lists
#: sm_100a, sm_101a/110a, sm_120a, sm_121a and the sm_100f/sm_110f families.
FP8_MULTIMEM = ("sm_100a", "sm_100f", "sm_103a", "sm_120a")

#: Targets with 256-bit ``ld``/``st`` (``.v8`` of 32-bit types, ``.v4`` of 64-bit types).
#: The PTX ISA: "require sm_100 or higher".
WIDE_LDST = ("sm_100a", "sm_100f", "sm_103a", "sm_120a")

#: Targets with the ``.release`` semantics and ``.global`` state space of ``st.async`` and
#: ``red.async`` (PTX ISA 8.7): the PTX ISA says "require sm_100 or higher".
ASYNC_RELEASE = ("sm_100a", "sm_100f", "sm_103a", "sm_120a")


def normalise_target(arch: str) -> str:
    """``"sm_90a"`` from ``"sm_90a"``, ``"90a"`` or ``"SM_90A"``; unknown targets pass through."""
    a = arch.strip().lower()
    return a if a.startswith("sm_") else f"sm_{a}"


#: The Hopper targets.
SM90 = ("sm_90", "sm_90a")

#: Targets of sm_100 or later (every target but sm_90 and sm_90a), for instructions the PTX
#: ISA introduces with "requires sm_100 or higher" (``st.bulk``, ``clusterlaunchcontrol``).
SM100_ON = ("sm_100a", "sm_100f", "sm_103a", "sm_120a")

#: The sm_100 family proper (sm_120a is not in it): CTA pairs (``.cta_group``) and the TMA modes
#: the ptxas of CUDA 13.0 and 13.5 allow there only (``.tile::scatter4``, ``.im2col::w::128``,
#: gather4 and im2col::w into ``.shared::cluster``, the tensor prefetch's new modes).  The PTX
#: ISA lists sm_100a, sm_101a/sm_110a, sm_103a and the sm_100f/sm_110f families.
SM100_FAMILY = ("sm_100a", "sm_100f", "sm_103a")
