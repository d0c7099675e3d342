"""Run the documentation's GPU programs as a user would: each ``<!-- gpu -->`` block of the pages
saved as the file its launch line names, next to the page's ``# NAME.py`` files, and started with
that launch line (``torchrun --nproc-per-node N NAME.py`` or ``python NAME.py``) in its own
folder, NVLink multicast off.  ``bash .ci/gpu docs`` runs it; a program that needs more GPUs
than are visible, or more than one node, is skipped saying so.

    python -m tests.support.doc_programs OUT [--gpus N] [--timeout S] [--page NAME ...]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.doc_blocks import LAUNCH, PAGES, ROOT, Block, page_modules, python_blocks

#: What every program runs under: NVLink multicast off (the lent GPUs must never execute multimem).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def programs() -> list[Block]:
    """Every GPU program of the pages, in page order."""
    return [b for page in PAGES for b in python_blocks(page) if b.gpu]


def needs(argv: list[str]) -> tuple[int, int]:
    """(nodes, GPUs per node) of a launch command."""
    if argv[0] != "torchrun":
        return 1, 1
    option = dict(zip(argv[1:-1:2], argv[2:-1:2]))
    return int(option.get("--nnodes", "1")), int(option["--nproc-per-node"])


def run(block: Block, out: Path, gpus: int, timeout_s: float) -> str | None:
    """Run one program in ``out/<page>/``; its log ``NAME.log`` there.  A line saying how it went;
    None where it passed."""
    launch = LAUNCH.match(block.code.splitlines()[0])
    assert launch, f"{block.where}: no launch line (tests/meta/test_docs.py checks it)"
    argv = shlex.split(block.code.splitlines()[0].split(":", 1)[1])
    nodes, per_node = needs(argv)
    if nodes > 1 or per_node > gpus:
        print(f"{block.where} {launch['name']}: skipped (needs {nodes} node(s) of {per_node} GPUs, {gpus} visible)")
        return None
    folder = out / block.page.stem
    folder.mkdir(parents=True, exist_ok=True)
    for module, source in page_modules(block.page).items():
        (folder / f"{module}.py").write_text(source.code)
    (folder / launch["name"]).write_text(block.code)
    if argv[0] == "python":
        argv[0] = sys.executable
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = folder / f"{Path(launch['name']).stem}.log"
    start = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    took = time.monotonic() - start
    verdict = "passed" if rc == 0 else ("timed out" if rc is None else f"failed (rc={rc})")
    line = f"{block.where} {launch['name']}: {verdict} in {took:.0f} s ({' '.join(argv[:-1])} ...; log {log})"
    print(line, flush=True)
    return None if rc == 0 else line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the programs and their logs")
    parser.add_argument("--gpus", type=int, help="GPUs to use (default: every visible one)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per program (default 240)")
    parser.add_argument("--page", action="append", default=[], help="only this page (e.g. guide-moe); repeatable")
    args = parser.parse_args(argv)
    chosen = [b for b in programs() if not args.page or {b.page.stem, b.page.name} & set(args.page)]
    if not chosen:
        parser.error(f"no GPU programs on {args.page} (pages: {sorted({b.page.stem for b in programs()})})")
    gpus = args.gpus
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    if gpus == 0:
        print("doc_programs: no GPU visible: nothing to run", file=sys.stderr)
        return 1
    failed = [line for b in chosen if (line := run(b, args.out, gpus, args.timeout))]
    print(f"{len(failed)} of {len(chosen)} documentation programs failed" if failed
          else f"every documentation program that fits {gpus} GPUs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
