"""The benchmarks' results: one record shape per bench, baseline columns that may fail, and
JSON files named after the machine.

Every bench keeps its timings as flat records (a dict per timing: the bench's key fields, then
``us``) in a :class:`Recorder`.  A baseline column (NCCL's, torch's) is timed through
:meth:`Recorder.baseline`: if it raises on any rank, every rank records it as skipped with the
reason (printed by rank 0 and written to the JSON's ``skipped`` list) and the run goes on; the
column is not tried again in that run (a communicator that failed may be unusable).  Ours are
timed through :meth:`Recorder.ours` and may not fail.  :meth:`Recorder.write` (rank 0) writes
``<name>-<device>.json`` (:func:`device_tag`: ``4xH200``) with the run's metadata, the records
and the skipped columns; :mod:`collectives.tools.bench_report` renders the tables from it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def device_tag(world: int, gpu: str) -> str:
    """``<world>x<model>`` for file names: ``4xH200`` for 4 x "NVIDIA H200", ``2xH100`` for
    "NVIDIA H100 80GB HBM3" (the first word that is letters then digits, else every word but
    the vendor's)."""
    words = [w for w in gpu.split() if w.upper() != "NVIDIA"]
    model = next((w for w in words if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", w)), "-".join(words) or "gpu")
    return f"{world}x{model}"


def _reason(err: BaseException) -> str:
    """An exception in one line: its type and first line (NCCL's messages run to many lines)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


@dataclass
class Recorder:
    """The records of one bench run.  ``keys``: the fields of a record before ``us`` (the same
    in every record of the bench); ``agree(ok)``: True when every rank passed True (a
    collective; :func:`all_ranks_agree` under torchrun); ``rank``: who prints and writes;
    ``column``: the fields that name a baseline column, which a failure disables (``impl``:
    the whole column, whose communicator may be broken; a bench whose baselines fail per
    mode, torch's fused ops refusing a graph capture, adds ``mode``)."""

    bench: str
    keys: tuple[str, ...]
    agree: Callable[[bool], bool]
    rank: int = 0
    column: tuple[str, ...] = ("impl",)
    results: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    failed: dict[tuple, str] = field(default_factory=dict)  # column -> its first failure, where and why

    def _fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        if set(fields) != set(self.keys):
            raise ValueError(f"{self.bench} records have fields {self.keys}, not {tuple(fields)}")
        return {k: fields[k] for k in self.keys}

    def add(self, us: float, spread: dict[str, float] | None = None, **fields: Any) -> float:
        """Record ``us`` microseconds under ``fields`` (exactly :attr:`keys`), ``spread`` (extra
        keys after ``us``: an interleaved column's ``us_min``, ``us_max``) with it; returns ``us``."""
        self.results.append({**self._fields(fields), "us": float(us), **(spread or {})})
        return us

    def ours(self, time: Callable[[], float], **fields: Any) -> float:
        """Time one of ours (``time()``: microseconds) and record it; a failure propagates."""
        return self.add(time(), **fields)

    def baseline(self, time: Callable[[], float], **fields: Any) -> float | None:
        """Time a baseline column (``time()``: microseconds, called on every rank) and record
        it; where it raises on any rank, it is skipped (:meth:`attempt`) and None returned."""
        ok, us = self.attempt(time, **fields)
        return self.add(us, **fields) if ok else None

    def attempt(self, fn: Callable[[], Any], **fields: Any) -> tuple[bool, Any]:
        """``(True, fn())`` where ``fn`` (a baseline column's setup or timing, called on every
        rank) returned on every rank; where it raised on any rank, record the column as skipped
        with the reason on every rank, print that (rank 0) and return ``(False, None)``.  A
        column (:attr:`column`) that failed once is skipped, untried, for the rest of the run."""
        record = self._fields(fields)
        impl, column = record["impl"], tuple(record[k] for k in self.column)
        if column in self.failed:
            self.skipped.append({**record, "reason": f"not tried: {self.failed[column]}"})
            return False, None
        error = value = None
        try:
            value = fn()
        except Exception as err:  # noqa: BLE001 (a baseline's failure is recorded, not fatal)
            error = _reason(err)
        everywhere = self.agree(error is None)
        if error is None and everywhere:
            return True, value
        reason = error or "failed on another rank"
        self.failed[column] = f"failed at {', '.join(f'{k}={v}' for k, v in record.items() if k != 'impl')}: {reason}"
        self.skipped.append({**record, "reason": reason})
        if self.rank == 0:
            print(f"  {self.bench}: {impl} skipped ({', '.join(str(v) for v in record.values())}): {reason}",
                  flush=True)
        return False, None

    def write(self, out_dir: str, world: int, gpu: str, **meta: Any) -> str:
        """Write ``<out_dir>/<bench>-<device>.json`` (:func:`device_tag`) with ``meta``, the
        records and the skipped columns; returns its path.  Call on one rank."""
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{self.bench}-{device_tag(world, gpu)}.json")
        with open(path, "w") as f:
            json.dump({"bench": self.bench, "gpu": gpu, "world": world, **meta, "fields": [*self.keys, "us"],
                       "results": self.results, "skipped": self.skipped}, f, indent=1)
        return path


def all_ranks_agree() -> Callable[[bool], bool]:
    """``agree(ok)`` for :class:`Recorder` under torch.distributed: a logical AND over every rank
    on a gloo group of its own (made here, collectively), so that it still works when a
    baseline's failure left an NCCL communicator unusable."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(backend="gloo")

    def agree(ok: bool) -> bool:
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item())

    return agree


__all__ = ["Recorder", "all_ranks_agree", "device_tag"]
