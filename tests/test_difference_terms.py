"""The layer's Taylor residuals and difference-estimator gradients (HMC-ECS, Sec. 4-5).

What each test proves: the residuals equal ``l_k - q_k`` computed from the layer's own per-row
values, gradients and dense per-row Hessians (orders 0-2); the second-order residuals vanish
for a Gaussian-linear model (zero-variance estimator); the fused gradients match central
finite differences of the estimators' own objectives; the full-data control-variate sum
equals the sum of the per-row Taylor terms.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.kernels.hmcecs import block_poisson_log_abs, perturbed_loglik
from pymc_bigdata.model.difference_terms import control_variate_sum


@pytest.fixture(scope="module")
def logistic():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 3))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ np.array([1.0, -0.5, 0.3]))))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    layer = pmbd.MinibatchModel(model)
    anchor = layer.map_anchor()
    rows_idx = rng.integers(400, size=40)
    theta = anchor.theta + 0.4 * rng.standard_normal(3)
    return layer, anchor, layer.take_rows(rows_idx), theta


def _taylor_terms(layer, anchor, rows, theta, order):
    """``q_k(theta)`` from per-row values, per-row gradients and per-row dense Hessians."""
    delta = theta - anchor.theta
    q = layer.row_logp(anchor.theta, rows)
    if order >= 1:
        q = q + layer.row_gradients(anchor.theta, rows) @ delta
    if order >= 2:
        single = [[r[k : k + 1] for r in rows] for k in range(len(rows[0]))]
        q = q + 0.5 * np.array(
            [delta @ layer.loglik_hessian(anchor.curvature_point, one) @ delta for one in single]
        )
    return q


@pytest.mark.parametrize("order", [0, 1, 2])
def test_residuals_are_loglik_minus_taylor_terms(logistic, order):
    layer, anchor, rows, theta = logistic
    residuals = layer.difference_terms.residuals(theta, rows, anchor, order)
    expected = layer.row_logp(theta, rows) - _taylor_terms(layer, anchor, rows, theta, order)
    np.testing.assert_allclose(residuals, expected, rtol=1e-9, atol=1e-10)


def test_second_order_residuals_vanish_for_gaussian_linear_rows():
    """Gaussian-linear rows are quadratic in theta: the second-order proxy is exact, so the
    difference estimator has zero variance (the paper's Sec. 6.7 remark)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 2))
    y = x @ np.array([0.4, -0.2]) + rng.standard_normal(300)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Normal("y", pm.math.dot(x, b), 1.0, observed=y)
    layer = pmbd.MinibatchModel(model)
    anchor = layer.map_anchor()
    rows = layer.take_rows(np.arange(300))
    theta = anchor.theta + np.array([0.7, -1.3])
    residuals = layer.difference_terms.residuals(theta, rows, anchor, 2)
    assert np.max(np.abs(residuals)) < 1e-9
    _, sigma2 = perturbed_loglik(0.0, residuals, 300)
    assert sigma2 < 1e-12
    first = layer.difference_terms.residuals(theta, rows, anchor, 1)
    assert np.std(first) > 0.1  # the first-order proxy is not exact: the test can tell


def _central_difference(f, theta, h=1e-5):
    return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(len(theta))])


@pytest.mark.parametrize("order", [0, 1, 2])
def test_perturbed_gradient_matches_finite_differences(logistic, order):
    """Eq. (4.7) with grad sigma_hat^2: the gradient of log p + log L_hat (4.5)."""
    layer, anchor, rows, theta = logistic
    terms = layer.difference_terms

    def log_post(t):
        prior, d, _ = terms.perturbed(t, rows, anchor, order)
        cv_sum, _ = control_variate_sum(t, anchor, order)
        return prior + perturbed_loglik(cv_sum, d, layer.n_rows)[0]

    prior, d, grad = terms.perturbed(theta, rows, anchor, order)
    grad = grad + control_variate_sum(theta, anchor, order)[1]
    np.testing.assert_allclose(grad, _central_difference(log_post, theta), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [1, 2])
def test_block_poisson_gradient_matches_finite_differences(logistic, order):
    """The gradient of log p + log |L_hat| of (5.1), four minibatches of ten rows."""
    layer, anchor, rows, theta = logistic
    terms = layer.difference_terms
    a, products = -20.0, 3

    def log_post(t):
        prior, d, _ = terms.block_poisson(t, rows, anchor, order, 10, a)
        cv_sum, _ = control_variate_sum(t, anchor, order)
        return prior + block_poisson_log_abs(cv_sum, d, layer.n_rows, 10, products, a)[0]

    _, _, grad = terms.block_poisson(theta, rows, anchor, order, 10, a)
    grad = grad + control_variate_sum(theta, anchor, order)[1]
    np.testing.assert_allclose(grad, _central_difference(log_post, theta), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_control_variate_sum_is_the_sum_of_taylor_terms(logistic, order):
    layer, anchor, _, theta = logistic
    every_row = layer.take_rows(np.arange(layer.n_rows))
    expected = _taylor_terms(layer, anchor, every_row, theta, order).sum()
    value, grad = control_variate_sum(theta, anchor, order)
    assert value == pytest.approx(expected, rel=1e-10, abs=1e-8)
    fd = _central_difference(lambda t: control_variate_sum(t, anchor, order)[0], theta)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)
