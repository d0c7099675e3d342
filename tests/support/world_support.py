"""One test body, two worlds: the multi-rank GPU tests run under torchrun (one process per GPU)
and, with ``COLLECTIVES_TEST_WORLD=W``, as W rank threads on one GPU (:mod:`collectives.testing`).

In the world, ``tests/conftest.py`` runs each ``multigpu`` test's function in every rank of the
session's :class:`~collectives.testing.World` (opened on first use; opened anew after a test
broke it or closed a rank's context) and a fixture value of type :class:`PerRank` is resolved
in each rank's thread first: a fixture that gives a test its communicator returns
``per_rank(communicator)`` there and the communicator itself under torchrun
(:func:`rank_value`).  A test that cannot run in the world is marked
``pytest.mark.no_world(reason)``: skipped there, with its reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: The world size of a one-GPU run (0: torchrun, or no multi-rank run).
WORLD = int(os.environ.get("COLLECTIVES_TEST_WORLD", "0"))
#: The communicators' GPU-side bound in the world (seconds): short, so a broken test fails fast.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("COLLECTIVES_WORLD_TIMEOUT_S", "20"))
#: Host-side bound of the world (seconds).
HOST_TIMEOUT_S = float(os.environ.get("COLLECTIVES_WORLD_HOST_TIMEOUT_S", "120"))

_world: Any = None


class PerRank:
    """A fixture value made in each rank's thread by ``make()``, once per rank context (a
    world opened anew makes it again)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self._made: dict[int, tuple[Any, Any]] = {}  # id(context) -> (context, value)

    def resolve(self) -> Any:
        from collectives.symmetric.context import current

        ctx = current()
        hit = self._made.get(id(ctx))
        if hit is None or hit[0] is not ctx:
            hit = self._made[id(ctx)] = (ctx, self.make())
        return hit[1]


def rank_value(make: Callable[[], Any]) -> Any:
    """``make()`` now (torchrun: this process is the rank), or a :class:`PerRank` (the world)."""
    return PerRank(make) if WORLD else make()


def session_world() -> Any:
    """The session's world of :data:`WORLD` ranks, opened on first use and anew where the last
    one broke or a test closed a rank's context."""
    global _world
    from collectives.testing import World

    if _world is not None and (_world.broken is not None or any(c is None or c.closed for c in _world.contexts)):
        _world.close()
        _world = None
    if _world is None:
        _world = World(WORLD, timeout_s=HOST_TIMEOUT_S, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    return _world


def close_session_world() -> None:
    global _world
    if _world is not None:
        _world.close()
        _world = None


def run_test(function: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """``function(**kwargs)`` in every rank of the session's world, each :class:`PerRank`
    argument resolved in the rank's thread."""

    def body(rank: int) -> Any:
        return function(**{k: v.resolve() if isinstance(v, PerRank) else v for k, v in kwargs.items()})

    session_world().run(body)


def close_rank_context() -> None:
    """At the end of a test module that opened its own communicator: close this rank's context
    under torchrun (the process's own); in the world the session's world closes it."""
    if not WORLD:
        import collectives

        ctx = collectives.current()
        if ctx is not None:
            ctx.close()


def fresh_communicator() -> Any:
    """A new communicator on this rank's context, made now (in the world: in the rank's thread),
    so that what a communicator reads once (the test seeds) is read again."""
    from collectives.runtime.communicator import communicator, forget
    from collectives.symmetric.bootstrap import init
    from collectives.symmetric.context import current

    ctx = current() or init()
    timeout_s = communicator(ctx).timeout_s  # (the world's bound, where it set one)
    forget(ctx)
    comm = communicator(ctx)
    comm.errors.timeout_s = timeout_s
    return comm


def warmup_stream() -> Any:
    """A stream to warm a graph's calls up on, ordered after the current one's work so far: a new
    side stream under torchrun (the current one is the default stream, where nothing is
    captured), the rank's own stream in the world (a new one there would come from torch's
    stream pool and might share a hardware queue with another rank's stream)."""
    import torch

    current = torch.cuda.current_stream()
    stream = current if WORLD else torch.cuda.Stream()
    stream.wait_stream(current)
    return stream
