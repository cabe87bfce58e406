"""The measured gradient noise a noise-limited step size is chosen from.

The step's gradient oracle measures, on the last transition of a measuring draw, the per-unit
noise ``N^2 s^2`` of its estimates per coordinate (:class:`~.gradient_oracle.NoiseSample`);
:class:`NoiseAccumulator` keeps their running means, for first- and second-order control
variates, across anchor moves.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NoiseAccumulator", "measured_variance"]


class NoiseAccumulator:
    """Running mean of the measured per-unit gradient noise ``N^2 s^2`` per coordinate (z
    coordinates at measurement time; first and second order), which does not depend on the
    batch size: the step turns it into the current batch's variance.

    Measurements made before the anchor last moved are kept as a fallback until enough new
    ones (``MIN_FRESH``) arrive, since moving the anchor changes the noise.
    """

    MIN_FRESH = 20

    def __init__(self, dim: int):
        self.dim = dim
        self.restart()

    def restart(self) -> None:
        """Forget every measurement (the target's coordinates were re-fitted)."""
        self._fresh = {1: _Mean(self.dim), 2: _Mean(self.dim)}
        self._stale = {1: _Mean(self.dim), 2: _Mean(self.dim)}

    def add(self, first: np.ndarray, second: np.ndarray | None) -> None:
        self._fresh[1].add(first)
        if second is not None:
            self._fresh[2].add(second)

    def keep(self, noise: tuple[np.ndarray, np.ndarray | None] | None) -> None:
        """Keep a draw's measurement (first order, second order or None); dropped when the
        draw made none or it is not finite, so that one blow-up does not decide the step
        size for the rest of tuning; a non-finite second order alone is left out."""
        if noise is None:
            return
        first, second = noise
        if not np.all(np.isfinite(first)):
            return
        self.add(first, second if second is not None and np.all(np.isfinite(second)) else None)

    def measured(self) -> bool:
        return self._fresh[1].count > 0 or self._stale[1].count > 0

    def recentred(self) -> None:
        self._stale = self._fresh
        self._fresh = {1: _Mean(self.dim), 2: _Mean(self.dim)}

    def variance(self, order: int) -> np.ndarray:
        order = max(order, 1)
        fresh, stale = self._fresh[order], self._stale[order]
        if fresh.count >= self.MIN_FRESH or stale.count == 0:
            return fresh.mean if fresh.count else np.empty(0)
        return stale.mean


class _Mean:
    def __init__(self, dim: int):
        self.count = 0
        self.mean = np.zeros(dim)

    def add(self, x: np.ndarray) -> None:
        self.count += 1
        self.mean = self.mean + (x - self.mean) / self.count


def measured_variance(
    noise: tuple[np.ndarray, np.ndarray | None] | None, order: int
) -> np.ndarray | None:
    """One measurement's per-unit noise ``N^2 s^2`` (z units) of the estimate of control-
    variate ``order`` (first order where second order is missing or for order 0); None
    where the draw measured nothing or the measurement is not finite."""
    if noise is None:
        return None
    first, second = noise
    chosen = second if order == 2 and second is not None else first
    return chosen if np.all(np.isfinite(chosen)) else None
