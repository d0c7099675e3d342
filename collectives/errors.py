"""Exceptions raised by the ``collectives`` host layer and kernels."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CollectiveError",
    "CollectiveTimeout",
    "MissingDependency",
    "MulticastUnavailable",
    "SymmetricMemoryError",
]


class CollectiveError(RuntimeError):
    """Base class of every error raised by ``collectives``."""


class CollectiveTimeout(CollectiveError):
    """A barrier or collective did not complete in time.

    Attributes:
        what: which barrier/collective timed out (e.g. ``"barrier"``, ``"all_reduce"``).
        missing_ranks: ranks that had not arrived when the wait gave up.
        timeout_s: the bound that was exceeded, in seconds.
    """

    def __init__(self, what: str, missing_ranks: Iterable[int], timeout_s: float,
                 detail: str | None = None) -> None:
        self.what = what
        self.missing_ranks: tuple[int, ...] = tuple(sorted(int(r) for r in missing_ranks))
        self.timeout_s = float(timeout_s)
        self.detail = detail
        msg = (f"{what} timed out after {self.timeout_s:g}s; "
               f"missing ranks: {list(self.missing_ranks) or 'unknown'}")
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class MulticastUnavailable(CollectiveError):
    """NVLink multicast (NVLS) cannot be used; ``reason`` says why.

    Typical reasons: an environment variable disables it (``NVSHMEM_DISABLE_NVLS``,
    ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST``), the device reports
    ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=0``, or the world is not a full NVLink mesh.
    """

    def __init__(self, reason: str | None) -> None:
        self.reason = reason or "multicast unavailable (no reason recorded)"
        super().__init__(f"NVLink multicast unavailable: {self.reason}")


class SymmetricMemoryError(CollectiveError):
    """Misuse of symmetric memory: a tensor not from the heap, sizes that differ across
    ranks, a misaligned pointer, use after ``close()``..."""


class MissingDependency(CollectiveError, ModuleNotFoundError):
    """A feature of ``collectives`` needs a package that cannot be imported; the message names
    the ptxops extra that installs it (also an ``ImportError``, with the package as ``name``)."""

    #: Each package the features import on first use -> (what it is, the extra that installs it).
    EXTRAS = {
        "torch": ("PyTorch", "pip install 'ptxops[torch]' (a CPU build for the host tests: the README's "
                  "'ptxops[torch-cpu]' command; a GPU stack: 'ptxops[cu13]' or 'ptxops[cu12]')"),
        "cutlass": ("CuTeDSL", "pip install 'ptxops[dsl]'"),
    }

    def __init__(self, feature: str, missing: str) -> None:
        what, install = self.EXTRAS[missing]
        ModuleNotFoundError.__init__(
            self, f"{feature} needs {what}, and {missing!r} cannot be imported: {install}", name=missing)
