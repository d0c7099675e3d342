"""``ptxops.reach`` in kernels traced through CuTeDSL (no GPU): each class of scope bug raises
:class:`ptxops.ScopeError` at trace time, the tag survives pointer arithmetic, tensors and
loops, weak and untagged accesses behave as before, and tagging changes no PTX."""

from __future__ import annotations

import pytest

from tests.support.cute_support import compile_ptx, cute, cutlass, global_tensor, opcodes
from cutlass.memory import SmemAllocator

import ptxops
from ptxops import ScopeError

I32, I64 = cutlass.Int32, cutlass.Int64


def ptx_of(body, arch: str = "sm_90a", cluster: int = 1) -> str:
    """Compile a one-block kernel running ``body(ptr)`` on a 32-byte aligned global int32 tensor."""

    @cute.kernel
    def kernel(g: cute.Tensor):
        body(g.iterator)

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[cluster, 1, 1], block=[32, 1, 1], cluster=[cluster, 1, 1])

    return compile_ptx(launch, global_tensor(I32), arch=arch)


def _tidx():
    return cute.arch.thread_idx()[0]


def _remote_mbarrier():
    """This CTA's mbarrier, initialised, mapped into the CTA of cluster rank 1."""
    mbar = SmemAllocator().allocate_array(I64, num_elems=1, byte_alignment=8)
    ptxops.mbarrier_init(mbar, 1)
    return ptxops.mapa(mbar, 1)


#: Each bug class of cross-GPU (and cross-CTA) code: legal PTX at a scope too narrow for the
#: memory, as (id, body, arch, the reach it breaks, the opcode it names).
BUGS = [
    ("flag published to a peer with st.release.gpu",
     lambda p: ptxops.st_release(ptxops.reach(p, "peer") + _tidx(), I32(1), scope="gpu"),
     "sm_90a", "peer", "st.release.gpu.global.b32"),
    ("flag published to a peer with red.release.gpu",
     lambda p: ptxops.red(ptxops.reach(p, "peer"), I32(1), sem="release", scope="gpu"),
     "sm_90a", "peer", "red.release.gpu.global.add.s32"),
    ("peer counter bumped with atom.add.gpu",
     lambda p: ptxops.atom_add(ptxops.reach(p, "peer") + 4, I32(1), sem="relaxed", scope="gpu"),
     "sm_90a", "peer", "atom.relaxed.gpu.global.add.s32"),
    ("peer counter bumped with atom.add (PTX's default .gpu)",
     lambda p: ptxops.atom_add(ptxops.reach(p, "peer"), I32(1)),
     "sm_90a", "peer", "atom.global.add.s32"),
    ("ld.acquire.cta spinning on a word a peer writes",
     lambda p: ptxops.ld_acquire(ptxops.reach(p, "peer"), scope="cta"),
     "sm_90a", "peer", "ld.acquire.cta.global.b32"),
    ("multimem.red.release.gpu",
     lambda p: ptxops.multimem_red(ptxops.reach(p, "multicast"), I32(1), sem="release", scope="gpu"),
     "sm_90a", "multicast", "multimem.red.release.gpu.global.add.s32"),
    ("multimem.ld_reduce.acquire.gpu",
     lambda p: ptxops.multimem_ld_reduce(ptxops.reach(p, "multicast"), sem="acquire", scope="gpu"),
     "sm_90a", "multicast", "multimem.ld_reduce.acquire.gpu.global.add.s32"),
    ("host-mapped record written with st.relaxed.gpu",
     lambda p: ptxops.st(ptxops.reach(p, "host"), I32(1), sem="relaxed", scope="gpu"),
     "sm_90a", "host", "st.relaxed.gpu.global.b32"),
    ("release reduction to a peer with red.async.release.gpu",
     lambda p: ptxops.red_async(ptxops.reach(p, "peer"), I32(1), scope="gpu"),
     "sm_100a", "peer", "red.async.release.gpu.global.add.s32"),
    ("remote mbarrier arrive at .cta (PTX's default)",
     lambda p: ptxops.mbarrier_arrive(_remote_mbarrier()),
     "sm_90a", "cluster", "mbarrier.arrive.shared::cluster.b64"),
    ("gpu-wide flag acquired at .cta",
     lambda p: ptxops.ld_acquire(ptxops.reach(p, "gpu"), scope="cta"),
     "sm_90a", "gpu", "ld.acquire.cta.global.b32"),
]


@pytest.mark.parametrize(("body", "arch", "kind", "opcode"), [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_each_scope_bug_raises(body, arch, kind, opcode) -> None:
    with pytest.raises(ScopeError) as info:
        ptx_of(body, arch, cluster=2 if kind == "cluster" else 1)
    e = info.value
    needs = ptxops.spec.reach.REACHES[kind].needs
    assert e.reach == kind and e.rule == f"reach-{kind}-needs-{needs}" and e.target == arch
    assert str(e).startswith(f"{opcode}: ") and f"needs .{needs}" in str(e)
    assert needs in e.legal["scope"] or kind == "cluster"
    where = "ptxops.mapa at " if kind == "cluster" else "ptxops.reach at "
    assert e.origin.startswith(where + __file__ + ":"), e.origin


def test_the_same_accesses_at_the_scope_the_reach_needs_compile_to_the_untagged_ptx() -> None:
    def body(tag):
        def run(p):
            peer = ptxops.reach(p, "peer") if tag else p
            mc = ptxops.reach(p + 64, "multicast") if tag else p + 64
            ptxops.st_release(peer + _tidx(), I32(1), scope="sys")
            ptxops.red(peer, I32(1), sem="release", scope="sys")
            ptxops.atom_add(peer + 4, I32(1), sem="relaxed", scope="sys")
            ptxops.ld_acquire(peer, scope="sys")
            ptxops.st(peer + 8, I32(2))  # weak: never checked
            ptxops.multimem_red(mc, I32(1), sem="release", scope="sys")
            ptxops.multimem_red(mc, I32(1))  # PTX's default .relaxed.sys
        return run

    tagged, untagged = ptx_of(body(True)), ptx_of(body(False))
    assert tagged == untagged
    assert opcodes(tagged)["st.release.sys.global.b32"] == 1


def test_the_tag_survives_tensors_tiles_recasts_and_loops() -> None:
    @cute.kernel
    def kernel(g: cute.Tensor):
        peer = cute.make_tensor(ptxops.reach(g.iterator, "peer"), cute.make_layout(1024))
        tile = cute.local_tile(peer, (128,), (cute.arch.block_idx()[0],))
        word = cute.recast_ptr(tile.iterator + 8, dtype=cutlass.Uint32)
        for i in cutlass.range(4):
            ptxops.st_release(word + i * 2, cutlass.Uint32(1), scope="gpu")

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    with pytest.raises(ScopeError, match="release store to peer memory needs .sys"):
        compile_ptx(launch, global_tensor(I32))


def test_untagged_pointers_and_weak_accesses_are_not_checked() -> None:
    def body(p):
        ptxops.st_release(p, I32(1), scope="gpu")  # untagged: as before
        peer = ptxops.reach(p + 32, "peer")
        ptxops.st(peer, I32(1))
        ptxops.ld(peer, sem="volatile")
        ptxops.multimem_st(ptxops.reach(p + 64, "multicast"), I32(1))  # .weak

    assert opcodes(ptx_of(body))["st.release.gpu.global.b32"] == 1


def test_who_tagged_the_pointer_is_named() -> None:
    def body(p):
        ptxops.st_release(ptxops.reach(p, "peer", by="mylib.PeerView.flag"), I32(1), scope="gpu")

    with pytest.raises(ScopeError, match=r"set by mylib\.PeerView\.flag at .*test_reach_compile\.py:\d+"):
        ptx_of(body)


def test_a_remote_arrive_at_cluster_scope_compiles() -> None:
    def body(p):
        ptxops.mbarrier_arrive(_remote_mbarrier(), sem="release", scope="cluster")

    assert opcodes(ptx_of(body, cluster=2))["mbarrier.arrive.release.cluster.shared::cluster.b64"] == 1


def test_a_reach_in_the_wrong_state_space_raises() -> None:
    def body(p):
        smem = SmemAllocator().allocate_array(I32, num_elems=4, byte_alignment=16)
        ptxops.st(ptxops.reach(smem, "peer"), I32(1))

    with pytest.raises(ScopeError, match=r"peer memory cannot address the .shared::cta state space") as info:
        ptx_of(body)
    assert info.value.rule == "reach-space"


def test_unknown_reach_raises() -> None:
    with pytest.raises(ptxops.QualifierError, match="the reaches are cta, cluster, gpu, peer"):
        ptx_of(lambda p: ptxops.reach(p, "remote"))


def test_emulated_multicast_is_checked_too() -> None:
    def body(p):
        with ptxops.emulate_multicast(I64(0), world=2):
            ptxops.multimem_red(ptxops.reach(p, "multicast"), I32(1), sem="release", scope="gpu")

    with pytest.raises(ScopeError, match="multimem reduction into multicast memory needs .sys"):
        ptx_of(body)


def test_the_tag_follows_a_pointer_a_dynamic_loop_carries() -> None:
    """Inside the loop (an scf.while region argument, an scf.for iteration argument) and after
    it (the loop's result), with a counter carried first."""

    def launcher(where: str):
        @cute.kernel
        def kernel(g: cute.Tensor, n: I32):
            i = I32(0)
            p = ptxops.reach(g.iterator, "peer")
            while i < n:
                if cutlass.const_expr(where == "while"):
                    ptxops.st_release(p, I32(1), scope="gpu")
                p = p + 8  # 32 bytes: the pointer keeps its type (align<32>)
                i += 1
            for _ in cutlass.range(n):
                if cutlass.const_expr(where == "for"):
                    ptxops.st_release(p, I32(1), scope="gpu")
                p = p + 8
            if cutlass.const_expr(where == "after"):
                ptxops.st_release(p, I32(1), scope="gpu")

        @cute.jit
        def launch(g: cute.Tensor, n: I32):
            kernel(g, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

        return launch

    for where in ("while", "for", "after"):
        with pytest.raises(ScopeError, match="release store to peer memory needs .sys"):
            compile_ptx(launcher(where), global_tensor(I32), I32(3))


def test_a_pointer_a_loop_swaps_between_local_and_peer_memory_has_the_reach_of_both() -> None:
    """Issue 48 (low): a pointer that enters a loop local (``gpu``) and is a peer's from the
    second iteration on is judged by the join of both (``peer``: a release at .gpu raises),
    after the loop and, inside :func:`~ptxops.ops.pointer_reach.required` (as the collectives'
    kernels trace), in it, once it is traced whole: in scf.while and scf.for loops; at .sys it
    compiles.  Reaches of one width but of different memory (peer and host) are refused."""
    from ptxops.ops.pointer_reach import required

    def launcher(where: str, scope: str = "gpu", kinds: tuple = ("gpu", "peer")):
        @cute.kernel
        def kernel(g: cute.Tensor, n: I32):
            with required("this test"):
                body(g, n)

        @cute.jit
        def body(g: cute.Tensor, n: I32):
            i = I32(0)
            p = ptxops.reach(g.iterator, kinds[0])
            q = ptxops.reach(g.iterator, kinds[1])
            while i < n:
                if cutlass.const_expr(where == "while"):
                    ptxops.st_release(p, I32(1), scope=scope)
                p = q
                i += 1
            r = ptxops.reach(g.iterator, kinds[0])
            for _ in cutlass.range(n):
                if cutlass.const_expr(where == "for"):
                    ptxops.st_release(r, I32(1), scope=scope)
                r = q
            if cutlass.const_expr(where == "after"):
                ptxops.st_release(r, I32(1), scope=scope)

        @cute.jit
        def launch(g: cute.Tensor, n: I32):
            kernel(g, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

        return launch

    for where in ("after", "while", "for"):
        with pytest.raises(ScopeError, match="release store to peer memory needs .sys"):
            compile_ptx(launcher(where), global_tensor(I32), I32(3))
        compile_ptx(launcher(where, "sys"), global_tensor(I32), I32(3))
    with pytest.raises(ptxops.QualifierError, match=r"reach-join"):
        compile_ptx(launcher("while", "sys", ("peer", "host")), global_tensor(I32), I32(3))


def test_required_refuses_untagged_pointers() -> None:
    from ptxops.ops.pointer_reach import required

    def body(p):
        with required("this test"):
            ptxops.st(ptxops.reach(p, "gpu"), I32(1))
            ptxops.st(p + 8, I32(1))

    with pytest.raises(ptxops.QualifierError, match=r"no reach, and this test tags every pointer[\s\S]*reach-required"):
        ptx_of(body)
    ptx_of(lambda p: ptxops.st(p, I32(1)))  # outside it, untagged pointers are fine


def test_emulated_multicast_tags_its_own_pointers() -> None:
    """Under emulate_multicast, the translation table's pointer and a tagged multicast
    pointer's per-rank copies carry reaches of their own: required() passes."""
    from ptxops.ops.pointer_reach import required

    def body(p):
        with required("this test"), ptxops.emulate_multicast(I64(0), world=2):
            ptxops.multimem_red(ptxops.reach(p, "multicast"), I32(1), sem="release", scope="sys")

    assert opcodes(ptx_of(body))["red.release.sys.global.add.s32"] == 2
