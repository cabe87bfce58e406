"""SGLD's options: the re-run of too-stiff draws at a finer step (``max_refinements``)."""

from __future__ import annotations

import numpy as np
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
