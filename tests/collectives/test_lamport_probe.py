"""``collectives.tools.lamport_probe``'s line per rank on CPU: its pad words decoded per Lamport
buffer, as many as :data:`collectives.config.LAMPORT_BUFFERS` says (the label and the groups)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("buffers", [2, 3, 4])
def test_a_ranks_line_has_an_entry_group_per_lamport_buffer(monkeypatch, buffers: int) -> None:
    from collectives.tools import lamport_probe

    monkeypatch.setattr(lamport_probe, "LAMPORT_BUFFERS", buffers)
    world = 2
    dirty = [10 + b for b in range(buffers)]
    sizes = [v for b in range(buffers) for s in range(world) for v in (100 * b + s, 7)]  # (n, tag) per entry
    arrivals = [0] * (4 * world)
    line = lamport_probe.describe(0, "ok", [5, 1, 1] + dirty + sizes + arrivals + [5], world)
    label = "|".join(str(b) for b in range(buffers))
    groups = " | ".join(",".join(f"7:{100 * b + s}" for s in range(world)) for b in range(buffers))
    assert f"dirty={dirty}" in line
    assert f"entries[buffer {label}]={groups} " in line
