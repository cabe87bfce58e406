"""The bulk of a correlated effect's covariance (``pymc_bigdata/model/correlated_fit.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* :func:`marginal_loglik` is the random-effects meta-analysis density
  ``sum_j log N(a_j^; mu, Sigma + K_j^-1)`` up to a constant (mutations: the log determinant
  dropped; ``+ eta' M^-1 mu`` halved);
* on a Gaussian likelihood with every group data-poor, :func:`fit_correlated_groups` reads
  each group's ``K_j = X_j' X_j`` and puts ``(mu, L)`` at the mode of that density with the
  model's priors, computed here independently from the rows (mutation: ``linear`` without
  its gradient term), with the marginal's curvature there (mutation: the finite
  differences' mixed term over ``2 step^2``); the model's MAP inflates ``L`` there, and
  the centring rule read at the fit centres none of the groups it would all centre at the
  MAP;
* by default a step samples those groups non-centred (mutation: ``coordinates.py`` reading
  the information at the MAP, as before: all 40 groups centred), and its layer holds the
  bulk's reading, from which its MAP is more than 5 marginal sds (mutation: no reading kept);
* written centred (``pm.MvNormal``), the same posterior gives the same fit, and its
  data-poor groups move to non-centred coordinates.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import multivariate_normal

from pymc_bigdata.model.correlated_effects import find_correlated_effects
from pymc_bigdata.model.correlated_fit import fit_correlated_groups, marginal_loglik
from pymc_bigdata.model.correlated_reparam import choose_correlated_centredness, group_information
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.coordinates import sampling_layer

sys.path.insert(0, str(Path(__file__).parents[1]))
import correlated_slopes as cs  # noqa: E402


def _meta_analysis(precision, linear, loc, chol) -> float:
    """``sum_j log N(a_j^; mu, Sigma + K_j^-1)`` with ``a_j^ = K_j^-1 eta_j``."""
    sigma = chol @ chol.T
    return sum(
        multivariate_normal.logpdf(np.linalg.solve(k, e), loc, sigma + np.linalg.inv(k))
        for k, e in zip(precision, linear)
    )


def test_marginal_loglik_is_the_meta_analysis_density():
    rng = np.random.default_rng(0)
    factors = rng.normal(size=(6, 2, 2))
    precision = factors @ np.swapaxes(factors, 1, 2) + 0.1 * np.eye(2)
    linear = rng.normal(size=(6, 2))
    gaps = []
    for _ in range(5):
        chol = np.tril(rng.normal(size=(2, 2)))
        chol[np.diag_indices(2)] = np.exp(rng.normal(size=2))
        loc = rng.normal(size=2)
        ours = marginal_loglik(precision, linear, loc, chol)
        gaps.append(ours - _meta_analysis(precision, linear, loc, chol))
    assert np.ptp(gaps) < 1e-9


def _poor(centred: bool):
    layer = MinibatchModel(cs.correlated_poor_groups(centred=centred))
    [effect] = find_correlated_effects(layer.model, layer.value_vars)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theta = layer.map_estimate().theta
    return layer, effect, theta


@pytest.fixture(scope="module")
def poor():
    return _poor(centred=False)


@pytest.fixture(scope="module")
def poor_centred():
    return _poor(centred=True)


def _independent_bulk(layer: MinibatchModel, effect) -> tuple[np.ndarray, ...]:
    """Each group's ``X_j' X_j`` and least-squares estimate from the rows, and the mode of the
    meta-analysis density plus ``mu``'s Normal(0, 2) prior and the packed factor's prior."""
    group, x, y = cs.make_poor_groups_data()
    design = np.column_stack([np.ones_like(x), x])
    precision = np.stack([design[group == j].T @ design[group == j] for j in range(40)])
    linear = np.stack([design[group == j].T @ y[group == j] for j in range(40)])
    packed_prior = cs._packed_log_prior()

    def negative(p: np.ndarray) -> float:
        chol = np.array([[np.exp(p[2]), 0.0], [p[3], np.exp(p[4])]])
        loc_prior = -0.5 * np.sum(p[:2] ** 2) / 4.0
        return -(_meta_analysis(precision, linear, p[:2], chol) + loc_prior + packed_prior(p[2:]))

    start = np.array([0.5, -0.3, np.log(0.4), -0.18, np.log(0.24)])
    best = minimize(negative, start, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10})
    return precision, best.x[:2], best.x[2:], _hessian_of_gradients(negative, best.x)


def _hessian_of_gradients(function, x: np.ndarray, step: float = 1e-4) -> np.ndarray:
    """Central differences of ``function``'s central-difference gradient, symmetrised."""
    eye = np.eye(len(x)) * step

    def gradient(at: np.ndarray) -> np.ndarray:
        return np.array([(function(at + e) - function(at - e)) / (2 * step) for e in eye])

    out = np.array([(gradient(x + e) - gradient(x - e)) / (2 * step) for e in eye])
    return 0.5 * (out + out.T)


def _checked_fit(layer: MinibatchModel, effect, theta: np.ndarray):
    """The fit at ``theta``, checked against :func:`_independent_bulk`; with its ``K_j``."""
    fit = fit_correlated_groups(
        effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp
    )
    precision, loc, packed, curvature = _independent_bulk(layer, effect)
    np.testing.assert_allclose(fit.precision, precision, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(effect.loc(fit.point), loc, atol=2e-4)
    np.testing.assert_allclose(fit.point[effect.scale_slice], packed, atol=2e-4)
    # the marginal's precision, in the fit's order (L's packed value, then mu)
    order = np.r_[2:5, 0:2]
    np.testing.assert_allclose(fit.hyper_precision, curvature[np.ix_(order, order)], rtol=2e-3)
    return fit, precision


@pytest.mark.slow  # compiles the model's layer and searches its MAP: 20-70 s cold
def test_fit_is_the_empirical_bayes_mode_on_a_gaussian_likelihood(poor):
    layer, effect, theta = poor
    fit, precision = _checked_fit(layer, effect, theta)
    # the MAP's factor is inflated several-fold, so every group looks data-rich there
    map_diagonal = np.diag(effect.factor(theta))
    assert np.all(map_diagonal > 4.0 * np.diag(effect.factor(fit.point)))
    at_map = choose_correlated_centredness(group_information(effect, theta, layer.full_loglik_hvp))
    assert at_map.sum() == 40
    chol = effect.factor(fit.point)
    exact = choose_correlated_centredness(chol.T @ precision @ chol)
    np.testing.assert_array_equal(choose_correlated_centredness(fit.information(effect)), exact)
    assert exact.sum() <= 2


@pytest.mark.slow  # compiles the model's layer and searches its MAP: 20-70 s cold
def test_data_poor_correlated_groups_are_sampled_non_centred(poor):
    layer, effect, _ = poor
    moved = sampling_layer(layer, "centre")
    centred = 0.0 if moved.reparam is None else moved.reparam.reparams[0].centredness.sum()
    assert centred <= 2
    # the layer knows where the bulk is, and that its own MAP is far from it
    _, loc, packed, curvature = _independent_bulk(layer, effect)
    reading = moved.bulk
    np.testing.assert_allclose(reading.point[reading.hyper], np.r_[packed, loc], atol=2e-4)
    sds = np.sqrt(np.diag(np.linalg.inv(curvature)))[np.r_[2:5, 0:2]]
    map_theta = moved.map_estimate().theta
    far = np.abs(map_theta[reading.hyper] - reading.point[reading.hyper]) / sds
    assert reading.distance(map_theta) == pytest.approx(far.max(), rel=1e-2)
    assert far.max() > 5.0


@pytest.mark.slow  # compiles the model's layer and searches its MAP: 20-70 s cold
def test_a_centred_model_reads_the_same_bulk(poor_centred):
    """The centred form (``pm.MvNormal``) of the same posterior: the same ``K_j`` and mode,
    read from a MAP where the centred funnel pulls ``L`` down. Mutation: the ``+ J log|L|``
    of ``_prior_of_loc_and_factor`` dropped (the effects' prior counted twice)."""
    layer, effect, theta = poor_centred
    _checked_fit(layer, effect, theta)


@pytest.mark.slow  # compiles the model's layer and searches its MAP: 20-70 s cold
def test_data_poor_groups_of_a_centred_model_are_sampled_non_centred(poor_centred):
    """Both directions: the centred model's data-poor groups move to non-centred
    coordinates. Mutation: the scan of ``model.free_RVs`` for a centred ``pm.MvNormal``
    removed from ``find_correlated_effects`` (the layer stays centred)."""
    layer, _, _ = poor_centred
    moved = sampling_layer(layer, "centre")
    assert moved.reparam is not None
    [reparam] = moved.reparam.reparams
    assert reparam.effect.centred and reparam.centredness.sum() <= 2
