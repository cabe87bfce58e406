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

This module is pure: the differences ``l_i`` come from a callback, one minibatch at a time,
in the order of a random permutation that the caller owns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import stats

__all__ = ["SequentialTestResult", "mh_threshold", "sequential_test", "t_statistic"]


class SequentialTestResult(NamedTuple):
    """One decision of Algorithm 1.

    ``rows`` used, ``batches`` drawn, ``delta`` the final p-value (0 when every row was used),
    ``mean`` the final ``l_bar``.
    """

    accept: bool
    rows: int
    batches: int
    delta: float
    mean: float


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
        The test's level ``epsilon`` in ``[0, 1)``; 0 uses every row (exact MH).
    """
    total = total_sq = 0.0
    n = batches = 0
    while True:
        k = min(batch_size, n_rows - n)
        batch = np.asarray(next_differences(k), dtype=np.float64)
        total += float(batch.sum())
        total_sq += float(batch @ batch)
        n += k
        batches += 1
        mean = total / n
        if n >= n_rows:
            return SequentialTestResult(mean > mu0, n, batches, 0.0, mean)
        if n < 2 or epsilon <= 0.0:
            continue
        var_l = max(total_sq - n * mean * mean, 0.0) / (n - 1)
        t = t_statistic(mean, var_l, n, mu0, n_rows)
        if not math.isfinite(t):  # identical differences so far: no evidence about the rest
            continue
        delta = float(stats.t.sf(abs(t), df=n - 1))
        if delta < epsilon:
            return SequentialTestResult(mean > mu0, n, batches, delta, mean)
