"""The Python API: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``all_to_all``, ``barrier``, ``empty``,
``synchronize``.

Collectives run on the current torch stream and are capturable in a CUDA graph once warmed up
(one eager call with the same tensors compiles the kernel and builds its plan).  A tensor from
:func:`empty` lives in symmetric memory and goes zero-copy; any other CUDA tensor is staged
through an internal symmetric buffer by the kernel itself.  Each distinct call (tensors,
dtype, op, algorithm, backend) is planned once; later calls only launch.  Traced by
``torch.compile``, each function records its custom operator (:mod:`collectives.runtime.torch_ops`)
instead of running (on the default communicator: ``group=None``).

A size mismatch across ranks, which kernels record, is raised by :func:`synchronize` or by the
first later call that reads the record, after that call's own launch (ranks read it at
different calls; every rank still makes every call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import config
from .algorithms import REGISTRY, Call, tuning
from .algorithms.all_to_all import AllToAllCall
from .algorithms.base import algorithms
from .algorithms.plan import capturing as _capturing
from .config import BACKENDS, COLLECTIVES, OPS, VECTOR_BYTES
from .dtypes import from_torch
from .errors import CollectiveError
from .runtime import all_to_all as exchange
from .runtime import torch_ops
from .runtime.communicator import Communicator, Group, communicator, traceable
from .symmetric.context import address


def empty(shape: int | tuple[int, ...], dtype: torch.dtype = torch.float32, *, group: Group = None) -> torch.Tensor:
    """A tensor in ``group``'s symmetric memory (collective over the group: every rank asks for
    the same shape); zero-copy in that group's collectives.  ``group``, in every function here:
    None (every rank), a ``torch.distributed`` ProcessGroup or one-dimensional DeviceMesh
    (its communicator opened on first use: :func:`collectives.init`), a context from
    ``collectives.init(group=...)`` or a :class:`~collectives.runtime.communicator.Communicator`."""
    return communicator(group).ctx.empty(shape, dtype)


def synchronize(group: Group = None) -> None:
    """Wait for this rank's queued collectives and raise any error a kernel of ``group``'s
    communicator recorded (:class:`~collectives.CollectiveTimeout`, size mismatch across ranks)."""
    torch.cuda.current_stream().synchronize()
    communicator(group).errors.check()


def barrier(backend: str = "auto", *, group: Group = None) -> None:
    """A device-side barrier of every rank on the current stream (no host sync; a rank that
    never arrives surfaces as CollectiveTimeout at the next collective or :func:`synchronize`).
    ``backend`` as for :func:`all_reduce`."""
    if _compiling():
        _check_options("barrier", backend=backend)
        traceable(group, "barrier")
        return torch_ops.traced_barrier(backend)
    comm = communicator(group)
    comm.errors.poll()
    # (the communicator's own plan, which algorithms launch too: Communicator.barrier_plan)
    plan = comm.plans.hit(("barrier", backend, config.PDL))  # (the plan hit: _replan's docstring)
    if plan is not None and not plan.alive:
        plan.run(None)  # (whether a capture is on: asked only where the stream changed)
        if comm.errors.deferred is not None:
            comm.errors.finish()
    else:
        _check_options("barrier", backend=backend)  # (a miss only: no plan has a refused backend)
        comm.barrier(backend, _capturing())
        if comm.errors.deferred is not None:
            comm.errors.finish()


def all_reduce(
    t: torch.Tensor,
    op: str = "sum",
    algorithm: str = "auto",
    backend: str = "auto",
    *,
    out: torch.Tensor | None = None,
    group: Group = None,
) -> torch.Tensor:
    """Reduce ``t`` across ranks (sum, min or max) in place, or into ``out``; return the result.

    ``algorithm``: ``"one_shot"`` (every rank reads every rank), ``"two_shot"``
    (reduce-scatter then all-gather: least traffic), ``"lamport"`` (one-shot without barriers:
    lowest latency, up to :data:`~collectives.config.LAMPORT_MAX_BYTES` per rank), ``"tma"``
    (two-shot moving tiles with bulk copies on at most a quarter of the SMs; 16-byte aligned
    tensors), ``"push"`` (each slice stored straight from ``t`` to its owner: no staging copy),
    or ``"auto"`` (chosen by size from measured crossovers, :mod:`collectives.algorithms.tuning`).  ``backend``: ``"multicast"``
    (NVLS ``multimem``), ``"peer"`` (NVLink loads/stores), ``"multicast_emulated"`` (the
    multicast kernels with every multimem access emulated by unicast accesses to every rank:
    runs with peer access alone, for testing; never chosen by ``"auto"``), or ``"auto"``.
    ``group``: the ranks that reduce (see :func:`empty`).
    """
    if _compiling():
        traceable(group, "all_reduce")
        _check_options("all_reduce", op, backend)
        if out is not None:
            _check_out(t, out)
        return torch_ops.traced_all_reduce(t, op, algorithm, backend, out)
    comm = communicator(group)
    comm.errors.poll()
    if out is None:
        result, key = t, ("all_reduce", None, t.data_ptr() or address(t), t.dtype, t.shape, t.is_contiguous(),
                          t.get_device(), op, algorithm, backend, config.PDL)
    else:
        result, key = out, ("all_reduce", out.data_ptr() or address(out), t.data_ptr() or address(t), t.dtype,
                            t.shape, t.is_contiguous(), t.get_device(), out.dtype, out.shape, out.is_contiguous(),
                            out.get_device(), op, algorithm, backend, config.PDL)
    plan = comm.plans.hit(key)  # (the plan hit: _replan's docstring)
    if plan is not None and not plan.alive and (plan.capture is None or plan.capture == _capturing()):
        plan.run(plan.capture)
        if comm.errors.deferred is not None:
            comm.errors.finish()
    else:
        capturing = _capturing()
        _replan(comm, key, plan, capturing, result, t, algorithm, backend, _all_reduce_call, t, op, backend, out,
                capturing)
    return result


def reduce_scatter(
    out: torch.Tensor, inp: torch.Tensor, op: str = "sum", algorithm: str = "auto", backend: str = "auto",
    *, max_blocks: int | None = None, group: Group = None,
) -> torch.Tensor:
    """``out`` (M elements) = the reduction over ranks of block ``rank`` of ``inp`` (W*M
    elements).  ``algorithm``: ``"one_shot"``, ``"tma"`` (bulk copies on at most a quarter of
    the SMs; 16-byte aligned tensors and output size), ``"push"`` (each slice stored straight
    from ``inp`` into its owner's receive buffer, no staging copy: ``auto``'s choice for an
    ``inp`` outside symmetric memory past Lamport's sizes), ``"lamport"`` (no barrier, the data its own flag: an output
    of at most 1 MB, :mod:`collectives.algorithms.lamport_blocks`) or ``"auto"``; ``backend`` as
    for all_reduce.
    ``max_blocks`` caps the kernel's thread blocks (to leave SMs to kernels running beside it,
    as a GEMM does in :func:`collectives.gemm_reduce_scatter`); the same on every rank.
    ``group`` as for :func:`empty` (W: its size; ``rank``: the group rank)."""
    if _compiling():
        traceable(group, "reduce_scatter")
        return torch_ops.traced_reduce_scatter(out, inp, op, algorithm, backend, max_blocks)
    if max_blocks is not None:
        _check_max_blocks("reduce_scatter", max_blocks)
    comm = communicator(group)
    comm.errors.poll()
    key = ("reduce_scatter", out.data_ptr() or address(out), inp.data_ptr() or address(inp), inp.dtype, inp.shape,
           inp.is_contiguous(), inp.get_device(), out.dtype, out.shape, out.is_contiguous(), out.get_device(), op,
           algorithm, backend, max_blocks, config.PDL)
    plan = comm.plans.hit(key)  # (the plan hit: _replan's docstring)
    if plan is not None and not plan.alive and (plan.capture is None or plan.capture == _capturing()):
        plan.run(plan.capture)
        if comm.errors.deferred is not None:
            comm.errors.finish()
    else:
        capturing = _capturing()
        _replan(comm, key, plan, capturing, out, inp, algorithm, backend, _block_call, "reduce_scatter", out, inp, op,
                backend, capturing, max_blocks)
    return out


def all_gather(out: torch.Tensor, inp: torch.Tensor, algorithm: str = "auto", backend: str = "auto",
               *, max_blocks: int | None = None, group: Group = None) -> torch.Tensor:
    """Block ``r`` of ``out`` (W*M elements) = rank ``r``'s ``inp`` (M elements), on every rank.

    Each rank stores its ``inp`` into block ``rank`` of every rank's symmetric buffer (one
    ``multimem.st`` per vector, or one store per peer) between a start and an end barrier;
    a symmetric ``out`` is that buffer (zero-copy), any other is copied from an internal one.
    ``algorithm``: ``"one_shot"`` (16-byte vectors, or one element at a time when the tensors
    or M are not 16-byte aligned), ``"tma"`` (bulk copies on at most a quarter of the SMs;
    16-byte aligned tensors and block size), ``"push"`` (the one-shot's pushes in pipelined
    rounds whose copies out of the internal buffer overlap the remote stores; peer backend:
    :mod:`collectives.algorithms.push_gather`), ``"lamport"`` (no barrier: each 4 bytes travel
    with the call's tag in one 8-byte word, every bit exact; an ``inp`` of at most 512 KB,
    ``config.LAMPORT_GATHER_MAX_BYTES``) or ``"auto"``; ``backend`` as for all_reduce;
    ``max_blocks`` and ``group`` as for reduce_scatter."""
    if _compiling():
        traceable(group, "all_gather")
        return torch_ops.traced_all_gather(out, inp, algorithm, backend, max_blocks)
    if max_blocks is not None:
        _check_max_blocks("all_gather", max_blocks)
    comm = communicator(group)
    comm.errors.poll()
    key = ("all_gather", out.data_ptr() or address(out), inp.data_ptr() or address(inp), inp.dtype, inp.shape,
           inp.is_contiguous(), inp.get_device(), out.dtype, out.shape, out.is_contiguous(), out.get_device(),
           algorithm, backend, max_blocks, config.PDL)
    plan = comm.plans.hit(key)  # (the plan hit: _replan's docstring)
    if plan is not None and not plan.alive:
        plan.run(None)  # (its key does not hold whether a capture is on: asked there where needed)
        if comm.errors.deferred is not None:
            comm.errors.finish()
    else:
        _replan(comm, key, plan, _capturing(), out, inp, algorithm, backend, _block_call, "all_gather", out, inp, "sum",
                backend, False, max_blocks)
    return out


def all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: exchange.Splits = None,
               in_splits: exchange.Splits = None, *, group: Group = None, transport: str = "nvlink",
               bounded: bool = False) -> torch.Tensor:
    """Tested on GPUs bit for bit: one-GPU worlds of 2 to 8 ranks and 2 x H100 under torchrun (issue 34).

    The uneven all-to-all, as :func:`torch.distributed.all_to_all_single`: rank ``s`` sends
    rows ``[sum(in_splits[:r]), +in_splits[r])`` of ``inp`` (dimension 0) to rank ``r``, which
    receives them as rows ``[sum(out_splits[:s]), +out_splits[s])`` of ``out``; without
    splits, dimension 0 in ``world`` equal chunks.  Splits are lists of ints or int64 tensors of
    ``world`` entries on this GPU (read by the kernel: no host synchronisation).  A symmetric
    ``out`` (:func:`empty`) is stored into directly by the senders, a plain one receives
    through an internal staging buffer (:data:`collectives.runtime.all_to_all.STAGING_BYTES`);
    every rank must receive the same way at a call.  Sizes are checked on the GPU: a pair whose
    sizes differ fails on both ends with a size mismatch, raised after the launch (see the
    module); the pairs that agree complete.  ``group`` as for :func:`empty`.

    A call like an earlier one (the same tensors, split values or split tensors) launches that
    call's plan from the communicator's plan cache (:func:`collectives.runtime.all_to_all.plan_key`),
    after the communicator's last collective as every collective; split tensors are read by the
    kernel, so new values in them cost nothing on the host.

    ``transport``: how chunks reach their receivers: ``"nvlink"`` (stores through the peers'
    mapped addresses) or ``"nvshmem"`` (NVSHMEM put-with-signal,
    :class:`~collectives.algorithms.all_to_all.NvshmemTransport`; each of its kernels links NVSHMEM's
    device bitcode: about 10 s to compile, once per key and process; needs nvshmem4py and a context on NVSHMEM's heap, else
    CollectiveError; not under ``torch.compile``).  Every rank passes the same.

    ``bounded=True`` (every rank alike; not under ``torch.compile``): receivers need not know
    what each source sends.  ``out``'s rows are cut in ``world`` equal slots (``out.shape[0] //
    world`` rows each; a plain ``out``: of the staging buffer's rows at most), source ``s``'s rows
    landing at row ``s * slot``; ``out_splits``, an int64 tensor of ``world`` entries on this GPU,
    is written with the rows each source sent (the kernel's: stream-ordered, no host sync).  A
    chunk past its slot fails its pair on both ends as a size mismatch and stores nothing (0
    rows written for it), never an overrun (:attr:`~collectives.algorithms.all_to_all.AllToAllKey.bounded`)."""
    if _compiling():
        if bounded:
            raise CollectiveError("all_to_all: bounded=True is not traceable by torch.compile; call it outside the "
                                  "compiled region")
        if transport != "nvlink":
            raise CollectiveError(f"all_to_all: transport={transport!r} is not traceable by torch.compile; call it "
                                  "outside the compiled region or use transport='nvlink'")
        traceable(group, "all_to_all")
        return torch_ops.traced_all_to_all(out, inp, out_splits, in_splits)
    comm = communicator(group)
    comm.errors.poll()
    key = exchange.plan_key(comm, out, inp, out_splits, in_splits, transport, bounded)
    capturing = _capturing()
    plan = comm.plans.hit(key)  # (the plan hit: _replan's docstring)
    if plan is not None and not plan.alive:
        plan.run(capturing)
        if comm.errors.deferred is not None:
            comm.errors.finish()
    else:
        _replan(comm, key, plan, capturing, out, inp, "push", "peer", _all_to_all_call, out, inp, out_splits,
                in_splits, transport, bounded)
    return out


class BoundAllToAll:
    """:func:`all_to_all` of fixed tensors, called again and again (the MoE layer's exchanges
    between its scratch and receive buffers, :mod:`collectives.moe`): ``bound()`` runs the
    call.  The first goes through :func:`all_to_all` (checked and planned there), and its plan
    is kept; later calls launch that plan directly, no key made, while it holds: the
    context's generation unchanged (no symmetric allocation made or freed since: the plan's
    key holds it) and the memory of its adopted buffers alive (:attr:`Plan.alive`); else the
    call goes through :func:`all_to_all` again and its plan is taken anew.  As there, each call
    first polls the communicator's error record, launches after the communicator's last
    collective (:meth:`~collectives.algorithms.plan.Plan.run`; pinning its split tensors
    under CUDA-graph capture) and closes where an error is deferred.  The tensors must not
    change place or size (they are held here); ``group`` and ``bounded`` as for :func:`all_to_all`."""

    __slots__ = ("args", "group", "bounded", "comm", "plan", "generation")

    def __init__(self, out: torch.Tensor, inp: torch.Tensor, out_splits: exchange.Splits = None,
                 in_splits: exchange.Splits = None, *, group: Group = None, bounded: bool = False) -> None:
        self.args, self.group, self.bounded = (out, inp, out_splits, in_splits), group, bounded
        self.comm = communicator(group)
        self.plan: Any = None
        self.generation = -1

    def __call__(self) -> torch.Tensor:
        comm, plan = self.comm, self.plan
        if plan is None or comm.ctx.generation != self.generation or (plan.alive and plan.expired()):
            return self._through_api()
        comm.errors.poll()
        plan.run(_capturing())
        if comm.errors.deferred is not None:
            comm.errors.finish()
        return self.args[0]

    def _through_api(self) -> torch.Tensor:
        """The call through :func:`all_to_all`, then its plan kept (None where it has none)."""
        comm, (out, inp, out_splits, in_splits) = self.comm, self.args
        self.plan = None
        all_to_all(out, inp, out_splits, in_splits, group=self.group, bounded=self.bounded)
        self.plan = comm.plans.hit(exchange.plan_key(comm, out, inp, out_splits, in_splits, bounded=self.bounded))
        self.generation = comm.ctx.generation
        return out


# -- the one call skeleton's miss path (the plan hit is inline in each collective: _replan says how) --------


def _replan(comm: Communicator, key: tuple, plan: Any, capture: bool, out: torch.Tensor, inp: torch.Tensor,
            algorithm: str, backend: str, describe: Callable[..., Call | None], *args: Any) -> None:
    """The call of ``key`` that missed the plan hit: its plan (``plan``, the hit's: None, or one
    over adopted memory, then the cache's checked lookup; else planned and cached under ``key``)
    launched, then the call closed (raising a deferred error:
    :meth:`~collectives.runtime.error_record.ErrorRecord.finish`).  ``out`` and ``inp``: the
    tensors written and read; ``capture``: whether the current stream is capturing a CUDA
    graph, asked once on a miss (:func:`~collectives.algorithms.plan.capturing`, about 0.6 us
    on a GPU host: no key holds it; a plan whose launch depends on it records it,
    :attr:`~collectives.algorithms.plan.Plan.capture`, and only its hit asks: in the other
    state, the call comes here and is planned anew, its plan cached under the key instead).

    The one call skeleton, inline in each collective (a Python call less per call):
    ``comm = communicator(group)``, ``comm.errors.poll()`` (raise an error a kernel recorded
    before, or defer a recoverable one to the end of this call), the key, then the plan hit:
    the plan stored under the key (:attr:`~collectives.runtime.staging.PlanCache.hit`: one
    dictionary lookup), unless there is none or it uses adopted memory (whose expiry only the
    checked lookup here reads), run, and the call closed where an error is deferred; else this,
    with the collective's describing function (its checks and :class:`Call`, an all-to-all's
    :class:`~collectives.algorithms.all_to_all.AllToAllCall`).  A collective's key holds every
    argument the plan and the checks depend on (but the capture state, above): the output's
    and the input's addresses (its second and third fields, None for an in-place all-reduce's
    output: a call's facts drop them), then the input's and (where given) the output's other fields
    of :func:`~collectives.runtime.staging.tensor_key` (inline; a hit is a call whose tensors
    passed the same checks), and no tuple; an all-to-all's:
    :func:`collectives.runtime.all_to_all.plan_key`.

    Tensors outside symmetric memory that the allocator placed elsewhere prepare nothing again:
    a call whose key differs from an earlier one's only in its tensors' addresses (the same
    checked facts: the plan cache holds the first plan of each under them)
    launches that call's plan with its own addresses swapped in
    (:meth:`~collectives.algorithms.plan.Plan.run`'s ``at``), making and caching no plan (the
    launch's staging buffers, adopted memory and turn are the earlier plan's: pinned under
    capture, checked for expiry and passed on as its own launch's), and remembers the call's
    addresses (the plan's :attr:`~collectives.algorithms.plan.Plan.met`, at most the plan cache's
    capacity); a call on remembered addresses (the
    allocator handing a loop's tensors the same addresses again) caches a plan of its own, that
    plan with its addresses (:meth:`~collectives.algorithms.plan.Plan.moved`), a plan hit from
    then on.  So tensors met once fill no cache, and tensors met again cost a hit.  Else the call is
    described (``describe(comm, *args)``: its checks and :class:`Call`) and planned with
    ``algorithm``.  A symmetric tensor's plan holds its peer table: never moved, nor used for
    another; nor is an all-to-all's (its arguments are not the collective layout's, whose ``out``
    and ``src`` a move swaps, and its key holds split values, not only tensor descriptions).

    A rank with nothing to move (``describe`` returns None) launches a barrier of size 0 on
    ``backend`` instead and closes the call: its peers' kernels advance the call
    count and wait for every rank, so skipping the launch would leave them to time out (the
    communicator lost) where their barriers now name the different sizes (and where its peers run
    Lamport, which ``auto`` picks for small tensors, their kernels meet the barrier too:
    :mod:`collectives.algorithms.lamport`); so does a rank whose
    call is refused (a CollectiveError of the checks or of the plan), before it raises.  Where
    ranks share the GPU, that barrier is planned with every rank's first plan of a call: its kernel's load
    could otherwise come while the other ranks' kernels spin for it, and a load waits for them
    (:func:`collectives.runtime.kernels.load`)."""
    plans = comm.plans
    if plan is not None:  # (over adopted memory: the checked lookup; made for the other capture state: planned anew)
        plan = plans.get(key)
        if plan is not None and plan.capture is not None and plan.capture != capture:
            plan = None
    facts = None
    if plan is None and key[0] in COLLECTIVES:
        ctx = comm.ctx
        at = (0, out.data_ptr(), inp.data_ptr())
        if not (ctx.is_symmetric(out) or (inp is not out and ctx.is_symmetric(inp))):
            # The facts: what the plan depends on but the tensors' addresses (the key without
            # its second and third fields) and whether each is 16-byte aligned (the vector
            # width, the kinds).
            facts = ("moved", key[0], *key[3:], at[1] % VECTOR_BYTES == 0, at[2] % VECTOR_BYTES == 0)
            earlier = plans.hit(facts)
            if earlier is not None and earlier.alive:
                earlier = plans.get(facts)  # (over adopted memory: the checked lookup)
            if (earlier is not None and earlier.moves is not None and earlier.moves[0] == (at[1] == at[2])
                    and (earlier.capture is None or earlier.capture == capture)):
                met = earlier.met
                seen = len(met)
                met.add(at[1:])
                if len(met) == seen:  # (its tensors again: a plan of their own, a plan hit from now on)
                    plan = plans[key] = earlier.moved(at)
                else:
                    if seen >= plans.capacity:
                        met.clear()
                    earlier.run(capture, at)
                    if comm.errors.deferred is not None:
                        comm.errors.finish()
                    return
    if plan is None:
        plan = _plan_of(comm, key, facts, capture, out, inp, algorithm, backend, describe, args)
    if plan is None:
        comm.barrier(backend, capture)
        comm.errors.finish()
        return
    plan.run(capture)
    if comm.errors.deferred is not None:
        comm.errors.finish()


def _plan_of(comm: Communicator, key: tuple, facts: tuple | None, capture: bool, out: torch.Tensor,
             inp: torch.Tensor, algorithm: str, backend: str, describe: Callable[..., Call | None], args: tuple) -> Any:
    """The plan of :func:`_replan`'s call, planned and cached under ``key`` and, where its
    tensors may move (``facts``: none symmetric), made movable from them
    (:meth:`~collectives.algorithms.plan.Plan.movable_from`) and cached under ``facts`` too;
    None for a rank with nothing to move."""
    if comm.residency is not None:
        comm.barrier_plan(backend)
    try:
        _check_algorithm(key[0], algorithm)  # an empty rank too: it plans nothing
        call = describe(comm, *args)
        plan = None if call is None else _plan(comm, call, algorithm)
    except CollectiveError:
        # Refused on this rank: its peers' kernels meet a barrier of size 0 and record a
        # size mismatch, instead of waiting for a launch that never comes (a fatal timeout).
        # (The all-to-all's kernels meet no barrier: it only raises.)
        if key[0] in COLLECTIVES:
            comm.barrier(backend if backend in BACKENDS else "auto", capture)
        raise
    if plan is None:
        return None
    if facts is not None:
        plan.movable_from(out.data_ptr(), inp.data_ptr())
        comm.plans[facts] = plan
    comm.plans[key] = plan
    return plan


def _check_options(collective: str, op: str = "sum", backend: str = "auto") -> None:
    """Refuse an ``op`` or ``backend`` no collective has."""
    if op not in OPS:
        raise CollectiveError(f"{collective}: op must be one of {OPS}, not {op!r}")
    if backend not in ("auto", *BACKENDS):
        raise CollectiveError(f"{collective}: backend must be one of {('auto', *BACKENDS)}, not {backend!r}")


def _check_max_blocks(collective: str, max_blocks: Any) -> None:
    """Refuse a ``max_blocks`` that is not a positive int (a bool is no count), on every call:
    ``True`` would otherwise meet a plan cached for ``max_blocks=1`` (``True == 1``)."""
    if max_blocks is not None and (type(max_blocks) is bool or not isinstance(max_blocks, int) or max_blocks < 1):
        raise CollectiveError(f"{collective}: max_blocks must be a positive int or None, not {max_blocks!r}")


def _check_out(t: torch.Tensor, out: torch.Tensor) -> None:
    """An all-reduce's ``out``: a contiguous tensor of ``t``'s dtype and shape on its device
    (eager and traced alike: a traced ``out.copy_(t)`` would cast or broadcast)."""
    if out.dtype != t.dtype or out.shape != t.shape or not out.is_contiguous() or out.device != t.device:
        raise CollectiveError(f"all_reduce: out must be a contiguous tensor of t's dtype and shape on its device "
                              f"({t.dtype}, {tuple(t.shape)}, {t.device}), not {out.dtype}, {tuple(out.shape)}, "
                              f"{out.device}{'' if out.is_contiguous() else ', not contiguous'}")


def _check_algorithm(collective: str, algorithm: str) -> None:
    """Refuse an ``algorithm`` that ``collective`` does not have."""
    names = algorithms(collective)
    if algorithm != "auto" and algorithm not in names:
        raise CollectiveError(f"{collective} algorithms: {names + ('auto',)}; not {algorithm!r}")


def _plan(comm: Communicator, call: Call | AllToAllCall, algorithm: str):
    """The plan of ``call``: ``algorithm`` (``"auto"``: :func:`collectives.algorithms.tuning.choose`)
    asked whether it can run the call, then for its plan."""
    if algorithm == "auto":
        algorithm = tuning.choose(call)
    _check_algorithm(call.collective, algorithm)
    impl = REGISTRY[call.collective, algorithm]
    reason = impl.refusal(call)
    if reason is not None:
        raise CollectiveError(reason)
    return impl.plan(comm, call)


def _all_reduce_call(comm: Communicator, t: torch.Tensor, op: str, backend: str, out: torch.Tensor | None,
                     capturing: bool) -> Call | None:
    """The call of an all-reduce of ``t`` (into ``out``), checked; None for an empty ``t``."""
    _check_options("all_reduce", op, backend)
    dtype = _dtype(comm, t)
    result = t if out is None else out
    if out is not None:
        _dtype(comm, out)
        _check_out(t, out)
    if t.numel() == 0:
        return None
    return Call("all_reduce", result, t, dtype, op, comm.choose_backend(backend, dtype, op), comm.world,
                n=t.numel(), nbytes=t.numel() * t.element_size(), symmetric=comm.ctx.is_symmetric(t),
                in_place=out is None, whole_vectors=True, pointers_aligned=_aligned(t, result), capturing=capturing)


def _all_to_all_call(comm: Communicator, out: torch.Tensor, inp: torch.Tensor, out_splits: exchange.Splits,
                     in_splits: exchange.Splits, transport: str = "nvlink", bounded: bool = False) -> AllToAllCall:
    """The call of an all-to-all (its plan checks the tensors, splits and transport: every rank
    launches, an empty one too)."""
    return AllToAllCall(out, inp, out_splits, in_splits, transport, bounded)


def _block_call(comm: Communicator, collective: str, out: torch.Tensor, inp: torch.Tensor, op: str, backend: str,
                capturing: bool, max_blocks: int | None) -> Call | None:
    """The call of a collective where one of ``out`` and ``inp`` is one rank's block of the
    other (reduce-scatter: ``out``, all-gather: ``inp``), checked; None for empty blocks."""
    _check_options(collective, op, backend)
    dtype = _dtype(comm, inp)
    _dtype(comm, out)
    if out.dtype != inp.dtype:
        raise CollectiveError(f"{collective}: out is {out.dtype}, inp is {inp.dtype}")
    scatter = collective == "reduce_scatter"
    (whole, block), names = ((inp, out), ("inp", "out")) if scatter else ((out, inp), ("out", "inp"))
    if whole.numel() != comm.world * block.numel():
        raise CollectiveError(
            f"{collective}: {names[0]} has {whole.numel()} elements, {names[1]} {block.numel()}; "
            f"{names[0]} must have world_size ({comm.world}) x {names[1]} elements"
        )
    backend = comm.choose_backend(backend, dtype, op)  # an all-gather passes "sum": no reduction to refuse
    if block.numel() == 0:
        return None
    return Call(collective, out, inp, dtype, op, backend, comm.world, n=block.numel(),
                nbytes=whole.numel() * whole.element_size(), symmetric=comm.ctx.is_symmetric(whole),
                in_place=False, whole_vectors=block.numel() * block.element_size() % VECTOR_BYTES == 0,
                pointers_aligned=_aligned(inp, out), capturing=capturing, max_blocks=max_blocks)


#: Whether torch.compile is tracing the call (then it records the custom operator).
_compiling = torch.compiler.is_compiling


def _dtype(comm: Communicator, t: torch.Tensor) -> str:
    if not t.is_cuda:
        raise CollectiveError(f"collectives take CUDA tensors, not {t.device}")
    if t.device.index != comm.device_index:
        raise CollectiveError(
            f"tensor on {t.device}, but this rank's collectives run on cuda:{comm.device_index} "
            "(create tensors after collectives.init(), or torch.cuda.set_device(LOCAL_RANK))"
        )
    if not t.is_contiguous():
        raise CollectiveError("collectives take contiguous tensors")
    return from_torch(t.dtype).name


def _aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor starts on a 16-byte boundary."""
    return all(t.data_ptr() % VECTOR_BYTES == 0 for t in tensors)


# -- the kernels of the custom operators (collectives.runtime.torch_ops): the functions above, eager --------


@torch_ops.implement("all_reduce")
def _all_reduce_kernel(t: torch.Tensor, op: str, algorithm: str, backend: str) -> None:
    all_reduce(t, op, algorithm, backend)


@torch_ops.implement("reduce_scatter")
def _reduce_scatter_kernel(out: torch.Tensor, inp: torch.Tensor, op: str, algorithm: str, backend: str,
                           max_blocks: int | None) -> None:
    reduce_scatter(out, inp, op, algorithm, backend, max_blocks=max_blocks)


@torch_ops.implement("all_gather")
def _all_gather_kernel(out: torch.Tensor, inp: torch.Tensor, algorithm: str, backend: str,
                       max_blocks: int | None) -> None:
    all_gather(out, inp, algorithm, backend, max_blocks=max_blocks)


@torch_ops.implement("all_to_all")
def _all_to_all_kernel(out: torch.Tensor, inp: torch.Tensor, out_splits: torch.Tensor | None = None,
                       in_splits: torch.Tensor | None = None) -> None:
    as_splits = (lambda s: s.tolist() if s is not None and not s.is_cuda else s)  # a CPU tensor: no GPU sync
    all_to_all(out, inp, as_splits(out_splits), as_splits(in_splits))


@torch_ops.implement("barrier", "CompositeExplicitAutograd")  # no tensor to dispatch on
def _barrier_kernel(backend: str) -> None:
    barrier(backend)
