"""Where a step starts (``pymc_bigdata/step_methods/start.py``, ``bulk_start.py``): the
anchor at the Laplace fit's centre and the census stratum, from the set-up's passes; the
Gaussian at the bulk where a layer's reading of it is far from its MAP."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.model.bulk_fit import BulkReading
from pymc_bigdata.step_methods import bulk_start as bulk_start_module
from pymc_bigdata.step_methods.bulk_start import diagonal_bulk_precision
from pymc_bigdata.step_methods.start import census_rows, starting_fit

N_ROWS, N_COEFS, CHUNK_ROWS = 20_000, 5, 1_024


def _layer() -> pmbd.MinibatchModel:
    """A logistic regression of 20,000 rows in passes of 1,024: the MAP search's first stage
    sees a subsample, so the exact Newton stage runs and takes its last step without a pass."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N_ROWS, N_COEFS))
    X[:40, 2] *= 30.0  # rows that dominate the minibatch noise (beta[2] = 0): a census
    y = (rng.random(N_ROWS) < 1 / (1 + np.exp(-X @ np.linspace(-1, 1, N_COEFS) / 4))).astype(
        np.int8
    )
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=N_COEFS)
        pm.Bernoulli("obs", logit_p=pm.math.dot(X, beta), observed=y)
    return pmbd.MinibatchModel(model, chunk_rows=CHUNK_ROWS)


def test_the_anchor_moves_to_the_fit_s_centre_in_the_census_pass():
    """Where the MAP search's last Newton step was not read (``sums_point``), the set-up
    anchors the control variates at the fit's centre, with the exact full-data sums there
    and the Hessian kept where it was read, and finds the census stratum in the same pass:
    one pass beyond the MAP search's, the same stratum as the census alone. Caught: the
    anchor left at ``sums_point`` (``move`` False); the anchor and the census read in two
    passes; the anchor moved with its Hessian dropped (first order only)."""
    layer = _layer()
    fit = layer.map_estimate()
    assert fit.sums_point is not None
    streamed = layer.rows.rows_streamed
    step = pmbd.SGHMC(model=layer.model, layer=layer)
    assert layer.rows.rows_streamed - streamed == N_ROWS  # one pass: anchor and census
    anchor = step.anchor
    np.testing.assert_array_equal(anchor.theta, fit.theta)
    loglik, loglik_grad = layer.full_loglik_grad(fit.theta)
    np.testing.assert_allclose(anchor.loglik_grad, loglik_grad, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(anchor.loglik, loglik, rtol=1e-12)
    np.testing.assert_array_equal(anchor.curvature_point, fit.hessian_point)
    assert anchor.loglik_hessian is not None
    alone = census_rows(layer, step.laplace, fit.theta, step.batch_size)
    assert len(alone) > 0
    np.testing.assert_array_equal(step.census, alone)


def test_a_fit_outside_the_set_up_is_anchored_at_its_centre():
    """A configuration fitted outside the step's set-up (the held variables' path, where no
    census follows) moves its anchor to the fit's centre with one gradient pass; without
    ``anchor_at_centre`` it stays where the MAP search read its sums, with no pass. Caught:
    ``anchored_at_centre`` returning the configuration unchanged."""
    layer = _layer()
    fit = layer.map_estimate()
    streamed = layer.rows.rows_streamed
    left = starting_fit(layer, None, "dense", "test", "auto", anchor_at_centre=False)
    assert layer.rows.rows_streamed == streamed
    np.testing.assert_array_equal(left.anchor.theta, fit.sums_point)
    moved = starting_fit(layer, None, "dense", "test", "auto")
    assert layer.rows.rows_streamed - streamed == N_ROWS
    np.testing.assert_array_equal(moved.anchor.theta, fit.theta)
    np.testing.assert_array_equal(moved.anchor.curvature_point, fit.hessian_point)
    _, loglik_grad = layer.full_loglik_grad(fit.theta)
    np.testing.assert_allclose(moved.anchor.loglik_grad, loglik_grad, rtol=1e-10, atol=1e-8)


def _read_bulk_at(layer: pmbd.MinibatchModel, shift_sds: float) -> BulkReading:
    """A reading whose point moves ``beta[0]`` ``shift_sds`` marginal sds (0.1) from the MAP."""
    point = layer.map_estimate().theta.copy()
    point[0] += 0.1 * shift_sds
    return BulkReading(point, np.array([0]), np.array([[100.0]]))


def test_a_map_far_from_the_bulk_starts_from_the_bulk_s_gaussian():
    """A layer whose reading of the bulk (:class:`BulkReading`, as the hierarchical fits leave
    it on ``layer.bulk``) is 5 marginal sds from its MAP starts from the Gaussian at the
    bulk: centred at the reading's point, ``beta[0]``'s marginal sd the reading's 0.1, the
    rest's conditional precision the full posterior's there, and the anchor there with the
    full-data Hessian (second order). Caught: ``bulk_start`` ignoring the reading; the
    anchor left at the MAP; the preconditioner from ``P`` without the reading's
    marginal."""
    layer = _layer()
    layer.bulk = _read_bulk_at(layer, 5.0)
    point = layer.bulk.point
    config = starting_fit(layer, None, "dense", "SGHMC", "auto")
    np.testing.assert_array_equal(config.laplace.center, point)
    covariance = config.laplace.covariance()
    assert covariance[0, 0] == pytest.approx(0.01, rel=1e-9)
    precision = -(layer.full_loglik_hessian(point) + layer.prior_hessian(point))
    np.testing.assert_allclose(config.laplace.precision[1:, 1:], precision[1:, 1:], rtol=1e-8)
    np.testing.assert_array_equal(config.anchor.theta, point)
    np.testing.assert_allclose(config.anchor.loglik_grad, layer.full_loglik_grad(point)[1])
    np.testing.assert_array_equal(config.anchor.curvature_point, point)
    np.testing.assert_allclose(config.anchor.loglik_hessian, layer.full_loglik_hessian(point))
    assert config.has_curvature and config.cv_order == 2 and config.map_problem is None


def test_a_map_within_the_bulk_starts_from_its_laplace_fit():
    """Within ``BULK_START_SDS`` (2 marginal sds here) the MAP's Laplace fit stands, with no
    pass spent on the bulk. Caught: the comparison reversed."""
    layer = _layer()
    fit = layer.map_estimate()
    layer.bulk = _read_bulk_at(layer, 2.0)
    config = starting_fit(layer, None, "dense", "SGHMC", "auto")
    np.testing.assert_array_equal(config.laplace.center, fit.theta)


def _without_a_mode(layer: pmbd.MinibatchModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer's MAP search reports no usable mode (a curvature that is not negative
    definite), as a centred crossed model's does, at the same point."""
    fit = layer.map_estimate()
    failed = dataclasses.replace(fit, min_curvature=-1.0)
    assert failed.problem is not None
    monkeypatch.setattr(layer, "map_estimate", lambda start=None: failed)


def test_beyond_the_dense_hessian_a_failed_map_search_starts_from_a_diagonal_bulk(monkeypatch):
    """Beyond ``DENSE_HESSIAN_MAX_DIM`` (lowered here to 2) a layer whose MAP search found no
    usable mode starts from the diagonal Gaussian at its reading, not from the model's
    initial point: centred at the reading's point, ``beta[0]``'s sd the reading's marginal
    0.1, every other coordinate's precision minus the log density's curvature there (the
    Hessian diagonal's estimate within 5 %), a first-order anchor there, and no
    ``ModeWarning``. Caught: the large-d branch returning None (the fallback's start at the
    initial point, with its warning); the hyperparameters' precision left at the profile's
    curvature."""
    layer = _layer()
    layer.bulk = _read_bulk_at(layer, 5.0)
    point = layer.bulk.point
    _without_a_mode(layer, monkeypatch)
    monkeypatch.setattr(bulk_start_module, "DENSE_HESSIAN_MAX_DIM", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.ModeWarning)
        config = starting_fit(layer, None, "diag", "SGHMC", "auto")
    np.testing.assert_array_equal(config.laplace.center, point)
    assert config.laplace.laplace_sd()[0] == pytest.approx(0.1, rel=1e-9)
    curvature = -np.diag(layer.full_loglik_hessian(point) + layer.prior_hessian(point))
    np.testing.assert_allclose(config.laplace.precision[1:], curvature[1:], rtol=0.05)
    np.testing.assert_array_equal(config.anchor.theta, point)
    np.testing.assert_allclose(config.anchor.loglik_grad, layer.full_loglik_grad(point)[1])
    assert config.map_problem is None and config.cv_order == 1


def test_beyond_the_dense_hessian_a_usable_map_stands(monkeypatch):
    """Beyond ``DENSE_HESSIAN_MAX_DIM`` a usable MAP stands even 5 marginal sds from the
    reading: there the reading is not compared with it (a centred model's reading is taken
    where its scales collapse). Caught: the diagonal branch taken on distance alone."""
    layer = _layer()
    fit = layer.map_estimate()
    layer.bulk = _read_bulk_at(layer, 5.0)
    monkeypatch.setattr(bulk_start_module, "DENSE_HESSIAN_MAX_DIM", 2)
    config = starting_fit(layer, None, "diag", "SGHMC", "auto")
    np.testing.assert_array_equal(config.laplace.center, fit.theta)


def test_the_diagonal_bulk_precision_reads_the_hyperparameters_marginal_variances():
    """Along the hyperparameters the diagonal precision is ``1 / var`` of their marginal
    (correlated ones: the inverse's diagonal, not ``S_h``'s own diagonal); elsewhere minus
    the curvature; None where an entry is not positive. Caught: ``S_h``'s diagonal used."""
    hyper_precision = np.array([[4.0, 1.5], [1.5, 2.0]])
    reading = BulkReading(np.zeros(4), np.array([1, 3]), hyper_precision)
    precision = diagonal_bulk_precision(np.array([-3.0, 7.0, -5.0, 9.0]), -1.0, reading)
    variance = np.diag(np.linalg.inv(hyper_precision))
    np.testing.assert_allclose(precision, [4.0, 1 / variance[0], 6.0, 1 / variance[1]])
    assert diagonal_bulk_precision(np.array([-3.0, 0.0, 1.5, 0.0]), -1.0, reading) is None
