"""Co-residency: how many thread blocks each rank may launch when several ranks share one GPU.

Every collective kernel has blocks that spin until the same block of every other rank arrives
(barriers, Lamport polls, push rounds).  With one rank per GPU the partner blocks run on other
GPUs; with ``W`` ranks on one GPU (the one-GPU world, :mod:`collectives.testing`) all ``W`` grids
must be resident at once, or the resident blocks wait for partners that never get an SM until
their deadline passes.  A rank's share is therefore what fits ``W`` times::

    per_sm = blocks of the kernel one SM holds (threads, registers, shared memory)
    share  = sms * per_sm // (W * footprint)

where ``footprint`` is 2 for a kernel launched with programmatic dependent launch (its
successor's blocks may become resident while it still runs, taking the same room) and 1
otherwise.  Every algorithm caps its grid at the share (Lamport runs its fixed parts on fewer
blocks); a world where not even one block per rank fits raises :class:`CoResidencyError`.  ``per_sm`` is what the CUDA driver computes for
the kernel's cubin (``cuOccupancyMaxActiveBlocksPerMultiprocessor``); where it cannot, CUDA's
occupancy rules give it (:func:`blocks_per_sm`) from the registers ``ptxas`` reports
(:func:`kernel_registers`; where that is not at hand, the most a block of its size may take:
one 512-thread block per SM) and a bound of its shared memory (:func:`shared_bound`).
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


def share(limits: SmLimits, ranks: int, per_sm: int, pdl: bool) -> int:
    """Blocks each of ``ranks`` ranks on one GPU may launch of a kernel of which one SM holds
    ``per_sm`` (``pdl``: launched with programmatic dependent launch, so its successor's
    blocks count too).

    Raises:
        CoResidencyError: not one block per rank fits.
    """
    footprint = 2 if pdl else 1
    blocks = limits.sms * per_sm // (ranks * footprint)
    if blocks < 1:
        raise CoResidencyError(
            f"{ranks} ranks on one GPU of {limits.sms} SMs holding {per_sm} block(s) each of this kernel"
            f"{' (x2: PDL successors)' if pdl else ''} cannot each have one block resident; use fewer ranks")
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
        return share(self.limits, self.ranks, per_sm, key.pdl)


__all__ = ["CoResidencyError", "Occupancy", "Residency", "SmLimits", "blocks_per_sm", "kernel_registers",
           "shared_bound", "share"]
