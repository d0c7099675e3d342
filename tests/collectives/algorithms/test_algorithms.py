"""The algorithm classes (collectives.algorithms): the registry is the extension point, each
algorithm decides which key choices and which calls it takes, and the kernel arguments are
declared once (collectives.layouts).  Pure Python: no kernel is compiled here."""

from __future__ import annotations

import inspect
import itertools

import pytest

pytest.importorskip("cutlass")

from collectives.algorithms import tuning  # noqa: E402
from collectives.algorithms import ALGORITHMS, REGISTRY, Algorithm, Call, KernelKey  # noqa: E402
from collectives.algorithms.base import algorithms  # noqa: E402
from collectives.config import LAMPORT_MAX_BYTES  # noqa: E402
from collectives.errors import CollectiveError  # noqa: E402
from collectives.device.launch import _signature, example_arguments, flag_example_arguments  # noqa: E402
from collectives.layouts import COLLECTIVE, FLAGS, PUSH_ALL_REDUCE  # noqa: E402


def call(collective: str = "all_reduce", *, nbytes: int = 1 << 20, backend: str = "peer", dtype: str = "bf16",
         symmetric: bool = True, in_place: bool = True, whole: bool = True, aligned: bool = True, world: int = 4) -> Call:
    return Call(collective, None, None, dtype, "sum", backend, world, n=nbytes // 2, nbytes=nbytes,
                symmetric=symmetric, in_place=in_place, whole_vectors=whole, pointers_aligned=aligned,
                capturing=False)


def test_a_call_of_more_elements_than_the_size_word_carries_is_refused() -> None:
    """The barriers compare sizes in the 29 bits below the kinds of the tensors: 2^29 elements
    would pass against a peer's 0."""
    fields = dict(out=None, inp=None, dtype="f32", op="sum", backend="peer", world=2, nbytes=0, symmetric=True,
                  in_place=True, whole_vectors=True, pointers_aligned=True, capturing=False)
    Call("all_reduce", n=(1 << 29) - 1, **fields)
    with pytest.raises(CollectiveError, match=r"29 bits.*at most 536870911"):
        Call("all_reduce", n=1 << 29, **fields)


@pytest.mark.parametrize("fact", ["symmetric", "in_place", "aligned"])
def test_each_fact_an_algorithm_choice_reads_of_a_ranks_tensors_has_its_own_kind_bit(fact: str) -> None:
    """Ranks whose tensors differ in any of these facts may plan different kernels: the kinds
    (brought to the barriers with the size) differ, whatever the others are."""
    from collectives.config import KIND_BITS

    base = dict(symmetric=True, in_place=True, aligned=True)
    for others in itertools.product([False, True], repeat=2):
        facts = dict(zip([f for f in base if f != fact], others))
        one, other = call(**facts, **{fact: True}), call(**facts, **{fact: False})
        assert one.kinds != other.kinds
        assert 0 <= min(one.kinds, other.kinds) < max(one.kinds, other.kinds) < 1 << KIND_BITS


def test_calls_that_differ_in_collective_dtype_op_or_kinds_bring_different_size_words() -> None:
    """Every pair of (collective, dtype, op, kinds) gives different size words for equal and
    for different element counts below 2^TAG_SHIFT (an f32 and a bf16 all-reduce of equal n,
    an all-gather and a reduce-scatter of equal n: issue 48 item 3), as the kernels form them
    (:func:`collectives.device.signals.size_word`: ``n ^ signature``, unsigned 32-bit)."""
    from collectives.algorithms.base import CALL_TAGS, TAG_SHIFT, signature
    from collectives.config import KIND_BITS

    signatures = {signature(*what, kinds) % (1 << 32) for what in CALL_TAGS for kinds in range(1 << KIND_BITS)}
    assert len(signatures) == len(CALL_TAGS) << KIND_BITS
    counts = [0, 1, 2, 2048, 4096, (1 << TAG_SHIFT) - 1]
    words = {(n ^ s) for n in counts for s in signatures}
    assert len(words) == len(counts) * len(signatures)
    fields = dict(out=None, inp=None, op="sum", backend="peer", world=2, n=2048, nbytes=0, symmetric=True,
                  in_place=False, whole_vectors=True, pointers_aligned=True, capturing=False)
    assert Call("all_reduce", dtype="f32", **fields).signature != Call("all_reduce", dtype="bf16", **fields).signature
    assert (Call("all_gather", dtype="f32", **fields).signature
            != Call("reduce_scatter", dtype="f32", **fields).signature)


REFUSED = [  # (key, a piece of the message)
    (dict(collective="all_gather", algorithm="one_shot", stage_in=True), "no stage_in"),
    (dict(collective="all_gather", algorithm="tma", stage_in=True), "no stage_in"),
    (dict(collective="barrier", algorithm="one_shot", gather_out=True), "gather_out"),
    (dict(collective="all_reduce", algorithm="one_shot", gather_out=True), "gather_out"),
    (dict(collective="reduce_scatter", algorithm="tma", gather_out=True), "gather_out"),
    (dict(collective="all_reduce", algorithm="push", stage_in=False), "push sends"),
    (dict(collective="all_reduce", algorithm="push", stage_in=True, end_barrier=False), "end barrier"),
    (dict(collective="reduce_scatter", algorithm="one_shot", end_barrier=False), "end barrier"),
    (dict(collective="all_reduce", algorithm="two_shot", stage_in=True, end_barrier=False), "end barrier"),
    (dict(collective="all_reduce", algorithm="tma", vector=1), "16-byte"),
    (dict(collective="all_gather", algorithm="tma", vector=1), "16-byte"),
    (dict(collective="all_reduce", algorithm="lamport", stage_in=True), "lamport"),
]
TAKEN = [
    dict(collective="all_reduce", algorithm="one_shot", stage_in=True, end_barrier=False),
    dict(collective="reduce_scatter", algorithm="push", stage_in=True, end_barrier=False),
    dict(collective="all_reduce", algorithm="two_shot", stage_in=True, gather_out=True),
    dict(collective="all_gather", algorithm="one_shot", gather_out=True, vector=1),
    dict(collective="all_reduce", algorithm="lamport", threads=256),
]


@pytest.mark.parametrize(("fields", "why"), REFUSED)
def test_each_algorithm_refuses_the_choices_it_does_not_take(fields: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        KernelKey(backend="peer", dtype="bf16", world=4, **fields)


@pytest.mark.parametrize("fields", TAKEN)
def test_and_takes_its_own(fields: dict) -> None:
    key = KernelKey(backend="peer", dtype="bf16", world=4, **fields)
    assert key.impl is REGISTRY[key.collective, key.algorithm]


def test_a_new_algorithm_is_one_class_in_one_module() -> None:
    """Defining the class registers it: keys take its name and the API can dispatch to it."""

    class Ring(Algorithm):
        collectives = ("all_reduce",)
        name = "ring"

        def plan(self, comm, c: Call):
            return ("ring plan", c.nbytes)

    try:
        assert REGISTRY["all_reduce", "ring"].name == "ring"
        assert algorithms("all_reduce")[-1] == "ring"
        assert KernelKey("all_reduce", "ring", "peer", "bf16", 4).impl is REGISTRY["all_reduce", "ring"]
        pytest.importorskip("torch")
        from collectives import api

        assert api._plan(None, call(nbytes=4096), "ring") == ("ring plan", 4096)
    finally:
        del REGISTRY["all_reduce", "ring"]
    assert "ring" not in algorithms("all_reduce") and "ring" not in ALGORITHMS["all_reduce"]


def test_refusals_name_the_limit() -> None:
    lamport, tma = REGISTRY["all_reduce", "lamport"], REGISTRY["all_reduce", "tma"]
    assert lamport.refusal(call(nbytes=LAMPORT_MAX_BYTES)) is None
    assert str(LAMPORT_MAX_BYTES) in lamport.refusal(call(nbytes=LAMPORT_MAX_BYTES + 2))
    assert tma.refusal(call()) is None
    assert "16-byte" in tma.refusal(call(aligned=False))
    assert "16-byte" in REGISTRY["all_gather", "tma"].refusal(call("all_gather", whole=False))


def test_auto_reads_the_call() -> None:
    assert tuning.choose(call(nbytes=4 << 10)) == "lamport"
    big = 256 << 20
    assert tuning.choose(call(nbytes=4 << 20)) in ("two_shot", "tma")
    assert tuning.choose(call(nbytes=16 << 20)) == "push"  # symmetric, 4 GPUs: stores only (SYMMETRIC_PUSH_MIN)
    assert tuning.choose(call(nbytes=big)) == "push"
    assert tuning.choose(call(nbytes=big, in_place=False)) == "push"  # symmetric input, but an out=
    assert tuning.choose(call(nbytes=big, symmetric=False)) == "push"
    assert tuning.choose(call("reduce_scatter", nbytes=big, symmetric=False)) == "push"
    assert tuning.choose(call("all_gather", nbytes=big)) == "one_shot"


def test_a_call_picks_its_vector() -> None:
    assert call().vector == 8 and call(dtype="f32").vector == 4
    assert call(whole=False).vector == 1 and call(aligned=False).vector == 1
    with pytest.raises(CollectiveError, match="16-byte aligned"):
        call(aligned=False, backend="multicast_emulated").vector  # noqa: B018


def test_kernel_arguments_are_declared_once() -> None:
    names = [a.name for a in COLLECTIVE.args]
    assert names[:2] == ["data_table", "data_mc"] and names[-2:] == ["rank", "timeout_ns"]
    # The push all-reduce's second argument is its own, of the same type in the same place.
    assert [a.name for a in PUSH_ALL_REDUCE.args] == ["data_table", "results"] + names[2:]
    assert [a.type for a in PUSH_ALL_REDUCE.args] == [a.type for a in COLLECTIVE.args]
    assert (COLLECTIVE.emulated, PUSH_ALL_REDUCE.emulated) == ("data_mc", "results")
    values = {name: i for i, name in enumerate(names)}
    assert COLLECTIVE.pack(**values) == tuple(range(len(names)))
    with pytest.raises(TypeError, match="missing"):
        COLLECTIVE.pack(**{k: v for k, v in values.items() if k != "err"})
    with pytest.raises(TypeError, match="unknown"):
        PUSH_ALL_REDUCE.pack(**values)
    assert len(example_arguments()) == len(names) + 2 and len(flag_example_arguments()) == len(FLAGS.args) + 1


def test_the_launcher_signature_is_the_layout() -> None:
    fn = _signature(lambda *values: None, PUSH_ALL_REDUCE, ("blocks", int))
    assert list(inspect.signature(fn).parameters) == [a.name for a in PUSH_ALL_REDUCE.args] + ["blocks"]
