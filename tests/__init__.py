"""The tests, as packages mirroring the code: ``tests.ptxops``, ``tests.collectives`` (by wing:
``symmetric``, ``runtime``, ``algorithms``, ``device``; GPU tests under ``gpu/`` in folders named
by what they need: ``one_gpu``, ``ranks`` (any number of ranks under torchrun), ``four_ranks``),
``tests.meta``, and the shared helpers of the package ``tests.support``
(``from tests.support.cute_support import ...``)."""
