"""HMC-ECS's fused estimate (one compiled call) against the step-by-step reference.

What each test proves: for both estimators, every Taylor order, both expansion spaces, a
dense and a diagonal ``L`` and with census rows, one compiled call gives what the step-by-step
path gives (the residual graphs, :func:`control_variate_sum`, the kernel's numpy estimators
and ``L^T``): the log posterior estimate, its gradient in ``z``, the estimator's variance, the
level, the sign and the factor nearest zero; and a chain of :func:`hmcecs_step` draws with
the fused evaluations is the reference chain (same random numbers, same draws to round-off).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.kernels.hmcecs import HMCECSState, hmcecs_step
from pymc_bigdata.model.laplace import posterior_precision
from pymc_bigdata.step_methods.hmcecs_estimates import EstimatorSettings, SubsampleEstimates
from pymc_bigdata.step_methods.minibatches import Minibatches
from pymc_bigdata.step_methods.preconditioner import Preconditioner


def _hierarchy() -> pm.Model:
    rng = np.random.default_rng(11)
    group, x = rng.integers(5, size=600), rng.standard_normal(600)
    y = rng.binomial(1, 1 / (1 + np.exp(-(0.3 * group - 0.5 + 0.8 * x))))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=5)
        slope = pm.Normal("slope", 0.0, 2.0)
        pm.Bernoulli("y", logit_p=(mu + tau * z)[group] + slope * x, observed=y)
    return model


@pytest.fixture(scope="module")
def layer():
    # PyTensor's Python mode: the graphs' formulas are what is tested, and compiling them with
    # Numba from a cold cache took ~20 s per case (the samplers' tests run them compiled)
    return pmbd.MinibatchModel(_hierarchy(), mode="FAST_COMPILE")


def _estimates(layer, estimator, order, space, layout, n_census, fused):
    """The estimates at the MAP's anchor, in the Laplace fit's coordinates."""
    anchor = layer.map_anchor()
    rng = np.random.default_rng(5)
    census = np.arange(n_census)
    minibatches = Minibatches(layer, 30, census, rng, replace=True, reshuffle=False)
    hessians = layer.full_loglik_hessian(anchor.theta), layer.prior_hessian(anchor.theta)
    kind = "dense" if layout == "dense" else "diag"
    precond = Preconditioner.from_precision(anchor.theta, posterior_precision(*hessians), kind)
    settings = EstimatorSettings(estimator, order, space, 40, 4, 10, 3, 1, -25.0)
    pool = None if n_census == 0 else np.arange(n_census, layer.n_rows)
    return SubsampleEstimates(layer, minibatches, pool, precond, anchor, settings, None, fused)


#: each estimator at every order, in both spaces and layouts, with and without census rows
CASES = [
    ("perturbed", 0, "parameters", "diagonal", 0),
    ("perturbed", 1, "likelihood_inputs", "dense", 7),
    ("perturbed", 2, "parameters", "dense", 7),
    ("perturbed", 2, "likelihood_inputs", "diagonal", 0),
    ("signed", 0, "parameters", "dense", 7),
    ("signed", 1, "parameters", "diagonal", 0),
    ("signed", 2, "likelihood_inputs", "dense", 0),
    ("signed", 2, "parameters", "diagonal", 7),
]


@pytest.mark.parametrize(("estimator", "order", "space", "layout", "census"), CASES)
def test_one_compiled_call_gives_the_step_by_step_estimate(
    layer, estimator, order, space, layout, census
):
    fused = _estimates(layer, estimator, order, space, layout, census, True)
    steps = _estimates(layer, estimator, order, space, layout, census, False)
    u = fused.fresh(np.random.default_rng(7))
    z = np.linspace(-0.8, 0.6, layer.dim)
    a, b = fused.evaluate(z, u), steps.evaluate(z, u)
    assert math.isfinite(b.logp) and b.sign in (-1, 1)
    assert a.logp == pytest.approx(b.logp, rel=1e-12, abs=1e-9)
    np.testing.assert_allclose(a.grad, b.grad, rtol=1e-9, atol=1e-9)
    assert a.loglik_var == pytest.approx(b.loglik_var, rel=1e-9)
    assert (a.sign, a.level) == (b.sign, pytest.approx(b.level, rel=1e-9, abs=1e-9))
    assert a.nearest_zero == pytest.approx(b.nearest_zero, rel=1e-9)
    assert fused.rows_read == steps.rows_read == census + len(u.indices)


def test_a_signed_estimate_with_no_minibatch_is_the_reference(layer):
    """Every ``X_l = 0``: no sampled rows, ``L_hat`` is the control variates' sum alone."""
    fused = _estimates(layer, "signed", 2, "parameters", "dense", 7, True)
    steps = _estimates(layer, "signed", 2, "parameters", "dense", 7, False)
    u = fused.fresh(np.random.default_rng(7))
    empty = type(u)(u.indices[:0], tuple(r[:0] for r in u.rows), counts=0 * u.counts, minibatch=10)
    z = np.full(layer.dim, 0.2)
    a, b = fused.evaluate(z, empty), steps.evaluate(z, empty)
    assert a.logp == pytest.approx(b.logp, rel=1e-12)
    np.testing.assert_allclose(a.grad, b.grad, rtol=1e-9, atol=1e-9)
    assert (a.sign, a.level, a.nearest_zero) == (1, 0.0, math.inf)
    assert math.isnan(a.loglik_var) and math.isnan(b.loglik_var)


@pytest.mark.parametrize("estimator", ["perturbed", "signed"])
def test_a_chain_on_fused_estimates_is_the_reference_chain(layer, estimator):
    draws = {}
    for fused in (True, False):
        estimates = _estimates(layer, estimator, 2, "parameters", "dense", 0, fused)
        rng = np.random.default_rng(3)
        z = np.zeros(layer.dim)
        u = estimates.fresh(rng)
        state = HMCECSState(z, u, estimates.evaluate(z, u))
        chain = []
        for _ in range(50):  # round-off parts longer chains (HMC is chaotic)
            state, _ = hmcecs_step(state, estimates.evaluate, estimates.propose, 0.4, 3, rng)
            chain.append(state.position)
        draws[fused] = np.array(chain)
    assert np.unique(draws[True], axis=0).shape[0] > 15  # the chain moves
    np.testing.assert_allclose(draws[True], draws[False], rtol=0, atol=1e-8)
