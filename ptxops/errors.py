"""Exceptions raised, and warnings issued, by ptxops."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class QualifierError(ValueError):
    """An instruction form that the PTX ISA (or ptxas) does not allow.

    Raised by :func:`ptxops.spec.instruction` and, at trace time, by every device function.
    The message names the family, the offending qualifiers, the rule broken, the legal
    alternatives in that context and the compile target.  The same facts are attributes:
    """

    def __init__(
        self,
        family: str,
        message: str,
        *,
        offending: Mapping[str, object] | None = None,
        rule: str | None = None,
        legal: Mapping[str, Sequence[object]] | None = None,
        target: str | None = None,
    ) -> None:
        self.family = family
        self.offending = dict(offending or {})
        self.rule = rule
        self.legal = {k: list(v) for k, v in (legal or {}).items()}
        self.target = target
        super().__init__(message)


class CuTeDSLMissing(ModuleNotFoundError):
    """The device functions need CuTeDSL (the ``cutlass`` package), which cannot be imported.

    Raised when a device function (``ptxops.multimem_ld_reduce``, ...) is first used; the spec
    and ``python -m ptxops`` work without CuTeDSL.
    """

    INSTALL = "pip install 'ptxops[dsl]'"

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"ptxops's device functions need CuTeDSL, and {missing!r} cannot be imported: "
            f"{self.INSTALL} (NVIDIA's nvidia-cutlass-dsl).  ptxops.spec and "
            "`python -m ptxops` work without it.",
            name=missing,
        )


class NvshmemMissing(ModuleNotFoundError):
    """:mod:`ptxops.nvshmem` needs nvshmem4py (its ``nvshmem.bindings.device.cute``), which
    cannot be imported.  The rest of ptxops works without it."""

    INSTALL = "pip install nvshmem4py-cu13 nvidia-nvshmem-cu13"

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"ptxops.nvshmem needs nvshmem4py, and {missing!r} cannot be imported: {self.INSTALL} "
            "(nvshmem4py-cu12 nvidia-nvshmem-cu12 on CUDA 12).",
            name=missing,
        )


class DefaultTargetWarning(UserWarning):
    """A kernel is compiled for CuTeDSL's default target because nothing chose one: neither a
    ``cute.GPUArch`` compile option nor ``CUTE_DSL_ARCH`` was given, and no GPU is visible.
    Issued once per process, by the first device function traced."""

    def __init__(self, target: str) -> None:
        super().__init__(
            f"ptxops: compiling for {target}: CUTE_DSL_ARCH is not set and no GPU is visible, so "
            f"CuTeDSL compiles for its default; set CUTE_DSL_ARCH (e.g. sm_90a for Hopper) to choose."
        )


class ScopeError(QualifierError):
    """Legal PTX whose scope is narrower than the memory it orders is observed from: a release
    store at ``.gpu`` scope to a flag another GPU polls (the rules: :mod:`ptxops.spec.reach`).

    Besides :class:`QualifierError`'s attributes, ``reach`` names the pointer's reach
    (``"peer"``, ...) and ``origin`` where it got it (who tagged it, and the call site).
    """

    def __init__(self, family: str, message: str, *, reach: str, origin: str, **kwargs: object) -> None:
        self.reach = reach
        self.origin = origin
        super().__init__(family, message, **kwargs)  # type: ignore[arg-type]
