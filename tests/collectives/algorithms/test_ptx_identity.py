"""The PTX-identity guard: every kernel key of every kernel family compiles to the PTX recorded in
``tests/data/ptx_identity.json`` (normalised: comments, the kernel's name, label and register
numbering aside), so that a change to the Python around the kernels changes no kernel.

CI compiles :func:`~collectives.tools.ptx_identity.sample` (every collective x algorithm x
backend, every variant flag, world size, dtype and op at least once); ``PTX_IDENTITY=all``
compiles all of them, as does ``python -m collectives.tools.ptx_identity check``.  A change meant
to change kernels records anew (``... record``) and says why in its commit."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("cutlass")

from collectives.tools import ptx_identity  # noqa: E402

RECORD = json.loads(ptx_identity.SNAPSHOT.read_text())
ALL = ptx_identity.snapshot_keys()
IDS = ALL if os.environ.get("PTX_IDENTITY") == "all" else ptx_identity.sample(ALL)


def test_the_record_covers_every_key() -> None:
    assert sorted(RECORD["kernels"]) == sorted(ALL), "keys changed: record anew and explain why"
    assert ptx_identity.gaps(RECORD["kernels"], ALL) == []


def test_the_sample_covers_every_algorithm_and_backend() -> None:
    collective = [kid for kid in ALL if kid.split("/")[0] in ptx_identity.families()["collective"].prefixes]
    covered = {tuple(kid.split("/")[:3]) for kid in ptx_identity.sample(collective)}
    assert covered == {tuple(kid.split("/")[:3]) for kid in collective}


def test_a_registered_family_missing_from_a_gate_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both gates compile every registered family's keys (the signed-word scan:
    :func:`~collectives.tools.signed_scan.scanned`); a family whose keys the record lacks, or
    that snapshots none, is a gap."""
    from dataclasses import replace

    from collectives.tools import signed_scan

    families = ptx_identity.families()
    twin = replace(families["moe_gather"], name="moe_twin", prefixes=("moe_twin",),
                   snapshot=lambda: ["moe_twin/b16/t256"])
    monkeypatch.setitem(families, "moe_twin", twin)
    ids = ptx_identity.snapshot_keys()
    assert "moe_twin/b16/t256" in ids and "moe_twin/b16/t256" in signed_scan.scanned(sample=True)
    assert ptx_identity.gaps(RECORD["kernels"], ids) == ["moe_twin/b16/t256"]
    monkeypatch.setitem(families, "moe_twin", replace(twin, snapshot=lambda: []))
    assert ptx_identity.gaps(RECORD["kernels"], ptx_identity.snapshot_keys()) == [
        "family moe_twin: no keys", "family moe_twin: no sampled keys"]


def test_normalising_keeps_instructions_and_drops_names() -> None:
    a = "// c\n.visible .entry k0(\n.param .u64 k0_param_0)\n{\nld.param.b64 %rd7, [k0_param_0];\n$L__BB0_3:\nadd.s64 %rd9, %rd7, 1;\n}"
    b = a.replace("k0", "other_1").replace("%rd7", "%rd2").replace("$L__BB0_3", "$L__BB1_0")
    assert ptx_identity.normalize(a) == ptx_identity.normalize(b)
    assert ptx_identity.normalize(a) != ptx_identity.normalize(a.replace("add.s64", "sub.s64"))
    assert ptx_identity.normalize(a) != ptx_identity.normalize(a.replace("%rd9, %rd7", "%rd7, %rd9"))


@pytest.mark.parametrize("kid", IDS)
def test_kernel_ptx_is_unchanged(kid: str) -> None:
    recorded = RECORD["kernels"][kid]
    if RECORD["versions"]["nvidia-cutlass-dsl"] != ptx_identity.versions()["nvidia-cutlass-dsl"]:
        pytest.skip(f"recorded with CuTeDSL {RECORD['versions']['nvidia-cutlass-dsl']}: record anew")
    _, now, _ = ptx_identity.compile_one(kid)
    assert now == recorded, (
        f"{kid}: the kernel's PTX changed ({recorded} -> {now}); diff the normalised texts with "
        "`python -m collectives.tools.ptx_identity check --dir D` against a record --dir of the base")
