"""CuTeDSL kernels that run litmus tests with the stress method (needs CuTeDSL, not torch).

One kernel per shape x style (:func:`make_launcher`); the scope (a runtime branch over the
three scoped versions of the test's instructions) and the placement are runtime arguments, so
30 kernels cover the whole catalogue.  A launch runs ``iters`` iterations; in each iteration
every group of role threads runs ``lanes`` independent instances of the test on fresh,
zeroed locations:

* **placement**: ``cta`` (role r of group g is CTA ``r * groups + g``; all 128 threads of a
  CTA play role r), ``warp`` (warp w of a CTA plays role ``w % T`` of group
  ``cta * (4 // T) + w // T``; 32 instances per group), ``gpu`` (as ``cta``, but a launch runs
  only the roles in ``roles_mask``: one rank per role, through peer memory).
* **start together**: each iteration begins with a bounded relaxed rendezvous of the group's
  CTAs (``red.relaxed.sys`` on a per-group counter, then polling ``ld.relaxed.sys``; no
  fences, so it adds no ordering to the test) and ``bar.sync`` in the CTA.
* **thread shuffle**: the instance lane a thread plays changes every iteration (XOR with a
  per-iteration, per-role mask), so different warps/threads meet each time.
* **location shuffle**: instance i's locations sit at slot ``(i * 40503 + k * 7919) mod N`` of
  each location's region (``stride`` words apart), so neighbouring instances share cache
  lines (``stride=1``) and the pairing changes every iteration.
* **random delay**: before its instructions each warp spins a pseudo-random number of LCG
  steps (``0 .. delay_mask``), from a hash of (seed, iteration, CTA, warp): uniform in a warp,
  so no divergence.
* **memory stress**: the CTAs after the test CTAs hammer a scratch buffer with weak loads and
  stores until every test CTA of this launch is done (or the deadline).

Results: every thread stores its registers (weak ``st``) at ``regs[(k * N + i) * R + j]``;
final values stay in the location buffers (``layout.word``); the host builds the
histogram.  ``status[0]`` counts rendezvous that timed out, ``status[1]`` finished test CTAs.
Every wait polls a bounded number of times and gives up at the ``%globaltimer`` deadline.
"""

from __future__ import annotations

from collections.abc import Callable

import cuda.bindings.driver as cuda
import cutlass
from cutlass import Int32, Int64, cute

import ptxops

from . import layout
from .model import SCOPES, Op
from .shapes import SHAPES, LitmusTest

THREADS = layout.THREADS
MAX_SPINS = 1 << 22
PLACEMENT_CODE = layout.PLACEMENT_CODE
WARP = PLACEMENT_CODE["warp"]


def _gptr(addr: Int64, align: int = 4) -> cute.Pointer:
    return cute.make_ptr(Int32, addr, cute.AddressSpace.gmem, assumed_align=align)


@cute.jit
def _rendezvous(counter: cute.Pointer, target: Int32, deadline: Int64) -> Int32:
    """Add 1 to ``counter`` and poll until it reaches ``target`` (relaxed, sys scope: it
    orders nothing).  Returns 1 if it gave up (deadline or MAX_SPINS polls), else 0."""
    ptxops.red(counter, Int32(1), sem="relaxed", scope="sys")
    state = Int32(0)  # 0 polling, 1 seen, 2 gave up
    spins = Int32(0)
    while state == 0:
        v = ptxops.ld(counter, sem="relaxed", scope="sys")
        spins += 1
        if v >= target:
            state = Int32(1)
        else:
            if cute.arch.globaltimer() > deadline:
                state = Int32(2)
            if spins >= MAX_SPINS:
                state = Int32(2)
    return state - 1


def _qualifiers(op: Op) -> dict:
    if op.sem == "weak":
        return {}
    if op.sem == "volatile":
        return {"sem": "volatile"}
    return {"sem": op.sem, "scope": op.scope}


def emit_op(op: Op, ptrs: dict[str, cute.Pointer]):
    """One litmus instruction through ptxops; returns the loaded/old value (or None)."""
    if op.kind == "fence":
        ptxops.fence(sem=op.sem, scope=op.scope)
        return None
    p = ptrs[op.loc]
    if op.kind == "st":
        ptxops.st(p, Int32(op.value), **_qualifiers(op))
        return None
    if op.kind == "ld":
        return ptxops.ld(p, **_qualifiers(op))
    if op.kind == "atom":
        return ptxops.atom(p, Int32(op.value), op=op.rmw, sem=op.sem, scope=op.scope)
    ptxops.red(p, Int32(op.value), op=op.rmw, sem=op.sem, scope=op.scope)
    return None


def make_launcher(shape: str, style: str) -> Callable:
    """The launcher of one shape x style: ``launch(*layout.ARGUMENTS, grid, stream)``."""
    sh = SHAPES[shape]
    scopes = (None,) if style in sh.unscoped else SCOPES
    tests = [LitmusTest(shape, style, s) for s in scopes]
    nthreads = tests[0].nthreads
    locations = tests[0].locations
    nloc = len(locations)
    registers = tests[0].registers
    nreg = max(1, len(registers))
    per_cta = 4 // nthreads  # warp placement: groups per CTA of 4 warps

    def run_role(test: LitmusTest, r: int, ptrs: dict, rbase: cute.Pointer) -> None:
        got = []
        for op in test.threads[r]:
            v = emit_op(op, ptrs)
            if op.reg is not None:
                got.append((registers.index(op.reg), v))
        for j, v in got:  # after the test's instructions, never between them
            ptxops.st(rbase + j, v)

    @cute.kernel
    def litmus_kernel(mem0: Int64, mem1: Int64, regs: Int64, sync: Int64, status: Int64, scratch: Int64,
                      placement: Int32, scope_sel: Int32, roles_mask: Int32, groups: Int32, n_log2: Int32,
                      iters: Int32, iter_base: Int32, stride: Int32, shuffle: Int32, delay_mask: Int32,
                      seed: Int32, test_ctas: Int32, n_active: Int32, scratch_mask: Int32,
                      budget_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        deadline = cute.arch.globaltimer() + budget_ns
        stat = _gptr(status)
        scr = _gptr(scratch)
        junk = seed + tidx
        wid = tidx // 32
        if bidx < test_ctas:
            role = Int32(0)
            group = Int32(0)
            lane = tidx
            lane_mask = Int32(THREADS - 1)
            active = Int32(1)
            cta_runs = Int32(1)
            if placement == WARP:
                role = wid % nthreads
                group = bidx * per_cta + wid // nthreads
                lane = tidx % 32
                lane_mask = Int32(31)
                if wid >= per_cta * nthreads:
                    active = Int32(0)
            else:
                role = bidx // groups
                group = bidx - role * groups
                if ((roles_mask >> role) & 1) == 0:
                    active = Int32(0)
                    cta_runs = Int32(0)
            nmask = (Int32(1) << n_log2) - 1
            n = nmask + 1
            timeouts = Int32(0)
            counter = _gptr(sync) + group * 32
            if cta_runs == 1:
                for k in range(iters):
                    kg = iter_base + k
                    # ---- start the group's CTAs together (orders nothing)
                    if placement != WARP:  # noqa: SIM102  (one DSL branch per dynamic condition)
                        if tidx == 0:
                            timeouts += _rendezvous(counter, (k + 1) * nthreads, deadline)
                    cute.arch.sync_threads()
                    # ---- a pseudo-random delay, the same for the whole warp
                    h = seed ^ (kg * 1103515245 + (bidx * 4 + wid) * 12345 + 1)
                    h = h * 1664525 + 1013904223
                    h = h ^ (h >> 15)
                    h = h * 1664525 + 1013904223
                    d = (h >> 9) & delay_mask
                    for _ in range(d):
                        junk = junk * 1664525 + 1013904223
                    # ---- the test
                    if active == 1:
                        m = (kg * 37 + role * 11) & lane_mask
                        i = group * (lane_mask + 1) + (lane ^ m)
                        slot = i
                        if shuffle != 0:
                            slot = (i * layout.SHUFFLE_MUL + k * layout.SHUFFLE_ADD) & nmask
                        block = k * (n * nloc)
                        ptrs = {}
                        for v, loc in enumerate(locations):
                            word = (block + v * n + slot) * stride
                            ptrs[loc] = _gptr(mem0 if v % 2 == 0 else mem1) + word
                        rbase = _gptr(regs) + (k * n + i) * nreg
                        for r in cutlass.range_constexpr(nthreads):
                            if role == r:
                                if cutlass.const_expr(len(tests) == 1):
                                    run_role(tests[0], r, ptrs, rbase)
                                else:
                                    for si, t in enumerate(tests):
                                        if scope_sel == si:
                                            run_role(t, r, ptrs, rbase)
            if tidx == 0:
                ptxops.red(stat + 0, timeouts)
                ptxops.red(stat + 1, cta_runs, sem="relaxed", scope="gpu")
        else:
            # ---- memory stress until every test CTA of this launch is done
            sidx = bidx - test_ctas
            j = Int32(0)
            running = Int32(1)
            while running == 1:
                for u in cutlass.range_constexpr(8):
                    w = ((j * 8 + u) * 97 + tidx * 33 + sidx * 4099) & scratch_mask
                    if cutlass.const_expr(u % 2 == 0):
                        ptxops.st(scr + w, j)
                    else:
                        junk = junk + ptxops.ld(scr + w)
                j += 1
                if ptxops.ld(stat + 1, sem="relaxed", scope="gpu") >= n_active:
                    running = Int32(0)
                if cute.arch.globaltimer() > deadline:
                    running = Int32(0)
        ptxops.st(scr + ((bidx * THREADS + tidx) & scratch_mask), junk)

    @cute.jit
    def launch(mem0: Int64, mem1: Int64, regs: Int64, sync: Int64, status: Int64, scratch: Int64,
               placement: Int32, scope_sel: Int32, roles_mask: Int32, groups: Int32, n_log2: Int32,
               iters: Int32, iter_base: Int32, stride: Int32, shuffle: Int32, delay_mask: Int32,
               seed: Int32, test_ctas: Int32, n_active: Int32, scratch_mask: Int32,
               budget_ns: Int64, grid: Int32, stream: cuda.CUstream):
        litmus_kernel(mem0, mem1, regs, sync, status, scratch, placement, scope_sel, roles_mask, groups,
                      n_log2, iters, iter_base, stride, shuffle, delay_mask, seed, test_ctas, n_active,
                      scratch_mask, budget_ns).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return launch


def example_arguments(stream=None) -> tuple:
    """Placeholder arguments to compile a launcher without a GPU (addresses unused)."""
    z64, z32 = Int64(0), Int32(0)
    scalars = (z32, z32, Int32(1), Int32(1), Int32(7), Int32(1), z32, Int32(1), Int32(1), Int32(255),
               Int32(1), Int32(2), Int32(2), Int32(1023), Int64(1_000_000_000), Int32(4))
    return (z64,) * 6 + scalars + (stream if stream is not None else cuda.CUstream(0),)


__all__ = ["MAX_SPINS", "THREADS", "emit_op", "example_arguments", "make_launcher"]
