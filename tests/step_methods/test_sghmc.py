"""SGHMC-specific options: the B-hat noise correction, the paper's Eq. 15 integrator and its
(eta, alpha) parameterisation, and the re-run of too-stiff draws at a finer step."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import check_posterior, sample_two_chains
from correlated_regression import correlated_regression

import pymc_bigdata as pmbd


def test_fisher_and_split_noise_estimates_agree(noisy_normal):
    """Both measurements of the gradient noise estimate the same variance.

    Without control variates the minibatch gradient of this model has variance
    ``(N^2/n)(1 - n/N) Var(y)`` in theta units, i.e. ``N/n (1 - n/N)`` in z units (curvature 1).
    """
    model, layer, _, _ = noisy_normal
    expected = 20_000 / 1_000 * (1 - 1_000 / 20_000)
    for estimate in ("running", "fisher"):
        step = pmbd.SGHMC(
            model=model,
            layer=layer,
            control_variates=False,
            noise_estimate=estimate,
            step_size=0.05,
            inner_steps=2,
        )
        with model:
            idata = pm.sample(
                step=step,
                chains=1,
                tune=300,
                draws=300,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
            )
        measured = float(idata.sample_stats["grad_noise_sd"].values[0, -1]) ** 2
        # a running mean over ~20 draws of chi-square(1) (split) or of n-row variances (fisher)
        assert 0.4 * expected < measured < 2.5 * expected, (estimate, measured, expected)


def test_bhat_correction_removes_noise_inflation(noisy_normal):
    """Without control variates the gradient noise (eps^2 V ~ half the injected noise here)
    inflates the posterior sd; B-hat from the empirical Fisher removes it (exact check), while
    B-hat = 0 with the same independent minibatches leaves the sd visibly too wide (predicted
    ratio sqrt(1 + 0.045 / 0.095) = 1.21)."""
    model, layer, mean, sd = noisy_normal
    common = dict(model=model, layer=layer, control_variates=False, step_size=0.05, friction=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)  # the corrected chain is on target
        corrected = sample_two_chains(model, pmbd.SGHMC(noise_estimate="fisher", **common), seed=2)
    check_posterior(corrected, "mu", np.array(mean), np.array(sd))
    with pytest.warns(pmbd.BiasWarning, match="virial|kinetic|noise"):  # and it says so
        uncorrected = sample_two_chains(
            model, pmbd.SGHMC(noise_estimate="zero", reshuffle=False, **common), seed=2
        )
    assert float(uncorrected.posterior["mu"].std()) > 1.1 * sd


def test_bhat_requires_independent_minibatches(noisy_normal):
    """A noise estimate with reshuffled (correlated) minibatches is refused, not ignored."""
    model, layer, _, _ = noisy_normal
    with pytest.raises(ValueError, match="reshuffle=False"):
        pmbd.SGHMC(model=model, layer=layer, noise_estimate="fisher", reshuffle=True)


def test_eq15_integrator_with_learning_rate_and_alpha(noisy_normal):
    """The paper's Alg. 2 (Eq. 15) given as learning rate eta and momentum decay alpha.

    eta = 0.01 (eps = 0.1), alpha = 0.1 (C = 1). Its O(eps) bias on a unit Gaussian is about
    eps/4 in variance, so the sd band is widened by sqrt(1 + eps/4) on one side."""
    model, layer, mean, sd = noisy_normal
    step = pmbd.SGHMC(
        model=model,
        layer=layer,
        integrator="sghmc",
        learning_rate=0.01,
        alpha=0.1,
        inner_steps=28,
    )
    assert step.step_size == pytest.approx(0.1) and step.friction == pytest.approx(1.0)
    idata = sample_two_chains(model, step, seed=3)
    check_posterior(idata, "mu", np.array(mean), np.array(sd), sd_bias_ratio=np.sqrt(1.025))


def test_eta_alpha_argument_errors(noisy_normal):
    """step_size and learning_rate (or friction and alpha) are exclusive; alpha needs a step."""
    model, layer, _, _ = noisy_normal
    with pytest.raises(ValueError, match="either step_size or learning_rate"):
        pmbd.SGHMC(model=model, layer=layer, step_size=0.1, learning_rate=0.01)
    with pytest.raises(ValueError, match="either friction or alpha"):
        pmbd.SGHMC(model=model, layer=layer, learning_rate=0.01, alpha=0.1, friction=1.0)
    with pytest.raises(ValueError, match="alpha"):
        pmbd.SGHMC(model=model, layer=layer, alpha=0.1)


def test_max_refinements_argument_errors(noisy_normal):
    """``max_refinements``: an int >= 0, and only with BAOAB (the default, 6)."""
    model, layer, _, _ = noisy_normal
    assert pmbd.SGHMC(model=model, layer=layer).max_refinements == 6
    assert pmbd.SGHMC(model=model, layer=layer, integrator="sghmc").max_refinements == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_refinements must be"):
            pmbd.SGHMC(model=model, layer=layer, max_refinements=bad)
    with pytest.raises(ValueError, match="integrator='sghmc' has none"):
        pmbd.SGHMC(model=model, layer=layer, integrator="sghmc", max_refinements=2)


def test_an_unstable_step_is_refined_and_samples_the_posterior(noisy_normal):
    """A fixed step of 2.2 (BAOAB is unstable beyond 2 at the posterior's curvature, 1 in the
    preconditioner's coordinates): every draw is re-run at 1.1, along the same Brownian path,
    and the posterior is right (full-data gradients: no noise). Caught (watched): with
    ``max_refinements=0`` every draw diverges; a re-run that does not call ``oracle.again``
    loses the log-density estimate the divergence check tracks."""
    model, layer, mean, sd = noisy_normal
    step = pmbd.SGHMC(model=model, layer=layer, step_size=2.2, batch_size=20_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=5)
    refinements = idata.sample_stats["step_refinements"].values
    assert np.all(refinements == 1)
    assert not idata.sample_stats["diverging"].values.any()
    lp_est = idata.sample_stats["lp_est"].values
    measured = np.isfinite(lp_est)  # NaN: not a measuring draw
    assert measured.sum() >= 2 * 1000 // step.measure_every, measured.sum()
    logp = model.compile_logp()
    exact = np.array([logp({"mu": m}) for m in idata.posterior["mu"].values[measured]])
    offset = lp_est[measured] - exact  # full-data estimates: exact up to a constant
    assert np.ptp(offset) < 1e-6 * np.abs(exact).max(), np.ptp(offset)
    check_posterior(idata, "mu", np.array(mean), np.array(sd))


@pytest.mark.slow
@pytest.mark.parametrize("estimate", ["fisher", "running"])
def test_bhat_subtracts_correlated_noise_as_a_matrix(estimate):
    """The paper's SGHMC (``PAPER_SETTINGS``: the model's own coordinates, plain gradients of
    1,000 of 5,000 rows) on a posterior of correlation 0.9, whose gradient noise is as
    correlated (``V ~ 5 Sigma^-1``, 26 % of the injected noise's variance per coordinate at
    eps = 0.04, C = 1.5): with B-hat the whole measured matrix every sd is within 4 of its
    Monte Carlo standard errors of the exact one (measured 1.000 and 0.997 at 2 x 4,000
    draws). Catches B-hat read as its diagonal: the sds 16 % short (0.84, no alarm)."""
    model, mean, cov = correlated_regression()
    sd = np.sqrt(np.diag(cov))
    settings = {**pmbd.SGHMC.PAPER_SETTINGS, "noise_estimate": estimate}
    step = pmbd.SGHMC(
        model=model, learning_rate=0.04**2, alpha=0.04 * 1.5, inner_steps=20, **settings
    )
    assert step.noise_covariance
    idata = sample_two_chains(model, step, seed=1, draws=2000)
    draws = idata.posterior["beta"]
    mcse_sd = az.mcse(idata, var_names=["beta"], method="sd")["beta"].values
    ratio = draws.std(("chain", "draw")).values / sd
    assert np.all(np.abs(ratio - 1.0) < 4.0 * mcse_sd / sd), (ratio, mcse_sd / sd)
    assert not idata.sample_stats["noise_clipped"].values.any()


@pytest.mark.slow
def test_tuning_keeps_the_noise_within_what_bhat_can_subtract():
    """With a noise estimate the step-size policy counts the noise B-hat cannot subtract
    (its share beyond 1 along the noise's stiffest direction): on the 0.9-correlated
    regression in the model's own coordinates, without control variates, tuning chooses a
    step and batch at which B-hat is never clipped, and the posterior's variance along both
    of its axes is within 10 %.

    Catches the policy blind to B-hat's excess (the share taken as 0, as before: clipped on
    98 % of the draws, the narrow axis's variance 1.15 times the exact one with the matrix,
    the wide axis's 0.45 with the diagonal)."""
    model, mean, cov = correlated_regression()
    step = pmbd.SGHMC(
        model=model,
        noise_estimate="fisher",
        preconditioner="identity",
        reparameterize=False,
        control_variates=False,
    )
    idata = sample_two_chains(model, step, seed=3)
    assert idata.sample_stats["noise_clipped"].values.mean() < 0.05
    values, vectors = np.linalg.eigh(cov)
    along_axes = (idata.posterior["beta"].values.reshape(-1, 2) - mean) @ vectors
    np.testing.assert_allclose(along_axes.var(axis=0) / values, 1.0, atol=0.1)


def test_bhat_excess_is_read_along_the_noises_stiffest_direction():
    """With a noise estimate, Eq. 15's share ``eps V / (2C)`` counts only beyond 1, after
    scaling by the measured matrix's largest eigenvalue over its largest variance (1.9 for
    unit variances of correlation -0.9): at eps = 1, C = 1 and V = 2 the share 1 becomes
    0.9; at eps = 0.5 (0.95 after scaling) nothing.

    Catches the excess read per coordinate only (0 at eps = 1) or not at all."""
    model, _, _ = correlated_regression()
    step = pmbd.SGHMC(
        model=model,
        noise_estimate="fisher",
        integrator="sghmc",
        friction=1.0,
        preconditioner="identity",
        reparameterize=False,
        control_variates=False,
    )
    # a measurement as the oracle reports one (the step's own accumulator)
    step._noise.add(np.ones(2), None, np.array([[1.0, -0.9], [-0.9, 1.0]]))
    np.testing.assert_allclose(step.noise_share(1.0, np.array([2.0, 2.0])), [0.9, 0.9])
    np.testing.assert_allclose(step.noise_share(0.5, np.array([2.0, 2.0])), [0.0, 0.0])
