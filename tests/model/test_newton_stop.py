"""When the MAP search's Newton stops (``pymc_bigdata/model/newton_stop.py``)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from pymc_bigdata.model.newton_stop import (
    GradientChange,
    predicted_after_fixed_step,
    predicted_decrement,
    predicted_from_gradient_change,
)


def test_the_search_s_last_step_is_predicted_from_the_one_before():
    """Quadratic convergence: a decrement of 0.033 reached from 388 predicts 2.4e-10 after
    the next step (the 10^6-row, d = 30 search, where a pass then read 1.6e-9); nothing is
    predicted from a first pass. Caught: the ratio's exponents swapped."""
    assert np.isclose(predicted_decrement(388.0, 0.0328), 2.34e-10, rtol=0.01)
    assert predicted_decrement(np.inf, 1e-6) == np.inf


def _log_density(theta: np.ndarray, scale: np.ndarray):
    """``sum_i (b_i theta_i - exp(theta_i)) scale_i`` with ``b_i = 1``: mode 0, precision
    ``scale exp(theta)``, third derivatives ``-scale exp(theta)`` (a Poisson likelihood's
    shape): its gradient and precision at ``theta``."""
    grad = scale * (1.0 - np.exp(theta))
    precision = np.diag(scale * np.exp(theta))
    return grad, precision


def _decrement(theta: np.ndarray, scale: np.ndarray) -> float:
    grad, precision = _log_density(theta, scale)
    return float(grad @ np.linalg.solve(precision, grad))


def test_the_forecasts_after_inexact_and_fixed_steps_match_the_next_decrement():
    """On a log density with third derivatives: a step with a precision 5 % off (the
    subsample's), then an exact Newton step, then one with that precision kept; each
    forecast is within a factor 3 of the decrement the step then reaches (they differ in
    size by orders). Caught: the step ratio not squared in the first forecast, the factor
    4 left out of the second, or the residual read without the step's precision term."""
    rng = np.random.default_rng(1)
    scale = rng.uniform(500.0, 5_000.0, size=6)
    theta0 = rng.normal(scale=0.05, size=6)
    grad0, precision0 = _log_density(theta0, scale)
    inexact = precision0 * (1.0 + 0.05 * rng.standard_normal(6))
    inexact = 0.5 * (inexact + inexact.T)
    step0 = np.linalg.solve(inexact, grad0)
    theta1 = theta0 + step0
    grad1, precision1 = _log_density(theta1, scale)
    factor1 = scipy.linalg.cho_factor(precision1)
    forecast = predicted_from_gradient_change(
        GradientChange(grad0, step0, grad1, precision1, factor1)
    )
    step1 = scipy.linalg.cho_solve(factor1, grad1)
    theta2 = theta1 + step1
    reached = _decrement(theta2, scale)
    assert reached / 3 < forecast < 3 * reached, (forecast, reached)
    grad2, _ = _log_density(theta2, scale)
    forecast = predicted_after_fixed_step(GradientChange(grad1, step1, grad2, precision1, factor1))
    theta3 = theta2 + scipy.linalg.cho_solve(factor1, grad2)
    reached_fixed = _decrement(theta3, scale)
    assert reached_fixed / 3 < forecast < 3 * reached_fixed, (forecast, reached_fixed)
    assert reached_fixed < reached < _decrement(theta1, scale)
