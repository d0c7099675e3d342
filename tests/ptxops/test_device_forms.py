"""Every legal form of every family, emitted through its device function, compiles through
CuTeDSL (and so through ptxas) for sm_90a and sm_100a, and the PTX holds exactly those
instructions.  For ld and st (tens of thousands of forms), every legal form of each oracle
group (``spec_groups``): each qualifier group's legal combinations with the other qualifiers
at a representative legal completion."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.cute_support import compile_ptx, cute, cutlass, global_tensor, opcodes
from cutlass.memory import SmemAllocator

import ptxops
from ptxops import spec
from ptxops.render import Instruction
from ptxops.ops.tensor import ROW_COORDS
from ptxops.spec.tensor import ROWS, WIDE
from ptxops.spec.tensormap import DIMENSION_FIELDS, MODE_FIELDS
from tests.support.spec_groups import legal_forms

TARGETS = ("sm_90a", "sm_100a")
_INT = {16: cutlass.Int16, 32: cutlass.Int32, 64: cutlass.Int64}


def _zeros(inst: Instruction, role: str) -> list:
    op = next(o for o in inst.operands if o.role == role)
    return [_INT[b](0) for b in op.carriers]


def emit_form(inst: Instruction, gptr, sptr, pointers: dict | None = None) -> None:
    """Call the device function that emits ``inst`` with packed zero registers (``pointers``:
    a pointer for each further state space, such as ``local``)."""
    q = dict(inst.qualifiers)
    q.pop("target")
    space = q.pop("space", None)
    ptr = sptr if str(space).startswith("shared") else (pointers or {}).get(space, gptr)
    common = dict(packed=True, type=q.pop("type", None), vec=q.pop("vec", None))
    if inst.family == "fence":
        needs_ptr = any(o.role == "a" for o in inst.operands)
        ptxops.fence(ptr=gptr if needs_ptr else None, **q)
    elif inst.family == "multimem.ld_reduce":
        ptxops.multimem_ld_reduce(ptr, space=space, **q, **common)
    elif inst.family in ("multimem.st", "multimem.red"):
        fn = ptxops.multimem_st if inst.family == "multimem.st" else ptxops.multimem_red
        fn(ptr, _zeros(inst, "b"), space=space, **q, **common)
    elif inst.family == "atom" and q["op"] == "cas":
        q.pop("op")
        common.pop("vec")
        ptxops.atom_cas(ptr, _zeros(inst, "b"), _zeros(inst, "c"), space=space, **q, **common)
    elif inst.family in ("atom", "red"):
        fn = ptxops.atom if inst.family == "atom" else ptxops.red
        fn(ptr, _zeros(inst, "b"), space=space, **q, **common)
    elif inst.family in ("ld", "st"):
        hints = dict(nc=q.pop("nc", None) == "nc") if inst.family == "ld" else {}
        if q.pop("cache_hint"):
            hints["cache_policy"] = cutlass.Int64(0)
        if inst.family == "ld":
            ptxops.ld(ptr, space=space, **q, **hints, **common)
        else:
            ptxops.st(ptr, _zeros(inst, "b"), space=space, **q, **hints, **common)
    elif inst.family == "cp.async.bulk":
        dst = sptr if q["dst"].startswith("shared") else gptr
        src = sptr if q["src"].startswith("shared") else gptr
        mbar = sptr if any(o.role == "mbar" for o in inst.operands) else None
        ptxops.cp_async_bulk(
            dst, src, 16, mbar=mbar, dst_space=q["dst"], src_space=q["src"],
            completion=q["completion"], cache_policy=cutlass.Int64(0) if q["cache_hint"] else None,
        )
    elif inst.family == "cp.reduce.async.bulk":
        dst = ptxops.mapa(sptr, 0) if q["dst"] == "shared::cluster" else gptr
        mbar = dst if any(o.role == "mbar" for o in inst.operands) else None
        ptxops.cp_reduce_async_bulk(
            dst, sptr, 16, op=q["op"], type=common["type"], mbar=mbar, dst_space=q["dst"],
            src_space=q["src"], completion=q["completion"],
            cache_policy=cutlass.Int64(0) if q["cache_hint"] else None,
        )
    elif inst.family in ("st.async", "red.async"):
        ptr = ptxops.mapa(sptr, 0) if space == "shared::cluster" else gptr
        mbar = ptr if q.pop("completion") else None
        if inst.family == "st.async":
            ptxops.st_async(ptr, _zeros(inst, "b"), mbar, space=space, **q, **common)
        else:
            common.pop("vec")
            ptxops.red_async(ptr, _zeros(inst, "b"), mbar, space=space, **q, **common)
    elif inst.family in ("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor", "cp.async.bulk.prefetch.tensor"):
        emit_tensor_form(inst, q, sptr, pointers["tmap"])
    elif inst.family == "tensormap.replace":
        value = 0 if q["field"] in MODE_FIELDS else _zeros(inst, "b")[0]
        ord_ = 0 if q["field"] in DIMENSION_FIELDS else None
        ptxops.tensormap_replace(sptr if space == "shared::cta" else pointers["tmap"], q["field"], value, ord=ord_, space=space)
    elif inst.family == "tensormap.cp_fenceproxy":
        ptxops.tensormap_cp_fenceproxy(pointers["tmap"], sptr, scope=q["scope"])
    elif inst.family == "multimem.cp.async.bulk":
        ptxops.multimem_cp_async_bulk(gptr, sptr, 16, byte_mask=0xFF if q["cp_mask"] else None)
    elif inst.family == "multimem.cp.reduce.async.bulk":
        ptxops.multimem_cp_reduce_async_bulk(gptr, sptr, 16, op=q["op"], type=common["type"])
    elif inst.family == "mapa":
        ptxops.mapa(sptr if space else gptr, 1, space=space, type=common["type"])
    elif inst.family == "nanosleep":
        ptxops.nanosleep(100)
    elif inst.family == "griddepcontrol.launch_dependents":
        ptxops.griddepcontrol_launch_dependents()
    elif inst.family == "griddepcontrol.wait":
        ptxops.griddepcontrol_wait()
    elif inst.family == "membar":
        ptxops.membar(q["level"], proxy=q["proxy"])
    elif inst.family == "elect.sync":
        ptxops.elect_sync()
    elif inst.family == "prefetch":
        ptxops.prefetch(ptr, q["level"], space=space)
    elif inst.family == "prefetchu":
        ptxops.prefetchu(gptr)
    elif inst.family == "cp.async.bulk.prefetch":
        ptxops.cp_async_bulk_prefetch(gptr, 64, cache_policy=cutlass.Int64(0) if q["cache_hint"] else None)
    elif inst.family == "st.bulk":
        ptxops.st_bulk(ptr, 64, sem=q["sem"], space=space)
    elif inst.family == "clusterlaunchcontrol.try_cancel":
        ptxops.clusterlaunchcontrol_try_cancel(ptr, ptr + 4, space=space, multicast=q["multicast"] is not None)
    elif inst.family == "clusterlaunchcontrol.query_cancel":
        ptxops.clusterlaunchcontrol_query_cancel([cutlass.Int64(0), cutlass.Int64(0)], q["query"])
    elif inst.family == "cp.async.bulk.commit_group":
        ptxops.cp_async_bulk_commit_group()
    elif inst.family == "cp.async.bulk.wait_group":
        ptxops.cp_async_bulk_wait_group(1, **q)
    elif inst.family == "mbarrier.init":
        ptxops.mbarrier_init(ptr, 1, space=space)
    elif inst.family == "mbarrier.arrive":
        tx = cutlass.Int32(16) if q.pop("expect_tx") else None
        ptxops.mbarrier_arrive(ptr, tx, space=space, **q)
    elif inst.family == "mbarrier.try_wait":
        waits = dict(phase=0) if q.pop("parity") else dict(state=cutlass.Int64(0))
        ptxops.mbarrier_try_wait(ptr, space=space, **waits, **q)
    else:
        raise AssertionError(inst.family)


def emit_tensor_form(inst: Instruction, q: dict, sptr, tmap) -> None:
    """A tensor-map form through its device function: zero coordinates and offsets, a cache
    policy where the form has ``.L2::cache_hint``, CTA 0 alone in a multicast mask."""
    coords = [0] * (ROW_COORDS if q["load_mode"] in ROWS else int(q["dim"][0]))
    policy = cutlass.Int64(0) if q["cache_hint"] else None
    offsets = [0] * (len(coords) - 2) if q["load_mode"] == "im2col" else [0, 0] if q["load_mode"] in WIDE else None
    if inst.family == "cp.async.bulk.prefetch.tensor":
        ptxops.cp_async_bulk_prefetch_tensor(
            tmap, coords, load_mode=q["load_mode"], im2col_offsets=offsets, cache_policy=policy
        )
    elif inst.family == "cp.reduce.async.bulk.tensor":
        ptxops.cp_reduce_async_bulk_tensor(
            tmap, sptr, coords, op=q["op"], load_mode=q["load_mode"], cache_policy=policy
        )
    elif q["src"] == "global":
        ptxops.cp_async_bulk_tensor(
            sptr, tmap, coords, mbar=sptr, load_mode=q["load_mode"], im2col_offsets=offsets,
            cta_mask=1 if q["multicast"] else None, cache_policy=policy, dst_space=q["dst"],
            cta_group=int(q["cta_group"][-1]) if q["cta_group"] else None,
        )
    else:
        ptxops.cp_async_bulk_tensor(tmap, sptr, coords, load_mode=q["load_mode"], cache_policy=policy)


def make_launcher(forms: list[Instruction]):
    @cute.kernel
    def kernel(g: cute.Tensor):
        smem = SmemAllocator()
        s = smem.allocate_array(cutlass.Int32, num_elems=64, byte_alignment=128)
        local = cute.make_rmem_tensor((16,), cutlass.Int32)
        pointers = {
            "local": cute.recast_ptr(local.iterator, dtype=cutlass.Int32),
            "const": cute.make_ptr(cutlass.Int32, 0, cute.AddressSpace.cmem, assumed_align=32),
            "tmap": cute.make_ptr(cutlass.Int64, g.iterator.toint(), cute.AddressSpace.gmem, assumed_align=64),
        }
        for inst in forms:
            emit_form(inst, g.iterator, s, pointers)

    @cute.jit
    def launch(g: cute.Tensor):
        kernel(g).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return launch


def _qualifiers(inst: Instruction) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in dict(inst.qualifiers).items() if k != "target"))


def forms_to_compile(family: str, target: str) -> list[Instruction]:
    """The legal forms of ``family`` on ``target`` that go through the device functions here: on
    the first of :data:`TARGETS` all of them; on a later one only those whose qualifiers the
    first lacks (a form legal on both emits the same text through the same function, and the
    ptxas oracle assembles every form on every target: ``test_oracle.py``)."""
    forms = legal_forms(family, target)
    if target == TARGETS[0]:
        return forms
    first = {_qualifiers(f) for f in legal_forms(family, TARGETS[0])}
    return [f for f in forms if _qualifiers(f) not in first]


#: Every family on every target where it has forms (st.bulk, clusterlaunchcontrol: sm_100+),
#: except where a later target adds none to the first (multimem's fp8 and ld/st's sm_100 forms
#: do); a target whose legal forms came out empty stays, and fails.
CASES = [(f, t) for f in spec.FAMILIES for t in TARGETS
         if next(spec.forms(f, target=t), None) and (not legal_forms(f, t) or forms_to_compile(f, t))]


def test_every_family_has_forms_on_a_tested_target() -> None:
    assert {f for f, _ in CASES} == set(spec.FAMILIES)


@pytest.mark.parametrize(("family", "target"), CASES)
def test_every_form_compiles_through_its_device_function(family: str, target: str) -> None:
    assert legal_forms(family, target), f"{family} has no forms on {target}"
    forms = forms_to_compile(family, target)
    ptx = compile_ptx(make_launcher(forms), global_tensor(align=64), arch=target)
    expected = Counter(f.opcode for f in forms)
    assert sum(expected.values()) == len(forms)
    found = opcodes(ptx, expected)
    missing = expected - found
    extra = found - expected
    assert not missing and not extra, f"missing {list(missing)[:5]}, extra {list(extra)[:5]}"
