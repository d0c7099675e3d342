"""Co-residency: how many thread blocks each rank may launch when several ranks share one GPU.

Every collective kernel has blocks that spin until the same block of every other rank arrives
(barriers, Lamport polls, push rounds).  With one rank per GPU the partner blocks run on other
GPUs; with ``W`` ranks on one GPU (the one-GPU world, :mod:`collectives.testing`) two things
must hold at once:

* every rank's grid is resident together, or the resident blocks wait for partners that never
  get an SM until their deadline passes;
* some SMs hold no spinning block, for whatever else a rank launches before its collective (the
  kernel that makes its input, a GEMM).  Measured on an H100 with 4 ranks: while the other
  three ranks' grids spun on all 132 SMs (3 x 44 blocks or more, about 3 of some 6 that fit an
  SM), a one-thread kernel of the fourth rank (``torch.cuda._sleep``), or the elementwise
  kernels making its input, did not start until their deadline passed; with 3 x 32 blocks it
  started at once.  Which kernels may join an SM where ours run is not ours to know (torch's
  ``fill_`` could join Lamport's blocks but not one_shot's, ``_sleep`` neither; an SM's
  shared-memory configuration is the likely reason), so a rank's other kernels must find SMs with no spinning block at all.

So each spinning block is counted as an SM of its own, and :func:`free_sms` SMs stay out of
the ranks' budget::

    share = (sms - free_sms) // (W * footprint)

where ``footprint`` is 2 for a kernel launched with programmatic dependent launch (its
successor's blocks may become resident while it still runs) and 1 otherwise.  Then, however the
GPU places blocks, every block finds an SM without a foreign one, and ``free_sms`` SMs stay
empty.  Every algorithm caps its grid at the share (Lamport runs its fixed parts on fewer
blocks); a world where not even one block per rank fits raises :class:`CoResidencyError`, and
so does a kernel whose block does not fit an SM at all: ``per_sm``, what the CUDA driver
computes for the kernel's cubin (``cuOccupancyMaxActiveBlocksPerMultiprocessor``) or, where it
cannot, CUDA's occupancy rules (:func:`blocks_per_sm`) from the registers ``ptxas`` reports
(:func:`kernel_registers`; where that is not at hand, the most a block of its size may take)
and a bound of its shared memory (:func:`shared_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CollectiveError

#: Registers are allocated per warp in units of this many (``sm_90``, ``sm_100``).
REGISTER_UNIT = 256
WARP = 32


class CoResidencyError(CollectiveError):
    """The ranks sharing a GPU cannot all have a kernel's grid resident at once."""


@dataclass(frozen=True)
class SmLimits:
    """What one GPU holds: ``sms`` multiprocessors, each with room for ``threads`` threads,
    ``blocks`` blocks, ``registers`` 32-bit registers and ``shared`` bytes of shared memory."""

    sms: int
    threads: int = 2048
    blocks: int = 32
    registers: int = 65536
    shared: int = 228 * 1024

    @classmethod
    def of(cls, properties: Any) -> SmLimits:
        """The limits of a GPU from ``torch.cuda.get_device_properties(device)`` (the fields
        an older torch lacks keep Hopper's figures)."""
        return cls(sms=properties.multi_processor_count,
                   threads=getattr(properties, "max_threads_per_multi_processor", cls.threads),
                   registers=getattr(properties, "regs_per_multiprocessor", cls.registers),
                   shared=getattr(properties, "shared_memory_per_multiprocessor", cls.shared))


def blocks_per_sm(limits: SmLimits, threads: int, registers: int | None, shared: int = 0) -> int:
    """Blocks of ``threads`` threads using ``registers`` registers per thread (None: unknown,
    the most a block may take) and ``shared`` bytes of shared memory that one SM holds at once
    (0 where the block cannot run at all)."""
    warps = -(-threads // WARP)
    if registers is None:
        registers = limits.registers // (warps * WARP)
    per_warp = -(-registers * WARP // REGISTER_UNIT) * REGISTER_UNIT
    fits = [limits.threads // (warps * WARP), limits.blocks, limits.registers // per_warp // warps]
    if shared:
        fits.append(limits.shared // shared)
    return max(0, min(fits))


def free_sms(limits: SmLimits) -> int:
    """SMs that no rank's collective blocks take where ranks share a GPU: one in eight, at
    least one (16 of an H100's 132)."""
    return max(1, limits.sms // 8)


def share(limits: SmLimits, ranks: int, pdl: bool) -> int:
    """Blocks each of ``ranks`` ranks on one GPU may launch of a kernel that spins (``pdl``:
    launched with programmatic dependent launch, so its successor's blocks count too): one SM
    each, :func:`free_sms` SMs left out.

    Raises:
        CoResidencyError: not one block per rank fits.
    """
    footprint = 2 if pdl else 1
    blocks = (limits.sms - free_sms(limits)) // (ranks * footprint)
    if blocks < 1:
        raise CoResidencyError(
            f"{ranks} ranks on one GPU of {limits.sms} SMs ({free_sms(limits)} kept free for other kernels) "
            f"cannot each have one block{' (x2: PDL successors)' if pdl else ''} on an SM of its own; "
            "use fewer ranks")
    return blocks


@dataclass(frozen=True)
class Occupancy:
    """What bounds a kernel's blocks per SM: ``per_sm`` as the CUDA driver computed it (None:
    not at hand), else ``registers`` per thread (None: unknown) and ``shared`` bytes."""

    per_sm: int | None = None
    registers: int | None = None
    shared: int = 0

    def blocks(self, limits: SmLimits, threads: int) -> int:
        """Blocks of ``threads`` threads one SM of ``limits`` holds."""
        if self.per_sm is not None:
            return self.per_sm
        return blocks_per_sm(limits, threads, self.registers, self.shared)


def shared_bound(key: Any) -> int:
    """A bound of the (dynamic: CuTeDSL sizes it at launch) shared memory a block of ``key``'s
    kernel uses: the TMA pipeline's budget for a TMA kernel
    (:data:`~collectives.config.TMA_SMEM_BYTES` and 1 KB of barriers), 1 KB for the others (a
    few flags)."""
    from ..config import TMA_SMEM_BYTES

    return TMA_SMEM_BYTES + 1024 if getattr(key, "algorithm", None) == "tma" else 1024


def kernel_registers(ptx: str | None, target: str) -> int | None:
    """Registers per thread of the one kernel in ``ptx`` (``ptxas -v``), None where ptxas or the
    PTX is not at hand."""
    if not ptx:
        return None
    from ptxops import ptxas

    try:
        (usage,) = ptxas.resource_usage(ptx, target)
    except (ptxas.PtxasUnavailable, RuntimeError, ValueError):
        return None
    return usage.registers


@dataclass(frozen=True)
class Residency:
    """The co-residency rule of a rank that shares its GPU (``limits``) with ``ranks - 1``
    others: :meth:`cap` gives a kernel's block budget."""

    limits: SmLimits
    ranks: int

    def cap(self, key: Any, occupancy: Occupancy) -> int:
        """Blocks of ``key``'s kernel this rank may launch (:func:`share`).

        Raises:
            CoResidencyError: not one block of it fits an SM, or not one per rank the GPU.
        """
        per_sm = occupancy.blocks(self.limits, key.threads)
        if per_sm < 1:
            raise CoResidencyError(f"{key}: a block of {key.threads} threads does not fit one SM ({occupancy})")
        return share(self.limits, self.ranks, key.pdl)


__all__ = ["CoResidencyError", "Occupancy", "Residency", "SmLimits", "blocks_per_sm", "kernel_registers",
           "free_sms", "shared_bound", "share"]
