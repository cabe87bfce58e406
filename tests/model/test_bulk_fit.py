"""The Gaussian at a hierarchical posterior's bulk (``pymc_bigdata/model/bulk_fit.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* :func:`bulk_precision` gives the Gaussian whose hyperparameters' marginal precision is the
  reading's ``S_h`` and whose conditional of the rest given them is the full precision's,
  checked against the covariance's blocks (mutations: ``P_hh`` replaced by ``S_h`` alone;
  ``P_hr`` zeroed in the result);
* it refuses a point whose conditional precision ``P_rr`` is not positive definite, while an
  indefinite ``P_hh`` (the joint's profile curvature along a scale) is no obstacle;
* :func:`finite_difference_hessian` recovers a cubic's Hessian (mutation: the mixed
  difference over ``2 step^2``);
* :meth:`BulkReading.distance` is in the marginal's sds (mutation: in its precision's
  diagonal).
"""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.model.bulk_fit import (
    BulkReading,
    bulk_precision,
    bulk_reading,
    finite_difference_hessian,
)


def _joint(rng: np.random.Generator, d: int = 6) -> np.ndarray:
    factor = rng.normal(size=(d, d))
    return factor @ factor.T + d * np.eye(d)


def test_the_hyperparameters_marginal_is_the_readings_and_the_conditional_is_kept():
    rng = np.random.default_rng(1)
    precision = _joint(rng)
    hyper = np.array([4, 1])
    rest = np.array([0, 2, 3, 5])
    wanted = np.array([[3.0, 0.4], [0.4, 0.7]])
    reading = BulkReading(np.zeros(6), hyper, wanted)
    out = bulk_precision(precision, reading)
    covariance = np.linalg.inv(out)
    np.testing.assert_allclose(covariance[np.ix_(hyper, hyper)], np.linalg.inv(wanted))
    # the conditional of the rest given h: its precision block and its regression on h
    np.testing.assert_allclose(out[np.ix_(rest, rest)], precision[np.ix_(rest, rest)])
    np.testing.assert_allclose(out[np.ix_(rest, hyper)], precision[np.ix_(rest, hyper)])


def test_an_indefinite_profile_is_replaced_and_an_indefinite_conditional_refused():
    rng = np.random.default_rng(2)
    precision = _joint(rng, 4)
    precision[0, 0] = -50.0  # the joint's curvature along h: not a mode there
    reading = BulkReading(np.zeros(4), np.array([0]), np.array([[2.0]]))
    out = bulk_precision(precision, reading)
    assert out is not None
    np.testing.assert_allclose(np.linalg.inv(out)[0, 0], 0.5)
    precision[2, 2] = -50.0  # a conditional direction with no curvature
    assert bulk_precision(precision, reading) is None


def test_finite_differences_recover_a_cubics_hessian():
    a = np.array([[2.0, 0.3, -0.5], [0.3, 1.0, 0.2], [-0.5, 0.2, 3.0]])

    def cubic(x):
        return 0.5 * x @ a @ x + x[0] * x[1] * x[2]

    x = np.array([0.3, -1.2, 0.7])
    exact = a + np.array([[0.0, x[2], x[1]], [x[2], 0.0, x[0]], [x[1], x[0], 0.0]])
    np.testing.assert_allclose(finite_difference_hessian(cubic, x), exact, atol=1e-6)


def test_distance_is_in_marginal_sds_of_the_hyperparameters_only():
    hyper_precision = np.array([[4.0, 1.0], [1.0, 1.0]])  # marginal sds 0.577 and 1.155
    reading = BulkReading(np.zeros(3), np.array([0, 2]), hyper_precision)
    theta = np.array([0.9, 50.0, -0.6])  # theta[1] is no hyperparameter
    assert reading.distance(theta) == pytest.approx(0.9 / np.sqrt(1.0 / 3.0))


def test_a_reading_joins_the_effects_blocks_and_refuses_a_shared_hyperparameter():
    """Caught: the blocks' precisions joined in the wrong order (a scalar block after the
    correlated one's)."""
    correlated = (np.array([4, 2]), np.array([[2.0, 0.5], [0.5, 1.0]]))
    reading = bulk_reading(np.arange(6.0), [(np.array([0]), 9.0), correlated])
    np.testing.assert_array_equal(reading.hyper, [0, 4, 2])
    expected = np.array([[9.0, 0.0, 0.0], [0.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    np.testing.assert_array_equal(reading.hyper_precision, expected)
    assert bulk_reading(np.zeros(6), [(np.array([2]), 1.0), correlated]) is None
    assert bulk_reading(np.zeros(6), []) is None
