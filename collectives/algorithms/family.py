"""The kernel families: every kind of kernel the package compiles (the collective algorithms'
kernels, the all-to-all's, the MoE placement's and combine's, the stream flags') registers one
:class:`Family` in :data:`FAMILIES` when its module is imported (:mod:`collectives.algorithms`
imports them all), as an :class:`~collectives.algorithms.base.Algorithm` registers itself.

A family says how its keys compile (:meth:`Family.build` and its argument layout) and how the
gates see them (the key ids it snapshots, an id to and from text, the facets of the CI sample).
Whatever iterates kernels (:mod:`collectives.runtime.kernels`, ``python -m collectives ptx``,
:mod:`collectives.tools.ptx_identity`, :mod:`collectives.tools.signed_scan`) iterates this
registry: a new family is in both gates by construction.  Pure Python (no CuTeDSL here)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..layouts import Layout


@dataclass(frozen=True)
class Family:
    """One kind of kernel.

    ``key``: the type of its keys (``str`` for the stream flags'); ``prefixes``: the first field
    of its key ids (``"all_to_all"``; the collective family's: every collective's name);
    ``layout``: its kernels' runtime arguments; ``gridded``: its launcher takes a grid before the
    stream; ``builder(key)``: the ``@cute.jit`` launcher; ``snapshot()``: the ids of the keys
    the gates compile (a refused key's too: its refusal is recorded); ``to_text(key)`` and
    ``from_text(id)`` (raises ValueError for a refused key); ``facets(id)``: what the CI sample
    covers (one key per facet); ``measured``: its occupancy is measured at load (a kernel of
    more than one thread)."""

    name: str
    key: type
    prefixes: tuple[str, ...]
    layout: Layout
    builder: Callable[[Any], Any]
    snapshot: Callable[[], list[str]]
    to_text: Callable[[Any], str]
    from_text: Callable[[str], Any]
    facets: Callable[[str], tuple[tuple, ...]]
    gridded: bool = True
    measured: bool = True

    def build(self, key: Any) -> Any:
        """The ``@cute.jit`` launcher of ``key``'s kernel (compile it with :meth:`example_arguments`)."""
        return self.builder(key)

    def example_arguments(self) -> tuple:
        """Placeholder runtime arguments of its launcher: the layout's, the grid where it takes
        one, the stream."""
        from ..device.launch import example_arguments, flag_example_arguments

        return example_arguments(self.layout) if self.gridded else flag_example_arguments()


#: The world sizes the gates compile every family's keys at.
SNAPSHOT_WORLDS = (2, 4, 8)
#: Every kernel family by name, in registration order.
FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (its name, key type and id prefixes its own), and
    return the family registered under its name: the first registration stands (a module's
    source executed again, as the device simulation tests do, leaves the imported module's)."""
    for other in FAMILIES.values():
        if other.name != family.name and (other.key is family.key or set(other.prefixes) & set(family.prefixes)):
            raise ValueError(f"kernel family {family.name!r} shares a key type or id prefix with {other.name!r}")
    return FAMILIES.setdefault(family.name, family)


def family_of(key: Hashable) -> Family:
    """The family of kernel key ``key`` (by its type)."""
    for family in FAMILIES.values():
        if type(key) is family.key:
            return family
    raise TypeError(f"no kernel family takes keys of type {type(key).__name__} ({key!r})")


def family_of_id(kid: str) -> Family:
    """The family of key id ``kid`` (by its first field)."""
    head = kid.partition("/")[0]
    for family in FAMILIES.values():
        if head in family.prefixes:
            return family
    raise ValueError(f"no kernel family has key ids starting {head!r} ({kid!r})")


def key_of(kid: str) -> Any:
    """The kernel key that id ``kid`` names (ValueError where the key is refused)."""
    return family_of_id(kid).from_text(kid)


def key_id(key: Hashable) -> str:
    """The id of kernel key ``key``."""
    return family_of(key).to_text(key)


__all__ = ["FAMILIES", "SNAPSHOT_WORLDS", "Family", "family_of", "family_of_id", "key_id", "key_of", "register"]
