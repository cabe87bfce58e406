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
        self._fresh = _means()
        self._stale = _means()

    def add(
        self,
        first: np.ndarray,
        second: np.ndarray | None,
        covariance: np.ndarray | None = None,
    ) -> None:
        self._fresh[1].add(first)
        if second is not None:
            self._fresh[2].add(second)
        if covariance is not None:
            self._fresh[COVARIANCE].add(covariance)

    def keep(self, noise: tuple | None) -> None:
        """Keep a draw's measurement (first order, second order and optionally the first
        order's covariance matrix, or None); dropped when the draw made none or it is not
        finite, so that one blow-up does not decide the step size for the rest of tuning; a
        non-finite second order or matrix alone is left out."""
        if noise is None:
            return
        first, second = noise[0], noise[1]
        covariance = noise[2] if len(noise) > 2 else None
        if not np.all(np.isfinite(first)):
            return
        self.add(
            first,
            second if second is not None and np.all(np.isfinite(second)) else None,
            covariance if covariance is not None and np.all(np.isfinite(covariance)) else None,
        )

    def measured(self) -> bool:
        return self._fresh[1].count > 0 or self._stale[1].count > 0

    def recentred(self) -> None:
        self._stale = self._fresh
        self._fresh = _means()

    def variance(self, order: int) -> np.ndarray:
        mean = self._current(max(order, 1))
        return np.empty(0) if mean is None else mean

    def covariance(self) -> np.ndarray | None:
        """The first-order estimate's per-unit covariance matrix (the mean of the
        measurements that carried one, as :meth:`variance` chooses them), or None."""
        return self._current(COVARIANCE)

    def _current(self, key: int | str) -> np.ndarray | None:
        """The fresh mean once it has ``MIN_FRESH`` measurements (or no stale one), else
        the stale one; None before any."""
        fresh, stale = self._fresh[key], self._stale[key]
        if fresh.count >= self.MIN_FRESH or stale.count == 0:
            return fresh.mean if fresh.count else None
        return stale.mean


#: the key of the first-order estimate's covariance matrices among the running means
COVARIANCE = "covariance"


def _means() -> dict[int | str, _Mean]:
    return {1: _Mean(), 2: _Mean(), COVARIANCE: _Mean()}


class _Mean:
    """A running mean of arrays of one shape (None before the first)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:
        self.count += 1
        if self.mean is None:
            self.mean = np.array(x, dtype=float)
        else:
            self.mean = self.mean + (x - self.mean) / self.count


def measured_variance(
    noise: tuple[np.ndarray, np.ndarray | None] | None, order: int
) -> np.ndarray | None:
    """One measurement's per-unit noise ``N^2 s^2`` (z units) of the estimate of control-
    variate ``order`` (first order where second order is missing or for order 0); None
    where the draw measured nothing or the measurement is not finite."""
    if noise is None:
        return None
    first, second = noise[0], noise[1]
    chosen = second if order == 2 and second is not None else first
    return chosen if np.all(np.isfinite(chosen)) else None
