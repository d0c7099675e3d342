"""NCCL's strongest baselines for the benchmarks, reached through torch's NCCL backend.

``nccl``       :func:`torch.distributed` collectives on tensors from torch's allocator.
``nccl_symm``  the same calls on buffers from NCCL's allocator (``ncclMemAlloc``, through
               ``ProcessGroupNCCL.mem_allocator``) registered as symmetric windows of the
               group's communicator (``register_mem_pool(pool, symm=True)``:
               ``ncclCommWindowRegister`` with ``NCCL_WIN_COLL_SYMMETRIC``), where NCCL (2.27+)
               runs its symmetric kernels.
``nccl_ce``    those windows registered with a second communicator whose CTA policy is
               ``NCCL_CTA_POLICY_ZERO``, where NCCL (2.28+, one node) runs the collectives it
               implements with copy engines (all-gather; none that reduce) on no SM; timed off
               the default stream, which NCCL before 2.29.7 refuses (:meth:`Baselines.stream`).

Every buffer is a view at offset 0 of two windows allocated once at the largest size, so every
rank passes the same offsets (the symmetric windows' contract).  A column this torch or NCCL
cannot give is skipped with the reason (:attr:`Baselines.skipped`).  NVLS stays off
(``NCCL_NVLS_ENABLE=0``, set by :func:`collectives.symmetric.capability.force_multicast_off`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

#: NCCL versions that first have the symmetric kernels and the copy-engine collectives.
SYMMETRIC_NCCL = (2, 27, 0)
COPY_ENGINE_NCCL = (2, 28, 0)
#: The collectives NCCL's copy-engine path implements (of those we benchmark).
COPY_ENGINE_COLLECTIVES = ("all_gather",)
#: The first NCCL whose copy-engine collectives run on the legacy default stream: before it,
#: ``cudaMemcpyBatchAsync`` refuses that stream and the call raises "unhandled cuda error"
#: ("invalid argument"; NVIDIA/nccl#2003, fixed in 2.29.7), which is what killed the 4-GPU
#: all-gather bench's first (eager) row on NCCL 2.28.9.
CE_DEFAULT_STREAM_NCCL = (2, 29, 7)


def nccl_version() -> tuple[int, ...]:
    """The NCCL version torch runs (major, minor, patch)."""
    return tuple(int(v) for v in torch.cuda.nccl.version()[:3])


@dataclass
class Windows:
    """Two buffers of ``nbytes`` from a pool of NCCL's allocator, registered as symmetric
    windows with one group's communicator (kept alive here: freeing them deregisters)."""

    group: dist.ProcessGroup
    pool: object
    first: torch.Tensor
    second: torch.Tensor

    def views(self, n_first: int, n_second: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n_first`` and ``n_second`` elements of ``dtype`` of the two windows."""
        size = torch.empty((), dtype=dtype).element_size()
        if max(n_first, n_second) * size > self.first.numel():
            raise ValueError(f"{max(n_first, n_second) * size} bytes exceed the {self.first.numel()}-byte windows")
        return self.first.view(dtype)[:n_first], self.second.view(dtype)[:n_second]


def _nccl_backend(group: dist.ProcessGroup):
    return group._get_backend(torch.device("cuda"))


def register_windows(group: dist.ProcessGroup, nbytes: int) -> Windows:
    """Two ``nbytes`` buffers from NCCL's allocator registered as symmetric windows of
    ``group``'s communicator (collective: every rank calls it alike).  Raises where this torch
    has no NCCL memory pools or no symmetric registration."""
    backend = _nccl_backend(group)
    allocator = getattr(backend, "mem_allocator", None)
    if allocator is None or not hasattr(backend, "register_mem_pool"):
        raise RuntimeError("this torch's ProcessGroupNCCL has no mem_allocator / register_mem_pool")
    dist.all_reduce(torch.zeros(1, device="cuda"), group=group)  # the communicator exists before registering
    pool = torch.cuda.MemPool(allocator)
    with torch.cuda.use_mem_pool(pool):
        first = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        second = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    try:
        backend.register_mem_pool(pool, symm=True)
    except TypeError as err:  # a torch whose registration has no symmetric flag
        raise RuntimeError(f"register_mem_pool takes no symm=True in this torch ({err})") from None
    torch.cuda.synchronize()
    return Windows(group, pool, first, second)


def copy_engine_group() -> dist.ProcessGroup:
    """A group of every rank whose NCCL communicator has the zero-CTA policy (the copy-engine
    collectives); raises where this torch cannot set it."""
    nccl = dist.ProcessGroupNCCL
    zero = getattr(nccl, "NCCL_CTA_POLICY_ZERO", None)
    options = nccl.Options()
    if zero is None or not hasattr(options.config, "cta_policy"):
        raise RuntimeError("this torch's ProcessGroupNCCL config has no cta_policy (NCCL_CTA_POLICY_ZERO)")
    options.config.cta_policy = zero
    return dist.new_group(backend="nccl", pg_options=options)


@dataclass
class Baselines:
    """The NCCL columns this torch and NCCL give, for buffers up to ``nbytes`` per rank:
    ``windows[name]`` the registered windows of each column beyond plain NCCL, ``skipped[name]``
    why a column is absent."""

    version: str
    windows: dict[str, Windows] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def columns(self, collective: str) -> list[str]:
        """The NCCL columns of ``collective``, plain NCCL first."""
        return ["nccl"] + [name for name in self.windows
                           if name != "nccl_ce" or collective in COPY_ENGINE_COLLECTIVES]

    def group(self, name: str) -> dist.ProcessGroup | None:
        return None if name == "nccl" else self.windows[name].group

    def needs_side_stream(self, name: str) -> bool:
        """Whether column ``name`` must not run on the default stream (:data:`CE_DEFAULT_STREAM_NCCL`)."""
        return name == "nccl_ce" and tuple(int(v) for v in self.version.split(".")) < CE_DEFAULT_STREAM_NCCL

    @contextlib.contextmanager
    def stream(self, name: str) -> Iterator[None]:
        """Where column ``name`` is timed: the current stream, or, for NCCL's copy engines before
        :data:`CE_DEFAULT_STREAM_NCCL`, a stream of its own that first waits for the current one."""
        if not self.needs_side_stream(name):
            yield
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream().wait_stream(side)

    def lines(self) -> list[str]:
        """What the run has: the NCCL version and every skipped column with its reason."""
        notes = [f"  {name} skipped: {why}" for name, why in self.skipped.items()]
        if "nccl_ce" in self.windows:
            notes.append("  nccl_ce times all_gather only: NCCL's copy engines do not reduce")
        return [f"NCCL {self.version}; columns: nccl, {', '.join(self.windows) or '(no other)'}"] + notes


def baselines(nbytes: int) -> Baselines:
    """Set up every NCCL column for buffers of up to ``nbytes`` per rank (collective)."""
    version = nccl_version()
    found = Baselines(".".join(str(v) for v in version))
    if version < SYMMETRIC_NCCL:
        found.skipped["nccl_symm"] = f"NCCL {found.version} has no symmetric kernels (2.27+)"
    else:
        try:
            found.windows["nccl_symm"] = register_windows(dist.group.WORLD, nbytes)
        except RuntimeError as err:
            found.skipped["nccl_symm"] = str(err)
    if version < COPY_ENGINE_NCCL:
        found.skipped["nccl_ce"] = f"NCCL {found.version} has no copy-engine collectives (2.28+)"
    elif "nccl_symm" not in found.windows:
        found.skipped["nccl_ce"] = "needs symmetric windows: " + found.skipped["nccl_symm"]
    else:
        try:
            found.windows["nccl_ce"] = register_windows(copy_engine_group(), nbytes)
        except RuntimeError as err:
            found.skipped["nccl_ce"] = str(err)
    return found


__all__ = ["Baselines", "COPY_ENGINE_COLLECTIVES", "Windows", "baselines", "copy_engine_group",
           "nccl_version", "register_windows"]
