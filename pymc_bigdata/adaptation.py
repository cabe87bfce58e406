"""Tuning-phase adaptation shared by every subsampling step method (pure numpy).

During ``tune`` draws a step learns, as NUTS's warm-up does, in windows (Stan's schedule,
scaled to the number of tuning draws): an initial buffer that only moves the chain into the
bulk, then windows of doubling length at the end of each of which the preconditioner is
re-estimated from the window's draws and the control-variate anchor is moved to their mean,
and a terminal buffer in which only the step size settles.  This module holds the pieces
that need no model: the window schedule, running moments, the covariance blend and the
step-size rule; :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` wires them up.

Step-size rule (:func:`largest_step_within_noise_bound`).  A kernel's stationary variance in
the preconditioned coordinates is its thermal part plus a part fed by the gradient noise;
each kernel states that share as a function of its step size and of the noise variance
``V_j`` of coordinate j (e.g. SGLD ``eps V / 4``; SGHMC/BAOAB ``kappa eps^2 V / (1 - c^2)``).
The step size is the largest one, not above the kernel's curvature default, that keeps
``max_j share_j <= bound``: noisy coordinates (rare rows, small groups) set the step, not the
average one.  The bias left is an inflation of the variance of the noisiest coordinate by at
most ``bound`` (``NOISE_SHARE_BOUND = 0.05``: its sd by at most 2.5 %; reshuffled minibatches
have anti-correlated noise, so the realised inflation is smaller).

In many dimensions a small inflation adds up: draws whose variance is ``1 + s_j`` times the
posterior's along each direction have a log density ``sum_j s_j / 2`` below the posterior's
on average, where the posterior's own log density has an sd near ``sqrt(d / 2)``. So the step
also keeps the mean share within ``NOISE_SHIFT_BOUND / sqrt(d / 2)`` (:func:`mean_share_bound`):
the draws' log density at most half of its posterior sd off, a quarter of the virial alarm's
``ENERGY_SHIFT_ALARM``. A parameter the likelihood ties to every direction moves with it: on
crossed ratings (d = 4,004, 2,000 raters x 2,000 items) SGHMC at the per-coordinate bound
alone (worst share 0.05) put the residual scale 0.24 posterior sds off without an alarm; at a
worst share of 0.01 it was 0.005 sds off. The mean bound binds above d = 200.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "NOISE_SHARE_BOUND",
    "RunningMoments",
    "blend_covariance",
    "largest_step_within_noise_bound",
    "mean_share_bound",
    "rescale_laplace",
    "residual_scale_shift_bound",
    "window_ends",
]

#: largest share of the stationary variance the gradient noise may feed (per coordinate)
NOISE_SHARE_BOUND = 0.05

#: largest shift of the draws' log density, in its posterior sds, that the gradient noise may
#: cause over all coordinates together (see the module docstring)
NOISE_SHIFT_BOUND = 0.5


def mean_share_bound(dim: int, shift: float = NOISE_SHIFT_BOUND) -> float:
    """Largest mean noise share over ``dim`` coordinates that shifts the draws' log density
    by at most ``shift`` of its posterior sds (``shift / sqrt(dim / 2)``)."""
    return shift / math.sqrt(max(dim, 1) / 2.0)


#: largest shift, in its posterior sds, of a residual scale (a parameter every row reads)
#: that an inflation realised in full (SGLD's Euler step) may cause (see
#: :func:`residual_scale_shift_bound`)
RESIDUAL_SCALE_SHIFT = 0.1


def residual_scale_shift_bound(n_rows: int, dim: int) -> float:
    """The log-density shift bound (in its posterior sds) that keeps a residual scale within
    :data:`RESIDUAL_SCALE_SHIFT` of its posterior sds: ``RESIDUAL_SCALE_SHIFT sqrt(N / d)``.

    Inflating the variance of ``m <= d`` data-rich effects by a mean share ``s`` raises the
    residual sum of squares by ``m s`` residual variances, so the residual scale's mode moves
    by ``m s / (2 N)`` in ``log sigma``, ``m s / sqrt(2 N)`` of its posterior sds
    (``1 / sqrt(2 N)``), while the log density moves by ``s sqrt(d / 2)`` of its own: a shift
    ``b`` of the log density moves the scale by at most ``b sqrt(d / N)`` sds. Binding below
    ``N = 25 d`` rows at the default 0.5; on the crossed ratings (``N = 10 d``) SGLD put
    ``log sigma`` 0.16-0.18 sds off at 0.5, as predicted (0.158).
    """
    return RESIDUAL_SCALE_SHIFT * math.sqrt(n_rows / max(dim, 1))


def window_ends(tune: int) -> tuple[int, list[int], int]:
    """The initial buffer's length, the draw counts at which adaptation windows end, and the
    start of the terminal buffer.

    For ``tune = 1000``: initial buffer 75 draws, windows ending at 100, 150, 250, 450, 900
    (25, 50, 100, 200, 450 draws; the last window absorbs the remainder), terminal buffer
    100 draws.  Fewer than 40 tuning draws: no windows (the step size still adapts).
    """
    if tune < 40:
        return 0, [], 0
    init = int(0.075 * tune)
    terminal = int(0.1 * tune)
    window = max(int(0.025 * tune), 5)
    ends = []
    start = init
    end_of_windows = tune - terminal
    while start + window <= end_of_windows:
        end = start + window
        if end + 2 * window > end_of_windows:  # the next window would not fit: stretch
            end = end_of_windows
        ends.append(end)
        start, window = end, 2 * window
    return init, ends, end_of_windows


class RunningMoments:
    """Welford running mean and (dense or diagonal) covariance of vectors."""

    def __init__(self, dim: int, dense: bool):
        self.dense = dense
        self.count = 0
        self.mean = np.zeros(dim)
        self._m2 = np.zeros((dim, dim)) if dense else np.zeros(dim)

    def add(self, x: np.ndarray) -> None:
        self.count += 1
        delta = x - self.mean
        self.mean = self.mean + delta / self.count
        if self.dense:
            self._m2 += np.outer(delta, x - self.mean)
        else:
            self._m2 += delta * (x - self.mean)

    def covariance(self) -> np.ndarray:
        """Unbiased sample covariance (dense matrix or diagonal vector)."""
        return self._m2 / max(self.count - 1, 1)


def blend_covariance(
    sample_cov: np.ndarray, n_draws: int, prior_cov: np.ndarray, prior_draws: int
) -> np.ndarray:
    """Shrink a window's covariance towards a prior guess: ``(n S + k P) / (n + k)``.

    Used when the MAP is no mode (no Laplace fit to keep): ``P`` is the current
    preconditioner's covariance and ``k`` draws' worth of it keeps a short window's estimate
    positive definite (Stan shrinks towards a small multiple of the identity instead).
    """
    weight = n_draws / (n_draws + prior_draws)
    return weight * sample_cov + (1.0 - weight) * prior_cov


#: a window's marginal variance replaces the Laplace one only when their log ratio exceeds
#: this many standard errors (sqrt(2 / n) for n draws)
RESCALE_Z = 3.0


def rescale_laplace(laplace_cov: np.ndarray, sample_cov: np.ndarray, n_draws: int) -> np.ndarray:
    """Keep the Laplace covariance's shape, correct the marginal scales the draws disagree on.

    ``D C D`` with ``D_jj = sqrt(s_jj / c_jj)`` where the window's variance ``s_jj`` differs
    from the Laplace ``c_jj`` by more than ``RESCALE_Z`` standard errors of a log variance
    from ``n`` draws (``sqrt(2/n)``), else 1.  A near-Gaussian posterior keeps its exact
    Laplace preconditioner (a dense covariance from a few hundred draws has eigenvalues off by
    ``(1 +- sqrt(d/n))^2``, which would cost step size); a skewed coordinate wider or
    narrower than its Laplace fit is rescaled.  ``laplace_cov``/``sample_cov`` may be dense or
    diagonals.
    """
    laplace_var = np.diag(laplace_cov) if laplace_cov.ndim == 2 else laplace_cov
    sample_var = np.diag(sample_cov) if sample_cov.ndim == 2 else sample_cov
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(sample_var / laplace_var)
    significant = np.isfinite(log_ratio) & (
        np.abs(log_ratio) > RESCALE_Z * np.sqrt(2.0 / max(n_draws, 1))
    )
    scale = np.where(significant, np.exp(0.5 * np.where(significant, log_ratio, 0.0)), 1.0)
    if laplace_cov.ndim == 2:
        return laplace_cov * np.outer(scale, scale)
    return laplace_cov * scale**2


def largest_step_within_noise_bound(
    noise_share: Callable[[float, np.ndarray], np.ndarray],
    noise_var: np.ndarray,
    default_step: float,
    bound: float = NOISE_SHARE_BOUND,
    smallest: float = 1e-4,
    mean_bound: float | None = None,
    own_share: Callable[[float], float] | None = None,
) -> float:
    """Largest ``eps <= default_step`` with ``max(noise_share(eps, noise_var)) <= bound``
    and, given ``mean_bound``, ``mean(noise_share(eps, noise_var)) + own_share(eps) <=
    mean_bound`` (``own_share``: the kernel's own inflation of every coordinate's variance at
    ``eps``, e.g. SGLD's ``eps / 4``; none by default).

    ``noise_share`` must increase with ``eps`` (all our kernels' do); found by bisection on
    a log scale (30 halvings: relative precision 1e-3). Returns ``smallest * default_step``
    when even that step exceeds the bound.
    """
    if noise_var.size and not np.all(np.isfinite(noise_var)):
        return smallest * default_step
    worst_var = np.array([float(np.max(noise_var)) if noise_var.size else 0.0])

    def within(step: float) -> bool:
        if noise_share(step, worst_var)[0] > bound:
            return False
        if mean_bound is None:
            return True
        own = 0.0 if own_share is None else own_share(step)
        return float(np.mean(noise_share(step, noise_var))) + own <= mean_bound

    if within(default_step):
        return default_step
    lo, hi = np.log(smallest * default_step), np.log(default_step)
    if not within(float(np.exp(lo))):
        return float(np.exp(lo))
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if within(float(np.exp(mid))):
            lo = mid
        else:
            hi = mid
    return float(np.exp(lo))
