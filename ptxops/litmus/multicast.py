"""Multicast-shaped litmus tests, run in emulation (names end in ``(emulated)``).

Message passing through multicast locations: x (data) and y (flag) have one copy on each of two
GPUs.  T0 on GPU 0 writes x with a weak ``multimem.st`` and publishes y with a ``multimem.st`` or
``multimem.red`` of some sem at sys scope; T1 on GPU 1 reads its own copy of y (``ld`` of some
sem, into r0) and then its own copy of x (into r1).  The tests run under
:func:`ptxops.emulate_multicast` (these GPUs forbid real multicast), so what runs, and what the
verdicts are computed for, is the emulation: each multimem op is its unicast op on both copies
(x0 = GPU 0's copy, x1 = GPU 1's), and the PTX memory model (:mod:`.model`) judges that
program.  Pure Python; the kernel and its host runner are in :mod:`.multicast_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Op, Where, allowed_outcomes, sc_outcomes
from .shapes import FORBIDDEN, SC, WEAK

REGISTERS = ("r0", "r1")
#: Writer and reader on different GPUs (placement ``gpu``).
WHERE = (Where(0, 0), Where(1, 1))


@dataclass(frozen=True)
class MulticastTest:
    """MP through multicast: the flag write (``"st"`` or ``"red"``) and its sem, the reader's
    sem (``"acquire"`` or ``"relaxed"``), all at sys scope."""

    flag: str
    writer_sem: str
    reader_sem: str

    @property
    def name(self) -> str:
        short = {"release": "rel", "relaxed": "rlx", "acquire": "acq"}
        return f"MP+mc_{self.flag}_{short[self.writer_sem]}_{short[self.reader_sem]}@sys (emulated)"

    def threads(self) -> tuple[tuple[Op, ...], ...]:
        """The emulated program: every multimem op as its unicast op on both copies, rank 0 first."""
        if self.flag == "st":
            publish = [Op("st", f"y{r}", 1, self.writer_sem, "sys") for r in (0, 1)]
        else:
            publish = [Op("red", f"y{r}", 1, self.writer_sem, "sys", None, "add") for r in (0, 1)]
        writer = (Op("st", "x0", 1), Op("st", "x1", 1), *publish)
        reader = (Op("ld", "y1", 0, self.reader_sem, "sys", "r0"), Op("ld", "x1", 0, "weak", None, "r1"))
        return writer, reader

    def verdicts(self) -> dict[tuple[int, ...], str]:
        """Every outcome (r0, r1) with its verdict: sc, weak (the model allows it) or forbidden."""
        threads = self.threads()
        sc = sc_outcomes(threads, REGISTERS)
        allowed = allowed_outcomes(threads, WHERE, REGISTERS)
        return {o: SC if o in sc else WEAK if o in allowed else FORBIDDEN
                for o in ((a, b) for a in (0, 1) for b in (0, 1))}


TESTS = {
    t.name: t
    for t in (
        MulticastTest("st", "release", "acquire"),
        MulticastTest("red", "release", "acquire"),
        MulticastTest("st", "relaxed", "relaxed"),
    )
}


__all__ = ["REGISTERS", "TESTS", "WHERE", "MulticastTest"]
