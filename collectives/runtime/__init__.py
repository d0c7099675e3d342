"""Host runtime: what a collective call runs on, one per communicator.

- :mod:`~collectives.runtime.communicator`: :class:`Communicator` (the per-call protocol: poll,
  plan, launch, finish) and :func:`communicator` (the one of a group); it satisfies the
  algorithms' :class:`~collectives.algorithms.protocol.Runtime`.
- Its parts: :mod:`~collectives.runtime.staging` (staging buffers, plan cache),
  :mod:`~collectives.runtime.views` (kernel views of symmetric buffers),
  :mod:`~collectives.runtime.error_record` (what kernels record, raised on the host),
  :mod:`~collectives.runtime.stream_flags` (post/wait between streams of one GPU),
  :mod:`~collectives.runtime.kernels` (the one compile path and the compiled-kernel cache),
  :mod:`~collectives.runtime.driver_streams` (streams outside torch's pool),
  :mod:`~collectives.runtime.all_to_all` (the all-to-all's :class:`~collectives.runtime.all_to_all.Exchange`:
  its slot region, staging buffer and split tensors; its plan), made at the first all-to-all.
- :mod:`~collectives.runtime.torch_ops`: the collectives as torch custom operators, the
  all-to-all's included.
- :mod:`~collectives.runtime.moe`: the MoE layer's local kernels (their keys and launches) and
  the MoE dispatch/combine as torch custom operators.

Importing this package loads nothing else: ``python -m collectives ptx`` compiles through
:mod:`~collectives.runtime.kernels` without torch.
"""
