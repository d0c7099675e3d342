"""Size-based choices for ``algorithm="auto"`` and for staging, from measured crossovers (the
Lamport reduce-scatter's and all-gather's are estimates until measured: :data:`RS_LAMPORT_MAX`).

Measured on 2026-11-21 with ``torchrun --nproc-per-node {2,4} -m collectives.tools.bench --dtypes bf16``
on NVIDIA H200 (NVLink NV18 full mesh, multicast off, peer backend), eager launches and CUDA
graphs.  All-reduce: Lamport was fastest up to 1 MB on 2 GPUs and up to 256 KB on 4; above
that two-shot and TMA tie within noise (TMA ahead from 4 MB on 2 GPUs, 16 MB on 4, using at
most a quarter of the SMs), and one-shot no longer wins anywhere Lamport does not.
Reduce-scatter: one-shot up to 16 MB, TMA from 64 MB.
8 GPUs and the multicast backend were not measurable here (no 8-GPU machine; multicast is off
on these machines): their entries extrapolate from the measured ones (one-shot reads W-1
remote copies per element, so its crossovers fall as W grows).
"""

from __future__ import annotations

from .. import config
from ..config import LAMPORT_GATHER_MAX_BYTES, LAMPORT_MAX_BYTES

#: (backend, world size) -> largest message (bytes per rank) for which Lamport is chosen.
LAMPORT_MAX: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 20,
    ("peer", 4): 256 << 10,
    ("peer", 8): 64 << 10,
    ("multicast", 2): 1 << 20,
    ("multicast", 4): 256 << 10,
    ("multicast", 8): 64 << 10,
}

#: (backend, world size) -> largest message (bytes per rank) for which one-shot is chosen
#: (on 2 and 4 GPUs Lamport covers every size where one-shot won, so it is never picked there).
ONE_SHOT_MAX: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 20,
    ("peer", 4): 256 << 10,
    ("peer", 8): 8 << 10,
    ("multicast", 2): 4 << 20,
    ("multicast", 4): 256 << 10,
    ("multicast", 8): 128 << 10,
}

#: (backend, world size) -> smallest message (bytes per rank) from which TMA is chosen
#: (over two-shot) for 16-byte aligned tensors.
TMA_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 4 << 20,
    ("peer", 4): 16 << 20,
    ("peer", 8): 16 << 20,
    ("multicast", 2): 4 << 20,
    ("multicast", 4): 16 << 20,
    ("multicast", 8): 16 << 20,
}

#: Smallest reduce-scatter input (bytes per rank) from which TMA is chosen over one-shot.
RS_TMA_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 64 << 20,
    ("peer", 4): 64 << 20,
    ("peer", 8): 64 << 20,
    ("multicast", 2): 64 << 20,
    ("multicast", 4): 64 << 20,
    ("multicast", 8): 64 << 20,
}

#: (backend, world size) -> largest reduce-scatter input (bytes per rank) for which the Lamport
#: reduce-scatter (:mod:`collectives.algorithms.lamport_blocks`) is chosen, symmetric or not.
#: Measured 2026-11-28 on 4 x H100 (``torchrun --nproc-per-node 4 -m collectives.tools.bench
#: --dtypes bf16``, docs/data/bench-4xH100.json): Lamport ahead at every size it takes, up to 4 MB
#: (graphs 3.0-3.6 us at 4-256 KB vs one-shot 9.5-11.2; 13.8 vs 22.5 us at 4 MB; eagerly 20.0 vs
#: 24.2 at 4 MB).  2 and 8 GPUs: estimates from the Lamport all-reduce, not yet measured.
RS_LAMPORT_MAX: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 20,
    ("peer", 4): 4 << 20,
    ("peer", 8): 512 << 10,
    ("multicast", 2): 1 << 20,
    ("multicast", 4): 4 << 20,
    ("multicast", 8): 512 << 10,
}

#: (backend, world size) -> largest all-gather output (bytes per rank) for which ``auto`` picks
#: the Lamport all-gather (bit-exact: tagged 8-byte words, each carrying 4 data bytes).
#: Measured 2026-11-28 on 2 x H200 (``torchrun --nproc-per-node 2 -m collectives.tools.bench
#: --dtypes bf16``, docs/data/bench-2xH200.json): the tagged kernel ahead of one-shot in graphs
#: at every size it takes, 4 KB-1 MB of output (3.0-3.5 us at 4-256 KB vs 5.0-6.2; 5.8 vs 7.5
#: at 1 MB, eagerly 10.7 vs 10.4 there), symmetric or not.  On 4 x H200 (the same bench,
#: docs/data/bench-4xH200.json, tree 3f33ec4) it was ahead in graphs at every size measured up to
#: 1 MB (3.2-4.1 us at 4-256 KB vs one-shot 5.2-7.0; 8.2 vs 9.0 at 1 MB); 2 MB, the most its
#: block limit allows at 4 ranks (:data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`), was not
#: measured, so the entry stops at 1 MB.  8 GPUs: an estimate (a quarter of 4's), not measured.
AG_LAMPORT_MAX: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 20,
    ("peer", 4): 1 << 20,
    ("peer", 8): 256 << 10,
    ("multicast", 2): 1 << 20,
    ("multicast", 4): 1 << 20,
    ("multicast", 8): 256 << 10,
}

#: (backend, world size) -> smallest all-gather output (bytes per rank) outside symmetric memory
#: from which ``auto`` picks the push all-gather (:mod:`collectives.algorithms.push_gather`: its
#: copies out overlap the NVLink stores) over one-shot.  Measured 2026-11-29 on 2 x H200
#: (docs/data/bench-2xH200.json, tree 156fdf8 + the copy-out unroll; us, graph / eager): ahead at
#: 256 MB (398.9 / 401.3 vs one-shot 436.5 / 437.8) and 64 MB (110.3 / 117.7 vs 117.4 / 122.7),
#: behind at 16 MB (39.9 / 41.5 vs 38.8 / 38.5).  On 4 x H200 (docs/data/bench-4xH200.json, tree
#: be08ba1, 2026-11-29; the copy out three quarters of the output): ahead at 256 MB (605.9 / 614.2
#: vs 675.0 / 689.7) and 64 MB (167.4 / 177.5 vs 182.5 / 189.1), tied at 16 MB (53.7 / 62.3 vs
#: 52.1 / 63.8).  8 GPUs not measured: never there; nor with multicast (the push all-gather runs
#: on the peer backend only).
AG_PLAIN_PUSH_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 64 << 20,
    ("peer", 4): 64 << 20,
    ("peer", 8): 1 << 62,
    ("multicast", 2): 1 << 62,
    ("multicast", 4): 1 << 62,
    ("multicast", 8): 1 << 62,
}

#: (backend, world size) -> the all-gather outputs (bytes per rank, from, to) of a symmetric,
#: 16-byte aligned output for which ``auto`` picks TMA over one-shot.  Measured on 4 x H200 in
#: three runs (docs/data/bench-4xH200.json of trees e88f8b8, 3f33ec4, 5dbb7ad; graphs, us): TMA
#: ahead at 16 MB in each (48.2 / 47.0 / 45.9 vs one-shot 53.0 / 49.7 / 50.7), tied at 4 MB (17.3 /
#: 16.8 / 17.5 vs 17.2 / 17.1 / 17.3), behind at 64 MB (162.2 / 162.4 / 159.9 vs 161.7 / 158.4 /
#: 157.0) and 256 MB; on 2 x H200 one-shot ahead or tied at every size (16 MB: 33.4 vs 32.1), and
#: on plain outputs TMA loses everywhere (its copy-out runs on the quarter of the SMs it has:
#: 65.9 vs 60.2 at 16 MB on 4 x H200).  The window covers the measured size, up to the next one
#: where TMA lost; none where not measured (8 GPUs, multicast).
AG_TMA_WINDOW: dict[tuple[str, int], tuple[int, int]] = {
    ("peer", 2): (0, -1),
    ("peer", 4): (16 << 20, 32 << 20),
    ("peer", 8): (0, -1),
    ("multicast", 2): (0, -1),
    ("multicast", 4): (0, -1),
    ("multicast", 8): (0, -1),
}

#: (backend, world size) -> largest all-reduce (bytes per rank) of a tensor outside symmetric
#: memory for which one-shot (staging in-kernel) is chosen over push.  Measured 2026-11-23 on
#: 2 x H200 with the pipelined push that stores its results: one-shot 68.2 / 63.0 us vs push
#: 73.7 / 70.1 at 16 MB (eager / graph), push ahead from 64 MB (209.9 vs 244.2 us; 776 vs 944
#: at 256 MB).  The push with 4 loads in flight (three 2 x H200 runs since, docs/data/
#: bench-2xH200.json of trees 9e61878, 5723ac3, d1a9677; graphs, us) was ahead at 16 MB in each
#: (61.6 / 58.3 / 59.5 vs one-shot 66.0 / 64.2 / 66.8) and tied or ahead at 4 MB (21.3 / 21.0 /
#: 22.1 vs 21.8 / 22.5 / 22.1); a fourth (2026-11-29, tree 156fdf8) had them tied at 16 MB (63.0 vs
#: 63.4) and split at 4 MB (graph 21.1 vs 22.3, eagerly 22.8 vs 20.4 with the bursts apart), so the
#: crossover is put at 4 MB.  On 4 GPUs (2026-11-22, the earlier push) push was the fastest plain
#: algorithm from 1 MB (16.9 us vs two-shot staged 18.0) to 256 MB (1300 vs 1562 us), so one-shot's
#: own crossover (inside Lamport's range) stands there; 8 GPUs extrapolated.
PLAIN_ONE_SHOT_MAX: dict[tuple[str, int], int] = {
    ("peer", 2): 4 << 20,
    ("peer", 4): 256 << 10,
    ("peer", 8): 8 << 10,
    ("multicast", 2): 4 << 20,
    ("multicast", 4): 256 << 10,
    ("multicast", 8): 128 << 10,
}

#: (backend, world size) -> smallest all-reduce (bytes per rank) of a symmetric tensor from which
#: push is chosen over two-shot and TMA.  Measured 2026-11-28 on 4 x H100 (docs/data/
#: bench-4xH100*.json): push stores only, where two-shot and TMA read 0.75 S over NVLink, and
#: was ahead from 64 MB (plain push 316 vs TMA 323 us in graphs; on symmetric tensors at 256 MB
#: 1165 vs 1240, eagerly 1164 vs 1244); at 16 MB TMA was ahead (92.6 vs 97.7).  On 2 x H200
#: (docs/data/bench-2xH200.json, tree d1a9677) push was ahead from 64 MB too (graph / eager: 202.9 /
#: 209.7 us vs TMA 205.3 / 219.2 and two-shot 206.8 / 212.8; at 256 MB 764.6 / 768.0 vs TMA 791.3 /
#: 799.8), behind at 16 MB (59.2 vs TMA 57.6 in a graph).  Not measured on 8 GPUs, nor with
#: multicast (whose two-shot reduces in the switch): never there.  On 4 GPUs from 16 MB since
#: 2026-11-29: there the push all-reduce unrolled 4 (:data:`PUSH_UNROLL4_MIN`) was ahead of TMA
#: (87.3 vs 90.8 us on 4 x H200, 91.6 vs 93.4 on 4 x H100, graphs).
SYMMETRIC_PUSH_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 64 << 20,
    ("peer", 3): 64 << 20,  # (as before: the push unrolled 4 was measured on 4 GPUs only)
    ("peer", 4): 16 << 20,
    ("peer", 8): 1 << 62,
    ("multicast", 2): 1 << 62,
    ("multicast", 4): 1 << 62,
    ("multicast", 8): 1 << 62,
}

#: (backend, world size) -> smallest all-reduce (bytes per rank) from which the push all-reduce
#: keeps 4 vectors of every rank in flight a thread (:func:`push_unroll`; below it, and elsewhere,
#: :data:`~collectives.config.DEFAULT_UNROLL`).  On 4 GPUs its ``_u4`` bench column was our fastest
#: all-reduce from 16 MB on in every run (graph, us, symmetric / plain, against the default's push):
#: 4 x H200 (docs/data/bench-4xH200.json, tree be08ba1, 2026-11-29) 87.3 / 86.1 vs 96.4 / 95.7 at
#: 16 MB (and TMA, auto's pick then for a symmetric tensor, 90.8), 310.6 / 309.0 vs 314.9 / 313.7 at
#: 64 MB, 1171.4 / 1167.4 vs 1185.7 / 1181.7 at 256 MB (eagerly 92.5 vs 96.7 at 16 MB); 4 x H200
#: tree e88f8b8 88.8 vs 98.2 and 4 x H100 (docs/data/bench-4xH100.json) 91.6 / 89.0 vs 92.0 at
#: 16 MB, 310.2 / 310.5 vs 320.6 / 321.3 at 64 MB.  Why (the kernel's CPU simulation,
#: tests/collectives/device/test_push_source.py): a push round is two grid strides for every slot
#: of up to 64 strides, so the 4-vector loop itself never runs at these sizes; unrolled 4 the
#: kernel takes 60 registers a thread, not 86, so two 512-thread blocks fit an SM and its 264
#: blocks run in one wave.  On 2 x H200 it was slower at every size (70.3 vs 60.6 us at 16 MB,
#: 770.5 vs 763.9 at 256 MB): 2 at W = 2.  W = 3 and 8 and multicast not measured: 2 there.
PUSH_UNROLL4_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 1 << 62,
    ("peer", 3): 1 << 62,
    ("peer", 4): 16 << 20,
    ("peer", 8): 1 << 62,
    ("multicast", 2): 1 << 62,
    ("multicast", 4): 1 << 62,
    ("multicast", 8): 1 << 62,
}

#: (backend, world size) -> smallest reduce-scatter input (bytes per rank) of a symmetric tensor
#: from which push is chosen over one-shot and TMA.  Measured 2026-11-28 on 4 x H200
#: (docs/data/bench-4xH200.json, tree e88f8b8): at 256 MB push 601.3 / 604.4 us vs TMA 621.0 /
#: 632.2 (graph / eager); at 64 MB they tie (push 172.0 / 169.4, TMA 169.4 / 175.8), so the
#: crossover is put between.  The same bench of tree 3f33ec4 there had push ahead at 16 MB as well
#: (50.7 / 55.3 us vs one-shot 53.4 / 59.6, graph / eager) and tying at 64 MB (166.8 / 170.7 vs TMA
#: 166.5 / 171.5), so on 4 GPUs push from 16 MB.  On 2 x H200 (tree d1a9677) push was ahead at
#: 256 MB (401.7 / 401.4 vs TMA 409.4 / 413.0) and behind at 64 MB (117.2 / 116.3 vs 110.0 /
#: 114.4): the crossover between.  Not measured on 8 GPUs, nor with multicast.
RS_SYMMETRIC_PUSH_MIN: dict[tuple[str, int], int] = {
    ("peer", 2): 128 << 20,
    ("peer", 4): 16 << 20,
    ("peer", 8): 1 << 62,
    ("multicast", 2): 1 << 62,
    ("multicast", 4): 1 << 62,
    ("multicast", 8): 1 << 62,
}

#: The largest all-gather GEMM (``M x N x K``, M the gathered rows) that GEMM overlap runs in the
#: ``"alternate"`` schedule when :data:`~collectives.config.OVERLAP_SCHEDULE` is ``"auto"`` (larger
#: ones, and every GEMM reduce-scatter: ``"comm"``).  Measured 2026-11-28 with
#: ``gemm_overlap_bench --variants ...,alternate`` (bf16, 4 blocks, graphs, us, comm / alternate):
#: on 4 x H200 (docs/data/gemm-overlap-4xH200.json) 210.8 / 203.1 at 4096^3, 806.9 / 801.3 at
#: 4096 x 8192^2, 824.6 / 777.5 at 16384 x 4096^2, 3290.7 / 3423.3 at 16384 x 8192^2; on 2 x H200
#: (docs/data/gemm-overlap-2xH200.json) 204.5 / 198.3, 791.4 / 771.3, 816.8 / 788.3, 3421.2 /
#: 3452.9.  The GEMM reduce-scatter lost every row in the alternate schedule on both machines
#: (4 x H200: 206.5 / 246.7 at 4096^3, 3356.3 / 3536.9 at 16384 x 8192^2).
OVERLAP_ALTERNATE_MAX_MNK = 1 << 38

#: World size -> CUDA priority of GEMM overlap's side stream (:func:`overlap_side_priority`;
#: lower is higher, torch maps it into the device's range), where measured apart from the
#: default, :data:`~collectives.runtime.stream_flags.SIDE_PRIORITY` (-1: the side stream's
#: one-block barriers dispatched ahead of a running GEMM's pending blocks).  On 2 x H200 the side
#: stream of default priority (``gemm_overlap_bench --comm-priority 0``, ``ours_prio0``) was the
#: faster in six runs of six trees (docs/data/gemm-overlap-2xH200.json and its history, graphs,
#: its time over the default's): all-gather GEMM 4096 x 8192^2 0.935-0.986 (every run), 16384 x
#: 4096^2 0.953-1.013, 16384 x 8192^2 0.976-1.013; GEMM reduce-scatter 4096 x 8192^2 0.939-1.013,
#: 16384 x 4096^2 0.936-1.011, and behind at 16384 x 8192^2 (0.988-1.051); 4096^3 1.00 both ops;
#: about 1 % less time over the eight shapes on average.  On 4 GPUs (five 4 x H200 runs, one
#: 4 x H100) it was as often behind as ahead (0.940-1.045): -1 stays there.
OVERLAP_SIDE_PRIORITY: dict[int, int] = {2: 0}


#: reduce_scatter stages inputs up to this size (bytes per rank) even when they are symmetric:
#: the in-kernel copy costs less than the end barrier it saves.
STAGE_MAX_BYTES = 4 << 20


def _lookup(table: dict[tuple[str, int], int], backend: str, world: int) -> int:
    """The entry for (backend, world); world sizes without one use the next larger measured one."""
    backend = "multicast" if backend == "multicast_emulated" else backend  # the same kernels
    sizes = sorted(w for b, w in table if b == backend)
    return table[(backend, next((w for w in sizes if w >= world), sizes[-1]))]


def default_unroll() -> int:
    """The ``unroll`` of a kernel key made now without one: :data:`~collectives.config.UNROLL`
    where set (a bench variant's), else :data:`~collectives.config.DEFAULT_UNROLL`."""
    return config.UNROLL or config.DEFAULT_UNROLL


def push_unroll(world: int, nbytes: int, backend: str) -> int:
    """The ``unroll`` of a push all-reduce of ``nbytes`` per rank: 4 from :data:`PUSH_UNROLL4_MIN`
    on unless a bench variant sets :data:`~collectives.config.UNROLL`, else :func:`default_unroll`."""
    if config.UNROLL is None and nbytes >= _lookup(PUSH_UNROLL4_MIN, backend, world):
        return 4
    return default_unroll()


def overlap_side_priority(world: int, default: int) -> int:
    """The CUDA priority of the side stream of GEMM overlap in a communicator of ``world`` ranks:
    :data:`OVERLAP_SIDE_PRIORITY`'s, else ``default``."""
    return OVERLAP_SIDE_PRIORITY.get(world, default)


def lamport_blocks(table: dict[tuple[str, int], int], world: int, nbytes: int, backend: str,
                   block_max: int = LAMPORT_MAX_BYTES) -> bool:
    """Whether a reduce-scatter's input or an all-gather's output of ``nbytes`` takes Lamport by
    ``table``: at most its entry, and a block (``nbytes / world``) of at most ``block_max`` (a
    slot; the all-gather's: :data:`~collectives.config.LAMPORT_GATHER_MAX_BYTES`)."""
    return nbytes <= min(_lookup(table, backend, world), world * block_max)


def all_reduce_algorithm(world: int, nbytes: int, backend: str, aligned: bool = True,
                         symmetric: bool = True) -> str:
    """Lamport up to its crossover, then one-shot; past that, for a tensor outside symmetric
    memory push (no staging copy in or out: two-shot and TMA staged lost to it, 1094 and 1820
    vs 875 us at 256 MB on 2 x H200), and for a symmetric one two-shot, or TMA from its
    crossover on (16-byte aligned), or push from :data:`SYMMETRIC_PUSH_MIN` on."""
    if nbytes <= min(_lookup(LAMPORT_MAX, backend, world), LAMPORT_MAX_BYTES):
        return "lamport"
    if not symmetric:
        return "one_shot" if nbytes <= _lookup(PLAIN_ONE_SHOT_MAX, backend, world) else "push"
    if nbytes <= _lookup(ONE_SHOT_MAX, backend, world):
        return "one_shot"
    if nbytes >= _lookup(SYMMETRIC_PUSH_MIN, backend, world):
        return "push"
    if aligned and nbytes >= _lookup(TMA_MIN, backend, world):
        return "tma"
    return "two_shot"


def reduce_scatter_algorithm(world: int, nbytes: int, backend: str, aligned: bool = True,
                             symmetric: bool = True) -> str:
    """Lamport up to its crossover (it reads the input where it lies); then push for an input
    outside symmetric memory (no staging copy; TMA's crossovers were measured on symmetric
    inputs); else one-shot, or TMA from its crossover on (16-byte aligned tensors and output
    size), or push from :data:`RS_SYMMETRIC_PUSH_MIN` on."""
    if lamport_blocks(RS_LAMPORT_MAX, world, nbytes, backend):
        return "lamport"
    if not symmetric or nbytes >= _lookup(RS_SYMMETRIC_PUSH_MIN, backend, world):
        return "push"
    if aligned and nbytes >= _lookup(RS_TMA_MIN, backend, world):
        return "tma"
    return "one_shot"


def all_gather_algorithm(world: int, nbytes: int, backend: str, aligned: bool = True,
                         symmetric: bool = True) -> str:
    """Lamport up to its crossover (:data:`AG_LAMPORT_MAX`), then one-shot, but push for an
    output outside symmetric memory from :data:`AG_PLAIN_PUSH_MIN` and TMA for a symmetric,
    16-byte aligned output inside :data:`AG_TMA_WINDOW`.  Measured 2026-11-23 on 2 x
    H200 (``collectives.tools.all_gather_bench``, bf16, 4 KB-256 MB of output per rank, eager and
    graphs): TMA never beat one-shot by more than noise on symmetric tensors (16 MB graph 34.5 vs
    37.0 us; 256 MB 409 vs 376-380 us, 8% slower) and lost badly on plain ones (926 vs 497-509 us
    at 256 MB: its copy-out runs on the quarter of the SMs it is given); 4 GPUs: the window."""
    if lamport_blocks(AG_LAMPORT_MAX, world, nbytes, backend, LAMPORT_GATHER_MAX_BYTES):
        return "lamport"
    if not symmetric and nbytes >= _lookup(AG_PLAIN_PUSH_MIN, backend, world):
        return "push"
    low, high = _lookup(AG_TMA_WINDOW, backend, world)
    if symmetric and aligned and low <= nbytes <= high:
        return "tma"
    return "one_shot"


def choose(call) -> str:
    """The algorithm ``algorithm="auto"`` picks for ``call`` (a
    :class:`~collectives.algorithms.Call`): an all-reduce counts as symmetric only when it
    reduces a symmetric tensor in place."""
    if call.collective == "all_reduce":
        return all_reduce_algorithm(call.world, call.nbytes, call.backend, call.aligned,
                                    call.in_place and call.symmetric)
    if call.collective == "reduce_scatter":
        return reduce_scatter_algorithm(call.world, call.nbytes, call.backend, call.aligned, call.symmetric)
    return all_gather_algorithm(call.world, call.nbytes, call.backend, call.aligned, call.symmetric)
