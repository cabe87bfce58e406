"""The stability watch of the noise-limited step sizes (SGLD, SGHMC, EWSG) in tuning.

A collaborator the step feeds each tuning draw's outcome (diverging or not, and its kinetic
temperature ``2 K / d`` over its equilibrium value, or the virial for kernels without a
momentum); it keeps a factor in ``(0, 1]`` that the step multiplies its default step size by,
and says when the factor changed and when a block ran hot (the step then restarts its kernel).
Samplers whose accept test handles instability (HMC-ECS, Austerity) or that have no step to
lower (SBPS) declare no watch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["HOT_TEMPERATURE", "RELAXING", "STABILITY_BLOCK", "StabilityVerdict", "StabilityWatch"]

#: in tuning, every this many draws a block with a divergence or a kinetic temperature (or
#: virial) above HOT_TEMPERATURE (or 4 sd of a block mean, if more) halves the step size:
#: the dynamics met curvature beyond what the step size is stable for (e.g. a likelihood
#: wall in a skewed tail)
STABILITY_BLOCK = 25
HOT_TEMPERATURE = 1.5
#: a hot block cooler than this fraction of the previous block's temperature is relaxing
#: from an excursion (its momentum is reset, its step kept)
RELAXING = 0.7


class StabilityVerdict(NamedTuple):
    """What one observation changed: the factor (then the step size is re-chosen), and
    whether a block ran hot (then the kernel restarts)."""

    factor_changed: bool
    hot: bool


class StabilityWatch:
    """Halve the step-size factor at a block's first tuning divergence (at once) and after a
    block that ran hot; double it back after a calm block, up to the largest factor not yet
    failed (forgotten when the coordinates change: :meth:`forget_failures`).

    Parameters
    ----------
    dim
        Parameters (a block mean of ``2 K / d`` has sd ``sqrt(2 / (d B))``).
    """

    def __init__(self, dim: int):
        self.dim = dim
        self.restart()
        self._last_diverged = False

    def restart(self) -> None:
        """Start afresh (new coordinates from a re-fitted Laplace fit): factor 1, no block,
        no failures."""
        self.factor = 1.0
        self._ceiling = 1.0
        self._block: list[float] = []
        self._block_diverged = False
        self._last_block_temperature = 0.0
        self.window_failures = 0

    def forget_failures(self) -> None:
        """After the first window (the start's transient: a Laplace draw of a poor fit, an
        anchor far from the bulk) and when the Laplace fit stops being trusted, failures
        seen so far no longer cap the factor."""
        self._ceiling = 1.0

    def take_window_failures(self) -> int:
        """Failures (halvings) since the last call."""
        failures, self.window_failures = self.window_failures, 0
        return failures

    def observe(self, diverging: bool, temperature: float) -> StabilityVerdict:
        """One tuning draw: ``temperature`` is its kinetic temperature (or virial; NaN when
        unknown)."""
        changed = False
        if diverging and (not self._block_diverged or self._last_diverged):
            # a block's first divergence, and each one that follows another (the chain has
            # not moved since: its step is still unstable where it stands)
            self._lower()
            changed = True
        self._block_diverged |= diverging
        self._last_diverged = diverging
        self._block.append(temperature)
        if len(self._block) < STABILITY_BLOCK:
            return StabilityVerdict(changed, False)
        finite = [t for t in self._block if math.isfinite(t)]
        mean = float(np.mean(finite)) if finite else 1.0
        spread = 4.0 * math.sqrt(2.0 / (self.dim * STABILITY_BLOCK))
        hot = mean > max(HOT_TEMPERATURE, 1.0 + spread)
        # a chain relaxing from an excursion (e.g. back from beyond a likelihood wall) is hot
        # but cooling: only a block at least RELAXING times as hot as the last one halves
        heating = hot and mean > RELAXING * self._last_block_temperature
        self._last_block_temperature = mean
        halved, calm = self._block_diverged, not hot and not self._block_diverged
        self._block, self._block_diverged = [], False
        if heating and not halved:  # at most one halving per block
            self._lower()
            changed = True
        elif calm and self.factor < self._ceiling:
            self.factor = min(2.0 * self.factor, self._ceiling)
            changed = True
        return StabilityVerdict(changed, hot)

    def _lower(self) -> None:
        self.window_failures += 1
        self.factor *= 0.5
        self._ceiling = min(self._ceiling, self.factor)
