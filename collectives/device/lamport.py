"""Lamport exchange: data that is its own ready flag.

A receive slot holds negative zero (the sign bit alone, in every lane of the element width)
until the sender's value lands, so a receiver polls the data itself, lane by lane, and needs
no barrier.  A sender replaces each -0.0 of its data by +0.0 (:func:`canonical`) so that no
real value looks unwritten; a sum then differs from IEEE only in the sign of a zero.  Lanes are
compared as bits, never as floats (where -0.0 == +0.0 and a flush-to-zero compare would take a
negative subnormal for -0.0).

Words are ``Uint32`` (four per 16-byte vector) or, for elements past the last whole vector,
one unsigned integer of the element's width.  These are ``@cute.jit`` functions over register
tensors (``cute.make_rmem_tensor``) of such words: call them from your own ``@cute.kernel``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64

import ptxops

from .signals import MULTICAST, PEER, gmem

#: Unsigned carrier of one element of each width, for the elements past the last vector.
CARRIER = {8: cutlass.Uint8, 16: cutlass.Uint16, 32: cutlass.Uint32}


def lanes(carrier_bits: int, bits: int) -> list[tuple[int, int]]:
    """(mask, negative zero) of each ``bits``-wide lane of a ``carrier_bits``-wide word."""
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    return [(mask << shift, sign << shift) for shift in range(0, carrier_bits, bits)]


def negative_zero(carrier_bits: int, bits: int) -> int:
    """A word with -0.0 in every lane: the value of an empty slot."""
    return sum(sign for _, sign in lanes(carrier_bits, bits))


@cute.jit
def canonical(word, bits: cutlass.Constexpr):
    """``word`` with every lane that holds -0.0 set to +0.0."""
    carrier = type(word)
    for mask, sign in lanes(carrier.width, bits):
        if (word & carrier(mask)) == carrier(sign):
            word = word & carrier(~mask & ((1 << carrier.width) - 1))
    return word


@cute.jit
def empty_lanes(word, bits: cutlass.Constexpr) -> Boolean:
    """Whether any lane of ``word`` still holds -0.0 (not yet written)."""
    carrier = type(word)
    empty = Boolean(False)
    for mask, sign in lanes(carrier.width, bits):
        empty = empty | ((word & carrier(mask)) == carrier(sign))
    return empty


@cute.jit
def load_words(words: cute.Tensor, address: Int64, sem: cutlass.Constexpr = None,
               reach: cutlass.Constexpr = PEER) -> None:
    """Fill the register tensor ``words`` from ``address`` (one vector access; ``sem``
    ``"relaxed"`` makes it a relaxed sys-scope load, for polling data other GPUs write;
    ``reach``: a receive slot's, or :data:`~collectives.device.signals.LOCAL` for an input)."""
    n = cutlass.const_expr(cute.size(words))
    carrier = words.element_type
    ptr = gmem(carrier, address, n * carrier.width // 8, reach, "collectives.device.lamport.load_words")
    if cutlass.const_expr(sem is None):
        loaded = ptxops.ld(ptr, num_elements=n)
    else:
        loaded = ptxops.ld(ptr, num_elements=n, sem=sem, scope="sys")
    if cutlass.const_expr(n == 1):
        words[0] = loaded
    else:
        words.store(loaded)


@cute.jit
def send(words: cute.Tensor, addrs, mc: Int64, multicast: cutlass.Constexpr) -> None:
    """Store ``words`` (already canonical) at each address of ``addrs`` with relaxed sys-scope
    stores, or, for a 16-byte vector, once at the multicast address ``mc`` with
    ``multimem.st`` (which has no 8- or 16-bit integer forms: single narrow elements go to
    each peer)."""
    n = cutlass.const_expr(cute.size(words))
    carrier = words.element_type
    if cutlass.const_expr(multicast and n == 4):
        # multimem.st has no integer vectors: move the bits as f32 (nothing is computed).
        bits32 = cute.recast_tensor(words, cutlass.Float32).load()
        ptxops.multimem_st(gmem(cutlass.Float32, mc, 16, MULTICAST, "collectives.device.lamport.send"), bits32,
                           sem="relaxed", scope="sys")
    else:
        value = words.load() if cutlass.const_expr(n > 1) else words[0]
        for r in cutlass.range_constexpr(len(addrs)):
            slot = gmem(carrier, addrs[r], n * carrier.width // 8, PEER, "collectives.device.lamport.send")
            ptxops.st(slot, value, sem="relaxed", scope="sys")


@cute.jit
def wait_slots(slots, addresses, bits: cutlass.Constexpr, deadline: Int64) -> Int32:
    """Poll the slots at ``addresses`` into the register tensors ``slots`` until no lane of any
    holds -0.0, or ``%globaltimer`` passes ``deadline``.  All loads of a round are in flight
    together.  Returns -1 when every slot arrived, else the index of one that did not."""
    missing = Int32(0)
    polling = Boolean(True)
    while polling:
        for q in cutlass.range_constexpr(len(slots)):
            load_words(slots[q], addresses[q], "relaxed")
        missing = Int32(-1)
        for q in cutlass.range_constexpr(len(slots)):
            for i in cutlass.range_constexpr(cute.size(slots[q])):
                if empty_lanes(slots[q][i], bits):
                    missing = Int32(q)
        polling = missing >= 0 and cute.arch.globaltimer() < deadline
    return missing


@cute.jit
def clear(words: cute.Tensor, address: Int64, bits: cutlass.Constexpr) -> None:
    """Mark the slot at ``address`` empty again (-0.0 in every lane)."""
    n = cutlass.const_expr(cute.size(words))
    carrier = words.element_type
    empty = carrier(negative_zero(carrier.width, bits))
    ptr = gmem(carrier, address, n * carrier.width // 8, PEER, "collectives.device.lamport.clear")
    if cutlass.const_expr(n == 1):
        ptxops.st(ptr, empty)
    else:
        ptxops.st(ptr, [empty] * n)


__all__ = ["CARRIER", "canonical", "clear", "empty_lanes", "lanes", "load_words", "negative_zero", "send", "wait_slots"]
