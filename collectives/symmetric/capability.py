"""Which backend can run here: NVLink multicast (NVLS) or peer (unicast NVLink) loads/stores
(the probing; the rules a call's dtype and op add: :mod:`collectives.algorithms.rules`).

Everything here only *queries* (environment, device attributes, NVML); nothing creates a
multicast object. The device queries go through a small :class:`DeviceQuery` protocol so
that :func:`probe` and :func:`choose_backend` can be tested on a CPU with fakes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from ptxops.nvls import MULTICAST_OFF, force_multicast_off

from ..errors import CollectiveError, MulticastUnavailable

#: A ``torch.distributed`` group of ranks: a ProcessGroup or a one-dimensional DeviceMesh (None:
#: the default group, where a function takes it).
TorchGroup = Any

__all__ = [
    "Backend",
    "Capabilities",
    "CudaDeviceQuery",
    "DeviceQuery",
    "agree",
    "can_access_peer",
    "choose_backend",
    "collective_device",
    "cuda_missing",
    "device_supports_multicast",
    "force_multicast_off",
    "multicast_disabled_by_env",
    "nvlink_full_mesh",
    "pci_bus_id",
    "probe",
]

Backend = Literal["multicast", "peer"]
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def _flag(env: Mapping[str, str], name: str) -> str | None:
    v = env.get(name)
    return None if v is None else v.strip().lower()


def multicast_disabled_by_env(env: Mapping[str, str] | None = None) -> str | None:
    """Return why the environment disables multicast, or ``None`` if it does not.

    Any one of ``NVSHMEM_DISABLE_NVLS`` truthy, ``NCCL_NVLS_ENABLE`` falsy (``0``), or
    ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` truthy disables it; all that apply are named.
    """
    env = os.environ if env is None else env
    reasons = []
    if _flag(env, "NVSHMEM_DISABLE_NVLS") in _TRUE:
        reasons.append(f"NVSHMEM_DISABLE_NVLS={env['NVSHMEM_DISABLE_NVLS']}")
    if _flag(env, "NCCL_NVLS_ENABLE") in _FALSE:
        reasons.append(f"NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}")
    if _flag(env, "TORCH_SYMM_MEM_DISABLE_MULTICAST") in _TRUE:
        reasons.append(f"TORCH_SYMM_MEM_DISABLE_MULTICAST={env['TORCH_SYMM_MEM_DISABLE_MULTICAST']}")
    if not reasons:
        return None
    return "disabled by environment: " + ", ".join(reasons)


class DeviceQuery(Protocol):
    """Read-only device queries used by :func:`probe` (real: :class:`CudaDeviceQuery`)."""

    def multicast_supported(self, device: int) -> bool: ...

    def can_access_peer(self, device: int, peer: int) -> bool: ...

    def nvlink_mesh(self, devices: Sequence[int]) -> tuple[bool | None, str | None]:
        """``(True|False, note)`` if known; ``(None, why unknown)`` otherwise."""
        ...


def cuda_missing() -> str | None:
    """Why this process can run no CUDA kernel (a CPU build of PyTorch, no NVIDIA driver, no GPU
    visible), or None where it can."""
    import torch

    if torch.version.cuda is None:
        return (f"this PyTorch ({torch.__version__}) is a CPU build: install a CUDA build "
                "(pip install 'ptxops[cu13]' or 'ptxops[cu12]')")
    if torch.cuda.device_count() > 0:
        return None
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver: libcuda.so.1 cannot be loaded"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "the NVIDIA driver sees no GPU" + ("" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})")


def _driver() -> Any:
    """``cuda.bindings.driver`` after ``cuInit(0)``; raises CollectiveError without a driver."""
    try:
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
    except Exception as e:  # no libcuda, no cuda-python
        raise CollectiveError(f"CUDA driver unavailable: {e}") from e
    _check(driver, err, "cuInit")
    return driver


def _check(driver: Any, err: Any, what: str) -> None:
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CollectiveError(f"{what} failed: {err!r}")


def _cu_device(driver: Any, ordinal: int) -> Any:
    err, dev = driver.cuDeviceGet(int(ordinal))
    _check(driver, err, f"cuDeviceGet({ordinal})")
    return dev


def device_supports_multicast(device: int) -> bool:
    """``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` of ``device`` (attribute query only)."""
    d = _driver()
    attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
    err, value = d.cuDeviceGetAttribute(attr, _cu_device(d, device))
    _check(d, err, "cuDeviceGetAttribute(MULTICAST_SUPPORTED)")
    return bool(value)


def can_access_peer(device: int, peer: int) -> bool:
    """``cuDeviceCanAccessPeer(device, peer)``; a device can always access itself."""
    if int(device) == int(peer):
        return True
    d = _driver()
    err, ok = d.cuDeviceCanAccessPeer(_cu_device(d, device), _cu_device(d, peer))
    _check(d, err, f"cuDeviceCanAccessPeer({device}, {peer})")
    return bool(ok)


def pci_bus_id(device: int) -> str:
    """``device``'s PCI bus id (``cuDeviceGetPCIBusId``): the same GPU's name in every process."""
    d = _driver()
    err, bus = d.cuDeviceGetPCIBusId(32, _cu_device(d, device))
    _check(d, err, "cuDeviceGetPCIBusId")
    raw = bus if isinstance(bus, (bytes, bytearray)) else str(bus).encode()
    return raw.split(b"\0", 1)[0].decode()


def nvlink_full_mesh(devices: Sequence[int], nvml: Any = None,
                     bus_id: Callable[[int], str] | None = None) -> tuple[bool | None, str | None]:
    """Whether every pair of ``devices`` has NVLink P2P, per NVML.

    Returns ``(None, note)`` when NVML (``pynvml`` from nvidia-ml-py) is not importable or
    fails; callers then treat peer access as sufficient and keep the note. ``nvml`` and
    ``bus_id`` (ordinal -> PCI bus id) default to ``pynvml`` and ``cuDeviceGetPCIBusId``.
    """
    bus_id = pci_bus_id if bus_id is None else bus_id
    devs = sorted({int(x) for x in devices})
    if len(devs) < 2:
        return True, None
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found, no-redef]
        except Exception:
            return None, "NVML (pynvml) not importable; NVLink mesh not checked, peer access treated as sufficient"
    try:
        nvml.nvmlInit()
    except Exception as e:
        return None, f"NVML init failed ({e}); NVLink mesh not checked, peer access treated as sufficient"
    try:
        handles = {x: nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id(x).encode()) for x in devs}
        for i, a in enumerate(devs):
            for b in devs[i + 1:]:
                st = nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], nvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if st != nvml.NVML_P2P_STATUS_OK:
                    return False, f"no NVLink P2P between devices {a} and {b} (NVML status {st})"
        return True, None
    except Exception as e:
        return None, f"NVML query failed ({e}); NVLink mesh not checked, peer access treated as sufficient"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


class CudaDeviceQuery:
    """The real :class:`DeviceQuery`: cuda-python driver attributes plus NVML."""

    def multicast_supported(self, device: int) -> bool:
        return device_supports_multicast(device)

    def can_access_peer(self, device: int, peer: int) -> bool:
        return can_access_peer(device, peer)

    def nvlink_mesh(self, devices: Sequence[int]) -> tuple[bool | None, str | None]:
        return nvlink_full_mesh(devices)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What this rank (or, after :func:`agree`, the whole group) can use.

    ``multicast`` is the final verdict (hardware, environment, peer access and mesh);
    ``multicast_reason``/``peer_reason`` say why not. ``nvlink_mesh`` is ``None`` if unknown.
    """

    device: int
    world_size: int
    multicast: bool
    multicast_reason: str | None
    peer_access: bool
    peer_reason: str | None
    nvlink_mesh: bool | None
    notes: tuple[str, ...] = ()


def probe(device: int, world_size: int, peers: Sequence[int], *,
          env: Mapping[str, str] | None = None, query: DeviceQuery | None = None) -> Capabilities:
    """Probe this rank's capabilities.

    Args:
        device: this rank's CUDA device ordinal.
        world_size: number of ranks that will communicate.
        peers: device ordinals (as seen by this process) of the other ranks; ``device``
            itself may be included and is ignored.
        env: environment to read (default ``os.environ``).
        query: device queries (default :class:`CudaDeviceQuery`); a failing query is
            recorded as "unavailable" with its message, never raised.
    """
    query = CudaDeviceQuery() if query is None else query
    others = sorted({int(p) for p in peers} - {int(device)})
    notes: list[str] = []

    peer_reason: str | None = None
    try:
        bad = [p for p in others if not (query.can_access_peer(device, p) and query.can_access_peer(p, device))]
        if bad:
            peer_reason = f"device {device} has no peer access with device(s) {bad}"
    except Exception as e:
        peer_reason = f"peer access query failed: {e}"
    peer_ok = peer_reason is None

    mesh: bool | None
    try:
        mesh, note = query.nvlink_mesh([device, *others])
    except Exception as e:
        mesh, note = None, f"NVLink mesh query failed: {e}"
    if note:
        notes.append(note)

    mc_reasons: list[str] = []
    env_reason = multicast_disabled_by_env(env)
    if env_reason:
        mc_reasons.append(env_reason)
    try:
        if not query.multicast_supported(device):
            mc_reasons.append(f"device {device}: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=0")
    except Exception as e:
        mc_reasons.append(f"multicast attribute query failed: {e}")
    if not peer_ok:
        mc_reasons.append(str(peer_reason))
    if mesh is False:
        mc_reasons.append(f"world is not a full NVLink mesh ({note})")

    return Capabilities(
        device=int(device), world_size=int(world_size),
        multicast=not mc_reasons, multicast_reason="; ".join(mc_reasons) or None,
        peer_access=peer_ok, peer_reason=peer_reason, nvlink_mesh=mesh, notes=tuple(notes),
    )


def choose_backend(requested: str, caps: Capabilities, *, env: Mapping[str, str] | None = None) -> Backend:
    """Pick ``"multicast"`` or ``"peer"`` for ``requested`` in ``{"auto", "multicast", "peer"}``.

    The environment is re-checked here (second guard), so a multicast verdict probed
    earlier cannot outlive a disabling variable set since.

    Raises:
        MulticastUnavailable: ``"multicast"`` requested but unavailable (with the reason).
        CollectiveError: no usable backend (no peer access and no multicast).
        ValueError: unknown ``requested``.
    """
    if requested not in ("auto", "multicast", "peer"):
        raise ValueError(f"backend must be 'auto', 'multicast' or 'peer', not {requested!r}")
    env_reason = multicast_disabled_by_env(env)
    mc_reason = env_reason or (None if caps.multicast else caps.multicast_reason or "multicast unavailable")
    if requested == "multicast":
        if mc_reason:
            raise MulticastUnavailable(mc_reason)
        return "multicast"
    if requested == "auto" and mc_reason is None:
        return "multicast"
    if not caps.peer_access:
        raise CollectiveError(f"peer backend unavailable: {caps.peer_reason}"
                              + ("" if requested == "peer" else f"; multicast: {mc_reason}"))
    return "peer"


def collective_device(group: TorchGroup) -> Any:
    """The device ``group``'s collectives exchange tensors on: this rank's GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(caps: Capabilities, group: TorchGroup = None) -> Capabilities:
    """Make ``caps`` identical on every rank of ``group`` (collective).

    Equivalent to an all-reduce MIN of (multicast, peer_access, nvlink_mesh); the flags
    are all-gathered so that the reasons can name the ranks that lack a capability.
    Without an initialized ``torch.distributed`` (single process) returns ``caps``.
    """
    try:
        import torch
        import torch.distributed as dist

        ready = dist.is_available() and dist.is_initialized()
    except ImportError:
        ready = False
    if not ready:
        if caps.world_size > 1:
            raise CollectiveError("agree() needs torch.distributed to be initialized for world_size > 1")
        return caps
    mesh_code = {False: 0, None: 1, True: 2}[caps.nvlink_mesh]
    mine = torch.tensor([int(caps.multicast), int(caps.peer_access), mesh_code], dtype=torch.int64,
                        device=collective_device(group))
    n = dist.get_world_size(group)
    allv = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(allv, mine, group=group)
    rows = [[int(x) for x in t.tolist()] for t in allv]
    no_mc = [r for r, row in enumerate(rows) if not row[0]]
    no_peer = [r for r, row in enumerate(rows) if not row[1]]
    mesh = {0: False, 1: None, 2: True}[min(row[2] for row in rows)]

    def reason(bad: list[int], local: str | None) -> str | None:
        if not bad:
            return None
        return f"unavailable on rank(s) {bad}" + (f"; here: {local}" if local else "")

    return dataclasses.replace(
        caps, world_size=n,
        multicast=not no_mc, multicast_reason=reason(no_mc, caps.multicast_reason),
        peer_access=not no_peer, peer_reason=reason(no_peer, caps.peer_reason), nvlink_mesh=mesh,
    )
