"""The log prior's Hessian by differences (``pymc_bigdata/model/prior_hessian.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* a prior with linear algebra (``pm.MvNormal``) reads its Hessian by differences, and it is
  the analytic one: ``-S^-1`` for the MvNormal block, ``-2 tau^2 / s^2`` for a
  log-transformed ``HalfNormal(s)``'s (mutations: ``holds_linear_algebra`` returning False;
  the difference divided by one step instead of two);
* elementwise priors keep the exact Hessian (their draws do not change);
* the differences match an analytic Hessian off the quadratic, at coordinates far from 0
  (the relative step), and are symmetric (mutation: the symmetrisation removed);
* SGHMC's defaults on a conjugate model with a correlated ``MvNormal`` prior, whose set-up
  reads the prior's Hessian this way, are within the bars of its exact Gaussian posterior
  (slow; mutations: a non-finite Hessian fails the set-up; ``holds_linear_algebra`` returning
  False fails its first assertion. A Hessian of the wrong sign and 100 times too large did
  not fail it: with 6,000 rows the likelihood dominates and tuning re-fits the
  preconditioner, so the first test, not this one, guards the values).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.prior_hessian import hessian_by_differences

#: the MvNormal prior's mean and covariance (correlated)
PRIOR_MEAN = np.array([0.5, -1.0, 0.0])
PRIOR_COV = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 0.8]])
#: the HalfNormal's scale
SCALE_SD = 1.5


def _mvnormal_model(n_rows: int = 60, seed: int = 0) -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """``x ~ MvNormal(PRIOR_MEAN, PRIOR_COV)``, ``tau ~ HalfNormal(SCALE_SD)``, and
    ``y_i ~ Normal(x[k_i], 1)`` with ``k_i`` cycling through the three entries; the rows'
    entry and values."""
    rng = np.random.default_rng(seed)
    k = np.arange(n_rows) % 3
    y = np.array([1.0, -0.5, 0.3])[k] + rng.standard_normal(n_rows)
    with pm.Model() as model:
        x = pm.MvNormal("x", PRIOR_MEAN, cov=PRIOR_COV)
        pm.HalfNormal("tau", SCALE_SD)
        pm.Normal("y", x[k], 1.0, observed=y)
    return model, k, y


def test_an_mvnormal_prior_reads_its_hessian_by_differences():
    model, _, _ = _mvnormal_model()
    layer = MinibatchModel(model)
    assert layer.compiled.prior_hessian_by_differences
    theta = np.array([0.3, -2.0, 1.5, 0.7])  # x, then log tau
    expected = np.zeros((4, 4))
    expected[:3, :3] = -np.linalg.inv(PRIOR_COV)
    # log HalfNormal(e^u) + u = -e^(2u) / (2 s^2) + u + const: second derivative -2 e^(2u) / s^2
    expected[3, 3] = -2.0 * np.exp(2.0 * theta[3]) / SCALE_SD**2
    np.testing.assert_allclose(layer.prior_hessian(theta), expected, rtol=1e-7, atol=1e-8)


def test_elementwise_priors_keep_the_exact_hessian():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=4)
        pm.Normal("y", mu + tau * z[np.arange(20) % 4], 1.0, observed=np.zeros(20))
    assert not MinibatchModel(model).compiled.prior_hessian_by_differences


def test_differences_match_an_analytic_hessian_off_the_quadratic():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 4))

    def gradient(x: np.ndarray) -> np.ndarray:  # of sum(log cosh(a x))
        return a.T @ np.tanh(a @ x)

    x = np.array([40.0, -0.2, 3.0, -12.0]) / 10.0
    exact = a.T @ np.diag(1.0 / np.cosh(a @ x) ** 2) @ a
    hessian = hessian_by_differences(gradient, x)
    np.testing.assert_allclose(hessian, exact, rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(hessian, hessian.T)


@pytest.mark.slow
def test_sghmc_on_a_correlated_mvnormal_prior_meets_the_bars():
    """The conjugate model's posterior of ``x`` is Gaussian: precision ``S^-1 + diag(n_k)``,
    mean ``P^-1 (S^-1 m + sum_k y)``; ``tau`` is its prior alone (``log tau``'s moments from
    a fine grid)."""
    model, k, y = _mvnormal_model(n_rows=6000, seed=1)
    prior_precision = np.linalg.inv(PRIOR_COV)
    precision = prior_precision + np.diag(np.bincount(k, minlength=3))
    cov = np.linalg.inv(precision)
    mean = cov @ (prior_precision @ PRIOR_MEAN + np.bincount(k, y, minlength=3))
    u = np.linspace(-12.0, 4.0, 200_001)
    w = np.exp(-np.exp(2.0 * u) / (2.0 * SCALE_SD**2) + u)
    w /= w.sum()
    u_mean = float(w @ u)
    u_sd = float(np.sqrt(w @ (u - u_mean) ** 2))
    with model:
        step = pmbd.SGHMC()
        assert step.layer.compiled.prior_hessian_by_differences
        idata = pm.sample(step=step, chains=2, random_seed=5, progressbar=False)
    x = idata.posterior["x"].values.reshape(-1, 3)
    log_tau = np.log(idata.posterior["tau"].values.ravel())
    draws = np.column_stack([x, log_tau])
    ref_mean = np.append(mean, u_mean)
    ref_sd = np.append(np.sqrt(np.diag(cov)), u_sd)
    err = np.abs(draws.mean(0) - ref_mean) / ref_sd
    ratio = draws.std(0) / ref_sd
    assert err.max() <= 0.1, err
    assert 0.9 <= ratio.min() and ratio.max() <= 1.1, ratio
