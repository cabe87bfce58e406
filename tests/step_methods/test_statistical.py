"""Statistical correctness: SGHMC and SGLD with default settings target the right posterior.

Each check compares posterior means and sds with a reference, with tolerances from the
Monte Carlo standard error (``conftest.check_posterior``: ``|mean - truth| <= 4.5 MCSE``).
The only widening is each sampler's documented step-size bias on the sd:

* SGHMC (BAOAB) is exact for Gaussian targets: no widening.
* SGLD (Euler-Maruyama) inflates the variance of a Gaussian target by ``1 / (1 - eps/4)`` in
  the preconditioned coordinates (eps = the default 0.2 at unit curvature): sd ratio 1.026.
* SBPS has no discretisation; its bias knob ``k`` only matters through bound violations,
  which the control variates keep rare on these targets (no widening).
* HMC-ECS accepts or rejects with the same estimate that drives its dynamics, so the step size
  adds no bias; the perturbed estimator's bias knob is ``m`` (its ``sigma_hat^2``), which the
  defaults hold near 0 on these targets (mean ``sigma_hat^2`` below 1e-2), and the signed
  estimator's results are sign-corrected (all signs +1 here): no widening.  Where the model
  is Gaussian-linear the second-order residuals vanish and HMC-ECS is exact full-data HMC;
  the estimator itself is tested in ``test_hmcecs.py`` with noisy (first-order) estimates.
* EWSG's default integrator (OBABO at temperature ``1 - h^2/4``) is exact for Gaussian targets,
  and its step size keeps the uniform-subsampling noise share within the bound that SGHMC's
  is held to (EWSG's selected gradients feed less): no widening.
* AusterityMH's bias knob is epsilon (default 0.05), the level of each look of its sequential
  test. With the default control-variate residuals the decisions come from the first
  minibatch and their wrong-decision rate is measured at 0-0.25 % on logistic regression
  (``test_austerity.py``); on Gaussian-linear models the residuals vanish and the decisions
  are exact MH's: no widening.
"""

from __future__ import annotations

from functools import partial

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import (
    check_posterior,
    laplace_importance_reference,
    logistic_data,
    logistic_model,
    sample_two_chains,
)

import pymc_bigdata as pmbd
from pymc_bigdata.demo import make_data

SAMPLERS = {
    "sghmc": (pmbd.SGHMC, 1.0),
    "sgld": (pmbd.SGLD, 1.0 / np.sqrt(1.0 - pmbd.SGLD.default_step_size / 4.0)),
    "sbps": (pmbd.SBPS, 1.0),
    "hmcecs": (pmbd.HMCECS, 1.0),
    "hmcecs_signed": (partial(pmbd.HMCECS, estimator="signed"), 1.0),
    "ewsg": (pmbd.EWSG, 1.0),
    "austerity": (pmbd.AusterityMH, 1.0),
}


# The targets for defaults: (max |mean err| / sd, sd ratio band, min bulk ESS)
TARGETS = {
    "sghmc": (0.10, (0.90, 1.10), 100),
    "sgld": (0.15, (0.85, 1.20), 100),
    "sbps": (0.10, (0.90, 1.10), 100),
    "hmcecs": (0.10, (0.90, 1.10), 100),
    "hmcecs_signed": (0.10, (0.90, 1.10), 100),
    "ewsg": (0.10, (0.90, 1.10), 100),
    "austerity": (0.15, (0.85, 1.20), 100),
}


def check_targets(idata, name: str, var: str, ref_mean, ref_sd) -> None:
    """The issue's bars for defaults (``TARGETS``), beside the MCSE bands: a sampler whose
    chains mix badly has wide MCSE bands, and these bars still catch it (checked: a wrong
    control-variate sum inflates HMC-ECS's sds 1.6x and passes the bands, not the bars)."""
    max_err, (lo, hi), min_ess = TARGETS[name]
    post = idata.posterior[var]
    err = np.abs(post.mean(("chain", "draw")).values - ref_mean) / ref_sd
    ratio = post.std(("chain", "draw")).values / ref_sd
    assert err.max() <= max_err, f"{var}: max |mean error| {err.max():.3f} sd > {max_err}"
    assert lo <= ratio.min() and ratio.max() <= hi, f"{var}: sd ratios {ratio} outside [{lo}, {hi}]"
    assert float(az.ess(idata, method="bulk")[var].min()) >= min_ess


def sample(model, cls, layer, seed: int):
    """Two chains with pm.sample's defaults; a signed HMC-ECS run must have all signs +1, so
    that its plain moments are its sign-corrected ones (Eq. 5.3)."""
    idata = sample_two_chains(model, cls(model=model, layer=layer), seed=seed)
    if "sign" in idata.sample_stats:
        assert np.all(idata.sample_stats["sign"].values == 1)
    return idata


@pytest.fixture(scope="module")
def conjugate_normal():
    """y_i ~ N(mu, 2), mu ~ N(1, 10): posterior N(m, s^2) in closed form. N = 20,000."""
    rng = np.random.default_rng(21)
    y = rng.normal(0.7, 2.0, size=20_000)
    with pm.Model() as model:
        mu = pm.Normal("mu", 1.0, 10.0)
        pm.Normal("y", mu, 2.0, observed=y)
    precision = 1 / 10.0**2 + len(y) / 2.0**2
    mean = (1.0 / 10.0**2 + y.sum() / 2.0**2) / precision
    return model, pmbd.MinibatchModel(model), mean, 1 / np.sqrt(precision)


@pytest.mark.parametrize("name", SAMPLERS)
def test_conjugate_normal_mean(name, conjugate_normal):
    """Normal mean with known variance: analytic posterior mean and sd."""
    model, layer, mean, sd = conjugate_normal
    cls, sd_bias = SAMPLERS[name]
    idata = sample(model, cls, layer, seed=1)
    check_posterior(idata, "mu", np.array(mean), np.array(sd), sd_bias_ratio=sd_bias)
    check_targets(idata, name, "mu", mean, sd)


@pytest.fixture(scope="module")
def linear_regression():
    """y = X b + e, e ~ N(0, 1.5^2) known, b ~ N(0, 2^2 I): Gaussian posterior in closed form."""
    rng = np.random.default_rng(22)
    n, d = 50_000, 4
    corr = 0.6 * np.ones((d, d)) + 0.4 * np.eye(d)
    x = rng.standard_normal((n, d)) @ np.linalg.cholesky(corr).T
    y = x @ np.array([0.5, -1.0, 0.2, 0.0]) + rng.normal(0.0, 1.5, size=n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=d)
        pm.Normal("y", pm.math.dot(x, b), 1.5, observed=y)
    precision = x.T @ x / 1.5**2 + np.eye(d) / 2.0**2
    cov = np.linalg.inv(precision)
    return model, pmbd.MinibatchModel(model), cov @ (x.T @ y) / 1.5**2, np.sqrt(np.diag(cov))


@pytest.mark.parametrize("name", SAMPLERS)
def test_linear_regression(name, linear_regression):
    """Bayesian linear regression with correlated covariates: analytic posterior."""
    model, layer, mean, sd = linear_regression
    cls, sd_bias = SAMPLERS[name]
    idata = sample(model, cls, layer, seed=2)
    check_posterior(idata, "b", mean, sd, sd_bias_ratio=sd_bias)
    check_targets(idata, name, "b", mean, sd)


def _logistic_log_post(x, y, prior_sd):
    def log_post(thetas):
        out = -0.5 * np.sum(thetas**2, axis=1) / prior_sd**2
        for start in range(0, len(x), 20_000):
            eta = x[start : start + 20_000] @ thetas.T
            out += y[start : start + 20_000] @ eta - np.logaddexp(0.0, eta).sum(axis=0)
        return out

    return log_post


@pytest.fixture(scope="module")
def logistic_100k():
    """Logistic regression, N = 100,000, 5 correlated covariates; reference = Laplace fit
    refined by importance sampling (exact up to its own, accounted, Monte Carlo error)."""
    x, y = logistic_data(100_000, 5, seed=23)
    model, layer = logistic_model(x, y)
    laplace = layer.map_estimate()
    ref = laplace_importance_reference(
        _logistic_log_post(x, y, 1.0), laplace.theta, laplace.hessian, 8_000, seed=5
    )
    assert ref["ess"] > 4_000  # the Laplace proposal is good: the reference is reliable
    return model, layer, ref


@pytest.mark.parametrize("name", SAMPLERS)
def test_logistic_regression_100k(name, logistic_100k):
    """Logistic regression on 100,000 rows against a Laplace + importance-sampling reference."""
    model, layer, ref = logistic_100k
    cls, sd_bias = SAMPLERS[name]
    idata = sample(model, cls, layer, seed=3)
    check_logistic_100k(idata, name, ref, sd_bias)


def check_logistic_100k(idata, name: str, ref: dict, sd_bias: float) -> None:
    """The MCSE bands and the issue's bars against the 100k regression's reference."""
    check_posterior(
        idata,
        "beta",
        ref["mean"],
        ref["sd"],
        ref_mean_se=ref["mean_se"],
        ref_sd_se=ref["sd_se"],
        sd_bias_ratio=sd_bias,
    )
    check_targets(idata, name, "beta", ref["mean"], ref["sd"])


def test_two_observed_variables_sharing_rows():
    """y1 ~ N(X a, 1) and y2 ~ Bernoulli(logit X c) on the same 30,000 rows: SGHMC matches a
    Laplace + importance-sampling reference of the joint posterior."""
    x, y2 = logistic_data(30_000, 2, seed=24)
    rng = np.random.default_rng(25)
    y1 = x @ np.array([0.3, -0.4]) + rng.standard_normal(len(x))
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=2)
        c = pm.Normal("c", 0.0, 1.0, shape=2)
        pm.Normal("y1", pm.math.dot(x, a), 1.0, observed=y1)
        pm.Bernoulli("y2", logit_p=pm.math.dot(x, c), observed=y2)
    step = pmbd.SGHMC(model=model)
    laplace = step.layer.map_estimate()
    logistic = _logistic_log_post(x, y2, 1.0)

    def log_post(thetas):
        a_, c_ = thetas[:, :2], thetas[:, 2:]
        resid = y1[:, None] - x @ a_.T
        gauss = -0.5 * np.sum(resid**2, axis=0) - 0.5 * np.sum(a_**2, axis=1)
        return gauss + logistic(c_)

    ref = laplace_importance_reference(log_post, laplace.theta, laplace.hessian, 8_000, seed=6)
    idata = sample_two_chains(model, step, seed=4)
    for name, sl in (("a", slice(0, 2)), ("c", slice(2, 4))):
        check_posterior(
            idata,
            name,
            ref["mean"][sl],
            ref["sd"][sl],
            ref_mean_se=ref["mean_se"][sl],
            ref_sd_se=ref["sd_se"][sl],
        )


@pytest.fixture(scope="module")
def logistic_d30():
    """The benchmark's shape at a test's size: N = 100,000, d = 30, equicorrelation 0.5."""
    x, y = make_data(100_000, 30, seed=26)
    model, layer = logistic_model(x, y)
    laplace = layer.map_estimate()
    ref = laplace_importance_reference(
        _logistic_log_post(x, y, 1.0), laplace.theta, laplace.hessian, 4_000, seed=7
    )
    return model, layer, ref


@pytest.mark.parametrize("name", SAMPLERS)
def test_defaults_meet_targets_on_30_coefficients(name, logistic_d30):
    """With defaults and pm.sample's defaults, the samplers meet the issue's accuracy targets
    on 30 correlated coefficients, and pass the per-coordinate MCSE check against the
    Laplace + importance-sampling reference."""
    model, layer, ref = logistic_d30
    cls, sd_bias = SAMPLERS[name]
    idata = sample(model, cls, layer, seed=5)
    result = check_posterior(
        idata,
        "beta",
        ref["mean"],
        ref["sd"],
        ref_mean_se=ref["mean_se"],
        ref_sd_se=ref["sd_se"],
        sd_bias_ratio=sd_bias,
    )
    max_err, (lo, hi), min_ess = TARGETS[name]
    post = idata.posterior["beta"]
    err = np.abs(post.mean(("chain", "draw")).values - ref["mean"]) / ref["sd"]
    assert err.max() <= max_err
    assert lo <= result["sd_ratio"].min() and result["sd_ratio"].max() <= hi
    assert float(az.ess(idata, method="bulk")["beta"].min()) >= min_ess


@pytest.mark.parametrize("name", ["sghmc", "sgld", "sbps"])
def test_window_gathers_on_the_logistic_regression_100k(name, logistic_100k):
    """The same 100,000 rows read through ``gather="windows"`` (windows of a shuffled copy:
    independent for SGHMC and SBPS, reshuffled passes for SGLD) against the same reference.
    With the copy's rows read as zeros every sampler fails it (watched). A copy whose ``X``
    rows sit one position off their ``y`` passes: with control variates a canonical GLM's
    gradient difference ``x (sigma(x a) - sigma(x theta))`` does not read ``y``, so
    ``tests/test_row_windows.py`` checks the copy's rows and the windows' law instead."""
    _, _, ref = logistic_100k
    x, y = logistic_data(100_000, 5, seed=23)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=x.shape[1])
        features = pmbd.Data("X", x, gather="windows")
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=y)
    cls, sd_bias = SAMPLERS[name]
    step = cls(model=model)
    assert step.layer.rows.gather == "windows" and step.minibatches.windows
    idata = sample_two_chains(model, step, seed=3)
    check_logistic_100k(idata, name, ref, sd_bias)
