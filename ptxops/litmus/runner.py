"""Host side: run litmus tests on the local GPU (``cta``, ``warp``) or on two GPUs through
peer memory (``gpu``, under torchrun with a ``collectives.init()`` context).  Needs torch,
CuTeDSL and a GPU.

``Runner(placement).run(test, iterations)`` compiles the test's kernel once per shape x style
(CuTeDSL's TVM-FFI call path, as in collectives), launches it until ``iterations``
instance-runs are done (each launch on freshly zeroed locations), builds the histogram of
observed outcomes on the GPU (``torch.unique`` over one row per instance-run) and returns a
:class:`~.classify.Result`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from . import layout
from .classify import Result
from .model import SCOPES
from .shapes import LitmusTest

SCRATCH_WORDS = 1 << 20
#: Compiled kernels, shared by every Runner of the process: (shape, style, arch) -> (compiled, fn).
_KERNELS: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def compile_target() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


class Runner:
    """Runs litmus tests at one placement with one set of stress parameters.

    ``groups``: instance groups per role in ``cta``/``gpu`` placement (a power of two; each
    group is one CTA per role, 128 instances); ``warp_ctas``: CTAs in ``warp`` placement (a
    power of two); ``stride``: words between neighbouring instances' slots (1: 32 instances
    per 128-byte line); ``shuffle``: shuffle instance slots every iteration; ``delay_mask``:
    the largest random delay (LCG steps, ``2**k - 1``); ``stress_ctas``: memory-stress CTAs
    (default: a quarter of the SMs); ``budget_s``: every launch gives up waiting after this.
    """

    def __init__(self, placement: str = "cta", *, ctx: Any = None, groups: int = 32, warp_ctas: int = 128,
                 stride: int = 1, shuffle: bool = True, delay_mask: int = 255, stress_ctas: int | None = None,
                 seed: int = 12345, budget_s: float = 10.0) -> None:
        if placement not in layout.PLACEMENT_CODE:
            raise ValueError(f"placement {placement!r}: one of {tuple(layout.PLACEMENT_CODE)}")
        for name, v in (("groups", groups), ("warp_ctas", warp_ctas)):
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, not {v}")
        if delay_mask < 0 or delay_mask & (delay_mask + 1):
            raise ValueError(f"delay_mask must be 2**k - 1, not {delay_mask}")
        self.placement = placement
        self.ctx = ctx
        if placement == "gpu":
            if ctx is None:
                raise ValueError("placement 'gpu' needs a collectives context: run under torchrun "
                                 "and pass ctx=collectives.init()")
            if ctx.world_size != 2:
                raise ValueError(f"placement 'gpu' runs on exactly 2 GPUs, not {ctx.world_size}")
            self.rank, self.world = ctx.rank, ctx.world_size
        else:
            self.rank, self.world = 0, 1
        self.groups, self.warp_ctas, self.stride, self.shuffle = groups, warp_ctas, stride, shuffle
        self.delay_mask, self.seed, self.budget_s = delay_mask, seed, budget_s
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.device_name = props.name
        self.stress_ctas = max(0, props.multi_processor_count // 4 if stress_ctas is None else stress_ctas)
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.scratch = torch.zeros(SCRATCH_WORDS, dtype=torch.int32, device=self.dev)

    # -- kernels ------------------------------------------------------------------------
    def kernel(self, test: LitmusTest) -> Any:
        """The compiled kernel of ``test``'s shape x style, as the TVM-FFI function."""
        key = (*test.kernel_key(), compile_target())
        if key not in _KERNELS:
            from cutlass import cute

            from .kernels import example_arguments, make_launcher

            compiled = cute.compile[cute.GPUArch(key[2])](
                make_launcher(*key[:2]), *example_arguments(), options="--enable-tvm-ffi")
            _KERNELS[key] = (compiled, compiled.__tvm_ffi_object__())
        return _KERNELS[key][1]

    def geometry(self, test: LitmusTest) -> dict[str, int]:
        """Instances per iteration ``n``, test CTAs, CTAs running here, roles mask."""
        t = test.nthreads
        if self.placement == "warp":
            per_cta = 4 // t
            n = self.warp_ctas * per_cta * 32
            return {"n": n, "groups": self.warp_ctas, "test_ctas": self.warp_ctas,
                    "n_active": self.warp_ctas, "roles_mask": (1 << t) - 1}
        roles = [r for r in range(t) if r % self.world == self.rank]
        return {"n": self.groups * layout.THREADS, "groups": self.groups, "test_ctas": t * self.groups,
                "n_active": len(roles) * self.groups, "roles_mask": sum(1 << r for r in roles)}

    # -- buffers ------------------------------------------------------------------------
    def _alloc(self, words: int) -> torch.Tensor:
        if self.placement == "gpu":
            return self.ctx.empty(words, torch.int32)
        return torch.empty(words, dtype=torch.int32, device=self.dev)

    def _free(self, *ts: torch.Tensor) -> None:
        if self.placement == "gpu":
            for t in ts:
                self.ctx.free(t)

    def _barrier(self) -> None:
        if self.placement == "gpu":
            self.ctx.host_barrier()
        else:
            torch.cuda.synchronize()

    # -- running ------------------------------------------------------------------------
    def run(self, test: LitmusTest, iterations: int = 1_000_000) -> Result:
        """Run ``test`` for at least ``iterations`` instance-runs; return the histogram."""
        fn = self.kernel(test)
        g = self.geometry(test)
        n, nloc = g["n"], len(test.locations)
        nreg, nobs = max(1, len(test.registers)), len(test.registers)
        per_launch = layout.max_iters(n, nloc, self.stride)
        total_iters = max(1, math.ceil(iterations / n))
        iters_cap = min(per_launch, total_iters)
        words = layout.words_per_launch(iters_cap, n, nloc, self.stride)
        mem = self._alloc(words)
        regs = self._alloc(iters_cap * n * nreg)
        sync = self._alloc(g["groups"] * 32)
        status = torch.zeros(2, dtype=torch.int32, device=self.dev)
        scope_sel = SCOPES.index(test.scope) if test.scope else 0
        hist: dict[tuple[int, ...], int] = {}
        timeouts = 0
        start = time.perf_counter()
        done = 0
        try:
            self._barrier()
            while done < total_iters:
                iters = min(iters_cap, total_iters - done)
                mem.zero_()
                regs.fill_(-1)
                sync.zero_()
                status.zero_()
                self._barrier()  # every rank's buffers are clean before anyone writes
                mems = self._peer(mem)
                mem0, mem1 = mems[0].data_ptr(), mems[1 % len(mems)].data_ptr()
                sync_ptr = self._peer(sync)[0].data_ptr()
                fn(mem0, mem1, regs.data_ptr(), sync_ptr, status.data_ptr(), self.scratch.data_ptr(),
                   layout.PLACEMENT_CODE[self.placement], scope_sel, g["roles_mask"], g["groups"],
                   int(math.log2(n)), iters, done, self.stride, int(self.shuffle), self.delay_mask,
                   (self.seed * 7919 + done) & 0x7FFFFFFF, g["test_ctas"], g["n_active"],
                   SCRATCH_WORDS - 1, int(self.budget_s * 1e9), g["test_ctas"] + self.stress_ctas,
                   torch.cuda.current_stream().cuda_stream)
                self._barrier()  # every rank's launch finished
                rows = self._rows(test, mems, regs, iters, n, nreg, nobs)
                values, counts = torch.unique(rows, dim=0, return_counts=True)
                for row, c in zip(values.tolist(), counts.tolist()):
                    key = tuple(row)
                    hist[key] = hist.get(key, 0) + c
                timeouts += int(status[0])
                self._barrier()  # everyone has read the peers' buffers before the next zeroing
                done += iters
        finally:
            self._free(sync, regs, mem)
        seconds = time.perf_counter() - start
        params = {"device": self.device_name, "world": self.world, "n_per_iteration": n,
                  "test_ctas": g["test_ctas"], "stress_ctas": self.stress_ctas, "stride": self.stride,
                  "shuffle": self.shuffle, "delay_mask": self.delay_mask, "seed": self.seed,
                  "iterations_per_launch": iters_cap}
        return Result(test, self.placement, hist, done * n, seconds, timeouts, params)

    def _peer(self, t: torch.Tensor) -> list[torch.Tensor]:
        """``t`` as every rank's copy (two GPUs), or ``[t]``."""
        if self.placement == "gpu":
            return self.ctx.peer_tensors(t)
        return [t]

    def _rows(self, test: LitmusTest, mems: list[torch.Tensor], regs: torch.Tensor, iters: int, n: int,
              nreg: int, nobs: int) -> torch.Tensor:
        """One row per instance-run: its registers, then the final values it observes."""
        cols = []
        if nobs:
            r = regs[: iters * n * nreg]
            if self.placement == "gpu":  # each rank wrote the registers of its own roles
                r = torch.maximum(*(p[: iters * n * nreg].to(self.dev) for p in self.ctx.peer_tensors(regs)))
            cols.append(r.view(iters * n, nreg)[:, :nobs])
        if test.finals:
            k = torch.arange(iters, device=self.dev, dtype=torch.int64)[:, None]
            i = torch.arange(n, device=self.dev, dtype=torch.int64)[None, :]
            nloc = len(test.locations)
            for loc in test.finals:
                v = test.locations.index(loc)
                idx = layout.word(k, i, v, n, nloc, self.stride, self.shuffle).reshape(-1)
                buf = mems[v % len(mems)].to(self.dev) if len(mems) > 1 else mems[0]
                cols.append(buf[idx][:, None])
        return torch.cat(cols, dim=1)


__all__ = ["Runner", "compile_target"]
