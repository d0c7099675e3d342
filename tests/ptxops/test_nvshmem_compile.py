"""``ptxops.nvshmem`` in kernels compiled without a GPU: the CI check of the pinned CuTeDSL and
nvshmem4py pair (a kernel with a device-side put and put-with-signal traces, links NVSHMEM's
device bitcode and assembles), and each rule of :mod:`ptxops.spec.nvshmem` refusing a wrong
kernel at trace time.  Skipped, with the reason, where nvshmem4py is not installed."""

from __future__ import annotations

import re

import pytest

pytest.importorskip(
    "nvshmem.bindings.device.cute", reason="nvshmem4py is not installed: pip install -e '.[nvshmem]'"
)

from tests.support import nvshmem_kernels  # noqa: E402
from tests.support.cute_support import compile_ptx, cute, cutlass, global_tensor  # noqa: E402

import ptxops  # noqa: E402
from ptxops import QualifierError  # noqa: E402
from ptxops import nvshmem as nv  # noqa: E402
from ptxops.spec import nvshmem as rules  # noqa: E402

F32, U64 = cutlass.Float32, cutlass.Uint64


def sym(t: cute.Tensor) -> cute.Tensor:
    """``t`` on a pointer tagged symmetric."""
    return cute.make_tensor(ptxops.reach(t.iterator, "symmetric"), t.layout)


def ptx_of(body, n_dst: int = 64, n_src: int = 64, dtype=F32, arch: str = "sm_90a") -> str:
    """Compile a one-block kernel running ``body(dst, src, signal)``: global tensors of ``dtype``
    (``n_dst`` and ``n_src`` elements, aligned to their element) and a one-word Uint64 signal."""

    @cute.kernel
    def kernel(dst: cute.Tensor, src: cute.Tensor, sig: cute.Tensor):
        body(dst, src, sig)

    @cute.jit
    def launch(dst: cute.Tensor, src: cute.Tensor, sig: cute.Tensor):
        kernel(dst, src, sig).launch(grid=[1, 1, 1], block=[32, 1, 1])

    width = dtype.width // 8
    return compile_ptx(launch, global_tensor(dtype, n_dst, width), global_tensor(dtype, n_src, width),
                       global_tensor(U64, 1, 8), arch=arch)


@pytest.mark.shard_weight(50)  # ptxas assembles NVSHMEM's device library: about 25 s
def test_put_and_signal_compile_and_link_without_a_gpu() -> None:
    """The pinned pair: the GPU test's kernel (put-with-signal, put_nbi of a count, quiet, get,
    fetch-add, signal_op, the bounded signal wait) traces through nvshmem4py's bindings, NVSHMEM's bitcode
    for the target links (its functions are defined in the PTX, not left external), and ptxas
    assembles it (compile_ptx runs it)."""
    ptx = compile_ptx(nvshmem_kernels.ring, *nvshmem_kernels.example_args())
    assert ".entry" in ptx and ".target sm_90a" in ptx
    defined = set(re.findall(r"^\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M))
    external = set(re.findall(r"^\.extern\s+\.func\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M))
    called = set(re.findall(r"\bcall(?:\.uni)?\s+(?:\([^)]*\),\s*)?(\w+)", ptx))
    assert {"nvshmem_float_put_signal", "nvshmem_float_put_nbi"} <= defined, "NVSHMEM's bitcode not linked"
    assert called <= defined | external and not {f for f in external if "nvshmem" in f}, \
        f"NVSHMEM functions left undefined: {sorted(called - defined)} {sorted(external)}"
    assert "ld.acquire.sys.global.b64" in ptx  # signal_wait: acquire loads at .sys


def test_the_bitcode_follows_the_compile_target() -> None:
    assert nv.bitcode_path("sm_90a").endswith("libnvshmem_device_sm_90.bc")
    assert nv.bitcode_path("sm_100a").endswith("libnvshmem_device_sm_100.bc")
    assert nv.bitcode_path("sm_103a").endswith("libnvshmem_device_sm_100.bc")  # newest not above
    with pytest.raises(RuntimeError, match="no NVSHMEM device bitcode for sm_70"):
        nv.bitcode_path("sm_70")


def test_every_call_nvshmem4py_binds() -> None:
    """Each binding :data:`ptxops.spec.nvshmem.CALLS` names exists, for every element type."""
    import nvshmem.bindings.device.cute as bindings

    for call in rules.CALLS.values():
        if call.name == "signal_wait":  # ptxops's own bounded poll
            continue
        ops = call.operands[:1]
        prefixes = rules.types_of(ops[0].types).values() if ops else [None]
        scopes = rules.SCOPES.values() if "{scope}" in call.binding else [""]
        for prefix in prefixes:
            for scope in scopes:
                name = call.binding.format(type=prefix, scope=scope)
                assert callable(getattr(bindings, name, None)), (call.name, name)


#: Wrong kernels, each refused at trace time: (id, body, the rule, kwargs of ptx_of).
WRONG = [
    ("put to a peer's mapped address", lambda d, s, g: nv.put(
        cute.make_tensor(ptxops.reach(d.iterator, "peer"), d.layout), s, 1), "nvshmem-symmetric", {}),
    ("put to an untagged dst", lambda d, s, g: nv.put(d, s, 1), "nvshmem-symmetric", {}),
    ("signal on non-symmetric memory", lambda d, s, g: nv.put_signal(sym(d), s, g, 1, 1), "nvshmem-symmetric", {}),
    ("put from a multicast address", lambda d, s, g: nv.put(
        sym(d), cute.make_tensor(ptxops.reach(s.iterator, "multicast"), s.layout), 1), "nvshmem-local", {}),
    ("fetch-add on a float", lambda d, s, g: nv.fetch_add(sym(d).iterator, 1.0, 1), "nvshmem-type", {}),
    ("put of a dtype NVSHMEM does not bind", lambda d, s, g: nv.put(sym(d), s, 1), "nvshmem-type",
     {"dtype": cutlass.Float8E4M3FN}),
    ("sizes differ, no count", lambda d, s, g: nv.put(sym(d), s, 1), "nvshmem-count", {"n_src": 32}),
    ("count above a size", lambda d, s, g: nv.put(sym(d), s, 1, count=65), "nvshmem-count", {}),
    ("a bare pointer without a count", lambda d, s, g: nv.put(sym(d).iterator, s, 1), "nvshmem-count", {}),
    ("strided src", lambda d, s, g: nv.put(
        sym(d), cute.make_tensor(s.iterator, cute.make_layout(32, stride=2)), 1, count=32), "nvshmem-contiguous", {}),
    ("unknown signal op", lambda d, s, g: nv.signal_op(sym(g), 1, 1, op="or"), "nvshmem-signal-op", {}),
    ("unknown scope", lambda d, s, g: nv.put(sym(d), s, 1, scope="grid"), "nvshmem-scope", {}),
    ("unknown comparison", lambda d, s, g: nv.signal_wait(sym(g), 1, cutlass.Int64(0), cmp="geq"),
     "nvshmem-compare", {}),
]


@pytest.mark.parametrize(("body", "rule", "kwargs"), [w[1:] for w in WRONG], ids=[w[0] for w in WRONG])
def test_wrong_kernels_are_refused_at_trace_time(body, rule: str, kwargs: dict) -> None:
    with pytest.raises(QualifierError) as info:
        ptx_of(body, **kwargs)
    assert info.value.rule == rule and f"[{rule}]" in str(info.value) and info.value.target == "sm_90a"

