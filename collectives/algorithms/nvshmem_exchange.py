"""The all-to-all's handshake and chunks over NVSHMEM (its ``transport="nvshmem"``:
:class:`collectives.algorithms.all_to_all.NvshmemTransport`), through :mod:`ptxops.nvshmem`; the
NVLink side of the same words is :mod:`collectives.device.all_to_all` (a kernel's block like it,
kept beside the algorithm: it needs nvshmem4py, which the device package does not).

The words, epochs and judging are :mod:`collectives.layouts`'s; what changes is how a word or a
chunk reaches a peer.  NVSHMEM names a peer's memory by *our* address of the symmetric
allocation and the peer's PE (the communicator's rank: its heap is NVSHMEM's, whose PEs are the
ranks, as the host checks), so every remote operand here is our own slot region's or receive
allocation's address, tagged :data:`SYMMETRIC`:

- :func:`post_ready` (receiver -> sender): thread 0 sets the place word with ``signal_op``,
  then ``fence`` (this thread's updates to one PE delivered in issue order), then ``ready`` with
  ``signal_op``: a sender whose acquire sees ``ready`` sees the place;
- :func:`put_part` (sender -> receiver): one block-scope ``put_signal`` (blocking): the CTA's
  threads move the part and NVSHMEM sets its ``arrived`` word after all of it
  (:data:`ptxops.spec.nvshmem.SCOPE_ORDERS`), so the receiver's ``ld.acquire.sys`` of the word
  (:func:`collectives.device.all_to_all.wait_word`, bounded) sees the data; on return the input
  may be reused.  :func:`post_arrived`: the word alone (an empty part, a refused pair).

Inside a node NVSHMEM's device library moves all of it over NVLink; across nodes the same
kernel hands the puts to the NIC (IBGDA: docs/guide-multinode.md).  Importing this module needs
nvshmem4py (:class:`~ptxops.errors.NvshmemMissing` otherwise).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64

from ptxops import nvshmem as nv

from ..device.all_to_all import pack
from ..device.signals import LOCAL, gmem
from ..layouts import ExchangeLayout

#: The reach of NVSHMEM-heap memory named by this PE's address (:func:`ptxops.reach`), which
#: :mod:`ptxops.nvshmem` requires of every remote operand.
SYMMETRIC = "symmetric"


@cute.jit
def post_ready(slots: Int64, rank: Int32, sender: Int32, offset: Int64, size: Uint32, epoch: Uint32,
               world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
    """As receiver ``rank``: the place ``offset``, ``fence``, then ``ready`` (``size``,
    ``epoch``), each by ``signal_op`` into ``sender``'s region (named by ours, ``slots``)."""
    layout = ExchangeLayout(world, parts)
    words = gmem(Uint64, slots, 8, SYMMETRIC, "collectives.algorithms.nvshmem_exchange.post_ready (our slot region)")
    nv.signal_op(words + layout.offset(0) // 2 + rank, Uint64(offset), sender)
    nv.fence()  # the place delivered before ready
    nv.signal_op(words + layout.ready(0) // 2 + rank, pack(size, epoch), sender)


@cute.jit
def arrived_signal(slots: Int64, rank: Int32, part: Int32, world: cutlass.Constexpr,
                   parts: cutlass.Constexpr) -> cute.Pointer:
    """The ``arrived`` word of our (``rank``'s) part ``part`` in every receiver's region, named
    by ours (``slots``)."""
    words = gmem(Uint64, slots, 8, SYMMETRIC, "collectives.algorithms.nvshmem_exchange.arrived_signal (our slot region)")
    return words + ExchangeLayout(world, parts).arrived(0, 0) // 2 + rank * parts + part


@cute.jit
def post_arrived(slots: Int64, rank: Int32, receiver: Int32, part: Int32, size: Uint32, epoch: Uint32,
                 world: cutlass.Constexpr, parts: cutlass.Constexpr) -> None:
    """As sender ``rank``: announce part ``part`` (``size`` elements in all) to ``receiver``
    without data (``signal_op``; one thread)."""
    nv.signal_op(arrived_signal(slots, rank, part, world, parts), pack(size, epoch), receiver)


@cute.jit
def put_part(dtype: cutlass.Constexpr, element: cutlass.Constexpr, src: Int64, dst: Int64, n: Int64, slots: Int64,
             rank: Int32, receiver: Int32, part: Int32, size: Uint32, epoch: Uint32, world: cutlass.Constexpr,
             parts: cutlass.Constexpr) -> None:
    """As sender ``rank``, every thread of the block: ``n`` (> 0) elements of ``dtype``
    (``element`` bytes) from ``src`` (ours) to ``dst`` (our address of the receive allocation)
    on ``receiver``, then part ``part``'s ``arrived`` word (``size``, ``epoch``) there: one
    block-scope ``put_signal``."""
    by = "collectives.algorithms.nvshmem_exchange.put_part"
    nv.put_signal(gmem(dtype, dst, element, SYMMETRIC, by), gmem(dtype, src, element, LOCAL, by),
                  arrived_signal(slots, rank, part, world, parts), pack(size, epoch), receiver, count=n,
                  scope="block")


__all__ = ["SYMMETRIC", "arrived_signal", "post_arrived", "post_ready", "put_part"]
