"""BAOAB's equilibrium kinetic temperature where the curvature is not 1
(:mod:`pymc_bigdata.step_methods.kinetic_temperature`)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.kernels.sghmc import SGHMCState, baoab_steps
from pymc_bigdata.step_methods.kinetic_temperature import BAOABKineticTemperature

#: curvatures of a Gaussian target in the sampler's units, one per coordinate
CURVATURES = np.array([0.5, 1.0, 3.0, 6.0])


def test_expected_momentum_variance_on_a_gaussian_of_other_curvatures():
    """BAOAB with exact gradients on a Gaussian whose curvatures are 0.5-6 (mean 2.6): the
    kept draws' mean ``|r|^2 / d`` is ``1 - eps^2 kappa / 4`` with ``kappa`` the mean path
    curvature, within 4 standard errors, and not the unit-curvature ``1 - eps^2 / 4``.

    Catches an expectation that ignores the curvature (the value before it) or reads it with
    the wrong power of the step."""
    rng = np.random.default_rng(7)
    step, chains, draws = 0.5, 400, 300
    expectation = BAOABKineticTemperature()
    grad = lambda z: -(z.reshape(chains, -1) * CURVATURES).ravel()  # noqa: E731
    z = (rng.standard_normal((chains, CURVATURES.size)) / np.sqrt(CURVATURES)).ravel()
    state = SGHMCState(z, rng.standard_normal(z.size), grad(z))
    temperatures = []
    for draw in range(draws):
        state, info = baoab_steps(state, grad, step, 1.0, 4, rng)
        if draw >= 50:  # burn-in
            expectation.observe(info.path_curvature)
            temperatures.append(np.mean(state.momentum**2))
    mean, se = np.mean(temperatures), np.std(temperatures) / np.sqrt(len(temperatures))
    assert expectation.curvature() == pytest.approx(CURVATURES.mean(), rel=0.05)
    assert abs(mean - expectation.expected(step)) < 4 * se + 1e-3
    assert abs(mean - (1 - step**2 / 4)) > 10 * se


def test_expectation_before_any_draw_and_floor():
    """1 - eps^2 / 4 before a kept draw; NaN curvatures ignored; never below the floor."""
    expectation = BAOABKineticTemperature()
    assert expectation.expected(0.7) == pytest.approx(1 - 0.49 / 4)
    expectation.observe(float("nan"))
    assert expectation.curvature() == 1.0
    expectation.observe(40.0)
    assert expectation.expected(0.7) == BAOABKineticTemperature.FLOOR


def test_sghmc_defaults_quiet_on_a_quartic_double_well():
    """``p(theta) ∝ exp(2 theta^2 - theta^4)`` from 10,000 rows (notebooks/sghmc_paper.ipynb):
    SGHMC's defaults draw it right (second moment within 0.05 of 0.8327) and, with the
    expectation at the chain's curvature (about 5), raise no BiasWarning. With the
    unit-curvature expectation the same run warned (mean kinetic temperature 0.815)."""
    rows, batch = 10_000, 100
    spread = np.random.default_rng(2014).standard_normal(rows)
    spread -= spread.mean()
    spread *= np.sqrt(batch / rows**2) * 2.0 / spread.std()
    with pm.Model() as model:
        theta = pm.Flat("theta")
        pm.CustomDist(
            "rows", theta, logp=lambda v, t: (2 * t**2 - t**4) / rows + v * t, observed=spread
        )
    logging.getLogger("pymc").setLevel(logging.ERROR)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pmbd.SGHMC()
        idata = pm.sample(
            step=step, random_seed=1, progressbar=False, compute_convergence_checks=False
        )
    assert not [w for w in caught if issubclass(w.category, pmbd.BiasWarning)]
    assert step.kinetic_expectation.curvature() > 3.0
    draws = idata.posterior["theta"].values
    assert np.mean(draws**2) == pytest.approx(0.8327, abs=0.05)
