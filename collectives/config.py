"""The collectives' constants (pure Python): the words host and device share are laid out in
:mod:`collectives.layouts`, each algorithm's formulas are its module's
(:mod:`collectives.algorithms.push`, :mod:`collectives.algorithms.lamport`), and what a kernel is
specialised on is :class:`collectives.algorithms.KernelKey`."""

from __future__ import annotations

from enum import IntEnum

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "barrier")
BACKENDS = ("multicast", "peer", "multicast_emulated")
#: Backends whose kernels take the multicast code paths; ``multicast_emulated`` traces them under
#: :func:`ptxops.emulate_multicast` (unicast accesses to every rank, no multimem): never "auto".
MULTICAST_PATHS = ("multicast", "multicast_emulated")
OPS = ("sum", "min", "max")
#: The PTX reduction operation of each op.
PTX_OP = {"sum": "add", "min": "min", "max": "max"}


VECTOR_BYTES = 16
#: Prepared plans a communicator keeps (least recently used evicted; plans hold no buffers: an
#: all-to-all's launch holds only its split tensors, ``W`` int64 each).
PLAN_CACHE_SIZE = 512
MAX_WORLD = 8
#: Bits of a barrier's 32-bit size word that carry the kinds of the caller's tensors
#: (:attr:`collectives.algorithms.Call.kinds`): the word is ``n ^ signature``, the signature
#: (:func:`collectives.algorithms.base.signature`) holding the kinds at ``KIND_SHIFT`` and the
#: call's collective, dtype and op below them, so that ranks that planned different kernels for
#: one call (their tensors differ in kind) or that make different calls fail it as a size
#: mismatch.
KIND_BITS = 3
KIND_SHIFT = 32 - KIND_BITS
#: Elements a rank's kernel may count in one call (``n``): a barrier's arrival word carries it
#: in the 29 bits below the kinds (and a Lamport size entry in 32), where sizes differing by
#: 2^29 would compare equal.
MAX_ELEMENTS = (1 << KIND_SHIFT) - 1
#: Threads of the barrier collective's one block: a warp (thread ``t`` signals and waits for rank ``t``).
BARRIER_THREADS = 32
#: Bytes per rank a Lamport all-reduce carries at most (the size of each sender's slot in
#: each of the three rotating receive buffers).
LAMPORT_MAX_BYTES = 1 << 20
#: Bytes per rank the Lamport all-gather carries at most: half a slot (each 4 data bytes travel
#: in an 8-byte word with the call's tag, :class:`~collectives.algorithms.lamport_blocks.GatherKernel`).
LAMPORT_GATHER_MAX_BYTES = LAMPORT_MAX_BYTES // 2
#: Thread blocks of every Lamport kernel: a fixed grid, so that each 16-byte vector of a slot
#: always belongs to the same block (whose call count then picks its buffer).
LAMPORT_BLOCKS = 128
#: Lamport element widths: 1-, 2- and 4-byte elements (fp8; bf16 and f16; f32), each with its own
#: receive buffers and call count (:func:`~collectives.algorithms.lamport.width_index`).
LAMPORT_WIDTHS = 3
#: Rotating Lamport receive buffers per element width.
LAMPORT_BUFFERS = 3
#: A Lamport call count runs modulo this multiple of :data:`LAMPORT_BUFFERS` (below 2^32, so a
#: ``Uint32`` pad word holds it and its tag): the buffers then rotate 0, 1, 2, 0, ... across the
#: wrap too.  (2^32 is no multiple of 3: counting modulo 2^32, calls 2^32 - 1 and 2^32 would
#: both use buffer 0, and a fast rank would overwrite a slot a slow rank still reads.)
LAMPORT_CALLS = LAMPORT_BUFFERS << 30


#: Grid sizes, read when a plan is made (so a change takes effect for plans made after it;
#: ``collectives.tools.bench`` times variants as columns of their own): the register-path
#: algorithms launch at most ``BLOCKS_PER_SM`` blocks per SM, the TMA ones at most
#: ``sms // TMA_SM_DIVISOR`` blocks.
BLOCKS_PER_SM = 2
TMA_SM_DIVISOR = 4
#: Vectors each thread of a register-path loop has in flight (a reduction loads ``unroll``
#: vectors of every rank before it stores, a copy ``unroll // 2``): :data:`DEFAULT_UNROLL`, and
#: the push all-reduce's where :func:`collectives.algorithms.tuning.push_unroll` measured more to
#: pay.  ``UNROLL``, where set (a bench variant's), is every key's made from now on (the default of
#: :attr:`KernelKey.unroll <collectives.algorithms.KernelKey>`, the tuned choice overruled).
DEFAULT_UNROLL = 2
UNROLL: int | None = None
#: TMA kernels: shared memory their pipeline may use, and its stages.
TMA_SMEM_BYTES = 192 << 10
TMA_STAGES = 4
#: Nanoseconds a TMA block whose stage missed its deadline still waits for the bulk loads it
#: issued (they write into its shared memory) before it exits.
TMA_DRAIN_NS = 10**9


#: The pipelined push (peer backend) moves each slot in rounds of at least this many grid
#: strides (a stride: one vector per thread of the grid; per block and slice, 2 x 512 threads x
#: 16 bytes = 16 KB), and in at most :data:`PUSH_MAX_ROUNDS` rounds (larger slots take longer
#: rounds), so that a call's signals fit a fixed range of :data:`PUSH_EPOCHS` epochs.
PUSH_ROUND_STRIDES = 2
PUSH_MAX_ROUNDS = 32
#: The most signals a block of a pipelined push emits in a call (:func:`~collectives.algorithms.push.push_events`).
PUSH_EPOCHS = PUSH_MAX_ROUNDS + 1
#: Epochs every collective call takes, whatever its collective, algorithm, size or grid: a
#: rank's pad holds its count of calls ``C`` (a multiple of this, see :func:`call_parity`) and a
#: call's blocks signal epochs ``C + 1`` up to :func:`call_last`; then ``C`` grows by this.  A
#: fixed step per call keeps every rank's ``C`` equal after a call whose sizes, and so grids,
#: rounds or algorithms, differed across ranks.  A power of two above :data:`PUSH_EPOCHS`, so
#: that ``C / CALL_EPOCHS`` alternates in parity across the 2^32 wrap (2^32 is a multiple of
#: twice it).
CALL_EPOCHS = 64
assert CALL_EPOCHS > PUSH_EPOCHS and CALL_EPOCHS & (CALL_EPOCHS - 1) == 0


#: Programmatic dependent launch for the kernels of keys made from now on (the default of
#: :attr:`KernelKey.pdl`; every target CuTeDSL compiles for, sm_90 and newer, has it).
PDL = True


#: Where ``all_gather_gemm`` launches its start (two barriers around the copy of the shard into
#: the workspace): ``"side"`` on the side stream beside this rank's own GEMM, which hides it
#: where the GPU runs the barrier kernels first, but a barrier dispatched after that GEMM's
#: blocks (in a graph, two independent nodes) waits for it to drain, and every pull with it;
#: ``"first"`` on the current stream before the own GEMM (as torch's fused all-gather matmul):
#: the start is exposed, and no pull waits for a GEMM (:mod:`collectives.overlap`).  ``"first"``
#: is the default: on 2 x H200 (docs/data/gemm-overlap-2xH200.json, graphs) it took 203.5 us at
#: M = N = K = 4096 against "side"'s 253.3 (torch's fused op 205.6, the GEMM alone 182.4) and was
#: the faster start at every shape.
OVERLAP_STARTS = ("side", "first")
OVERLAP_START = "first"

#: Eager GEMM overlap (a call not captured into a CUDA graph) splits its GEMM into one block per
#: rank only where the whole GEMM, at :data:`OVERLAP_GEMM_FLOPS`, lasts at least as long as the
#: host takes to issue the blocks, ``W x OVERLAP_EAGER_HOST_US_PER_BLOCK``
#: (:func:`collectives.overlap.eager_blocks`); else it is one GEMM and one collective (the
#: library's reduce-scatter or all-gather), fewer launches than the host could hide.  Captured
#: calls always run the blocks (a replay costs no host time).  On 4 x H200 (tree e88f8b8,
#: docs/data/gemm-overlap-4xH200.json, mode ``host``) an eager call of 4 blocks took 450-670 us
#: of host time, ~150 us a block on that host's slow CPU (4 GEMMs at ~25 us, copies, events,
#: stream switches, 2 barriers), while the GEMM of M = N = K = 4096 takes 180 us: eagerly ours
#: took 572 us (reduce-scatter) and 611 us (all-gather) against 304 and 301 for torch.mm + NCCL.
#: Inf: always one GEMM; 0: always the blocks.
OVERLAP_EAGER_HOST_US_PER_BLOCK = 150.0
#: The GEMM rate (flop/s) :data:`OVERLAP_EAGER_HOST_US_PER_BLOCK` is weighed against: cuBLAS's
#: bf16 on an H200, 733-763 TFLOP/s at the GEMM-overlap bench's shapes (180 us at 4096^3).
OVERLAP_GEMM_FLOPS = 7.5e14

#: How GEMM overlap's blocks cross between GPUs (the reduce-scatter's pushes, the all-gather's
#: pulls): ``"copy"``, torch's ``copy_`` (``cudaMemcpyAsync``); or ``"engine"``,
#: ``cuMemcpyBatchAsync`` with ``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`` (CUDA 12.8+), the
#: driver's hint to keep a copy on a copy engine, off the GEMMs' SMs.  Eager calls only: the
#: driver has no graph node for a batched copy, so a captured call copies with ``"copy"``.  A
#: diagnostic (``gemm_overlap_bench --variants engine``): on 4 x H200 at 4096^3 a block's GEMM
#: took 58 us beside a pull and 50 us alone (``docs/data/overlap-timeline-4xH200.json``).
OVERLAP_COPIES = ("copy", "engine")
OVERLAP_COPY = "copy"

#: Which streams run GEMM overlap's blocks (:mod:`collectives.overlap`): ``"comm"``, every GEMM
#: on the current stream and every peer copy on the side stream (the communication beside the
#: GEMMs, which run one after another); or ``"alternate"``, torch's fused ops' decomposition
#: (``_pipelined_all_gather_and_consume``, ``_pipelined_produce_and_all2all``): a peer block's
#: copy and GEMM on one stream, the side stream for the first peer, the current one for the
#: second, and so on (this rank's own GEMM on the current stream), so that two blocks' GEMMs can
#: run at once (the next one's tiles fill the last wave of the other's) and each copy waits
#: only for its stream's previous GEMM.  The copies are ``cudaMemcpyAsync`` either way (copy
#: engines, a memcpy node of a captured graph).  ``gemm_overlap_bench --variants alternate``.
#: ``"auto"`` (the default): ``"alternate"`` for an all-gather GEMM of at most
#: :data:`~collectives.algorithms.tuning.OVERLAP_ALTERNATE_MAX_MNK`, else ``"comm"``.
OVERLAP_SCHEDULES = ("auto", "comm", "alternate")
OVERLAP_SCHEDULE = "auto"


#: Slots of a communicator's stream flags (:meth:`collectives.runtime.stream_flags.StreamFlags.post`;
#: the GEMM-overlap functions use none).
FLAG_SLOTS = 32


class Slot(IntEnum):
    """The staging slots of a communicator's :class:`~collectives.runtime.staging.StagingPool`, one per use that must not
    share a buffer with another (a rank may rewrite a slot only once no rank still reads it)."""

    #: The single-barrier collectives, in turn (:attr:`~collectives.runtime.communicator.Communicator.turn`, passed on
    #: by every collective launch): a rank rewrites one only after every rank started a later collective.
    TURN_0 = 0
    TURN_1 = 1
    #: The staged collectives that keep their end barrier.
    STAGED = 2
    #: Push reduce-scatters that keep their end barrier: their stores into other ranks' buffers
    #: come before their first barrier, so no collective that reads its buffer after its last
    #: barrier may share it.
    PUSH_REDUCE_SCATTER = 3
    #: Push all-reduces' receive slots: read by other ranks after their last barrier and
    #: pushed into before their first.
    PUSH_ALL_REDUCE = 4
    #: The push all-reduces' result regions, one per owner, apart from the slots the next call
    #: pushes into while other ranks may still read the last one's results.
    PUSH_RESULTS = 5
    #: The GEMM-overlap workspaces (:mod:`collectives.overlap`).
    GEMM_REDUCE_SCATTER = 6
    ALL_GATHER_GEMM = 7
    #: Push all-gathers' receive slots (:mod:`collectives.algorithms.push_gather`): pushed into
    #: before their first wait, read until their last.
    PUSH_ALL_GATHER = 8

#: The largest finite float8_e4m3fn: the MoE dispatch's fp8 quantization maps a token's largest
#: magnitude to it (:func:`collectives.moe.quantize`, and its kernel's steps in
#: :mod:`collectives.device.rounding`).
E4M3_MAX = 448.0
