"""Device building blocks for cross-GPU kernels: ``@cute.jit`` functions to call from your own
``@cute.kernel`` (see docs for an all-gather written with them).  Every block module's functions
are listed here, grouped by file (as CuTeDSL's ``cutlass.cute.arch`` lists its own); the
launchers of the package's kernels and their view of the argument layouts
(:mod:`collectives.layouts`) are :mod:`.launch` and :mod:`.kernel_args`."""

from ..errors import MissingDependency

try:  # CuTeDSL functions, every one: without CuTeDSL, say which extra installs it
    from . import all_to_all, flags, lamport, reduce, regions, rounding, signals, tiles

    # signals, bounded waits, barriers, the call count, the error record
    from .signals import (
        HOST, LOCAL, MULTICAST, PEER, arrival_word, barrier_multicast, barrier_peer, block_all, enter_call, gave_up,
        gmem, in_call, lamport_counts, lamport_missed, lamport_missed_any, lamport_missed_start, lamport_skip,
        leave_call, peer_address, reached, record_error, signal, signal_multicast, signal_peers, size_word, spin,
        wait_peers, wait_until,
    )
    # load-reduce and store-to-all, multicast or peer
    from .reduce import combine, convert, load_reduce_multicast, load_reduce_peer, store_multicast, store_peers
    # data that is its own flag (the Lamport all-reduce)
    from .lamport import CARRIER, canonical, clear, empty_lanes, lanes, load_words, negative_zero, send, wait_slots
    # the TMA bulk-copy reduce pipeline
    from .tiles import reduce_tiles, shared_buffers, smem_bytes
    # post and wait between two kernels of one GPU (the stream flags)
    from .flags import post, wait
    # the all-to-all's ready and arrived words
    from .all_to_all import (
        arrived_word, epoch_of, pack, place, place_of, poll_epoch, post_arrived, post_ready, ready_offset, ready_word,
        size_of, wait_within, wait_word,
    )
    # the regions' exchange (two kernels: rows stored into each receiver's region, then waited for)
    from .regions import (
        post_rows, refuse_rows, region_arrived_at, region_arrived_word, region_facts_word, wait_free, wait_rows,
    )
    # f32 products, sums and fp8 conversions rounded as torch rounds them (the MoE kernels)
    from .rounding import E4M3_MAX, E4M3_NAN_PAST, add_rn, amax, div_rn, e4m3, fp8_scale, mul_rn, narrow, widen, zero

except ModuleNotFoundError as err:
    if (err.name or "").partition(".")[0] not in MissingDependency.EXTRAS:
        raise
    raise MissingDependency("collectives.device", err.name.partition(".")[0]) from None

#: Every block module's names, by file.
__all__ = ["HOST", "LOCAL", "MULTICAST", "PEER", "arrival_word", "barrier_multicast", "barrier_peer", "block_all",
           "enter_call", "gave_up", "gmem", "in_call", "lamport_counts", "lamport_missed", "lamport_missed_any",
           "lamport_missed_start", "lamport_skip", "leave_call", "peer_address", "reached", "record_error", "signal",
           "signal_multicast", "signal_peers", "size_word", "spin", "wait_peers", "wait_until", "combine", "convert",
           "load_reduce_multicast", "load_reduce_peer", "store_multicast", "store_peers", "CARRIER", "canonical",
           "clear", "empty_lanes", "lanes", "load_words", "negative_zero", "send", "wait_slots", "reduce_tiles",
           "shared_buffers", "smem_bytes", "post", "wait", "arrived_word", "epoch_of", "pack", "place", "place_of",
           "poll_epoch",
           "post_arrived", "post_ready", "ready_offset", "ready_word", "size_of", "wait_within", "wait_word",
           "post_rows", "refuse_rows", "region_arrived_at", "region_arrived_word", "region_facts_word", "wait_free",
           "wait_rows", "E4M3_MAX",
           "E4M3_NAN_PAST", "add_rn", "amax", "div_rn", "e4m3", "fp8_scale", "mul_rn", "narrow", "widen", "zero"]
