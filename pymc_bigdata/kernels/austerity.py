"""The sequential test of approximate Metropolis-Hastings (Korattikara, Chen & Welling, 2014).

Metropolis-Hastings accepts ``theta'`` when (Eq. 2)

    mu = (1/N) sum_i l_i  >  mu_0 = (1/N) log[u p(theta) q(theta'|theta)
                                            / (p(theta') q(theta|theta'))],

with ``l_i = log p(x_i | theta') - log p(x_i | theta)``, ``u ~ U(0, 1)`` and ``p`` the prior.
Sec. 4 decides this from a sample of the ``l_i`` drawn without replacement: after ``n``
rows, with mean ``l_bar`` and sd ``s_l``, the mean's standard error with the finite-population
correction is (Eq. 3)

    s = (s_l / sqrt(n)) sqrt(1 - (n - 1) / (N - 1)),

the statistic is ``t = (l_bar - mu_0) / s`` (Eq. 4), Student-t with ``n - 1`` degrees of
freedom when ``mu = mu_0``, and the test stops when ``delta = 1 - Phi_{n-1}(|t|) < epsilon``
(accept iff ``l_bar > mu_0``) or when every row is used (then ``s = 0`` and the decision is
exact MH's). ``epsilon = 0`` is exact MH (Algorithm 1).

The t-test's error level is exact only as far as the mean of ``n`` differences is normal. The
Edgeworth expansion of the t statistic's tail gives the first correction, of order
``skew / sqrt(n)``; each decision reports it (``clt_error``) so that an adapter can warn when
heavy-tailed differences (rare rows, no control variates) make the nominal ``epsilon``
optimistic (Bardenet, Doucet & Holmes 2014 show such failures).

Proposals (Sec. 6.1 and 6.2) work in the adapter's preconditioned coordinates ``z``: the
random walk ``z' = z + h xi``, and the Langevin proposal ``z' = z + (h^2 / 2) g(z) + h xi``,
whose drift ``g`` may be a minibatch gradient as long as the same minibatch gives ``g`` at
both ends (the mixture-kernel argument of Sec. 6.2: each minibatch's kernel is reversible).

Approximate Gibbs (Sec. 5) updates a binary variable ``x_j`` by the same test: set
``x_j = 1`` iff ``log[u / (1 - u)] < log P(x_j = 1 | x_-j) - log P(x_j = 0 | x_-j)``, the
conditional log-odds, whose row part is ``sum_i l_i`` with ``l_i = log f_i(x_j = 1, x_-j) -
log f_i(x_j = 0, x_-j)``; so ``mu_0 = (log[u / (1 - u)] - known) / N`` with ``known`` the
log prior odds (:func:`gibbs_decision`).

This module is pure: the differences ``l_i`` come from a callback, one minibatch at a time,
in the order of a random permutation that the caller owns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import special

__all__ = [
    "MHDecision",
    "Proposal",
    "SequentialTestResult",
    "gibbs_decision",
    "langevin_proposal",
    "mh_decision",
    "mh_threshold",
    "random_walk_proposal",
    "sequential_test",
    "t_statistic",
]


#: with epsilon = 0 no look can stop the test, so the rows are read in chunks of this many
#: (at least ``batch_size``) rather than minibatch by minibatch: the same decision, with
#: far fewer calls
EXACT_CHUNK = 65_536


class SequentialTestResult(NamedTuple):
    """One decision of Algorithm 1.

    ``rows`` used, ``batches`` drawn, ``delta`` the final p-value (0 when every row was used),
    ``mean`` the final ``l_bar``, ``clt_error`` the Edgeworth estimate of how far the t-test's
    tail probability at the final ``t`` is off for the skewness seen (0 when every row was
    used; NaN when it cannot be estimated).
    """

    accept: bool
    rows: int
    batches: int
    delta: float
    mean: float
    clt_error: float = 0.0


def mh_threshold(
    log_u: float, log_prior_ratio: float, log_proposal_ratio: float, n_rows: int
) -> float:
    """``mu_0`` of Eq. 2: ``(log u - log p(theta')/p(theta) - log q(theta|theta')/q(theta'|theta))
    / N``, from ``log_prior_ratio = log p(theta') - log p(theta)`` and ``log_proposal_ratio =
    log q(theta | theta') - log q(theta' | theta)``."""
    return (log_u - log_prior_ratio - log_proposal_ratio) / n_rows


def t_statistic(mean: float, var: float, n: int, mu0: float, n_rows: int) -> float:
    """Eqs. 3-4: ``(l_bar - mu_0) / s`` with ``s = sqrt(var / n) sqrt(1 - (n - 1) / (N - 1))``
    (``var``: the sample variance of the ``n`` differences, ``ddof = 1``); ``inf`` (signed) or
    NaN when ``s = 0``."""
    s = math.sqrt(max(var, 0.0) / n * (1.0 - (n - 1) / (n_rows - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(mean - mu0) / s)


def edgeworth_error(skewness: float, t: float, n: int) -> float:
    """First Edgeworth correction to the one-sided tail probability of a studentised mean at
    ``t``: ``|skew| (2 t^2 + 1) phi(t) / (6 sqrt(n))`` (Hall 1987, the t statistic's term)."""
    with np.errstate(all="ignore"):  # extreme differences: inf or NaN, never an exception
        t = np.float64(t)
        phi = np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
        return float(abs(skewness) * (2.0 * t * t + 1.0) * phi / (6.0 * math.sqrt(n)))


class _Moments:
    """Running sums of ``x - shift`` (the first value) up to the third power."""

    def __init__(self):
        self.n, self.shift = 0, math.nan
        self.s1 = self.s2 = self.s3 = 0.0

    def add(self, batch: np.ndarray) -> None:
        if self.n == 0:
            self.shift = float(batch[0])
        x = batch - self.shift
        self.n += len(batch)
        with np.errstate(over="ignore", invalid="ignore"):
            self.s1 += float(x.sum())
            self.s2 += float(x @ x)
            self.s3 += float((x * x) @ x)

    def mean(self) -> float:
        return self.shift + self.s1 / self.n

    def var(self) -> float:
        m = self.s1 / self.n
        return max(self.s2 - self.n * m * m, 0.0) / (self.n - 1)

    def skewness(self) -> float:
        with np.errstate(all="ignore"):  # in float64: overflow gives inf or NaN, not an error
            m = np.float64(self.s1) / self.n
            m2 = self.s2 / self.n - m * m
            m3 = self.s3 / self.n - 3.0 * m * self.s2 / self.n + 2.0 * m**3
            return float(m3 / m2**1.5) if m2 > 0 else math.nan


def sequential_test(
    mu0: float,
    next_differences: Callable[[int], np.ndarray],
    n_rows: int,
    batch_size: int,
    epsilon: float,
) -> SequentialTestResult:
    """Algorithm 1: draw minibatches of ``l_i`` until the t-test is confident or all rows are in.

    Parameters
    ----------
    mu0
        The threshold ``mu_0`` (:func:`mh_threshold`).
    next_differences
        ``next_differences(k)``: the next ``k`` differences ``l_i`` of a random permutation of
        the rows (without replacement across calls).
    n_rows
        ``N``.
    batch_size
        ``m``, rows per minibatch (the last one may be smaller).
    epsilon
        The test's level ``epsilon`` in ``[0, 1)``; 0 uses every row (exact MH), read in
        chunks of ``EXACT_CHUNK`` rows.
    """
    moments, batches = _Moments(), 0
    step = batch_size if epsilon > 0.0 else max(batch_size, EXACT_CHUNK)
    while True:
        k = min(step, n_rows - moments.n)
        moments.add(np.asarray(next_differences(k), dtype=np.float64))
        batches += 1
        n, mean = moments.n, moments.mean()
        if n >= n_rows:
            return SequentialTestResult(mean > mu0, n, batches, 0.0, mean, 0.0)
        if n < 2 or epsilon <= 0.0:
            continue
        t = t_statistic(mean, moments.var(), n, mu0, n_rows)
        if not math.isfinite(t):  # identical differences so far: no evidence about the rest
            continue
        delta = float(special.stdtr(n - 1, -abs(t)))  # Student-t tail, 1 - F(|t|)
        if delta < epsilon:
            clt = edgeworth_error(moments.skewness(), t, n)
            return SequentialTestResult(mean > mu0, n, batches, delta, mean, clt)


class Proposal(NamedTuple):
    """A proposed position and ``log q(z | z') - log q(z' | z)``."""

    position: np.ndarray
    log_ratio: float


def random_walk_proposal(z: np.ndarray, scale: float, rng: np.random.Generator) -> Proposal:
    """Sec. 6.1: ``z' = z + h xi``, ``xi ~ N(0, I)``; symmetric, so the ratio is 0."""
    return Proposal(z + scale * rng.standard_normal(z.shape), 0.0)


def langevin_proposal(
    z: np.ndarray,
    scale: float,
    drift: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
) -> Proposal:
    """Sec. 6.2 (Eq. 10) in preconditioned coordinates: ``z' = z + (h^2/2) g(z) + h xi``.

    ``drift`` is one kernel of the mixture: the same function (the same minibatch, or a
    deterministic gradient) gives ``g`` at ``z`` and at ``z'``, so ``log q(z | z')`` is that
    kernel's reverse density. A non-finite drift gives a NaN ratio (a rejection).
    """
    half_h2 = 0.5 * scale * scale
    forward_mean = z + half_h2 * drift(z)
    proposed = forward_mean + scale * rng.standard_normal(z.shape)
    backward_mean = proposed + half_h2 * drift(proposed)
    inv = 0.5 / (scale * scale)
    log_forward = -inv * float(np.sum((proposed - forward_mean) ** 2))
    log_backward = -inv * float(np.sum((z - backward_mean) ** 2))
    return Proposal(proposed, log_backward - log_forward)


class MHDecision(NamedTuple):
    """One approximate MH decision: the test's result and what fed it."""

    test: SequentialTestResult
    log_u: float
    mu0: float


def mh_decision(
    proposal: Proposal,
    known_log_ratio: float,
    next_differences: Callable[[int], np.ndarray],
    n_rows: int,
    batch_size: int,
    epsilon: float,
    rng: np.random.Generator,
) -> MHDecision:
    """Accept or reject ``proposal`` by Algorithm 1.

    The log target ratio is ``known_log_ratio + sum_i l_i``: the terms known without the rows
    (the log prior ratio, and with control variates the difference of their full-data sums)
    plus the rows' differences, which ``next_differences`` hands out (plain ``l_i`` or their
    residuals against the control variates). Accept iff (Eq. 2)
    ``mean l > (log u - known - log q ratio) / N``, decided by :func:`sequential_test`.
    """
    log_u = math.log(rng.uniform())
    mu0 = mh_threshold(log_u, known_log_ratio, proposal.log_ratio, n_rows)
    test = sequential_test(mu0, next_differences, n_rows, batch_size, epsilon)
    return MHDecision(test, log_u, mu0)


def gibbs_decision(
    known_log_odds: float,
    next_differences: Callable[[int], np.ndarray],
    n_rows: int,
    batch_size: int,
    epsilon: float,
    rng: np.random.Generator,
) -> MHDecision:
    """Draw a binary variable from its conditional by the sequential test (Sec. 5).

    The conditional log-odds of ``x_j = 1`` is ``known_log_odds + sum_i l_i``: the log prior
    odds plus the rows' differences ``l_i = l_i(x_j = 1) - l_i(x_j = 0)``, which
    ``next_differences`` hands out. The new value is 1 iff ``log[u / (1 - u)]`` is below it,
    i.e. iff ``mean l > mu_0 = (log[u / (1 - u)] - known_log_odds) / N``: ``test.accept`` is
    the new value. ``log_u`` holds ``log[u / (1 - u)]``.
    """
    u = rng.uniform()
    logit_u = math.log(u) - math.log1p(-u)
    mu0 = (logit_u - known_log_odds) / n_rows
    test = sequential_test(mu0, next_differences, n_rows, batch_size, epsilon)
    return MHDecision(test, logit_u, mu0)
