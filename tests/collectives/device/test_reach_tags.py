"""Every pointer a collectives kernel accesses has a reach (:func:`ptxops.reach`): the launchers
trace their bodies under ``ptxops.ops.pointer_reach.required``, so an untagged access does not
compile, and a tagged one at a scope too narrow for its memory raises ``ScopeError``."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

import cutlass.cute as cute  # noqa: E402
from cutlass import Int32, Uint32  # noqa: E402

import ptxops  # noqa: E402
from ptxops.ops import pointer_reach  # noqa: E402
from collectives.device import signals  # noqa: E402
from collectives.device.kernel_args import KernelArgs  # noqa: E402
from collectives.device.launch import example_arguments, launcher  # noqa: E402
from tests.support.cute_support import compile_ptx  # noqa: E402


def compiled(store) -> str:
    @cute.jit
    def body(args: KernelArgs):
        store(args.pad)

    return compile_ptx(launcher(body, 32), *example_arguments())


def test_a_tagged_pointer_compiles() -> None:
    ptx = compiled(lambda pad: ptxops.st_release(signals.gmem(Uint32, pad, 4, signals.PEER, "this test"), Uint32(1),
                                                 scope="sys"))
    assert "st.release.sys.global.b32" in ptx


def test_an_untagged_pointer_does_not_compile() -> None:
    with pytest.raises(ptxops.QualifierError, match=r"no reach, and a collectives kernel tags every pointer"):
        compiled(lambda pad: ptxops.st(signals.gmem(Uint32, pad, 4), Uint32(1)))


def test_a_signal_pad_word_released_at_gpu_scope_raises() -> None:
    with pytest.raises(ptxops.ScopeError, match=r"release store to peer memory needs \.sys[\s\S]*set by this test"):
        compiled(lambda pad: ptxops.st_release(signals.gmem(Uint32, pad, 4, signals.PEER, "this test"), Uint32(1),
                                               scope="gpu"))


@pytest.mark.parametrize(("reach", "scope"), [("PEER", "sys"), ("MULTICAST", "sys"), ("LOCAL", "gpu"), ("HOST", "sys")])
def test_the_reach_names_are_ptxops_reaches_with_the_scopes_collectives_use(reach: str, scope: str) -> None:
    kind = getattr(signals, reach)
    assert ptxops.spec.reach.REACHES[kind].needs == scope


def test_every_multimem_store_of_the_multicast_barrier_goes_through_a_multicast_pointer(monkeypatch) -> None:
    """Its signal and the gave-up word of a wait that times out: both through the pad's
    multicast address (peer and multicast reaches need the same scope, so only the tag tells)."""
    reaches: list[tuple[str, str]] = []
    check = pointer_reach.check

    def recording(inst, ptr, *, tag=None):
        reaches.append((inst.family, (tag or pointer_reach.reach_of(ptr)).kind))
        check(inst, ptr, tag=tag)

    monkeypatch.setattr(pointer_reach, "check", recording)

    @cute.jit
    def body(args: KernelArgs):
        signals.barrier_multicast(args.pad_mc, args.pad, args.rank, Int32(0), Uint32(0), Uint32(1), args.timeout_ns,
                                  args.err, Int32(0), Uint32(args.n), 2)

    compile_ptx(launcher(body, 32), *example_arguments())
    assert [kind for family, kind in reaches if family == "multimem.st"] == [signals.MULTICAST] * 2
