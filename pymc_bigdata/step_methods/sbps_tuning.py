"""SBPS's tuning policy: the travel time per draw and the band multiple ``k``.

The step asks it on the base's schedule (:mod:`.step_size`) and hands it every tuning draw's
statistics (:meth:`TravelTimeAndBand.observe`): the travel time follows the preconditioner's
curvature, ``k`` the violation rate of the proposal-rate bound (Eqs. 12-13 of Pakman et al.
2017: the bound holds only in a band ``k`` standard deviations wide).
"""

from __future__ import annotations

import numpy as np

from pymc_bigdata.step_methods.step_size import CurvatureStepSize, StepChoice, StepContext

__all__ = ["DEFAULT_K", "TravelTimeAndBand"]

#: ``k`` starts here; unless given, tuning raises it by ``K_GROWTH`` (up to ``K_MAX``) while
#: more than ``VIOLATION_TARGET`` of the proposals violate the band (judged every
#: ``K_MIN_PROPOSALS`` proposals or more).  The paper's k = 3 keeps violations at 0.04-0.3 % on
#: GLMs; on skewed and hierarchical targets G(t) is curved and it let 1.6-4 % through
#: (e.g. 210 of 5468 on the rare-event model), with sds up to 5 % too wide
DEFAULT_K = 3.0
K_GROWTH = 1.3
K_MAX = 10.0
VIOLATION_TARGET = 0.005
K_MIN_PROPOSALS = 200


class TravelTimeAndBand(CurvatureStepSize):
    """SBPS's tuning policy: the travel time per draw follows the curvature default
    (:class:`~.step_size.CurvatureStepSize`), and the band multiple ``k`` the tuning draws'
    violation rate: raised by ``K_GROWTH`` while more than ``VIOLATION_TARGET`` of the
    proposals since the last change violate the band, lowered back towards ``DEFAULT_K`` when
    fewer than a fifth of that do (judged on at least ``K_MIN_PROPOSALS`` proposals)."""

    def __init__(self, *, fixed_step: bool, k: float, fixed_k: bool):
        super().__init__(fixed_step=fixed_step)
        self.k, self.fixed_k = k, fixed_k
        #: violations and proposals in tuning since k last changed
        self._counts = np.zeros(2)

    def observe(self, stats: dict) -> None:
        """A tuning draw's violations and proposals (none for a rejected draw)."""
        self._counts += (stats["violations"], stats["proposals"])

    def choose(self, context: StepContext, final: bool) -> StepChoice:
        """The travel time; ``k`` adapted (unless given, or at the end)."""
        choice = super().choose(context, final)
        if not self.fixed_k and not final:
            self._adapt_k()
        return choice

    def _adapt_k(self) -> None:
        violations, proposals = self._counts
        if proposals < K_MIN_PROPOSALS:
            return
        rate = violations / proposals
        if rate > VIOLATION_TARGET:
            self.k = min(self.k * K_GROWTH, K_MAX)
        elif rate < VIOLATION_TARGET / 5:
            self.k = max(self.k / K_GROWTH**0.5, DEFAULT_K)
        self._counts = np.zeros(2)
