"""Run a test body on several CPU processes joined by torch.distributed's gloo backend.

``run_gloo(body, world, tmp_path)`` spawns ``world`` processes; each initialises a gloo process
group (60 s timeout), calls ``body(rank, world, out)`` (a module-level function, appending
strings to ``out``), and reports ``out``; an exception is reported as ``"unexpected:..."``.
Returns each rank's list.  Bounded: every wait gives up after ``timeout`` seconds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from datetime import timedelta


def _entry(body: Callable[[int, int, list[str]], None], rank: int, world: int, store: str, q) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    out: list[str] = []
    try:
        body(rank, world, out)
    except BaseException as e:  # noqa: BLE001  # reported to the test
        out.append("unexpected:" + repr(e) + traceback.format_exc()[-800:])
    finally:
        q.put((rank, out))
        dist.destroy_process_group()


def run_gloo(body: Callable[[int, int, list[str]], None], world: int, tmp_path: os.PathLike[str],
             timeout: float = 180) -> dict[int, list[str]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = os.path.join(str(tmp_path), "store")
    procs = [ctx.Process(target=_entry, args=(body, r, world, store, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(q.get(timeout=timeout) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
