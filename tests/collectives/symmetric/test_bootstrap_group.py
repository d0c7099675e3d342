"""The process group that :func:`collectives.init` starts under torchrun outlives a context's
``close()``: torch cannot start a default group again under torchrun's store once one was
destroyed (its new gloo pairs may read the old group's addresses there), so an init after a
close must borrow the group. Three ranks under ``python -m torch.distributed.run`` on the CPU
(gloo) open and close a context three times, at staggered moments, talking over the group each
time; the same loop that destroys the group at close (the code before) failed 2 runs of 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]

RANK = textwrap.dedent("""
    import os, random, time
    import torch.distributed as dist
    from collectives.symmetric import bootstrap
    from collectives.symmetric.context import Context
    from tests.collectives.symmetric.test_symmetric_host import FakeHeap, caps

    for round in range(3):
        if not dist.is_initialized():
            bootstrap.start_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        ctx = Context(heap=FakeHeap(rank), group=None, rank=rank, world_size=world, device=0,
                      caps=caps(False, world), backend="peer")
        seen = [None] * world
        dist.all_gather_object(seen, (round, rank))
        assert seen == [(round, r) for r in range(world)], seen
        time.sleep(random.random() * 0.3)  # ranks close at different moments
        ctx.close()
        assert dist.is_initialized(), "close() destroyed the process group"
    os.write(1, f"rank {rank} ok\\n".encode())  # one write: the three ranks share the pipe
""")


def test_init_after_close_borrows_the_group_that_the_first_init_started(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                          "--standalone", str(script)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(line for line in run.stdout.splitlines() if line.startswith("rank")) == \
        [f"rank {r} ok" for r in range(3)]
