"""What each GPU can push out over NVLink when every rank sends to every peer at once.

    torchrun --nproc-per-node 4 -m collectives.tools.nvlink_limit [--sizes MB,...] [--json PATH]

Every rank holds a ``size``-byte source and a symmetric ``world * size``-byte buffer
(:func:`collectives.empty`, NVLink multicast off); in one step each rank writes its source
into slot ``rank`` of every peer's buffer through the peer's load/store mapping, one stream
per peer, all peers at once.  Columns (bytes out of each GPU per second, slowest rank):

* ``copy_engine``: ``Tensor.copy_`` between the mapped pointers (``cudaMemcpyAsync``);
* ``sm_stores``: an elementwise kernel (``torch.mul(src, 1, out=peer)``) whose stores go to the
  peer: SM stores over NVLink (torch picks the SM count and vector width);
* ``local_hbm``: a local copy of ``size`` bytes, counted as read + write (the HBM reference).

The bus-bandwidth formulas the docs compare collectives with are :func:`bus_bandwidth`.
"""

from __future__ import annotations

import argparse
import json

from ..symmetric.capability import force_multicast_off

force_multicast_off()

import torch  # noqa: E402

SIZES_MB = (16, 64, 256)
COLUMNS = ("copy_engine", "sm_stores", "local_hbm")
_FACTORS = {"all_reduce": lambda w: 2 * (w - 1) / w, "reduce_scatter": lambda w: (w - 1) / w,
            "all_gather": lambda w: (w - 1) / w}


def bus_bandwidth(collective: str, nbytes: int, world: int, seconds: float) -> float:
    """Bus bandwidth in bytes/s of a collective over ``nbytes`` (the full tensor: the all-reduce's
    input, the reduce-scatter's input, the all-gather's output): ``factor * nbytes / seconds`` with
    factor ``2(W-1)/W`` for all-reduce and ``(W-1)/W`` for reduce-scatter and all-gather, the bytes
    that leave each rank on a ring or a full mesh."""
    if collective not in _FACTORS:
        raise ValueError(f"bus_bandwidth: unknown collective {collective!r}; one of {sorted(_FACTORS)}")
    if world < 1 or nbytes < 0 or seconds <= 0:
        raise ValueError(f"bus_bandwidth: need world >= 1, nbytes >= 0, seconds > 0 (got {world}, {nbytes}, {seconds})")
    return _FACTORS[collective](world) * nbytes / seconds


def bytes_out(column: str, size: int, world: int) -> int:
    """Bytes one step of ``column`` moves per GPU: ``size`` to each of the ``world - 1`` peers, or
    for ``local_hbm`` ``size`` read plus ``size`` written."""
    if column == "local_hbm":
        return 2 * size
    if column not in COLUMNS:
        raise ValueError(f"bytes_out: unknown column {column!r}; one of {COLUMNS}")
    return (world - 1) * size


def _step(column: str, src: torch.Tensor, peers: list[torch.Tensor], local: torch.Tensor, rank: int,
          streams: list[torch.cuda.Stream]) -> None:
    """One step of ``column``: the peers' writes each on its own stream, joined to the current one."""
    main = torch.cuda.current_stream()
    if column == "local_hbm":
        local.copy_(src)
        return
    for p, stream in enumerate(streams):
        if p == rank:
            continue
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            dst = peers[p][rank]
            if column == "copy_engine":
                dst.copy_(src)
            else:
                torch.mul(src, 1, out=dst)
        main.wait_stream(stream)


def measure(sizes_mb: tuple[int, ...] = SIZES_MB, iters: int = 20) -> list[dict]:
    """The table's rows (``column, bytes, us, bytes_per_s``), the slowest rank's time; collective
    over every rank of the default communicator."""
    import torch.distributed as dist

    import collectives
    from collectives.runtime.communicator import communicator

    comm = communicator()
    world, rank = comm.world, comm.rank
    streams = [torch.cuda.Stream() for _ in range(world)]
    rows = []
    for mb in sizes_mb:
        size = mb << 20
        elems = size // 2  # bf16
        src = torch.ones(elems, dtype=torch.bfloat16, device="cuda")
        buf = collectives.empty((world, elems), torch.bfloat16)
        peers = comm.ctx.peer_tensors(buf)
        local = torch.empty_like(src)
        for column in COLUMNS:
            _step(column, src, peers, local, rank, streams)  # warm-up
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                _step(column, src, peers, local, rank, streams)
            end.record()
            torch.cuda.synchronize()
            us = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device="cuda")
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            dist.barrier()  # no rank starts the next column while a peer still writes
            t = float(us.item())
            moved = bytes_out(column, size, world)
            rows.append({"column": column, "bytes": size, "world": world, "us": t, "bytes_per_s": moved / (t * 1e-6)})
        del buf, peers
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collectives.tools.nvlink_limit", description=__doc__)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES_MB), help="MB per peer write")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="write the rows to PATH (rank 0)")
    args = parser.parse_args(argv)
    rows = measure(tuple(int(s) for s in args.sizes.split(",")), args.iters)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"{'column':12} {'MB':>5} {'us':>10} {'GB/s out of each GPU':>22}")
        for r in rows:
            print(f"{r['column']:12} {r['bytes'] >> 20:>5} {r['us']:>10.1f} {r['bytes_per_s'] / 1e9:>22.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
