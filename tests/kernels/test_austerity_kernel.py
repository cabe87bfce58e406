"""The sequential test of approximate MH (Korattikara et al. 2014, Sec. 4, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pymc_bigdata.kernels.austerity import (
    gibbs_decision,
    mh_threshold,
    sequential_test,
    t_statistic,
)


def _permuted(population: np.ndarray, rng: np.random.Generator):
    """``next_differences`` over a random permutation of ``population``."""
    order = rng.permutation(len(population))
    position = [0]

    def next_differences(k: int) -> np.ndarray:
        start = position[0]
        position[0] += k
        return population[order[start : start + k]]

    return next_differences


def test_epsilon_zero_is_exact_mh_decision_by_decision():
    """With epsilon = 0 every row is used (in one chunk here) and each decision is exact MH's
    ``mu > mu_0``."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        population = rng.standard_normal(1_003) * rng.uniform(0.1, 3.0) + rng.normal(0, 0.05)
        mu0 = mh_threshold(np.log(rng.uniform()), rng.normal(0, 5), rng.normal(0, 5), 1_003)
        result = sequential_test(mu0, _permuted(population, rng), 1_003, 100, 0.0)
        assert result.rows == 1_003 and result.batches == 1 and result.delta == 0.0
        assert result.accept == (population.mean() > mu0)
        assert result.mean == pytest.approx(population.mean())


class _Recorder:
    """``next_differences`` over a random permutation of ``population`` that keeps every
    minibatch it hands out."""

    def __init__(self, population: np.ndarray, rng: np.random.Generator):
        self.next = _permuted(population, rng)
        self.batches: list[np.ndarray] = []

    def __call__(self, k: int) -> np.ndarray:
        batch = self.next(k)
        self.batches.append(batch)
        return batch


def _t_tail(rows: np.ndarray, mu0: float, n_rows: int) -> float:
    """Eqs. 3-4 written out: ``delta = 1 - Phi_{n-1}(|l_bar - mu_0| / s)``, ``s = (s_l /
    sqrt(n)) sqrt(1 - (n - 1) / (N - 1))``, with the Student-t law of ``n - 1`` degrees of
    freedom (scipy's)."""
    n = len(rows)
    s = rows.std(ddof=1) / np.sqrt(n) * np.sqrt(1.0 - (n - 1) / (n_rows - 1))
    return float(stats.t(df=n - 1).sf(abs(rows.mean() - mu0) / s))


def test_confident_decisions_stop_early_and_agree():
    """A threshold far from the mean (in standard errors of one minibatch) is decided from
    the first minibatches, and correctly; one at the mean needs every row. The stop is the
    first look whose p-value, recomputed from the rows read (Eqs. 3-4 and scipy's Student-t
    with n - 1 degrees of freedom), is below epsilon, and the reported ``delta`` is that
    p-value.

    Catches a test that reads the normal tail, or the wrong degrees of freedom (``delta``
    differs from the recomputed one), and one that stops at the wrong look."""
    rng = np.random.default_rng(1)
    population = rng.standard_normal(10_000) + 0.5
    for mu0 in (0.0, 0.4, 0.45):
        record = _Recorder(population, rng)
        far = sequential_test(mu0, record, 10_000, 100, 0.05)
        rows = np.concatenate(record.batches)
        assert far.rows == len(rows) and far.batches == len(record.batches)
        assert far.accept == (rows.mean() > mu0) and far.mean == pytest.approx(rows.mean())
        assert far.delta == pytest.approx(_t_tail(rows, mu0, 10_000), rel=1e-9)
        assert far.delta < 0.05
        looks = [_t_tail(rows[:n], mu0, 10_000) for n in range(100, far.rows, 100)]
        assert all(p >= 0.05 for p in looks)  # no earlier look was confident
    assert far.rows > 100  # the last threshold needed more than one look: the loop is tested
    far = sequential_test(0.0, _permuted(population, rng), 10_000, 100, 0.05)
    assert far.accept and far.rows <= 200
    at_mean = sequential_test(population.mean(), _permuted(population, rng), 10_000, 100, 0.05)
    assert at_mean.rows >= 1_000  # no confident decision until much of the data is in


class _SecondLook(Exception):
    """Raised by :class:`_OneLook` when the test asks for a second minibatch."""


class _OneLook:
    """``next_differences`` of normal differences ``N(mean, sd^2)`` that allows one look."""

    def __init__(self, mean: float, sd: float, rng: np.random.Generator):
        self.mean, self.sd, self.rng, self.calls = mean, sd, rng, 0

    def __call__(self, k: int) -> np.ndarray:
        self.calls += 1
        if self.calls > 1:
            raise _SecondLook
        return self.rng.normal(self.mean, self.sd, size=k)


@pytest.mark.parametrize("epsilon", [0.01, 0.1])
def test_first_look_stops_at_level_two_epsilon(epsilon: float):
    """Under the null (normal differences whose mean is ``mu_0``, a population so large that
    the finite-population correction is 1), the first look at ``m = 3`` rows stops with
    probability ``P(|t_2| > t_{2, 1 - epsilon}) = 2 epsilon`` exactly: the share of 20,000
    tests that stop there is within 4.5 binomial standard errors of it.

    Small minibatches make the degrees of freedom matter: the normal tail instead of Student-t
    with ``n - 1`` df stops 15 % of the time at epsilon = 0.01 (``2 P(t_2 > 2.33)``) and 33 %
    at 0.1, ``n`` df instead of ``n - 1`` 4.5 % and 24 % (25 and 15 standard errors away),
    and a level that ignores epsilon fails one of the two."""
    rng = np.random.default_rng(7)
    mu0, trials, stopped = 0.3, 20_000, 0
    for _ in range(trials):
        try:
            sequential_test(mu0, _OneLook(mu0, 2.0, rng), 10**12, 3, epsilon)
        except _SecondLook:
            continue
        stopped += 1
    p = 2 * epsilon
    assert abs(stopped / trials - p) <= 4.5 * np.sqrt(p * (1 - p) / trials)


def test_wrong_decisions_stay_near_epsilon():
    """Thresholds drawn near the population mean (where decisions are hard): the fraction of
    decisions that differ from exact MH stays of the order of epsilon, and shrinks with it."""
    rng = np.random.default_rng(2)
    population = rng.exponential(size=5_000) - 1.0
    sd_mean = population.std() / np.sqrt(500)
    errors = {}
    for epsilon in (0.01, 0.1):
        wrong = 0
        for _ in range(400):
            mu0 = population.mean() + rng.normal(0, 2 * sd_mean)
            result = sequential_test(mu0, _permuted(population, rng), 5_000, 100, epsilon)
            wrong += result.accept != (population.mean() > mu0)
        errors[epsilon] = wrong / 400
    assert errors[0.01] < errors[0.1] <= 0.25
    assert errors[0.01] <= 0.05


def test_t_statistic_null_law_without_replacement():
    """The paper's Fig. 1: with mu_0 the population mean, t of n rows drawn without
    replacement from N follows Student-t(n - 1) (KS test), here at n/N = 0.82 where the
    finite-population correction matters; without it the same test rejects."""
    rng = np.random.default_rng(3)
    n_rows, n = 12_214, 10_000
    population = np.where(rng.uniform(size=n_rows) < 0.3, 2.0, 0.0) + rng.normal(0, 0.5, n_rows)
    mu = population.mean()
    ts, naive = [], []
    for _ in range(2_000):
        sample = population[rng.choice(n_rows, size=n, replace=False)]
        var = sample.var(ddof=1)
        ts.append(t_statistic(sample.mean(), var, n, mu, n_rows))
        naive.append((sample.mean() - mu) / np.sqrt(var / n))
    law = stats.t(df=n - 1)
    assert stats.kstest(ts, law.cdf).pvalue > 1e-3
    assert stats.kstest(naive, law.cdf).pvalue < 1e-6


def test_gibbs_decision_at_epsilon_zero_is_exact_gibbs():
    """With epsilon = 0 each draw is exact Gibbs's: 1 iff ``log[u / (1 - u)]`` is below the
    conditional log-odds (prior odds plus the row sum), for the same u."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        population = rng.standard_normal(2_001) * rng.uniform(0.1, 2.0) + rng.normal(0, 0.002)
        known = rng.normal(0, 3)
        decision = gibbs_decision(known, _permuted(population, rng), 2_001, 100, 0.0, rng)
        log_odds = known + population.sum()
        assert decision.test.rows == 2_001
        assert decision.test.accept == (decision.log_u < log_odds)
        assert decision.mu0 == pytest.approx((decision.log_u - known) / 2_001)


def test_gibbs_decision_draws_the_conditional_law():
    """Over many draws the share of ones is the conditional probability sigma(log-odds), for
    clear and balanced conditionals (binomial 4-sigma band)."""
    rng = np.random.default_rng(5)
    population = rng.standard_normal(1_000) * 0.05
    population -= population.mean()
    for log_odds in (-2.0, 0.0, 1.0):
        known = log_odds - population.sum()
        ones = sum(
            gibbs_decision(known, _permuted(population, rng), 1_000, 100, 0.0, rng).test.accept
            for _ in range(4_000)
        )
        p = 1.0 / (1.0 + np.exp(-log_odds))
        assert abs(ones / 4_000 - p) <= 4 * np.sqrt(p * (1 - p) / 4_000)


def test_extreme_differences_decide_without_overflow():
    """Differences of order 1e120 (a proposal far out in a tail) overflow the third moment's
    arithmetic: the test still decides, its Edgeworth estimate inf or NaN, not an error."""
    rng = np.random.default_rng(6)
    population = -np.abs(rng.standard_normal(5_000)) * 1e120
    result = sequential_test(0.0, _permuted(population, rng), 5_000, 500, 0.05)
    assert not result.accept and result.rows == 500
