"""The backend decision, made in one place (:func:`collectives.algorithms.rules.resolve_backend` and
the kernel key's :func:`~collectives.algorithms.rules.key_backend_refusal`), against the three places
that decided it before issue 21 (``capability.choose_backend``, ``Communicator.choose_backend``
and ``KernelKey.__post_init__``): the same answer, or the same exception and message, for
every combination."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from collectives.algorithms.rules import key_backend_refusal, resolve_backend
from collectives.symmetric.capability import Capabilities, choose_backend
from collectives.algorithms import KernelKey
from collectives.config import BACKENDS, COLLECTIVES, MULTICAST_PATHS, OPS, PTX_OP
from collectives.algorithms.rules import multimem_reduces
from collectives.dtypes import DTYPES
from collectives.errors import CollectiveError, MulticastUnavailable

CLEAN: dict[str, str] = {}
BASE_CAPS = Capabilities(device=0, world_size=2, multicast=True, multicast_reason=None,
                         peer_access=True, peer_reason=None, nvlink_mesh=True)
CAPS = {
    "all": BASE_CAPS,
    "no multicast": dataclasses.replace(BASE_CAPS, multicast=False, multicast_reason="NVSHMEM_DISABLE_NVLS=1"),
    "nothing": dataclasses.replace(BASE_CAPS, multicast=False, multicast_reason="no mc", peer_access=False,
                                   peer_reason="no peer access"),
}
REQUESTS = ("auto", "multicast", "peer", "multicast_emulated", "nvls")
TARGETS = ("sm_90a", "sm_100a")


def _old_communicator_choose_backend(requested: str, caps: Capabilities, context_backend: str, dtype: str,
                                     op: str, target: str) -> str:
    """``Communicator.choose_backend`` as it was at 38c3fa8 (its context and GPU as arguments)."""
    if requested == "multicast_emulated":
        backend = requested
    else:
        backend = choose_backend(requested, caps, env=CLEAN)
        if backend == "multicast" and context_backend != "multicast":
            raise MulticastUnavailable(f"this context was opened with the {context_backend!r} backend")
    if backend in MULTICAST_PATHS and not multimem_reduces(dtype, op):
        if requested == "auto":
            return "peer"
        raise CollectiveError(
            f"multimem.ld_reduce has no {PTX_OP[op]} of {dtype} (PTX: .min/.max reduce integers, "
            f"16-bit floats and fp8, not .f32); use backend='peer' or 'auto'"
        )
    if backend in MULTICAST_PATHS and DTYPES[dtype].fp8 and not target.startswith("sm_10"):
        raise MulticastUnavailable(f"multimem on {dtype} needs sm_100a or newer, not {target}")
    return backend


def _outcome(fn, *args) -> tuple[str, str]:
    try:
        return "ok", fn(*args)
    except Exception as e:  # the exception's type and message are the behaviour compared
        return type(e).__name__, str(e)


def _capable(caps):
    """The GPUs' answer over ``caps`` (the runtime's: choose_backend over its context's), the environment clean."""
    return lambda requested: choose_backend(requested, caps, env=CLEAN)


def test_the_runtime_decision_matches_the_old_one_everywhere() -> None:
    rows = 0
    for requested, caps, context, dtype, op, target in itertools.product(
            REQUESTS, CAPS, ("multicast", "peer"), DTYPES, OPS, TARGETS):
        old = _outcome(_old_communicator_choose_backend, requested, CAPS[caps], context, dtype, op, target)
        new = _outcome(lambda: resolve_backend(requested, _capable(CAPS[caps]), context, dtype, op, lambda: target))
        assert new == old, (requested, caps, context, dtype, op, target)
        rows += 1
    assert rows == len(REQUESTS) * len(CAPS) * 2 * len(DTYPES) * len(OPS) * len(TARGETS)


def test_the_target_is_read_only_for_fp8_on_a_multicast_path() -> None:
    """The compile target needs a GPU: the decision asks for it only where it matters."""
    def no_gpu() -> str:
        raise AssertionError("target read")

    assert resolve_backend("peer", _capable(BASE_CAPS), "peer", "e4m3", "sum", no_gpu) == "peer"
    assert resolve_backend("multicast_emulated", _capable(BASE_CAPS), "peer", "bf16", "sum", no_gpu) == "multicast_emulated"
    with pytest.raises(AssertionError, match="target read"):
        resolve_backend("multicast_emulated", _capable(BASE_CAPS), "peer", "e4m3", "sum", no_gpu)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_the_key_predicate_matches_the_kernel_keys_rules(collective: str) -> None:
    """``key_backend_refusal`` says why exactly where a kernel key refuses the backend, dtype
    and op (with the key's message)."""
    for backend, dtype, op in itertools.product(BACKENDS, DTYPES, OPS):
        why = key_backend_refusal(collective, backend, dtype, op)
        try:
            KernelKey(collective, "one_shot", backend, dtype, 4, op=op)
        except ValueError as e:
            assert str(e) == why, (backend, dtype, op)
        else:
            assert why is None, (backend, dtype, op)
