"""Command-line tools built on the library (not imported by it): ``python -m collectives.tools.bench``
(collective bandwidth and latency), ``python -m collectives.tools.bench_launch`` (host cost of
one launch) and ``torchrun ... -m collectives.tools.litmus`` (ptxops' litmus tests across GPUs)."""
