"""Every collective kernel compiles without a GPU (ptxas included): each collective, algorithm,
backend and dtype at world size 2 (4 and 8 too: bf16; ``slim``); multicast kernels hold the multimem
instructions and peer kernels none."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from collectives.__main__ import main
from collectives.config import LAMPORT_BLOCKS
from collectives.dtypes import DTYPES
from collectives.layouts import PadLayout

pytest.importorskip("cutlass")
from collectives.algorithms import ALGORITHMS, KernelKey  # noqa: E402
from collectives.runtime.kernels import kernel_ptx  # noqa: E402

def slim(collective: str, algorithm: str, dtype: str, world: int) -> bool:
    """Cases left out to keep CI short (``PTX_IDENTITY=all`` compiles every key): the world size
    enters a kernel only as the unrolled count of its per-rank loops and its pad layout (no
    kernel builder branches on it, and none on the dtype and the world together), so every dtype
    at world 2 (a world-8 kernel takes half as long again to compile) and bf16 at worlds 4 and 8
    too (the most unrolled ranks: ``test_kernel_registers`` holds world 8's registers); the
    Lamport reduce-scatter and all-gather differ from the Lamport all-reduce (compiled so) only
    in their send and delivery, so every dtype at world 4 and bf16 at 2 and 8."""
    if collective in ("reduce_scatter", "all_gather") and algorithm == "lamport":
        return world != 4 and dtype != "bf16"
    return world != 2 and dtype != "bf16"


def peer_only(collective: str, algorithm: str, backend: str) -> bool:
    """The keys an algorithm refuses by backend (:attr:`Algorithm.backends`): the push
    all-gather's on the multicast backends (``test_push_all_gather_refuses_the_multicast_backends``)."""
    from collectives.algorithms import REGISTRY

    return backend not in REGISTRY[collective, algorithm].backends


CASES = [
    (collective, algorithm, backend, dtype, world)
    for collective, algorithms in ALGORITHMS.items()
    for algorithm in algorithms
    for backend in ("multicast", "peer")
    for dtype in (DTYPES if collective != "barrier" else ("bf16",))
    for world in (2, 4, 8)
    if not slim(collective, algorithm, dtype, world) and not peer_only(collective, algorithm, backend)
]


@pytest.mark.parametrize("backend", ["multicast", "multicast_emulated"])
def test_push_all_gather_refuses_the_multicast_backends(backend: str) -> None:
    """Its key names the rule; a call gets the refusal with the algorithms that take it."""
    from collectives.algorithms import REGISTRY, Call

    with pytest.raises(ValueError, match="peer backend only"):
        KernelKey("all_gather", "push", backend, "bf16", 4, stage_in=True)
    call = Call("all_gather", None, None, "bf16", "sum", backend, 4, n=64, nbytes=512, symmetric=False,
                in_place=False, whole_vectors=True, pointers_aligned=True, capturing=False)
    assert "algorithm='one_shot' or backend='peer'" in REGISTRY["all_gather", "push"].refusal(call)
    assert REGISTRY["all_gather", "push"].refusal(replace(call, backend="peer")) is None


def test_every_collective_has_its_algorithms_registered_once() -> None:
    """Each (collective, algorithm) names one registered class, which builds its kernels."""
    from collectives.algorithms import REGISTRY

    assert set(REGISTRY) == {(c, a) for c, algorithms in ALGORITHMS.items() for a in algorithms} | {
        ("all_to_all", "push")}
    assert ALGORITHMS["all_reduce"] == ("one_shot", "two_shot", "lamport", "tma", "push")
    assert all(impl.name == a and c in impl.collectives for (c, a), impl in REGISTRY.items())


def test_gather_out_only_where_a_result_is_gathered() -> None:
    with pytest.raises(ValueError, match="gather_out"):
        KernelKey("all_reduce", "one_shot", "peer", "bf16", 2, gather_out=True)


def _multimem(ptx: str) -> set[str]:
    return set(re.findall(r"\bmultimem\.[\w.:]+", ptx))


@pytest.mark.parametrize(("collective", "algorithm", "backend", "dtype", "world"), CASES)
def test_kernel_compiles(collective: str, algorithm: str, backend: str, dtype: str, world: int) -> None:
    key = KernelKey(collective, algorithm, backend, dtype, world, stage_in=algorithm == "push")
    ptx = kernel_ptx(key, "sm_100a" if DTYPES[dtype].fp8 else "sm_90a")
    found = _multimem(ptx)
    bulk = set(re.findall(r"\bcp\.async\.bulk[\w.:]*", ptx))
    if algorithm == "tma":
        assert "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes" in bulk, bulk
        assert "cp.async.bulk.global.shared::cta.bulk_group" in bulk, bulk
        assert {"cp.async.bulk.commit_group", "cp.async.bulk.wait_group.read"} <= bulk, bulk
        assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    else:
        assert not bulk, bulk
    if algorithm == "lamport":  # no barrier: relaxed sys-scope data stores and polls
        # (its one release store is the error record's status, 32 bits)
        assert ("ld.relaxed.sys.global.v4.b32" in ptx or collective == "all_gather") and not re.findall(r"st\.release\.sys\.global\.(?!b32\b)", ptx)
        # part 0's verdict (the dirty word), polled by the other parts' blocks: strong at gpu
        # scope on both sides, never a weak access that another SM's L1 may serve stale
        assert "st.relaxed.gpu.global.b32" in ptx and "ld.relaxed.gpu.global.b32" in ptx
        if collective == "all_gather":  # tagged 64-bit words: stored and polled 16 bytes at a time
            assert "st.relaxed.sys.global.v2.b64" in ptx and "ld.relaxed.sys.global.v2.b64" in ptx
            assert found <= {"multimem.st.relaxed.sys.global.b64"}, found  # the size entries alone
        elif backend == "peer":
            assert not found and "st.relaxed.sys.global.v4.b32" in ptx
        elif collective == "reduce_scatter":  # each rank gets other data: peer stores, multicast size entries
            assert found == {"multimem.st.relaxed.sys.global.b64"} and "st.relaxed.sys.global.v4.b32" in ptx, found
        else:
            assert found == {"multimem.st.relaxed.sys.global.v4.f32", "multimem.st.relaxed.sys.global.b64"}, found
        return
    if backend == "peer":
        assert not found, found
        assert "st.release.sys.global" in ptx and "ld.acquire.sys.global" in ptx
        return
    assert "multimem.st.release.sys.global.b64" in found, found  # the barrier's signal
    if collective == "all_gather":  # a copy: stores to every rank, never a reduction
        assert not any(f.startswith("multimem.ld_reduce") for f in found), found
        if algorithm == "one_shot":
            assert any(f.startswith("multimem.st.global.v4") for f in found), found
        return
    if collective != "barrier" and algorithm not in ("tma", "push"):
        acc = f".acc::{DTYPES[dtype].acc}" if DTYPES[dtype].acc else ""
        assert any(f.startswith("multimem.ld_reduce") and f".add{acc}.v" in f for f in found), found
    if collective == "all_reduce" and algorithm == "two_shot":
        assert any(f.startswith("multimem.st.global.v4") for f in found), found


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_tma_pipeline_fits_shared_memory(collective: str, world: int) -> None:
    """Every stage's input tiles and both output tiles fit the budget, with at least 4 KB tiles."""
    from collectives.config import TMA_SMEM_BYTES, TMA_STAGES
    from collectives.device.tiles import smem_bytes

    key = KernelKey(collective, "tma", "peer", "bf16", world)
    assert key.tile_bytes >= 4096
    assert smem_bytes(world, key.tile_bytes, TMA_STAGES) <= TMA_SMEM_BYTES + 1024


def test_staged_and_unaligned_variants_compile() -> None:
    for key in (
        KernelKey("all_reduce", "tma", "peer", "bf16", 4, stage_in=True, gather_out=True),
        KernelKey("reduce_scatter", "tma", "peer", "f32", 2, stage_in=True),
        KernelKey("all_reduce", "lamport", "peer", "e5m2", 2, vector=1),
        KernelKey("all_reduce", "lamport", "multicast", "f16", 8, vector=1),
        KernelKey("reduce_scatter", "lamport", "peer", "e4m3", 4, vector=1),
        KernelKey("all_gather", "lamport", "multicast", "bf16", 2, vector=1),
        KernelKey("all_gather", "one_shot", "peer", "e4m3", 4, vector=1, gather_out=True),
        KernelKey("all_gather", "tma", "multicast", "bf16", 8, gather_out=True),
        KernelKey("all_gather", "one_shot", "multicast", "f32", 2, gather_out=True),
        KernelKey("all_gather", "one_shot", "multicast", "bf16", 4, vector=1, gather_out=True),
    ):
        ptx = kernel_ptx(key, "sm_100a" if DTYPES[key.dtype].fp8 else "sm_90a")
        assert ".entry" in ptx, key


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("backend", ["multicast", "peer"])
def test_min_max_kernels(op: str, backend: str) -> None:
    ptx = kernel_ptx(KernelKey("all_reduce", "one_shot", backend, "bf16", 4, op=op))
    if backend == "multicast":
        assert any(f".{op}.v" in f for f in _multimem(ptx))


def test_unaligned_variant_moves_single_elements() -> None:
    ptx = kernel_ptx(KernelKey("all_reduce", "one_shot", "peer", "bf16", 2, vector=1))
    assert "ld.global.b16" in ptx and "v4.b32" not in ptx


def test_fp8_multicast_needs_blackwell() -> None:
    from ptxops import QualifierError

    with pytest.raises(QualifierError, match=r"fp8-target[\s\S]*sm_90a"):
        kernel_ptx(KernelKey("all_reduce", "one_shot", "multicast", "e4m3", 4), "sm_90a")


def test_cli_prints_and_writes_ptx(tmp_path, capsys) -> None:
    out = tmp_path / "k.ptx"
    assert main(["ptx", "--collective", "reduce_scatter", "--backend", "multicast", "--dtype", "bf16",
                 "--world-size", "8", "--arch", "sm_90a", "-o", str(out)]) == 0
    assert "multimem.ld_reduce" in out.read_text()
    assert main(["ptx", "--collective", "barrier", "--backend", "peer", "--world-size", "2"]) == 0
    barrier = capsys.readouterr().out
    assert ".target sm_90a" in barrier and ".reqntid 32," in barrier  # the runtime's one warp
    assert main(["ptx", "--collective", "all_reduce", "--algorithm", "push", "--backend", "peer",
                 "--world-size", "2"]) == 0  # a push key sends a non-symmetric input
    assert "st.release.sys" in capsys.readouterr().out
    assert main(["ptx", "--collective", "all_reduce", "--backend", "multicast", "--dtype", "e5m2",
                 "--arch", "sm_90a"]) == 2
    assert "fp8-target" in capsys.readouterr().err


def test_kernel_keys_reject_bad_choices() -> None:
    with pytest.raises(ValueError, match="world size"):
        KernelKey("all_reduce", "one_shot", "peer", "bf16", 9)
    with pytest.raises(ValueError, match="algorithms"):
        KernelKey("reduce_scatter", "two_shot", "peer", "bf16", 4)
    with pytest.raises(ValueError, match="fp8"):
        KernelKey("all_reduce", "one_shot", "peer", "e4m3", 4, op="max")
    with pytest.raises(ValueError, match="16-byte"):
        KernelKey("all_reduce", "tma", "peer", "bf16", 4, vector=1)
    with pytest.raises(ValueError, match="lamport"):
        KernelKey("all_reduce", "lamport", "peer", "bf16", 4, stage_in=True)
    with pytest.raises(ValueError, match="lamport"):
        KernelKey("reduce_scatter", "lamport", "peer", "bf16", 4, stage_in=True)
    with pytest.raises(ValueError, match="algorithms"):
        KernelKey("barrier", "lamport", "peer", "bf16", 4)


def test_pad_regions_do_not_overlap() -> None:
    layout = PadLayout(max_blocks=4, world=3)
    words = [layout.arrival(p, b, s) + half for p in (0, 1) for b in range(4) for s in range(3) for half in (0, 1)]
    words += [layout.calls, layout.tickets]
    words += [layout.lamport_step(w, b) for w in range(3) for b in range(LAMPORT_BLOCKS)]
    words += [layout.lamport_size(w, b, s) + half for w in range(3) for b in range(3) for s in range(3) for half in (0, 1)]
    words += [layout.lamport_dirty(w, b) for w in range(3) for b in range(3)]
    assert sorted(words) == list(range(layout.words))
    assert all(layout.lamport_size(w, b, s) % 2 == 0 for w in range(3) for b in range(3) for s in range(3))
    assert all(layout.arrival(p, b, s) % 2 == 0 for p in (0, 1) for b in range(4) for s in range(3))


def test_lamport_count_is_unsigned_and_wraps_at_lamport_calls() -> None:
    """The call count (up to 3 x 2^30, past 2^31) is taken modulo 3 and wrapped at
    LAMPORT_CALLS in unsigned arithmetic: a signed remainder would pick a wrong buffer."""
    from collectives.config import LAMPORT_CALLS

    ptx = kernel_ptx(KernelKey("all_reduce", "lamport", "peer", "bf16", 3), "sm_90a")
    assert "mul.hi.u32" in ptx and not re.search(r"mul\.hi\.s32|rem\.s32|div\.s32", ptx)
    assert re.search(rf"setp\.lt\.u32\s+%p\d+, %r\d+, {LAMPORT_CALLS - 2**32};", ptx)


def test_runtime_call_path_compiles_with_tvm_ffi() -> None:
    """The runtime calls kernels through CuTeDSL's TVM-FFI path (microseconds per call)."""
    import cutlass.cute as cute

    from collectives import algorithms

    key = KernelKey("all_reduce", "one_shot", "peer", "bf16", 2, stage_in=True, end_barrier=False)
    compiled = cute.compile[cute.GPUArch("sm_90a")](
        algorithms.build(key), *algorithms.example_arguments(), options="--enable-tvm-ffi"
    )
    assert callable(compiled.__tvm_ffi_object__())


def test_launch_cost_benchmark_kernel_compiles() -> None:
    """python -m collectives.tools.bench_launch launches this idle kernel (one GPU); it builds on CPU."""
    pytest.importorskip("torch")
    from collectives.tools import bench_launch

    assert b"kernel_cutlass__idle" in bench_launch.idle_cubin("sm_90a")


def test_launch_cost_benchmark_times_a_group_of_launches_against_a_graph_of_them(monkeypatch) -> None:
    """bench_launch's :func:`grouped` (torch's CUDA pieces stood in for): the graph captures GROUP
    launches on its capture stream, the eager form launches GROUP on the current stream, each
    timed by host_us."""
    pytest.importorskip("torch")
    from contextlib import contextmanager
    from types import SimpleNamespace

    from collectives.tools import bench_launch

    launched: list[str] = []

    class Stream:
        def __init__(self, name: str = "capture") -> None:
            self.cuda_stream = name

        def wait_stream(self, other) -> None:
            pass

    class Graph:
        def replay(self) -> None:
            launched.append("replay")

    @contextmanager
    def graph(g, stream):
        launched.append("capture begins")
        yield

    current = Stream("current")
    cuda = SimpleNamespace(current_stream=lambda: current, CUDAGraph=Graph, Stream=Stream, graph=graph,
                           synchronize=lambda: None)
    monkeypatch.setattr(bench_launch, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(bench_launch, "host_us", lambda fn, n: (fn(), float(len(launched)))[1])
    rows = bench_launch.grouped(launched.append)
    group = bench_launch.GROUP
    assert launched == ["capture begins"] + ["capture"] * group + ["current"] * group + ["replay"]
    assert [name for name, _ in rows] == [f"{group} launches", f"a CUDA graph of {group}: replay()"]


def test_barrier_cost_variants_compile_and_differ_where_named() -> None:
    """python -m collectives.tools.barrier_costs (one GPU) times these kernels; each does what
    its name says: only the barrier releases, only the fence variant fences alone."""
    pytest.importorskip("torch")
    from tests.support.cute_support import compile_ptx

    from collectives.device.launch import example_arguments
    from collectives.tools import barrier_costs

    ptx = {name: compile_ptx(launch, *example_arguments()) for name, launch in barrier_costs.kernels().items()}
    assert "st.release.sys" in ptx["barrier"] and "ld.acquire.sys" in ptx["barrier"]
    for name, last in (("relaxed poll", "ld.acquire.sys"), ("fenced poll", "fence.acq_rel.sys")):
        body = ptx[name].split(".entry")[1]
        assert "st.release.sys" in body and "ld.relaxed.sys" in body and body.count(last) == 1, name
    assert "ld.acquire.sys" not in ptx["fenced poll"] and "fence.acq_rel" not in ptx["relaxed poll"]
    relaxed = ptx["relaxed signal"]
    assert "st.relaxed.sys" in relaxed and "ld.acquire.sys" in relaxed and ".release" not in relaxed
    assert "red.release.sys" in ptx["no loads"] and "ld.global.b" not in ptx["no loads"]
    assert "fence.acq_rel.sys" in ptx["fence only"] and "st." not in ptx["fence only"].split(".entry")[1]
    assert not any(op in ptx["empty"].split(".entry")[1] for op in ("ld.global", "st.", "fence"))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_peer_barrier_is_one_64_bit_release_store_and_no_block_sync(world: int) -> None:
    """The barrier kernel signals each rank with one 64-bit release store (size and epoch),
    polls one 64-bit acquire load, reads no peer size word and no own table entry, syncs its
    one warp once (bar.warp.sync, before thread 0 advances the call count), never the block,
    and takes no ticket (one block); the data kernels keep the bar.sync before their barriers
    and take a ticket (atom.add.acq_rel.gpu) when their grid has several blocks."""
    ptx = kernel_ptx(KernelKey("barrier", "one_shot", "peer", "bf16", world, threads=32), "sm_90a")
    # (then the error record's publishing store, st.release.sys.global.b32, and the word a
    # wait that gives up leaves in the missing rank's pad, signals.gave_up)
    assert re.findall(r"\bst\.release\.sys\.global\.\w+", ptx) == ["st.release.sys.global.b64",
                                                                    "st.release.sys.global.b32",
                                                                    "st.release.sys.global.b64"]
    assert set(re.findall(r"\bld\.acquire\.sys\.global\.\w+", ptx)) == {"ld.acquire.sys.global.b64"}
    assert "bar.sync" not in ptx and "barrier.sync" not in ptx and ".add.u32" not in ptx
    assert ptx.count("bar.warp.sync") == 1
    data = kernel_ptx(KernelKey("all_reduce", "one_shot", "peer", "bf16", world), "sm_90a")
    assert "st.release.sys.global.b64" in data and ("bar.sync" in data or "barrier.sync" in data)
    assert "atom.acq_rel.gpu.global.add.u32" in data


def _signals(ptx: str) -> tuple[int, int]:
    """(64-bit release stores, 64-bit acquire loads) in ``ptx``: the peer signals and, one per
    wait, the word a wait that gives up leaves in the missing rank's pad
    (:func:`~collectives.device.signals.gave_up`); the waits (each polls with two loads, the
    first and the loop's)."""
    return (len(re.findall(r"\bst\.release\.sys\.global\.b64", ptx)),
            len(re.findall(r"\bld\.acquire\.sys\.global\.b64", ptx)))


@pytest.mark.parametrize("dtype", ["bf16", "f32", "e4m3"])
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("vector", [0, 1])
def test_peer_push_all_reduce_is_a_pipeline_of_split_signals(dtype: str, world: int, vector: int) -> None:
    """The peer push all-reduce: one signal after the first chunk's pushes and one per round,
    the first wait, one per later round and the final one, no barrier (no other release or
    acquire) and no multimem.  Every data load has one store: the pushes and the copies out of
    the result buffer copy, and the reduction stores each vector it loads from ``world``
    slots to ``world`` places (out and its region on every other rank: no pull).  The 32-bit
    words of the call's bookkeeping are the same in every dtype's kernel, so they are counted in
    the bf16 one (whose data moves in 16-bit and vector accesses only) and taken out: the call
    count (read, stored), the tickets, and the failed start's Lamport count move
    (:func:`~collectives.device.signals.lamport_missed_start`: one count read, its stores)."""
    def push_ptx(kind: str) -> str:
        return kernel_ptx(KernelKey("all_reduce", "push", "peer", kind, world, vector=vector, stage_in=True),
                          "sm_100a" if DTYPES[kind].fp8 else "sm_90a")

    def accesses(ptx: str) -> tuple[list[str], list[str]]:
        return (sorted(op for op in re.findall(r"\bld\.global\.([\w.]+)", ptx) if op != "b64"),  # not the tables
                sorted(re.findall(r"\bst\.global\.([\w.]+)", ptx)))

    ptx = push_ptx(dtype)
    assert _signals(ptx) == (2 + 3, 6), _signals(ptx)
    records = ptx.count("st.release.sys.global.b32")  # each wait's error record, published
    assert len(re.findall(r"\.(release|acquire)\.", ptx)) - records == 11
    assert not _multimem(ptx)
    words = accesses(ptx if dtype == "bf16" else push_ptx("bf16"))
    words = (words[0].count("b32"), words[1].count("b32"))  # the bookkeeping's 32-bit loads and stores
    assert words[0] == 2 and words[1] > 3, words  # the two counts read; tickets, call count, the move's stores
    loads, stores = accesses(ptx)
    for _ in range(words[0]):
        loads.remove("b32")
    for _ in range(words[1]):
        stores.remove("b32")
    assert loads == stores, (loads, stores)


@pytest.mark.parametrize("backend", ["multicast", "peer"])
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("vector", [0, 1])
def test_push_reduce_scatter_stores_to_peers_and_reduces_locally(backend: str, world: int, vector: int) -> None:
    """Push: plain stores into the owners' buffers, local loads, no multimem data path (the
    multicast flavour keeps only its multicast barrier, one eagerly, two in graphs; the peer
    pipeline signals in two places and waits in two, and once more in graphs)."""
    for end_barrier in (False, True):
        key = KernelKey("reduce_scatter", "push", backend, "bf16", world, vector=vector,
                        stage_in=True, end_barrier=end_barrier)
        ptx = kernel_ptx(key, "sm_90a")
        stores = re.findall(r"\bst\.global\.[\w.]+", ptx)
        assert ("st.global.v4.b32" in stores) == (vector == 0), stores
        found = _multimem(ptx)
        if backend == "peer":
            assert not found
            assert _signals(ptx) == (2 + 2 + end_barrier, 2 * (2 + end_barrier)), _signals(ptx)
            continue
        assert found == {"multimem.st.release.sys.global.b64"}, found  # the barriers' signals
        releases = len(re.findall(r"st\.release\.sys\.global\.b64", ptx))
        # each barrier's multimem.st.release (matched inside it) and its wait's gave-up word
        assert releases == 2 * (1 + end_barrier), releases
    with pytest.raises(ValueError, match="push"):
        KernelKey("reduce_scatter", "push", backend, "bf16", world)


def test_push_all_reduce_keeps_both_barriers_and_slices_whole_vectors() -> None:
    """Push all-reduce: the input goes straight to its owners (stage_in), the second barrier
    guards the pull of the owners' results, so it cannot be dropped; slices are whole vectors."""
    from collectives.algorithms.push import push_slice_elements

    with pytest.raises(ValueError, match="end barrier"):
        KernelKey("all_reduce", "push", "peer", "bf16", 4, stage_in=True, end_barrier=False)
    with pytest.raises(ValueError, match="push"):
        KernelKey("all_reduce", "push", "peer", "bf16", 4)
    key = KernelKey("all_reduce", "push", "peer", "bf16", 4, stage_in=True)
    assert key.barriers == 2
    assert [push_slice_elements(n, 4, 8) for n in (1, 32, 33, 1000)] == [8, 8, 16, 256]
    assert push_slice_elements(1001, 4, 1) == 251
    ptx = kernel_ptx(key, "sm_90a")
    assert not _multimem(ptx) and "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx


def test_flag_kernels_post_with_release_and_wait_with_acquire_at_gpu_scope() -> None:
    """The stream flags: one thread each; the post is one ``red.release.gpu`` add, the wait
    polls with ``ld.acquire.gpu`` against its own consumed count (a plain load and store) and,
    on a timeout, writes the error record; nothing at sys scope but the record."""
    from tests.support.cute_support import compile_ptx, opcodes

    from collectives.algorithms import flags
    from collectives.device.launch import flag_example_arguments

    post, wait = (compile_ptx(flags.build(kind), *flag_example_arguments()) for kind in flags.KINDS)
    assert ".reqntid 1, 1, 1" in post and ".reqntid 1, 1, 1" in wait
    assert opcodes(post) == {"red.release.gpu.global.add.u32": 1}
    found = opcodes(wait)
    assert found["ld.acquire.gpu.global.b32"] >= 1 and found["ld.global.b32"] == 1 and found["st.global.b32"] == 1
    assert "%globaltimer" in wait and found["atom.relaxed.sys.global.cas.b32"] == 1
    # the record: claimed (cas), its fields (relaxed stores), its status published (release)
    assert {op for op in found if ".sys." in op} == {"atom.relaxed.sys.global.cas.b32", "st.relaxed.sys.global.b32",
                                                     "st.release.sys.global.b32"}
    assert not {op for op in found if op.startswith(("red", "ld.acquire.sys"))}


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_tma_block_that_timed_out_waits_for_its_bulk_loads(collective: str) -> None:
    """A TMA stage that missed its deadline: the block waits (bounded) for that stage and the
    ones issued after it before exiting, so no bulk load writes into shared memory after the
    block has gone: the pipeline's wait (first try and loop) and the drain's."""
    ptx = kernel_ptx(KernelKey(collective, "tma", "peer", "bf16", 2, stage_in=True), "sm_90a")
    assert ptx.count("mbarrier.try_wait.parity.shared::cta.b64") == 4, ptx.count("mbarrier.try_wait")


def _loads_in_flight(ptx: str) -> int:
    """The most 16-byte global loads the PTX issues with no store between them."""
    most = run = 0
    for line in ptx.splitlines():
        if line.strip().startswith("ld.global.v4"):
            run += 1
            most = max(most, run)
        elif line.strip().startswith("st."):
            run = 0
    return most


def test_unroll_puts_more_loads_in_flight(monkeypatch) -> None:
    """``config.UNROLL`` (the default of ``KernelKey.unroll``, a bench variant) sets the loads a
    thread issues before its stores: a push all-reduce's reduction loads ``unroll`` vectors of
    each of its ``world`` slots at once (the default's kernels are the PTX-identity record's)."""
    from collectives import config

    monkeypatch.setattr(config, "UNROLL", 4)
    key = KernelKey("all_reduce", "push", "peer", "bf16", 2, stage_in=True)
    assert key.unroll == 4
    assert _loads_in_flight(kernel_ptx(key)) == 4 * 2
    from collectives.algorithms import key_id, key_of

    assert "/u" not in key_id(key)  # the default's id
    monkeypatch.setattr(config, "UNROLL", 2)
    assert key_id(key).endswith("/u4") and key_of(key_id(key)) == key  # an id of its own
    with pytest.raises(ValueError, match="unroll"):
        KernelKey("all_reduce", "push", "peer", "bf16", 2, stage_in=True, unroll=3)
