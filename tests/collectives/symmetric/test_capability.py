"""CPU tests of backend detection: env parsing, probe with fake devices, choice, agreement."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import types
from collections.abc import Sequence

import pytest

from collectives.symmetric import capability
from collectives.symmetric.capability import (
    MULTICAST_OFF,
    Capabilities,
    agree,
    choose_backend,
    force_multicast_off,
    multicast_disabled_by_env,
    probe,
)
from collectives.errors import CollectiveError, MulticastUnavailable

CLEAN: dict[str, str] = {}


@pytest.mark.parametrize(
    "env, names",
    [
        ({}, []),
        ({"NVSHMEM_DISABLE_NVLS": "1"}, ["NVSHMEM_DISABLE_NVLS"]),
        ({"NVSHMEM_DISABLE_NVLS": "true"}, ["NVSHMEM_DISABLE_NVLS"]),
        ({"NVSHMEM_DISABLE_NVLS": "0"}, []),
        ({"NCCL_NVLS_ENABLE": "0"}, ["NCCL_NVLS_ENABLE"]),
        ({"NCCL_NVLS_ENABLE": "1"}, []),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, ["TORCH_SYMM_MEM_DISABLE_MULTICAST"]),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": ""}, []),
        (
            {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"},
            ["NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"],
        ),
    ],
)
def test_multicast_disabled_by_env(env: dict[str, str], names: list[str]) -> None:
    reason = multicast_disabled_by_env(env)
    if not names:
        assert reason is None
    else:
        assert reason is not None
        for n in names:
            assert n in reason


def test_env_default_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for n in ("NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        monkeypatch.delenv(n, raising=False)
    assert multicast_disabled_by_env() is None
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    assert "NCCL_NVLS_ENABLE=0" in (multicast_disabled_by_env() or "")


def test_force_multicast_off_sets_every_switch_even_over_a_stray_value() -> None:
    env = {"NVSHMEM_DISABLE_NVLS": "0", "NCCL_NVLS_ENABLE": "1", "PATH": "/bin"}
    force_multicast_off(env)
    reason = multicast_disabled_by_env(env) or ""
    assert all(f"{n}={v}" in reason for n, v in MULTICAST_OFF.items()), reason
    assert env["PATH"] == "/bin"


def test_multicast_switches_are_defined_once_in_ptxops() -> None:
    import ptxops.nvls

    assert MULTICAST_OFF is ptxops.nvls.MULTICAST_OFF and force_multicast_off is ptxops.nvls.force_multicast_off


class FakeQuery:
    """Fake devices: ``mc`` = devices with the multicast attribute, ``no_peer`` = pairs without P2P."""

    def __init__(self, mc: frozenset[int] = frozenset({0, 1, 2, 3}),
                 no_peer: frozenset[tuple[int, int]] = frozenset(),
                 mesh: tuple[bool | None, str | None] = (True, None), fail: str | None = None) -> None:
        self.mc, self.no_peer, self.mesh, self.fail = mc, no_peer, mesh, fail

    def multicast_supported(self, device: int) -> bool:
        if self.fail == "mc":
            raise CollectiveError("boom")
        return device in self.mc

    def can_access_peer(self, device: int, peer: int) -> bool:
        if self.fail == "peer":
            raise CollectiveError("boom")
        return (device, peer) not in self.no_peer

    def nvlink_mesh(self, devices: Sequence[int]) -> tuple[bool | None, str | None]:
        return self.mesh


def test_probe_all_good() -> None:
    c = probe(0, 4, [0, 1, 2, 3], env=CLEAN, query=FakeQuery())
    assert (c.multicast, c.peer_access, c.nvlink_mesh) == (True, True, True)
    assert c.multicast_reason is None and c.peer_reason is None
    assert choose_backend("auto", c, env=CLEAN) == "multicast"


def test_probe_env_disables_multicast() -> None:
    c = probe(0, 2, [1], env={"NVSHMEM_DISABLE_NVLS": "1"}, query=FakeQuery())
    assert not c.multicast and c.peer_access
    assert "NVSHMEM_DISABLE_NVLS" in (c.multicast_reason or "")
    assert choose_backend("auto", c, env={}) == "peer"


def test_probe_attribute_zero() -> None:
    c = probe(1, 2, [0], env=CLEAN, query=FakeQuery(mc=frozenset({0})))
    assert not c.multicast
    assert "MULTICAST_SUPPORTED=0" in (c.multicast_reason or "")


def test_probe_no_peer_access() -> None:
    c = probe(0, 3, [1, 2], env=CLEAN, query=FakeQuery(no_peer=frozenset({(2, 0)})))
    assert not c.peer_access and not c.multicast
    assert "[2]" in (c.peer_reason or "")
    with pytest.raises(CollectiveError, match="peer backend unavailable"):
        choose_backend("auto", c, env=CLEAN)


def test_probe_not_full_mesh() -> None:
    c = probe(0, 2, [1], env=CLEAN, query=FakeQuery(mesh=(False, "no NVLink between 0 and 1")))
    assert not c.multicast and c.peer_access and c.nvlink_mesh is False
    assert "full NVLink mesh" in (c.multicast_reason or "")


def test_probe_mesh_unknown_keeps_note() -> None:
    c = probe(0, 2, [1], env=CLEAN, query=FakeQuery(mesh=(None, "NVML (pynvml) not importable")))
    assert c.multicast and c.nvlink_mesh is None
    assert any("pynvml" in n for n in c.notes)


@pytest.mark.parametrize("fail", ["mc", "peer"])
def test_probe_query_failure_is_recorded_not_raised(fail: str) -> None:
    c = probe(0, 2, [1], env=CLEAN, query=FakeQuery(fail=fail))
    assert not c.multicast
    assert "failed" in (c.multicast_reason or "")


def test_probe_on_this_machine_never_raises() -> None:
    # Here there is no GPU/driver: the real queries fail and are reported as reasons.
    c = probe(0, 1, [], env=CLEAN)
    assert isinstance(c, Capabilities)
    if not c.multicast:
        assert c.multicast_reason


def _caps(**kw: object) -> Capabilities:
    base = Capabilities(device=0, world_size=2, multicast=True, multicast_reason=None,
                        peer_access=True, peer_reason=None, nvlink_mesh=True)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_choose_backend_requests() -> None:
    ok = _caps()
    assert choose_backend("multicast", ok, env=CLEAN) == "multicast"
    assert choose_backend("peer", ok, env=CLEAN) == "peer"
    assert choose_backend("auto", ok, env=CLEAN) == "multicast"
    with pytest.raises(ValueError):
        choose_backend("nvls", ok, env=CLEAN)


def test_choose_backend_multicast_unavailable_carries_reason() -> None:
    c = _caps(multicast=False, multicast_reason="device 0: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=0")
    with pytest.raises(MulticastUnavailable) as ei:
        choose_backend("multicast", c, env=CLEAN)
    assert "MULTICAST_SUPPORTED=0" in str(ei.value)
    assert ei.value.reason == c.multicast_reason
    assert choose_backend("auto", c, env=CLEAN) == "peer"


def test_choose_backend_rechecks_env() -> None:
    # Probed "available", but the environment now disables it: second guard.
    for env in ({"NVSHMEM_DISABLE_NVLS": "1"}, {"NCCL_NVLS_ENABLE": "0"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}):
        with pytest.raises(MulticastUnavailable, match=next(iter(env))):
            choose_backend("multicast", _caps(), env=env)
        assert choose_backend("auto", _caps(), env=env) == "peer"


def test_choose_backend_peer_unavailable() -> None:
    c = _caps(multicast=False, multicast_reason="x", peer_access=False, peer_reason="no P2P")
    with pytest.raises(CollectiveError, match="no P2P"):
        choose_backend("peer", c, env=CLEAN)
    with pytest.raises(MulticastUnavailable):
        choose_backend("multicast", c, env=CLEAN)


def test_nvlink_full_mesh_with_fake_nvml() -> None:
    links = {("b0", "b1"), ("b0", "b2")}  # b1-b2 missing
    fake = types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_NVLINK=3, NVML_P2P_STATUS_OK=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId_v2=lambda b: b.decode(),
        nvmlDeviceGetP2PStatus=lambda a, b, idx: 0 if (a, b) in links or (b, a) in links else 4,
    )
    def bus(d: int) -> str:
        return f"b{d}"

    assert capability.nvlink_full_mesh([0, 1], nvml=fake, bus_id=bus) == (True, None)
    ok, note = capability.nvlink_full_mesh([0, 1, 2], nvml=fake, bus_id=bus)
    assert ok is False and "1 and 2" in (note or "")
    assert capability.nvlink_full_mesh([0], nvml=fake, bus_id=bus) == (True, None)


def test_nvlink_full_mesh_nvml_failure_is_unknown() -> None:
    def boom() -> None:
        raise RuntimeError("no driver")

    fake = types.SimpleNamespace(nvmlInit=boom, nvmlShutdown=lambda: None)
    ok, note = capability.nvlink_full_mesh([0, 1], nvml=fake, bus_id=str)
    assert ok is None and "peer access treated as sufficient" in (note or "")


def test_agree_single_process() -> None:
    c = _caps(world_size=1)
    assert agree(c) == c
    with pytest.raises(CollectiveError):
        agree(_caps(world_size=2))


def _agree_worker(rank: int, world: int, store: str, q: mp.Queue[object]) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        mine = [
            _caps(),  # rank 0: everything
            _caps(multicast=False, multicast_reason="NVSHMEM_DISABLE_NVLS=1", nvlink_mesh=None),
            _caps(peer_access=True),
        ][rank]
        got = agree(mine)
        q.put((rank, got, choose_backend("auto", got, env={})))
    except BaseException as e:  # report instead of hanging the parent
        q.put((rank, repr(e), None))
    finally:
        dist.destroy_process_group()


def test_agree_three_ranks_gloo(tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("torch.distributed")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    world = 3
    procs = [ctx.Process(target=_agree_worker, args=(r, world, str(tmp_path) + "/store", q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted([q.get(timeout=120) for _ in range(world)], key=lambda x: x[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for _rank, got, backend in results:
        assert isinstance(got, Capabilities), got
        assert got.multicast is False and got.peer_access is True
        assert got.nvlink_mesh is None  # one rank could not tell
        assert "rank(s) [1]" in (got.multicast_reason or "")
        assert backend == "peer"
    # identical verdict on every rank (the reason differs only in the local "here:" part)
    assert len({(g.multicast, g.peer_access, g.nvlink_mesh) for _, g, _ in results}) == 1
    assert "here: NVSHMEM_DISABLE_NVLS=1" in (results[1][1].multicast_reason or "")
