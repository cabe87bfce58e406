"""The likelihood's inputs ``phi(theta)`` and the Taylor expansion in them (HMC-ECS).

What each test proves: the frontier finds the parameter-only tensors the rows read, tells
selections of ``theta`` (a GLM's coefficients) from nonlinear functions of it (a non-centred
model's group effects), and rebuilds the row log-likelihood in ``phi`` exactly; a model that is
quadratic in ``phi`` but not in ``theta`` has zero second-order residuals in ``phi`` only (so an
expansion that silently stayed in ``theta`` fails it); the full-data sums in ``phi`` equal the
sum of the per-row Taylor terms; the estimators' fused gradients in ``phi`` match finite
differences; settings that cannot be honoured raise before any full-data pass.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import layer_without_map_search

import pymc_bigdata as pmbd
import pymc_bigdata.model.likelihood_inputs as likelihood_inputs
from pymc_bigdata.kernels.hmcecs import block_poisson_log_abs, perturbed_loglik
from pymc_bigdata.model.difference_terms import control_variate_sum


def _noncentred_model(n_groups: int = 6, n_rows: int = 400, seed: int = 5) -> pm.Model:
    rng = np.random.default_rng(seed)
    group = rng.integers(n_groups, size=n_rows)
    x = rng.standard_normal(n_rows)
    a_true = -0.5 + 0.7 * rng.standard_normal(n_groups)
    y = rng.binomial(1, 1 / (1 + np.exp(-(a_true[group] + 0.4 * x))))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
        slope = pm.Normal("slope", 0.0, 2.0)
        a = pm.Deterministic("a", mu + tau * z)
        pm.Bernoulli("y", logit_p=a[group] + slope * x, observed=y)
    return model


@pytest.fixture(scope="module")
def noncentred():
    layer = pmbd.MinibatchModel(_noncentred_model())
    anchor = layer.map_anchor()
    rng = np.random.default_rng(6)
    rows = layer.take_rows(rng.integers(layer.n_rows, size=40))
    theta = anchor.theta + 0.3 * rng.standard_normal(layer.dim)
    return layer, anchor, rows, theta


def test_frontier_of_a_noncentred_model(noncentred):
    layer, _, rows, theta = noncentred
    inputs = layer.likelihood_inputs
    assert inputs.available and not inputs.linear
    assert inputs.dim == 6 + 1  # the group effects a and the slope
    assert "a" in inputs.names
    phi = inputs(theta)
    mu, tau = theta[0], np.exp(theta[1])  # value vars: mu, tau_log__, z, slope
    np.testing.assert_allclose(np.sort(phi), np.sort([*(mu + tau * theta[2:8]), theta[8]]))
    rebuilt = layer.compiled.compile([inputs.phi, *layer.row_inputs], inputs.row_graph)(phi, *rows)
    np.testing.assert_allclose(rebuilt, layer.row_logp(theta, rows), rtol=1e-12)


def test_frontier_of_a_glm_is_a_selection(small_logistic):
    _, layer = small_logistic
    inputs = layer.likelihood_inputs
    assert inputs.available and inputs.linear and inputs.dim == layer.dim


def test_scale_model_keeps_checks_out_of_the_expansion():
    """``sigma > 0`` is a parameter-only check the rows read; it becomes a constant in the
    rebuilt graph, while ``sigma`` and ``log(sigma)`` become coordinates."""
    rng = np.random.default_rng(7)
    y = 1.0 + 2.0 * rng.standard_normal(50)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu, sigma, observed=y)
    layer = pmbd.MinibatchModel(model)
    inputs = layer.likelihood_inputs
    assert inputs.available and not inputs.linear
    rows = layer.take_rows(np.arange(50))
    theta = np.array([0.8, np.log(1.7)])
    rebuilt = layer.compiled.compile([inputs.phi, *layer.row_inputs], inputs.row_graph)
    np.testing.assert_allclose(rebuilt(inputs(theta), *rows), layer.row_logp(theta, rows))


def test_second_order_residuals_vanish_when_rows_are_quadratic_in_phi():
    """``y ~ Normal(b0 + exp(c) x, 1)``: each row is quadratic in ``phi = (b0, exp(c))`` but
    not in ``theta = (b0, c)``, so only the expansion in ``phi`` is exact."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(200)
    y = 0.3 + 1.5 * x + rng.standard_normal(200)
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 2.0)
        c = pm.Normal("c", 0.0, 1.0)
        pm.Normal("y", b0 + pm.math.exp(c) * x, 1.0, observed=y)
    layer = pmbd.MinibatchModel(model)
    anchor = layer.map_anchor()
    rows = layer.take_rows(np.arange(200))
    theta = anchor.theta + np.array([0.4, -0.5])
    terms = layer.difference_terms
    in_phi = terms.residuals(theta, rows, anchor, 2, "likelihood_inputs")
    in_theta = terms.residuals(theta, rows, anchor, 2, "parameters")
    assert np.max(np.abs(in_phi)) < 1e-9
    assert np.std(in_theta) > 1e-2


@pytest.mark.parametrize("order", [1, 2])
def test_control_variate_sum_in_phi_is_the_sum_of_taylor_terms(noncentred, order):
    layer, anchor, _, theta = noncentred
    every_row = layer.take_rows(np.arange(layer.n_rows))
    residuals = layer.difference_terms.residuals(
        theta, every_row, anchor, order, "likelihood_inputs"
    )
    expected = layer.row_logp(theta, every_row).sum() - residuals.sum()
    value, grad = control_variate_sum(theta, anchor, order, "likelihood_inputs", layer)
    assert value == pytest.approx(expected, rel=1e-10)
    fd = _central_difference(
        lambda t: control_variate_sum(t, anchor, order, "likelihood_inputs", layer)[0], theta
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-5)


def _central_difference(f, theta, h=1e-5):
    return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(len(theta))])


def test_perturbed_gradient_in_phi_matches_finite_differences(noncentred):
    layer, anchor, rows, theta = noncentred
    terms, space = layer.difference_terms, "likelihood_inputs"

    def log_post(t):
        prior, d, _ = terms.perturbed(t, rows, anchor, 2, space=space)
        cv_sum, _ = control_variate_sum(t, anchor, 2, space, layer)
        return prior + perturbed_loglik(cv_sum, d, layer.n_rows)[0]

    _, _, grad = terms.perturbed(theta, rows, anchor, 2, space=space)
    grad = grad + control_variate_sum(theta, anchor, 2, space, layer)[1]
    np.testing.assert_allclose(grad, _central_difference(log_post, theta), rtol=1e-5, atol=1e-4)


def test_block_poisson_gradient_in_phi_matches_finite_differences(noncentred):
    layer, anchor, rows, theta = noncentred
    terms, space, a, products = layer.difference_terms, "likelihood_inputs", -30.0, 4

    def log_post(t):
        prior, d, _ = terms.block_poisson(t, rows, anchor, 2, 10, a, space=space)
        cv_sum, _ = control_variate_sum(t, anchor, 2, space, layer)
        return prior + block_poisson_log_abs(cv_sum, d, layer.n_rows, 10, products, a)[0]

    _, _, grad = terms.block_poisson(theta, rows, anchor, 2, 10, a, space=space)
    grad = grad + control_variate_sum(theta, anchor, 2, space, layer)[1]
    np.testing.assert_allclose(grad, _central_difference(log_post, theta), rtol=1e-5, atol=1e-4)


def test_unavailable_expansion_is_refused_before_any_full_data_pass(monkeypatch):
    monkeypatch.setattr(likelihood_inputs, "MAX_INPUT_DIM", 3)
    model = _noncentred_model()
    layer = layer_without_map_search(model)
    assert not layer.likelihood_inputs.available
    assert "7 > 3" in layer.likelihood_inputs.reason
    with pytest.raises(ValueError, match="taylor_space='likelihood_inputs' is not available"):
        pmbd.HMCECS(model=model, layer=layer, taylor_space="likelihood_inputs")


def test_unknown_space_is_refused():
    with pytest.raises(ValueError, match="taylor_space must be one of"):
        pmbd.HMCECS(model=_noncentred_model(), taylor_space="theta")


def test_signed_auto_picks_the_inputs_of_a_noncentred_model():
    """On a non-centred model the expansion in the group effects varies far less over the
    posterior than the one in ``(mu, tau, z)``: ``"auto"`` picks it (stat ``taylor_inputs``);
    the perturbed estimator keeps the parameters (``AUTO_SPACE_ESTIMATORS``) in the model's
    own coordinates. Where its groups are re-centred it expands in the inputs
    (``RECENTRED_SPACE``): checked by the slow
    ``test_hard_hierarchies.py::test_hmcecs_perturbed_on_recentred_groups_expands_in_their_inputs``
    (here it cost 30-40 s of a cold compile cache for a second layer's graphs). Mutations
    (watched failing): ``AUTO_SPACE_ESTIMATORS`` empty, or holding ``"perturbed"`` too."""
    model = _noncentred_model(n_groups=6, n_rows=2000)
    layer = pmbd.MinibatchModel(model)
    with model:
        kwargs = dict(tune=60, draws=5, chains=1, random_seed=4, progressbar=False)
        kwargs["compute_convergence_checks"] = False
        # in the model's own coordinates (by default its data-rich groups are centred)
        own = {"layer": layer, "reparameterize": False}
        signed = pm.sample(step=pmbd.HMCECS(estimator="signed", **own), **kwargs)
        perturbed = pm.sample(step=pmbd.HMCECS(**own), **kwargs)
    assert bool(signed.sample_stats["taylor_inputs"].values[0, -1])
    assert not perturbed.sample_stats["taylor_inputs"].values.any()
