"""SGLD's options: the re-run of too-stiff draws at a finer step (``max_refinements``)."""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import check_posterior, sample_two_chains

import pymc_bigdata as pmbd


def test_max_refinements_argument_errors(noisy_normal):
    """``max_refinements``: an int >= 0 (default 0, as in ``PAPER_SETTINGS``); Euler's
    stiffness is ``eps kappa`` (order 1)."""
    model, layer, _, _ = noisy_normal
    assert pmbd.SGLD(model=model, layer=layer).max_refinements == 0
    step = pmbd.SGLD(model=model, layer=layer, max_refinements=6)
    assert step.max_refinements == 6 and step.refinement.order == 1
    assert pmbd.SGLD.PAPER_SETTINGS["max_refinements"] == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_refinements must be"):
            pmbd.SGLD(model=model, layer=layer, max_refinements=bad)


def test_an_unstable_step_is_refined_and_samples_euler_s_posterior(noisy_normal):
    """A fixed step of 4.4 (Euler is unstable beyond 4 at the posterior's curvature, 1 in the
    preconditioner's coordinates) is re-run at 2.2 (``eps kappa`` 2.2: near instability) and
    then at 1.1 on every draw, along the same Brownian path; the draws then have Euler's
    stationary sd at 1.1, ``1 / sqrt(1 - 1.1 / 4)`` = 1.174 times the posterior's (full-data
    gradients: no noise; no adaptation, which would re-fit the preconditioner to the
    inflated draws), and the bias alarm says the draws are too dispersed. Caught
    (watched): with ``max_refinements=0`` every draw diverges."""
    model, layer, mean, sd = noisy_normal
    settings = {"step_size": 4.4, "inner_steps": 4, "batch_size": 20_000, "adapt": False}
    step = pmbd.SGLD(model=model, layer=layer, max_refinements=6, **settings)
    with pytest.warns(pmbd.BiasWarning, match="too dispersed"):
        idata = sample_two_chains(model, step, seed=5)
    refinements = idata.sample_stats["step_refinements"].values
    assert np.all(refinements == 2)
    assert not idata.sample_stats["diverging"].values.any()
    euler_sd = 1.0 / np.sqrt(1.0 - 1.1 / 4.0)
    draws = idata.posterior["mu"].values
    assert 1.1 < draws.std() / sd < 1.25  # the band's upper side below allows up to 1.174
    check_posterior(idata, "mu", np.array(mean), np.array(sd), sd_bias_ratio=euler_sd)


def test_a_tuned_step_on_a_gaussian_is_not_re_run(noisy_normal):
    """With re-runs on a Gaussian posterior (the preconditioner fits: path curvature 1
    everywhere) no draw is re-run, and the draws are those of ``max_refinements=0``: the
    random numbers are drawn in the same order, and a split's are never drawn. Caught
    (watched): one extra innovation drawn per draw."""
    model, layer, _, _ = noisy_normal
    runs = [
        sample_two_chains(model, pmbd.SGLD(model=model, layer=layer, **kw), seed=3, draws=300)
        for kw in ({"max_refinements": 6}, {"max_refinements": 0})
    ]
    assert not runs[0].sample_stats["step_refinements"].values.any()
    np.testing.assert_array_equal(runs[0].posterior["mu"].values, runs[1].posterior["mu"].values)


def _crossed_with_residual_scale(raters: int = 200, per: int = 10):
    """Crossed ratings with known effect scales and an unknown residual scale: ``raters``
    raters x as many items, ``per`` ratings per rater (N = raters x per, d = 2 raters + 2), and
    the exact posterior mean and sd of ``log sigma`` (a grid over its marginal: given sigma
    the rest is Gaussian, so ``y`` is Gaussian and its density is read through d x d
    matrices)."""
    rng = np.random.default_rng(21)
    items, sd_r, sd_i = raters, 0.5, 0.8
    rater = np.repeat(np.arange(raters), per)
    item = rng.permutation(np.tile(np.arange(items), per))
    effects = rng.normal(0, sd_r, raters)[rater] + rng.normal(0, sd_i, items)[item]
    y = 3.0 + effects + rng.normal(0.0, 1.0, len(rater))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        r = pm.Normal("r", 0.0, sd_r, shape=raters)
        i = pm.Normal("i", 0.0, sd_i, shape=items)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", mu + r[rater] + i[item], sigma, observed=y)
    X = np.zeros((len(y), 1 + raters + items))
    X[:, 0] = 1.0
    X[np.arange(len(y)), 1 + rater] = 1.0
    X[np.arange(len(y)), 1 + raters + item] = 1.0
    prior = np.r_[1 / 25.0, np.full(raters, 1 / sd_r**2), np.full(items, 1 / sd_i**2)]
    xtx, xty, yty = X.T @ X, X.T @ y, y @ y
    log_sigma = np.linspace(-0.3, 0.3, 601)
    log_post = []
    for ls in log_sigma:
        s2 = np.exp(2 * ls)
        chol = np.linalg.cholesky(np.diag(prior) + xtx / s2)  # P0 + X'X / s2
        solved = np.linalg.solve(chol, xty / s2)
        log_det = 2 * np.log(np.diag(chol)).sum() - np.log(prior).sum() + len(y) * np.log(s2)
        quad = yty / s2 - solved @ solved
        log_prior = -np.exp(2 * ls) / (2 * 4.0) + ls  # HalfNormal(2) in log sigma
        log_post.append(-0.5 * (log_det + quad) + log_prior)
    weights = np.exp(np.array(log_post) - max(log_post))
    weights /= weights.sum()
    mean = weights @ log_sigma
    return model, mean, np.sqrt(weights @ (log_sigma - mean) ** 2)


@pytest.mark.slow
def test_residual_scale_with_few_rows_per_parameter():
    """SGLD's defaults but a 100-row minibatch, on crossed ratings with 2.5 rows per
    parameter (N = 1,000, d = 402; 2 chains of 1,000 tuning and 4,000 draws): the variance
    inflation of 400 effects (Euler's and the gradient noise's) adds up into the residual
    sum of squares, and the step's budget keeps ``log sigma`` within 0.1 of its posterior
    sds (:func:`~pymc_bigdata.adaptation.residual_scale_shift_bound`); asserted within 0.1
    plus 2 MCSEs (one-off at this seed: 0.051, MCSE 0.019). Caught (watched failing): the
    budget without that bound (0.152 sds off, MCSE 0.013), and the corrected
    preconditioner keeping the diagonal's curvature range (13.6 where it is 1.65 on the
    first crossed model tried: a step too small for the budget to bind)."""
    model, ref_mean, ref_sd = _crossed_with_residual_scale(per=5)
    step = pmbd.SGLD(model=model, batch_size=100)
    assert step.low_rank == 2 and step.precond.curvature_range[1] < 2.0
    idata = sample_two_chains(model, step, seed=5, draws=4000)
    log_sigma = np.log(idata.posterior["sigma"].values)
    mcse = float(az.mcse(az.from_dict({"posterior": {"x": log_sigma}}))["x"]) / ref_sd
    error = abs(log_sigma.mean() - ref_mean) / ref_sd
    assert error <= 0.1 + 2.0 * mcse, (error, mcse)
