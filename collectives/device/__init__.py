"""Device building blocks for cross-GPU kernels: signals, bounded waits, barriers, and
backend-neutral load-reduce / store-to-all; :mod:`.lamport` (data that is its own flag),
:mod:`.tiles` (a TMA bulk-copy reduce pipeline) and :mod:`.flags` (post/wait between two
kernels of one GPU) in their own modules.  ``@cute.jit`` functions:
call them from your own ``@cute.kernel`` (see docs for an all-gather written with them)."""

from ..errors import MissingDependency

try:  # CuTeDSL functions, every one: without CuTeDSL, say which extra installs it
    from .reduce import (
        combine,
        load_reduce_multicast,
        load_reduce_peer,
        store_multicast,
        store_peers,
    )
    from .signals import (
        barrier_multicast,
        barrier_peer,
        block_all,
        enter_call,
        gmem,
        leave_call,
        peer_address,
        reached,
        record_error,
        signal,
        signal_multicast,
        signal_peers,
        spin,
        wait_peers,
        wait_until,
    )
except ModuleNotFoundError as err:
    if (err.name or "").partition(".")[0] not in MissingDependency.EXTRAS:
        raise
    raise MissingDependency("collectives.device", err.name.partition(".")[0]) from None

__all__ = [
    "barrier_multicast", "barrier_peer", "block_all", "combine", "enter_call", "gmem", "leave_call",
    "load_reduce_multicast", "load_reduce_peer", "peer_address", "reached",
    "record_error", "signal", "signal_multicast", "signal_peers", "spin", "store_multicast", "store_peers", "wait_peers", "wait_until",
]
