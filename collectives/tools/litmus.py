"""``torchrun --nproc-per-node 2 -m collectives.tools.litmus --placement gpu ...``: the
``python -m ptxops.litmus`` command (same options) with placement ``gpu`` on this library's
symmetric memory (peer backend: NVLink multicast stays off)."""

from __future__ import annotations

import sys

from ptxops.nvls import force_multicast_off

force_multicast_off()  # before nvshmem or NCCL can start

from ptxops.litmus.__main__ import main  # noqa: E402


def open_context(device: int):
    """This rank's symmetric-memory context on ``device``."""
    from .. import init

    return init(device=device)


if __name__ == "__main__":
    sys.exit(main(open_context=open_context))
