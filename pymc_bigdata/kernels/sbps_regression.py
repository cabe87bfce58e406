"""SBPS's local regression of the directional derivative (Pakman et al. 2017, Sec. 4).

Since the last bounce the sampler has observed ``G_i ~ G(t_i)`` with noise variances
``c_i^2`` (Eq. 10).  Eq. 9 models them as ``G_i = beta_1 t_i + beta_0 + e_i``,
``e_i ~ N(0, c_i^2)``, with a Gaussian prior ``N(mu, sigma^2)`` on the slope ``beta_1`` (and a
flat one on ``beta_0``).  The posterior of ``beta = (beta_0, beta_1)`` gives the predictive
``G(t) ~ N(beta_1 t + beta_0, rho^2(t))`` with ``rho^2(t) = x Sigma x^T + c_m^2``,
``x = (1, t)`` (Eqs. 11-12), and the thinning proposal rate is the upper band
``beta_1 t + beta_0 + k rho(t)`` (Eq. 13), interpolated linearly between knots.

``mu`` and ``sigma^2`` learn from the data of each completed segment: the paper takes "a
gradient ascent step on the marginal likelihood"; :func:`prior_step` takes it in its EM form
(the gradient scaled by ``sigma^2``, ``2 sigma^4``), which moves the prior towards the
segment's posterior slope only as far as the segment informs it.

Beyond the paper (``misfit=True``): when the points disagree with a line by more than their
noise (a curved ``G(t)``, where the posterior is far from Gaussian along the path), the
observation variances are scaled by the reduced chi-square of the fit (never below 1), so the
band widens instead of being violated.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["LineFit", "Segment", "band_knots", "fit_line", "prior_step"]

#: relative floor of an observation's variance (exact gradients give c^2 = 0)
RELATIVE_NOISE_FLOOR = 1e-12
#: the slope prior's sd never falls below this fraction of |mu| (ours: on a Gaussian target
#: every slope is a curvature v^T H v, and on an isotropic one they are all equal, so the
#: marginal likelihood drives sigma to 0 and the band of a segment's first observation would
#: no longer allow for any other slope)
RELATIVE_SLOPE_SD_FLOOR = 0.1


class Segment(NamedTuple):
    """Sufficient statistics of the observations since the last bounce: with weights
    ``w_i = 1 / c_i^2``, the sums of ``w``, ``w t``, ``w t^2``, ``w G``, ``w t G`` and
    ``w G^2``, their count and the last one's noise variance."""

    sw: float = 0.0
    swt: float = 0.0
    swtt: float = 0.0
    swg: float = 0.0
    swtg: float = 0.0
    swgg: float = 0.0
    count: int = 0
    last_noise_var: float = math.nan

    def add(self, t: float, value: float, noise_var: float) -> Segment:
        """The statistics with one more observation ``G(t) = value`` of variance ``c^2``."""
        noise_var = max(noise_var, RELATIVE_NOISE_FLOOR * max(1.0, value * value))
        w = 1.0 / noise_var
        return Segment(
            self.sw + w,
            self.swt + w * t,
            self.swtt + w * t * t,
            self.swg + w * value,
            self.swtg + w * t * value,
            self.swgg + w * value * value,
            self.count + 1,
            noise_var,
        )


class LineFit(NamedTuple):
    """Posterior mean ``(beta_0, beta_1)`` and covariance ``[[v00, v01], [v01, v11]]`` of Eq.
    9's line, and the last observation's noise variance ``c_m^2`` (the covariance and ``c_m^2``
    scaled by the misfit factor)."""

    beta0: float
    beta1: float
    v00: float
    v01: float
    v11: float
    last_noise_var: float

    def mean(self, t):
        """``beta_1 t + beta_0`` (a float or an array like ``t``)."""
        return self.beta0 + self.beta1 * t

    def predictive_sd(self, t):
        """``rho(t)`` of Eq. 12."""
        var = self.v00 + 2.0 * self.v01 * t + self.v11 * t * t + self.last_noise_var
        return np.sqrt(np.maximum(var, 0.0))

    def upper_band_at(self, t: float, k: float) -> float:
        """:meth:`upper_band` at one time, in Python floats."""
        var = self.v00 + 2.0 * self.v01 * t + self.v11 * t * t + self.last_noise_var
        return self.beta0 + self.beta1 * t + k * math.sqrt(max(var, 0.0))

    def predictive_sd_at(self, t: float) -> float:
        """:meth:`predictive_sd` at one time, in Python floats."""
        var = self.v00 + 2.0 * self.v01 * t + self.v11 * t * t + self.last_noise_var
        return math.sqrt(max(var, 0.0))

    def upper_band(self, t, k: float):
        """``beta_1 t + beta_0 + k rho(t)`` (Eq. 13 before interpolation)."""
        return self.mean(t) + k * self.predictive_sd(t)


def fit_line(segment: Segment, mu: float, sigma2: float, misfit: bool = True) -> LineFit:
    """The posterior of Eq. 9's line (at least one observation): precision
    ``X^T W X + diag(0, 1 / sigma^2)``, mean ``precision^-1 (X^T W G + (0, mu / sigma^2))``."""
    a, b, c = segment.sw, segment.swt, segment.swtt + 1.0 / sigma2
    r0, r1 = segment.swg, segment.swtg + mu / sigma2
    det = a * c - b * b
    v00, v01, v11 = c / det, -b / det, a / det
    beta0, beta1 = v00 * r0 + v01 * r1, v01 * r0 + v11 * r1
    scale = 1.0
    if misfit and segment.count > 2:  # sum w (G - beta0 - beta1 t)^2, from the sums
        chi2 = (
            segment.swgg
            - 2.0 * (beta0 * segment.swg + beta1 * segment.swtg)
            + beta0 * beta0 * segment.sw
            + 2.0 * beta0 * beta1 * segment.swt
            + beta1 * beta1 * segment.swtt
        )
        scale = max(1.0, chi2 / (segment.count - 2))
    return LineFit(
        beta0, beta1, v00 * scale, v01 * scale, v11 * scale, segment.last_noise_var * scale
    )


#: knot offsets of the proposal rate, in units of the knot scale
KNOT_OFFSETS = (0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0)


def band_knots(fit: LineFit, start: float, scale: float, k: float) -> tuple[list, list]:
    """Knots ``t`` from ``start`` out to ``start + 16 scale`` (geometric spacing) and the upper
    band's values there: the proposal rate ``gamma`` of Eq. 13 (Python floats: the thinning
    loop is scalar).

    The band is a line plus ``k`` times the norm of an affine function of ``t``, a convex
    curve, so its chords lie above it: the interpolation never undercuts the band between
    knots.
    """
    knots = [start + scale * offset for offset in KNOT_OFFSETS]
    beta0, beta1, v00, v01, v11, last = fit  # :meth:`LineFit.upper_band_at`, inlined
    rates = []
    for t in knots:
        var = v00 + 2.0 * v01 * t + v11 * t * t + last
        rates.append(beta0 + beta1 * t + k * math.sqrt(0.0 if var < 0.0 else var))
    return knots, rates


def prior_step(
    segment: Segment, mu: float, sigma2: float, rate: float, update: str = "em"
) -> tuple[float, float]:
    """One step of size ``rate`` up the marginal likelihood of ``(mu, sigma^2)`` given a
    segment's observations; unchanged with fewer than two.

    With ``m`` and ``s^2`` the posterior mean and variance of the segment's slope (Eq. 9's
    posterior, which already holds the prior), the log marginal likelihood's gradients are
    ``(m - mu) / sigma^2`` and ``((m - mu)^2 + s^2 - sigma^2) / (2 sigma^4)``.

    ``update="em"`` (ours, the step's default) scales them by ``sigma^2`` and ``2 sigma^4``:
    ``mu += rate (m - mu)`` and ``sigma^2 += rate ((m - mu)^2 + s^2 - sigma^2)``, with ``sigma``
    at least ``RELATIVE_SLOPE_SD_FLOOR |mu|``. A segment that says little about its slope
    (noisy, short) has ``m ~ mu`` and ``s^2 ~ sigma^2`` and moves nothing.

    ``update="gradient"`` is the paper's plain gradient-ascent step (Sec. 4), with no floor:
    in ``(mu, log sigma^2)``, the coordinates in which a step keeps ``sigma^2`` positive
    (the paper names neither the coordinates nor the rate).
    """
    if segment.count < 2:
        return mu, sigma2
    fit = fit_line(segment, mu, sigma2, misfit=False)
    if not (math.isfinite(fit.beta1) and math.isfinite(fit.v11)):
        return mu, sigma2
    gap2 = (fit.beta1 - mu) ** 2 + fit.v11
    if update == "gradient":
        new_mu = mu + rate * (fit.beta1 - mu) / sigma2
        log_step = rate * (gap2 - sigma2) / (2.0 * sigma2)
        return new_mu, sigma2 * math.exp(min(log_step, 700.0))
    new_mu = mu + rate * (fit.beta1 - mu)
    new_sigma2 = sigma2 + rate * (gap2 - sigma2)
    floor = (RELATIVE_SLOPE_SD_FLOOR * new_mu) ** 2 + 1e-300
    return new_mu, max(new_sigma2, floor)
