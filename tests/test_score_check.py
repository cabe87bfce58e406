"""The full-data score check (:mod:`pymc_bigdata.score_check`).

Its reference is exact: draws from the Normal-inverse-gamma posterior of a conjugate linear
regression, made here with NumPy (no sampler involved). Exact draws must pass; draws made
too wide, too narrow or off-centre on purpose must be flagged.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.datasets import conjugate_regression


@pytest.fixture(scope="module")
def conjugate():
    """The conjugate regression (5,000 rows, 4 coefficients and the noise variance), its
    layer and its exact posterior."""
    model, posterior = conjugate_regression()
    return model, pmbd.MinibatchModel(model), posterior


def _exact_draws(posterior, seed, **change):
    """Exact draws (2 x 1,000), or made wider, narrower or moved on purpose (``change``)."""
    return az.from_dict({"posterior": posterior.draws(np.random.default_rng(seed), **change)})


@pytest.mark.parametrize("seed", range(5))
def test_exact_draws_pass(conjugate, seed):
    """No false alarm on exact draws (five seeds), and the virial ratio is near 1.

    Catches a virial centred at 0 instead of at the draws' mean (all five seeds fail). (A
    score missing the log-Jacobian of ``s2``'s transform passes: at 5,000 rows that moves
    ``log s2`` by 0.02 of its sd, which no check on 100 draws can see.)"""
    model, layer, posterior = conjugate
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        result = pmbd.score_check(_exact_draws(posterior, seed), model, layer=layer)
    assert not result.off_target, result
    assert result.draws == 100 and result.nonfinite == 0
    assert abs(result.virial_ratio - 1.0) < 0.2


@pytest.mark.parametrize(
    ("change", "test"),
    [
        ({"scale": 1.3}, "virial"),
        ({"scale": 0.8}, "virial"),
        ({"shift_sd": 0.8}, "mean score"),
    ],
)
def test_off_target_draws_are_flagged(conjugate, change, test):
    """Draws 1.3 or 0.8 times too wide, or one coefficient 0.8 sd off, are flagged with a
    BiasWarning by the test meant for them, and the result is stored in the attrs."""
    model, layer, posterior = conjugate
    idata = _exact_draws(posterior, 11, **change)
    with pytest.warns(pmbd.BiasWarning, match="off their target"):
        result = pmbd.score_check(idata, model, layer=layer)
    assert result.off_target
    cut = result.level / 2
    if test == "virial":
        assert result.p_virial < cut
        assert (result.virial_ratio > 1.2) == (change["scale"] > 1)
    else:
        assert result.p_mean_score < cut
    assert idata["posterior"].attrs["score_check_off_target"] == 1


def test_draws_outside_the_support_are_flagged(conjugate):
    """A draw where the log density is not finite counts as off target."""
    model, layer, posterior = conjugate
    idata = _exact_draws(posterior, 3)
    idata["posterior"]["beta"][0, 0, 0] = np.inf
    with pytest.warns(pmbd.BiasWarning, match="not finite"):
        result = pmbd.score_check(idata, model, layer=layer, store=False)
    assert result.nonfinite == 1 and result.off_target


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"draws": 5}, r"draws must be an integer of at least 10, got 5"),
        ({"level": 1.5}, r"level must be a number in \(0, 1\), got 1\.5"),
    ],
)
def test_bad_settings_are_named(conjugate, kwargs, match):
    model, layer, posterior = conjugate
    with pytest.raises(ValueError, match=match):
        pmbd.score_check(_exact_draws(posterior, 0), model, layer=layer, **kwargs)


def test_too_few_effective_draws_is_an_error(conjugate):
    """Draws that barely move (ESS below 10) cannot be tested: a clear error."""
    model, layer, posterior = conjugate
    idata = az.from_dict({"posterior": posterior.draws(np.random.default_rng(0), draws=4)})
    with pytest.raises(ValueError, match=r"needs at least 10 nearly independent draws"):
        pmbd.score_check(idata, model, layer=layer)


@pytest.mark.parametrize(
    ("make_step", "off"),
    [
        (lambda layer: pmbd.SGHMC(layer=layer), False),
        # about twice the step its rule picks here: sds 15-18 % too wide
        (lambda layer: pmbd.SGLD(layer=layer, adapt=False, step_size=1.0), True),
    ],
    ids=["sghmc-defaults", "sgld-step-too-large"],
)
def test_sampler_runs(conjugate, make_step, off):
    """On pm.sample's results: SGHMC with its defaults is quiet; SGLD with a fixed step that
    widens the sds by 15-18 % is flagged (virial ratio about 1.4)."""
    model, layer, _ = conjugate
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", pmbd.BiasWarning)
        idata = pm.sample(
            step=make_step(layer),
            draws=1000,
            tune=1000,
            chains=2,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    result = pmbd.score_check(idata, model, layer=layer, warn=False)
    assert result.off_target == off, result
    assert idata["sample_stats"].attrs["score_check_off_target"] == int(off)
