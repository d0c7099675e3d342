"""Flags between a producer and a consumer on the same GPU: ``post`` and a bounded ``wait``.

A flag is a pair of uint32 counters per slot: ``flags[index]``, which every :func:`post`
increments, and ``consumed[index]``, which only the slot's one consumer writes (the posts it
has taken).  :func:`wait` waits until ``flags[index]`` is past ``consumed[index]`` and then
takes that post.  Nothing is ever reset: every post is taken by exactly one wait, so eager
calls and CUDA-graph replays (which repeat the same launches) stay matched, and comparisons are
wrap-safe (:func:`~collectives.device.signals.reached`).  Call either from one thread.

Scope: producer and consumer are threads of this GPU (two kernels, possibly on two streams),
so ``gpu`` is the smallest scope containing both (``cta`` and ``cluster`` do not: they are
different grids); the host never reads a flag.  What the post publishes is cumulative: a
release makes visible every write that happens before it in the posting thread's view, and
writes of earlier kernels of the posting thread's stream happen before it (stream order is a
kernel boundary, after which the earlier kernel's writes are visible to the device).  So a
GEMM, then a post on the same stream, then a wait, then a kernel on the waiter's stream: that
kernel sees the GEMM's output, and a ``sys``-scope release of its own (a collective's barrier)
carries it on to other GPUs, since causality order is transitive across scopes.

These are ``@cute.jit`` functions: call them from your own ``@cute.kernel`` (a ``bar.sync``
before a post carries the block's writes into it; one after a wait carries the acquire to the
block).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64, Uint32

import ptxops

from .signals import LOCAL, gmem, wait_until


@cute.jit
def post(flags: Int64, index: Int32) -> None:
    """``red.release.gpu.global.add.u32 [flags + 4 * index], 1``: publish everything this
    thread has seen (earlier kernels of its stream included) to the waiter of slot ``index``."""
    ptxops.red(gmem(Uint32, flags, 4, LOCAL, "collectives.device.flags.post") + index, Uint32(1), sem="release", scope="gpu")


@cute.jit
def wait(flags: Int64, consumed: Int64, index: Int32, deadline: Int64) -> Boolean:
    """Poll ``flags[index]`` with ``ld.acquire.gpu`` until it is past ``consumed[index]`` (one
    more post than this consumer has taken) or ``%globaltimer`` passes ``deadline``; then count
    the post as taken (a plain store: only this consumer writes the word, and its later waits
    follow in stream order).  True if the post came; on a timeout nothing is taken."""
    taken = gmem(Uint32, consumed, 4, LOCAL, "collectives.device.flags.wait") + index
    want = ptxops.ld(taken, dtype=Uint32) + Uint32(1)
    ok = wait_until(gmem(Uint32, flags, 4, LOCAL, "collectives.device.flags.wait") + index, want, deadline, "gpu")
    if ok:
        ptxops.st(taken, want)
    return ok


__all__ = ["post", "wait"]
