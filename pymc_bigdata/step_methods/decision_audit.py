"""An audit of approximate MH's decisions: how often does the sequential test decide wrong?

Korattikara, Chen & Welling (2014), Theorem 1, bound the total variation between the
approximate chain's stationary law and the posterior by ``Delta_max / (1 - eta)``: the
largest error of a decision's acceptance probability times the chain's mixing time. Neither
is known in a run, and no per-draw statistic shows a wrong decision: the test's p-value says
how sure each look was, not how often the many looks of one decision err together.

:class:`DecisionAudit` measures the error directly. Every ``every``-th kept decision is
decided a second time, with the same threshold ``mu_0`` (the same ``u``, proposal and known
terms) but a fresh permutation of the rows and the level ``AUDIT_LEVEL``, so the second
opinion reads as many rows as it needs to be nearly certain (all of them, exactly, when the
proposal sits at the threshold). A decision whose first test read every row is exact and
agrees by construction: it counts as audited, at no cost. The audit draws its rows from a
generator of its own (:func:`audit_generator`), so the chain's draws are the same with the
audit on or off.

The rate of wrong decisions times the decisions per recorded draw (``inner_steps``, chosen
to be about one autocorrelation time of the proposal) estimates Theorem 1's
``Delta / (1 - eta)`` per draw: the alarm (:class:`~.alarms.AusterityAlarm`) fires above
``WRONG_PER_DRAW_ALARM``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from pymc_bigdata.kernels.austerity import sequential_test
from pymc_bigdata.rows import LazyPermutation

__all__ = [
    "AUDIT_EVERY",
    "AUDIT_LEVEL",
    "AUDIT_MIN_WRONG",
    "WRONG_PER_DRAW_ALARM",
    "DecisionAudit",
    "audit_generator",
    "audit_verdict",
    "check_audit_every",
]

#: one kept decision in this many is audited (the audit's extra rows are a few per cent of
#: the chain's: see docs/austerity.md)
AUDIT_EVERY = 50

#: the second opinion's level: the t-test stops only when its p-value is below this
AUDIT_LEVEL = 1e-6

#: the alarm fires when the audited rate of wrong decisions times the decisions per draw
#: exceeds this. Chosen on ``datasets.conjugate_regression`` with the paper's plain test and
#: random walk (one chain, 1,000 + 1,000 draws of 15 decisions; audited exactly with 400
#: full-data passes, one-off): epsilon 0.01 gave 0.5 % wrong decisions (0.075 per draw) and
#: sds 3-6 % wide, epsilon 0.02 1.5 % (0.23 per draw) and sds 4-14 % wide, epsilon 0.05
#: 5.3 % (0.79 per draw) and sds 19-24 % wide; the residual test at 0.05: none of 400
#: wrong, sds within 4 %.
WRONG_PER_DRAW_ALARM = 0.2

#: and at least this many wrong decisions were seen (one is no evidence of a rate)
AUDIT_MIN_WRONG = 2


def check_audit_every(audit_every: object) -> None:
    """Refuse an ``audit_every`` that is not an integer >= 1 or None."""
    if audit_every is not None and (
        isinstance(audit_every, bool) or not isinstance(audit_every, int) or audit_every < 1
    ):
        raise ValueError(f"audit_every must be an integer >= 1 or None, got {audit_every!r}.")


def audit_verdict(
    sampler: str, audited: int, wrong: int, decisions_per_draw: float, remedy: str
) -> str | None:
    """The alarm's text when the audited share of wrong decisions times the decisions per
    draw exceeds ``WRONG_PER_DRAW_ALARM`` (from at least ``AUDIT_MIN_WRONG`` wrong ones),
    else None."""
    if not audited or wrong < AUDIT_MIN_WRONG:
        return None
    rate = wrong / audited
    per_draw = rate * decisions_per_draw
    if per_draw <= WRONG_PER_DRAW_ALARM:
        return None
    return (
        f"{sampler}: {wrong} of {audited} audited decisions disagreed with a second test at "
        f"level {AUDIT_LEVEL:g} ({rate:.1%}; about {per_draw:.2f} wrong decisions per draw, "
        f"above {WRONG_PER_DRAW_ALARM:g}): the chain's law is off the posterior (Korattikara "
        f"et al. 2014, Theorems 1 and 2). {remedy}"
    )


def audit_generator(rng: np.random.Generator) -> np.random.Generator:
    """A generator seeded from ``rng``'s state without drawing from it: the audit's random
    numbers are fixed by the chain's seed and leave the chain's own stream untouched."""
    digest = hashlib.sha256(repr(rng.bit_generator.state).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


class DecisionAudit:
    """Decides every ``every``-th kept decision again at ``AUDIT_LEVEL``.

    Parameters
    ----------
    n_rows
        Rows the test samples from (``N`` without the census stratum).
    batch_size
        Rows per look of the second test.
    every
        One kept decision in ``every`` is audited.
    rng
        The chain's generator (read, not drawn from: :func:`audit_generator`).
    """

    def __init__(self, n_rows: int, batch_size: int, every: int, rng: np.random.Generator):
        self.n_rows, self.batch_size, self.every = int(n_rows), int(batch_size), int(every)
        self.rng = audit_generator(rng)
        self.permutation = LazyPermutation(self.n_rows, self.rng)
        self._kept = 0

    def due(self) -> bool:
        """Whether the next kept decision is audited (call once per kept decision)."""
        self._kept += 1
        return self._kept % self.every == 1 or self.every == 1

    def redecide(
        self, mu0: float, differences: Callable[[LazyPermutation], Callable[[int], np.ndarray]]
    ) -> bool:
        """The second opinion on ``mean l > mu0``: ``differences(permutation)`` returns the
        test's ``next_differences`` drawing rows from the audit's own permutation (started
        here). A non-finite difference among the rows raises as in the first test."""
        self.permutation.start(self.rng)
        test = sequential_test(
            mu0, differences(self.permutation), self.n_rows, self.batch_size, AUDIT_LEVEL
        )
        return bool(test.accept)
