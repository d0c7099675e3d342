"""Programmatic dependent launch (:data:`collectives.config.PDL`): with ``pdl`` every kernel
waits (``griddepcontrol.wait``) before its first global memory access, the tables' and the
signal pad's loads included, and then lets dependents launch; without it neither instruction
appears.  One key per kernel family (the barrier, design's start/move/end kernels on each
backend, the push pipeline, Lamport, TMA): they share :func:`collectives.device.launch.launcher`."""

from __future__ import annotations

import re

import pytest

from collectives import config
from collectives.algorithms import KernelKey
from collectives.config import BARRIER_THREADS

pytest.importorskip("cutlass")
from collectives.runtime.kernels import kernel_ptx  # noqa: E402

#: The first global (or generic) memory access of a kernel: loads, stores, atomics,
#: reductions, multimem and bulk copies (``ld.param`` is a kernel argument, not memory).
_ACCESS = re.compile(r"^\s*(?:@%p\d+\s+)?(?:ld|st|atom|red|multimem|cp\.async\.bulk|cp\.reduce\.async\.bulk)"
                     r"\.(?!param|shared|local)[\w.:]*", re.M)

KEYS = [
    KernelKey("barrier", "one_shot", "peer", "bf16", 2, threads=BARRIER_THREADS),
    KernelKey("all_reduce", "one_shot", "multicast", "bf16", 4),
    KernelKey("all_reduce", "two_shot", "multicast_emulated", "bf16", 2),
    KernelKey("all_reduce", "push", "peer", "bf16", 4, stage_in=True),
    KernelKey("all_reduce", "lamport", "peer", "bf16", 2),
    KernelKey("reduce_scatter", "tma", "peer", "bf16", 2),
]


def _name(key: KernelKey) -> str:
    return f"{key.collective}-{key.algorithm}-{key.backend}"


@pytest.mark.parametrize("key", KEYS, ids=_name)
def test_kernel_waits_for_the_kernel_before_it_ahead_of_any_memory_access(key: KernelKey) -> None:
    assert key.pdl  # the default
    ptx = kernel_ptx(key, "sm_90a")
    wait = ptx.find("griddepcontrol.wait;")
    first = _ACCESS.search(ptx)
    assert ptx.count("griddepcontrol.wait;") == 1 and ptx.count("griddepcontrol.launch_dependents;") == 1
    assert first is not None and 0 <= wait < first.start(), (wait, first.group(0) if first else None)
    assert wait < ptx.find("griddepcontrol.launch_dependents;") < first.start()


def test_without_pdl_no_griddepcontrol(monkeypatch) -> None:
    monkeypatch.setattr(config, "PDL", False)
    key = KernelKey("all_reduce", "one_shot", "peer", "bf16", 2)
    assert not key.pdl and key != KernelKey("all_reduce", "one_shot", "peer", "bf16", 2, pdl=True)
    ptx = kernel_ptx(key, "sm_90a")
    assert "griddepcontrol" not in ptx and _ACCESS.search(ptx)
