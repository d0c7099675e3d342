"""Shared pieces of the tests (a package: ``from tests.support.cute_support import ...``)."""
