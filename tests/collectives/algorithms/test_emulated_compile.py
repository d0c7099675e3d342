"""``backend="multicast_emulated"``: every collective, algorithm and dtype at world size 2
(4 and 8 too: bf16; ``test_collectives_compile.slim``) compiles without a GPU with the multicast code
paths under ptxops emulation, and its PTX holds no ``multimem`` instruction but the unicast
accesses that replace them; the runtime's safety net refuses a kernel with multimem on a
context without multicast."""

from __future__ import annotations

import re

import pytest

from collectives.algorithms import ALGORITHMS, KernelKey
from collectives.dtypes import DTYPES

pytest.importorskip("cutlass")
from collectives.runtime.kernels import kernel_ptx  # noqa: E402
from tests.collectives.algorithms.test_collectives_compile import peer_only, slim  # noqa: E402 (the same cases left out)

CASES = [
    (collective, algorithm, dtype, world)
    for collective, algorithms in ALGORITHMS.items()
    for algorithm in algorithms
    for dtype in (DTYPES if collective != "barrier" else ("bf16",))
    for world in (2, 4, 8)
    if not slim(collective, algorithm, dtype, world) and not peer_only(collective, algorithm, "multicast_emulated")
]


@pytest.mark.parametrize(("collective", "algorithm", "dtype", "world"), CASES)
def test_emulated_kernel_has_no_multimem(collective: str, algorithm: str, dtype: str, world: int) -> None:
    key = KernelKey(collective, algorithm, "multicast_emulated", dtype, world,
                    stage_in=algorithm == "push")  # push always sends a non-symmetric input
    ptx = kernel_ptx(key, "sm_100a" if DTYPES[dtype].fp8 else "sm_90a")
    assert "multimem" not in ptx
    # the multicast barrier's signal, a multimem.st.release.sys, is one release store per rank
    if algorithm != "lamport":
        assert len(re.findall(r"st\.release\.sys\.global\.b64", ptx)) >= world
    if algorithm == "tma" and collective == "all_reduce":  # the multicast TMA store: a copy per rank
        stores = re.findall(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group", ptx)
        assert len(stores) >= world + 1, len(stores)  # W translated copies and the plain one


def test_safety_net_refuses_multimem_without_multicast() -> None:
    from collectives.errors import CollectiveError
    from collectives.runtime.kernels import refuse_multimem

    key = KernelKey("barrier", "one_shot", "multicast", "bf16", 2)
    ptx = kernel_ptx(key)
    with pytest.raises(CollectiveError, match="multimem"):
        refuse_multimem(ptx, key, "peer")
    refuse_multimem(ptx, key, "multicast")
    emulated = KernelKey("barrier", "one_shot", "multicast_emulated", "bf16", 2)
    refuse_multimem(kernel_ptx(emulated), emulated, "peer")
    with pytest.raises(CollectiveError, match="no PTX"):
        refuse_multimem(None, emulated, "peer")


def test_auto_never_chooses_emulation() -> None:
    from collectives.symmetric.capability import choose_backend

    with pytest.raises(ValueError):
        choose_backend("multicast_emulated", None)  # only Communicator.choose_backend knows it, explicitly


def test_multicast_paths_refuse_what_multimem_cannot_reduce() -> None:
    """ptxops' spec decides: PTX has no multimem .min/.max of .f32, so neither multicast path
    builds one (the runtime falls back to peer under auto, and names the reason otherwise)."""
    from collectives.algorithms.rules import multimem_reduces

    assert not multimem_reduces("f32", "min") and not multimem_reduces("f32", "max")
    assert multimem_reduces("f32", "sum") and multimem_reduces("bf16", "max") and multimem_reduces("e4m3", "min")
    for backend in ("multicast", "multicast_emulated"):
        with pytest.raises(ValueError, match="no min of f32"):
            KernelKey("all_reduce", "one_shot", backend, "f32", 2, op="min")
    KernelKey("all_reduce", "one_shot", "peer", "f32", 2, op="min")
