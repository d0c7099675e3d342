"""The Python API: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``barrier``, ``empty``, ``synchronize``.

Collectives run on the current torch stream and are capturable in a CUDA graph once warmed up
(one eager call with the same tensors compiles the kernel and builds its plan).  A tensor from
:func:`empty` lives in symmetric memory and goes zero-copy; any other CUDA tensor is staged
through an internal symmetric buffer by the kernel itself.  Each distinct call (tensors,
dtype, op, algorithm, backend) is planned once; later calls only launch.  Traced by
``torch.compile``, each function records its custom operator (:mod:`collectives.torch_ops`)
instead of running (on the default communicator: ``group=None``).

A size mismatch across ranks, which kernels record, is raised by :func:`synchronize` or by the
first later call that reads the record, after that call's own launch (ranks read it at
different calls; every rank still makes every call).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from . import config, torch_ops, tuning
from .config import ALGORITHMS, LAMPORT_MAX_BYTES, MULTICAST_PATHS, VECTOR_BYTES, KernelKey, push_slice_elements
from .dtypes import DTYPES, from_torch
from .errors import CollectiveError
from .runtime import Buffer, Communicator, _capturing, communicator, traceable


def empty(shape: int | tuple[int, ...], dtype: torch.dtype = torch.float32, *, group: Any = None) -> torch.Tensor:
    """A tensor in ``group``'s symmetric memory (collective over the group: every rank asks for
    the same shape); zero-copy in that group's collectives.  ``group``, in every function here:
    None (every rank), a ``torch.distributed`` ProcessGroup or one-dimensional DeviceMesh
    (its communicator opened on first use: :func:`collectives.init`), a context from
    ``collectives.init(group=...)`` or a :class:`~collectives.runtime.Communicator`."""
    return communicator(group).ctx.empty(shape, dtype)


def synchronize(group: Any = None) -> None:
    """Wait for this rank's queued collectives and raise any error a kernel of ``group``'s
    communicator recorded (:class:`~collectives.CollectiveTimeout`, size mismatch across ranks)."""
    torch.cuda.current_stream().synchronize()
    communicator(group).check()


def barrier(backend: str = "auto", *, group: Any = None) -> None:
    """A device-side barrier of every rank on the current stream (no host sync; a rank that
    never arrives surfaces as CollectiveTimeout at the next collective or :func:`synchronize`).
    ``backend`` as for :func:`all_reduce`."""
    if _compiling():
        traceable(group, "barrier")
        return torch_ops.traced_barrier(backend)
    comm = communicator(group)
    comm.poll()
    comm.barrier(backend)
    comm.finish()


def all_reduce(
    t: torch.Tensor,
    op: str = "sum",
    algorithm: str = "auto",
    backend: str = "auto",
    *,
    out: torch.Tensor | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Reduce ``t`` across ranks (sum, min or max) in place, or into ``out``; return the result.

    ``algorithm``: ``"one_shot"`` (every rank reads every rank), ``"two_shot"``
    (reduce-scatter then all-gather: least traffic), ``"lamport"`` (one-shot without barriers:
    lowest latency, up to :data:`~collectives.config.LAMPORT_MAX_BYTES` per rank), ``"tma"``
    (two-shot moving tiles with bulk copies on at most a quarter of the SMs; 16-byte aligned
    tensors), or ``"auto"`` (chosen by size from measured crossovers, :mod:`collectives.tuning`).  ``backend``: ``"multicast"``
    (NVLS ``multimem``), ``"peer"`` (NVLink loads/stores), ``"multicast_emulated"`` (the
    multicast kernels with every multimem access emulated by unicast accesses to every rank:
    runs with peer access alone, for testing; never chosen by ``"auto"``), or ``"auto"``.
    ``group``: the ranks that reduce (see :func:`empty`).
    """
    if _compiling():
        traceable(group, "all_reduce")
        return torch_ops.traced_all_reduce(t, op, algorithm, backend, out)
    comm = communicator(group)
    comm.poll()
    result = t if out is None else out
    capturing = _capturing()
    key = ("all_reduce", t.data_ptr(), t.numel(), t.dtype, t.is_contiguous(), op, algorithm,
           backend, result.data_ptr(), result.is_contiguous(), capturing, config.PDL)
    plan = comm.plans.get(key)
    if plan is None:
        if t.numel() == 0:
            return result
        plan = comm.plans[key] = _all_reduce_plan(comm, t, op, algorithm, backend, out, capturing)
    plan.run()
    comm.finish()
    return result


def _all_reduce_plan(comm: Communicator, t, op, algorithm, backend, out, capturing: bool):
    dtype = _dtype(comm, t)
    result = t if out is None else out
    if out is not None:
        _dtype(comm, out)
    if out is not None and (out.dtype != t.dtype or out.shape != t.shape or not out.is_contiguous()):
        raise CollectiveError("all_reduce: out must be a contiguous tensor of t's dtype and shape")
    nbytes = t.numel() * t.element_size()
    backend = comm.choose_backend(backend, dtype, op)
    aligned = _aligned(t, result)
    if algorithm == "auto":
        symmetric = out is None and comm.ctx.is_symmetric(t)
        algorithm = tuning.all_reduce_algorithm(comm.world, nbytes, backend, aligned, symmetric)
    _check_algorithm("all_reduce", algorithm, nbytes, aligned)
    vector = _vector(dtype, backend, aligned)
    if algorithm == "lamport":
        return _lamport_plan(comm, t, result, dtype, op, backend, vector)
    if algorithm == "push":
        return _push_all_reduce_plan(comm, t, result, dtype, op, backend, vector)
    # Two-shot works in place on a symmetric t (zero-copy).  One-shot always stages t into an
    # internal symmetric buffer inside the kernel: alternating between two buffers lets it
    # write its result straight into t and skip the end barrier (not under graph capture,
    # where a replayed graph would reuse one buffer: there it keeps the end barrier).
    zero_copy = algorithm in ("two_shot", "tma") and out is None and comm.ctx.is_symmetric(t)
    alternate = algorithm == "one_shot" and not capturing
    if zero_copy:
        data: Buffer | list[Buffer] = comm.buffer(t)
    else:
        data = [comm.buffer(comm.staging(nbytes, i)) for i in ((0, 1) if alternate else (2,))]
    key = KernelKey(
        "all_reduce", algorithm, backend, dtype, comm.world, op=op, vector=vector,
        gather_out=algorithm != "one_shot" and not zero_copy,
        stage_in=not zero_copy, end_barrier=not alternate,
    )
    work = -(-t.numel() // key.elements_per_access)
    if algorithm != "one_shot":
        work = -(-work // comm.world)
    src = 0 if zero_copy else t.data_ptr()
    target = result.data_ptr()
    if alternate:  # a later graph capture of this call needs the end-barrier variant: prepare it
        _prepare_capture(comm, key, nbytes)
    return comm.plan(key, data, target, src, t.numel(), comm.blocks(key, work))


def _lamport_plan(comm: Communicator, t, result, dtype: str, op: str, backend: str, vector: int):
    """A Lamport all-reduce reads ``t`` and writes ``result`` directly (no staging): its
    symmetric memory is the rotating receive buffers of its element width."""
    key = KernelKey("all_reduce", "lamport", backend, dtype, comm.world, op=op, vector=vector, threads=256)
    data = comm.buffer(comm.lamport(t.element_size()))
    work = -(-t.numel() // key.elements_per_access)
    return comm.plan(key, data, result.data_ptr(), t.data_ptr(), t.numel(), comm.blocks(key, work))


def _push_all_reduce_plan(comm: Communicator, t, result, dtype: str, op: str, backend: str, vector: int):
    """A push all-reduce reads ``t`` and writes ``result`` directly: its symmetric memory is
    staging slot 4 (``world`` receive slots of one slice each) and slot 5 (``world`` result
    regions of one slice each, one per owner), apart from the slots so that a call's pushes
    never land where the last call's results, of another size, may still be read."""
    key = KernelKey("all_reduce", "push", backend, dtype, comm.world, op=op, vector=vector, stage_in=True)
    m = push_slice_elements(t.numel(), comm.world, key.elements_per_access)
    slice_bytes = m * t.element_size()
    data = comm.buffer(comm.staging(comm.world * slice_bytes, 4))
    results = comm.buffer(comm.staging(comm.world * slice_bytes, 5))
    work = -(-m // key.elements_per_access)
    return comm.plan(key, data, result.data_ptr(), t.data_ptr(), t.numel(), comm.blocks(key, work), results)


def _check_algorithm(collective: str, algorithm: str, nbytes: int, aligned: bool) -> None:
    """Refuse an algorithm the call cannot use, saying why."""
    if algorithm not in ALGORITHMS[collective]:
        raise CollectiveError(f"{collective} algorithms: {ALGORITHMS[collective] + ('auto',)}; not {algorithm!r}")
    if algorithm == "lamport" and nbytes > LAMPORT_MAX_BYTES:
        raise CollectiveError(
            f"lamport all_reduce carries at most {LAMPORT_MAX_BYTES} bytes per rank, not {nbytes}; "
            "use algorithm='auto', 'one_shot' or 'two_shot'"
        )
    if algorithm == "tma" and not aligned:
        raise CollectiveError(
            f"tma {collective} moves 16-byte tiles: its tensors (and a reduce-scatter's output "
            "or an all-gather's input size) must be 16-byte aligned; use algorithm='auto'"
        )


def _prepare_capture(comm: Communicator, key: KernelKey, nbytes: int) -> None:
    """Compile the end-barrier variant of a single-barrier collective and allocate the staging
    buffer it uses, so that capturing the same call in a CUDA graph allocates and compiles
    nothing (neither may happen during a capture)."""
    comm.kernel(dataclasses.replace(key, end_barrier=True))
    comm.buffer(comm.staging(nbytes, _two_barrier_slot(key.algorithm)))


def _two_barrier_slot(algorithm: str) -> int:
    """The staging buffer of a staged collective that keeps its end barrier: 3 for push,
    whose stores into other ranks' buffers come before its first barrier (so no other kind
    of collective, some of which read their buffer after their last barrier, may share it), 2
    for the rest."""
    return 3 if algorithm == "push" else 2


def reduce_scatter(
    out: torch.Tensor, inp: torch.Tensor, op: str = "sum", algorithm: str = "auto", backend: str = "auto",
    *, max_blocks: int | None = None, group: Any = None,
) -> torch.Tensor:
    """``out`` (M elements) = the reduction over ranks of block ``rank`` of ``inp`` (W*M
    elements).  ``algorithm``: ``"one_shot"``, ``"tma"`` (bulk copies on at most a quarter of
    the SMs; 16-byte aligned tensors and output size), ``"push"`` (each slice stored straight
    from ``inp`` into its owner's receive buffer, no staging copy: ``auto``'s choice for an
    ``inp`` outside symmetric memory) or ``"auto"``; ``backend`` as for all_reduce.
    ``max_blocks`` caps the kernel's thread blocks (to leave SMs to kernels running beside it,
    as a GEMM does in :func:`collectives.gemm_reduce_scatter`); the same on every rank.
    ``group`` as for :func:`empty` (W: its size; ``rank``: the group rank)."""
    if _compiling():
        traceable(group, "reduce_scatter")
        return torch_ops.traced_reduce_scatter(out, inp, op, algorithm, backend, max_blocks)
    comm = communicator(group)
    comm.poll()
    capturing = _capturing()
    key = ("reduce_scatter", inp.data_ptr(), inp.numel(), inp.dtype, inp.is_contiguous(),
           out.data_ptr(), out.numel(), out.dtype, out.is_contiguous(), op, algorithm, backend,
           capturing, max_blocks, config.PDL)
    plan = comm.plans.get(key)
    if plan is None:
        _check_max_blocks("reduce_scatter", max_blocks)
        plan = _reduce_scatter_plan(comm, out, inp, op, algorithm, backend, capturing, max_blocks)
        if plan is None:
            return out
        comm.plans[key] = plan
    plan.run()
    comm.finish()
    return out


def _check_max_blocks(collective: str, max_blocks: int | None) -> None:
    if max_blocks is not None and (not isinstance(max_blocks, int) or max_blocks < 1):
        raise CollectiveError(f"{collective}: max_blocks must be a positive int or None, not {max_blocks!r}")


def _reduce_scatter_plan(comm: Communicator, out, inp, op, algorithm, backend, capturing: bool,
                         max_blocks: int | None):
    dtype, whole_vectors, pointers_aligned = _block_pair(comm, "reduce_scatter", out, inp, out)
    backend = comm.choose_backend(backend, dtype, op)
    if out.numel() == 0:
        return None
    nbytes = inp.numel() * inp.element_size()
    aligned = whole_vectors and pointers_aligned
    symmetric = comm.ctx.is_symmetric(inp)
    if algorithm == "auto":
        algorithm = tuning.reduce_scatter_algorithm(comm.world, nbytes, backend, aligned, symmetric)
    _check_algorithm("reduce_scatter", algorithm, nbytes, aligned)
    # Small inputs are staged in-kernel into alternating buffers (one barrier); large
    # symmetric ones are read in place (two barriers, no copy).  TMA keeps both barriers.
    # Push sends the input straight into the owners' alternating receive buffers.
    zero_copy = symmetric and nbytes > tuning.STAGE_MAX_BYTES and algorithm != "push"
    alternate = not zero_copy and not capturing and algorithm in ("one_shot", "push")
    if zero_copy:
        data: Buffer | list[Buffer] = comm.buffer(inp)
    else:
        slots = (0, 1) if alternate else (_two_barrier_slot(algorithm),)
        data = [comm.buffer(comm.staging(nbytes, i)) for i in slots]
    vector = _vector(dtype, backend, pointers_aligned) if whole_vectors else 1
    key = KernelKey("reduce_scatter", algorithm, backend, dtype, comm.world, op=op, vector=vector,
                    stage_in=not zero_copy, end_barrier=not alternate)
    work = -(-out.numel() // key.elements_per_access)
    src = 0 if zero_copy else inp.data_ptr()
    if alternate:
        _prepare_capture(comm, key, nbytes)
    return comm.plan(key, data, out.data_ptr(), src, out.numel(), comm.blocks(key, work, max_blocks))


def all_gather(out: torch.Tensor, inp: torch.Tensor, algorithm: str = "auto", backend: str = "auto",
               *, max_blocks: int | None = None, group: Any = None) -> torch.Tensor:
    """Block ``r`` of ``out`` (W*M elements) = rank ``r``'s ``inp`` (M elements), on every rank.

    Each rank stores its ``inp`` into block ``rank`` of every rank's symmetric buffer (one
    ``multimem.st`` per vector, or one store per peer) between a start and an end barrier;
    a symmetric ``out`` is that buffer (zero-copy), any other is copied from an internal one.
    ``algorithm``: ``"one_shot"`` (16-byte vectors, or one element at a time when the tensors
    or M are not 16-byte aligned), ``"tma"`` (bulk copies on at most a quarter of the SMs;
    16-byte aligned tensors and block size) or ``"auto"``; ``backend`` as for all_reduce;
    ``max_blocks`` and ``group`` as for reduce_scatter."""
    if _compiling():
        traceable(group, "all_gather")
        return torch_ops.traced_all_gather(out, inp, algorithm, backend, max_blocks)
    comm = communicator(group)
    comm.poll()
    key = ("all_gather", inp.data_ptr(), inp.numel(), inp.dtype, inp.is_contiguous(),
           out.data_ptr(), out.numel(), out.dtype, out.is_contiguous(), algorithm, backend, max_blocks, config.PDL)
    plan = comm.plans.get(key)
    if plan is None:
        _check_max_blocks("all_gather", max_blocks)
        plan = _all_gather_plan(comm, out, inp, algorithm, backend, max_blocks)
        if plan is None:
            return out
        comm.plans[key] = plan
    plan.run()
    comm.finish()
    return out


def _all_gather_plan(comm: Communicator, out, inp, algorithm, backend, max_blocks: int | None):
    dtype, whole_vectors, pointers_aligned = _block_pair(comm, "all_gather", out, inp, inp)
    backend = comm.choose_backend(backend, dtype)
    if inp.numel() == 0:
        return None
    nbytes = out.numel() * out.element_size()
    aligned = whole_vectors and pointers_aligned
    if algorithm == "auto":
        algorithm = tuning.all_gather_algorithm(comm.world, nbytes, backend, aligned)
    _check_algorithm("all_gather", algorithm, nbytes, aligned)
    zero_copy = comm.ctx.is_symmetric(out)
    data = comm.buffer(out if zero_copy else comm.staging(nbytes, 2))
    vector = _vector(dtype, backend, pointers_aligned) if whole_vectors else 1
    key = KernelKey("all_gather", algorithm, backend, dtype, comm.world, vector=vector, gather_out=not zero_copy)
    work = -(-inp.numel() // key.elements_per_access)
    return comm.plan(key, data, out.data_ptr(), inp.data_ptr(), inp.numel(), comm.blocks(key, work, max_blocks))


def _block_pair(comm: Communicator, collective: str, out: torch.Tensor, inp: torch.Tensor,
                block: torch.Tensor) -> tuple[str, bool, bool]:
    """Check ``out`` and ``inp`` of a collective where ``block`` (one of them) is one rank's
    block of the other; return (dtype, whether a block fills whole 16-byte vectors, whether
    both start on a 16-byte boundary)."""
    dtype = _dtype(comm, inp)
    _dtype(comm, out)
    if out.dtype != inp.dtype:
        raise CollectiveError(f"{collective}: out is {out.dtype}, inp is {inp.dtype}")
    whole, names = (inp, ("inp", "out")) if block is out else (out, ("out", "inp"))
    if whole.numel() != comm.world * block.numel():
        raise CollectiveError(
            f"{collective}: {names[0]} has {whole.numel()} elements, {names[1]} {block.numel()}; "
            f"{names[0]} must have world_size ({comm.world}) x {names[1]} elements"
        )
    return dtype, block.numel() * block.element_size() % VECTOR_BYTES == 0, _aligned(inp, out)


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


def _vector(dtype: str, backend: str, aligned: bool) -> int:
    """16-byte vectors when the tensors are 16-byte aligned, else one element at a time
    (the peer path: multimem has no single-element form of the 16-bit types)."""
    if aligned:
        return DTYPES[dtype].elements(VECTOR_BYTES)
    if backend in MULTICAST_PATHS:
        raise CollectiveError(f"the {backend} backend needs 16-byte aligned tensors; use backend='peer'")
    return 1


# -- the kernels of the custom operators (collectives.torch_ops): the functions above, eager --------


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


@torch_ops.implement("barrier", "CompositeExplicitAutograd")  # no tensor to dispatch on
def _barrier_kernel(backend: str) -> None:
    barrier(backend)
