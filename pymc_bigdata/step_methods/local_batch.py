"""Per-draw batch sizes from the gradient noise measured where the chain is (``local_batch``).

Tuning chooses the step size from the gradient noise averaged over the tuning draws. That
average can hide a part of the posterior where the noise is far larger: on the non-centred
three-level model (``benchmarks/local_batch.py``) the second-order control variates' noise
share, measured draw by draw (the ``local_noise_share`` stat), is 51 times larger where the
countries' scale is in its left tail (``log tc < -2``) than in the bulk, so the gradient
noise heats the chain there and the tail comes out short. With ``local_batch=True`` every
draw after tuning measures its noise on its last transition (two half minibatches, as tuning
does), and the next draw reads enough rows to bring the worst coordinate's share of that
measurement back within ``noise_bound`` (at least the tuned batch size, at most every row).
The batch size is a function of the chain's past, so the draws stay reproducible for a seed.

A reading has one degree of freedom per coordinate (the square of two halves' difference),
so the worst of ``d`` coordinates of one reading is far above its mean by chance alone: on
the crossed ratings (d = 4,004) the worst share of one reading had a median of 0.35 in
in-band runs (``hard_targets.py``'s ``local_noise``, seed 1 at 09a28e0) against a bound of
0.05, and a rule reading it grew the batch at nearly every draw (+24 to +35 % data passes)
for no gain. So a coordinate's reading counts only where the noise there is *persistently*
above its mean: above ``chance_ratio(d)`` times the chain's mean reading (the level that
one coordinate in ``d`` of a reading passes by chance with probability ``CHANCE_LEVEL``) in
two draws running, and then the smaller of the two readings sizes the batch. A coordinate
whose mean reading is itself above the bound (a step too long for its noise everywhere)
sizes it from that mean.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

__all__ = [
    "CHANCE_LEVEL",
    "MIN_READINGS",
    "LocalBatch",
    "chance_ratio",
    "check_local_batch",
    "local_batch_size",
]

#: the probability that one reading, at the chain's mean noise in every coordinate, has some
#: coordinate above ``chance_ratio(d)`` times its mean; two readings running, about
#: ``CHANCE_LEVEL**2 / d``
CHANCE_LEVEL = 0.1

#: readings a chain takes after tuning before they are compared with their mean
MIN_READINGS = 10


def check_local_batch(local_batch: object, sampler: str, reads_oracle: bool) -> bool:
    """``local_batch``: True or False (numpy's booleans too), True only for a sampler whose
    kernel calls the gradient oracle (``reads_oracle``; ``sampler`` names it)."""
    if not isinstance(local_batch, bool | np.bool_):
        raise ValueError(f"local_batch must be True or False, got {local_batch!r}.")
    if local_batch and not reads_oracle:
        raise ValueError(
            f"local_batch sizes the minibatches of a gradient oracle; {sampler} evaluates its "
            "own estimates. Use SGHMC, SGLD or EWSG, or raise batch_size."
        )
    return bool(local_batch)


@functools.lru_cache(maxsize=64)
def chance_ratio(dim: int) -> float:
    """The ratio to its mean that one coordinate's reading (a mean-one chi-square with one
    degree of freedom) passes with probability ``CHANCE_LEVEL / dim``: Bonferroni over the
    ``dim`` coordinates."""
    return float(stats.chi2.isf(CHANCE_LEVEL / max(dim, 1), 1))


def local_batch_size(
    worst_share: float, noise_bound: float, base_batch: int, pool_size: int, replace: bool
) -> int:
    """The smallest batch size, from ``base_batch`` up to ``pool_size``, at which a noise
    whose worst share is ``worst_share`` at ``base_batch`` rows feeds at most
    ``noise_bound``: the estimate's variance falls as ``1/n`` (with replacement) or
    ``1/n - 1/N`` (without), and the share is taken as proportional to it (SGHMC's share
    with a B-hat, ``max(share - 1, 0)`` of the raw one, falls faster: the size is then more
    than enough)."""
    if not worst_share > noise_bound:  # NaN too: no reading, no change
        return base_batch
    ratio = noise_bound / worst_share
    if replace:
        return min(pool_size, math.ceil(base_batch / ratio))
    target = (1.0 / base_batch - 1.0 / pool_size) * ratio
    return min(pool_size, math.ceil(1.0 / (target + 1.0 / pool_size) - 1e-9))


class LocalBatch:
    """The batch size of a chain's next draw from the noise its last draw measured.

    Parameters
    ----------
    minibatches
        The step's :class:`~.minibatches.Minibatches`, resized after each draw (its
        ``batch_factor``, ``pool_size`` and ``replace`` are read).
    shares
        ``shares(noise_var)``: each coordinate's share of the stationary variance fed by a
        gradient noise of variance ``noise_var`` at the step's step size now.
    noise_bound
        The step's bound on the share.
    """

    def __init__(
        self, minibatches: Any, shares: Callable[[np.ndarray], np.ndarray], noise_bound: float
    ):
        self.minibatches, self.shares, self.noise_bound = minibatches, shares, noise_bound
        self.restart()

    @classmethod
    def of(cls, step: Any) -> LocalBatch:
        """The collaborator of a step: its minibatches, its noise model at its step size
        now (``step.noise_share(step.step_size, noise_var)``) and its ``noise_bound``."""
        return cls(
            step.minibatches,
            lambda noise_var: step.noise_share(step.step_size, noise_var),
            step.noise_bound,
        )

    def restart(self) -> None:
        """A new chain: the tuned batch size is read at its first draw after tuning, and the
        readings' mean starts afresh."""
        self.base_batch: int | None = None
        self._sum: np.ndarray | None = None
        self._count = 0
        self._last: np.ndarray | None = None  # the last reading, where it was above chance

    def next_batch(self, batch_size: int, unit_noise: np.ndarray | None) -> int:
        """The next draw's batch size, given this draw's (``batch_size`` rows, the first
        draw after tuning fixes the base) and its measured per-unit noise ``N^2 s^2`` per
        coordinate (None: no reading, the base batch)."""
        if self.base_batch is None:
            self.base_batch = batch_size
        base = self.base_batch
        if unit_noise is None or not np.all(np.isfinite(unit_noise)):
            self._last = None
            return base
        noise = self.sizing_noise(np.asarray(unit_noise, dtype=np.float64))
        if noise is None:
            return base
        rows = self.minibatches
        worst = float(np.max(self.shares(noise * rows.batch_factor(base))))
        return local_batch_size(worst, self.noise_bound, base, rows.pool_size, rows.replace)

    def sizing_noise(self, reading: np.ndarray) -> np.ndarray | None:
        """Per coordinate, the noise that sizes the next batch: the readings' mean, or where
        this reading and the last are both above ``chance_ratio(d)`` times it, the smaller
        of the two if larger (None before ``MIN_READINGS`` readings)."""
        self._sum = reading.copy() if self._sum is None else self._sum + reading
        self._count += 1
        mean = self._sum / self._count
        above = reading > chance_ratio(reading.size) * mean
        last, self._last = self._last, np.where(above, reading, np.nan)
        if self._count < MIN_READINGS:
            return None
        if last is None:
            return mean
        persistent = above & np.isfinite(last)
        return np.where(persistent, np.maximum(mean, np.fmin(reading, last)), mean)

    def after_draw(self, unit_noise: np.ndarray | None) -> None:
        """Resize the minibatches for the next draw (:meth:`next_batch` of the draw's
        measurement, or None)."""
        batch = self.next_batch(self.minibatches.size, unit_noise)
        if batch != self.minibatches.size:
            self.minibatches.resize(batch)
