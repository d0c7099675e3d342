"""The tests, as packages (``tests.ptxops``, ``tests.collectives``, ``tests.meta``, each with its
``gpu`` folders) so that test modules have unique names and ``import ptxops`` / ``import
collectives`` still find the libraries. Shared helpers live in ``tests/support`` (on ``sys.path``
through conftest: ``from cute_support import ...``)."""
