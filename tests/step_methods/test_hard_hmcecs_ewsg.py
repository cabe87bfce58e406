"""HMC-ECS (both estimators) and EWSG against the NUTS references (slow; CI runs them).
Bars and references: ``tests/hard_checks.py``.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
from conftest import sample_two_chains
from hard_checks import (
    HARD,
    REFERENCES,
    assert_bars,
    available,
    check_against_reference,
    reference,
    unconstrained_draws,
)
from hard_models import (
    hier_logistic,
    rare_event_logistic,
)

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods.alarms import SUBSAMPLE_ACCEPT_ALARM

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------- HMC-ECS
def _sign_corrected_check(model, idata, ref):
    """Signed HMC-ECS: sign-corrected moments (Eq. 5.3) against the reference. The bands are
    ``check_posterior``'s, with the chain's MCSE divided by the mean sign (the sign
    correction's ESS factor ``(2 tau - 1)^2``, Eq. 5.4)."""
    signs = idata.sample_stats["sign"].values.astype(float)
    mean_sign = signs.mean()
    assert mean_sign > 0.8, f"{(signs < 0).mean():.1%} negative signs"
    weights = (signs / signs.sum())[:, :, None]
    for value in model.value_vars:
        name = value.name
        draws = unconstrained_draws(model, idata, name)
        mean = (weights * draws).sum((0, 1))
        sd = np.sqrt(np.maximum((weights * draws**2).sum((0, 1)) - mean**2, 0.0))
        plain = az.from_dict({"posterior": {name: draws}})
        mcse_mean = az.mcse(plain, method="mean")[name].values.ravel() / mean_sign
        mcse_sd = az.mcse(plain, method="sd")[name].values.ravel() / mean_sign
        z = 4.5
        mean_band = z * np.sqrt(mcse_mean**2 + ref[f"{name}__mean_se"] ** 2)
        sd_band = z * np.sqrt(mcse_sd**2 + ref[f"{name}__sd_se"] ** 2)
        assert np.all(np.abs(mean - ref[f"{name}__mean"]) <= mean_band), name
        assert np.all(np.abs(sd - ref[f"{name}__sd"]) <= sd_band), name


@pytest.mark.parametrize("name", available(HARD))
@pytest.mark.parametrize("estimator", ["perturbed", "signed"])
def test_hmcecs_skewed_targets_against_nuts(estimator, name):
    """HMC-ECS with defaults (both estimators; 2 x 6,000 draws) matches the NUTS references
    where the Laplace fit is measurably off (``test_laplace_gradient_sampler_fails`` shows
    the same bands reject the Laplace approximation). No sd widening: the accept test uses
    the same estimate as the dynamics, and the perturbed estimator's mean sigma_hat^2 is held
    small (checked below)."""
    builder, _ = HARD[name]
    model = builder()
    # the perturbed estimator's bias knob is sigma_hat^2 (via m): at 12,000 draws the MCSE
    # bands resolve its perturbation (defaults: a data-poor group of the centred model 0.064 sd
    # off, 4.6 MCSE; within the bars, see docs/hmcecs.md), so this check of the algorithm
    # turns the knob down tenfold; the defaults are judged by the bars in the benchmarks
    knob = {"loglik_var_target": 0.1} if estimator == "perturbed" else {}
    idata = sample_two_chains(
        model, pmbd.HMCECS(model=model, estimator=estimator, **knob), seed=13, draws=6000
    )
    stats = idata.sample_stats
    # the subsample chain moves (the sampler's own alarm level). Signed on scale_few_rows
    # (m = N = 30, lambda = 1) its mean alpha_u varies with the tuned a: 0.67-0.89 over seeds
    # 1-6 and 13 (a chain tuned to a = -2.5 gave 0.44), 0.585 in one CI run whose floating-
    # point history differed; the bands below passed for every seed tried, the low ones too
    assert float(stats["subsample_accept"].mean()) > SUBSAMPLE_ACCEPT_ALARM
    if estimator == "perturbed":
        assert float(np.nanmean(stats["loglik_var"].values)) < 1.0
        check_against_reference(model, idata, reference(name), 1.0)
    else:
        _sign_corrected_check(model, idata, reference(name))


def test_signed_hmcecs_noncentred_expands_in_the_group_effects():
    """Signed HMC-ECS with defaults on the non-centred hierarchical model in its own
    coordinates (2 x 6,000 draws, sign-corrected) against the NUTS reference. Expanded in
    ``theta = (mu, tau, z)`` its control variates fail over most of this posterior (one
    30-row estimate's variance runs to 10^2-10^6 at posterior draws; at e1225ce the chains
    gave 33 sd errors, all draws diverging); ``taylor_space="auto"`` expands in the group
    effects ``a = mu + tau z``, whose Taylor terms hold wherever ``a`` is in its posterior."""
    if not (REFERENCES / "hier_logistic_noncentred.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model = hier_logistic(centred=False)
    step = pmbd.HMCECS(model=model, estimator="signed", reparameterize=False)
    idata = sample_two_chains(model, step, seed=13, draws=6000)
    stats = idata.sample_stats
    assert stats["taylor_inputs"].values[:, -1].all()
    assert float(stats["subsample_accept"].mean()) > SUBSAMPLE_ACCEPT_ALARM
    _sign_corrected_check(model, idata, reference("hier_logistic_noncentred"))


# ---------------------------------------------------------------------- EWSG
def _all_coordinates(model, idata, ref):
    names = [v.name for v in model.value_vars]
    draws = np.concatenate([unconstrained_draws(model, idata, n) for n in names], axis=-1)
    ref_mean = np.concatenate([np.atleast_1d(ref[f"{n}__mean"]) for n in names])
    ref_sd = np.concatenate([np.atleast_1d(ref[f"{n}__sd"]) for n in names])
    ref_mean_se = np.concatenate([np.atleast_1d(ref[f"{n}__mean_se"]) for n in names])
    return draws, ref_mean, ref_sd, ref_mean_se


EWSG_TARGETS = {
    **{name: builder for name, (builder, _) in HARD.items()},
    "hier_logistic_noncentred": lambda: hier_logistic(centred=False),
    "rare_event_logistic": rare_event_logistic,
}


@pytest.mark.parametrize("name", available(EWSG_TARGETS))
def test_ewsg_defaults_against_nuts(name):
    """EWSG with every default (its own batch size too; the linear index weights) and
    pm.sample's defaults meets the issue's bars against the references, and its means are
    within 4.5 MCSE of them. Its sds are judged by the bars only. The non-centred target at
    this seed is the one that caught a loose blow-up bound: with BLOWUP_TEMPERATURE at 1e4
    a chain kept a draw at temperature 3.4e3 with tau at 6e-14 in its fifth tuning draw,
    every later draw diverged and its mean virial stayed at 4.35e3."""
    model = EWSG_TARGETS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pmbd.ModeWarning)  # the non-centred model's MAP
        idata = sample_two_chains(model, pmbd.EWSG(model=model), seed=13)
    draws, ref_mean, ref_sd, ref_mean_se = _all_coordinates(model, idata, reference(name))
    flat = draws.reshape(-1, draws.shape[-1])
    assert_bars(pmbd.EWSG, flat.mean(0), flat.std(0), ref_mean, ref_sd)
    mcse = az.mcse(az.from_dict({"posterior": {"x": draws}}), method="mean")["x"].values
    z = np.abs(flat.mean(0) - ref_mean) / np.sqrt(mcse**2 + ref_mean_se**2)
    assert z.max() <= 4.5, f"mean off by {z.max():.2f} MCSE"
