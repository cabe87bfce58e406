"""The compiled BAOAB loop (kernels/baoab_compiled.py) against the reference
``baoab_steps``: the same states, gradients and path curvature for the same innovations and
the same per-call gradient noise, with the last estimate in compiled code or measured in
Python; a parameter leaving its support inside the loop is a non-finite draw."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.kernels.baoab_compiled import compiled_baoab_steps
from pymc_bigdata.kernels.sghmc import SGHMCState, baoab_steps

DIM, N_STEPS = 5, 6


@njit
def _noisy_gaussian(z, k, context):
    """``-P z + noise[k]``: a Gaussian target's gradient with the k-th call's noise."""
    precision, noise = context
    if z[0] > 1e6:
        raise ParameterValueError("left its support")
    return -(precision @ z) + noise[k]


class _Gradients:
    """A :class:`~pymc_bigdata.kernels.baoab_compiled.CompiledGradients` and its Python twin,
    drawing each call's noise from one sequence."""

    def __init__(self, precision: np.ndarray, noise: np.ndarray, last_plain: bool):
        self.precision, self.noise, self.last_plain = precision, noise, last_plain
        self.calls = 0
        self.finished_at: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, z: np.ndarray) -> np.ndarray:  # the reference's oracle
        g = -(self.precision @ z) + self.noise[self.calls]
        self.calls += 1
        return g

    def plan(self, n_calls: int):
        context = (self.precision, self.noise[self.calls : self.calls + n_calls].copy())
        self.calls += n_calls
        return _noisy_gaussian, context

    def last_is_plain(self) -> bool:
        return self.last_plain

    def finished(self, z: np.ndarray, g: np.ndarray) -> None:
        self.finished_at = (z, g)


def _problem(seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((DIM, DIM))
    precision = a @ a.T / DIM + np.eye(DIM)
    noise = 0.3 * rng.standard_normal((N_STEPS, DIM))
    state = SGHMCState(rng.standard_normal(DIM), rng.standard_normal(DIM), np.zeros(DIM))
    innovations = rng.standard_normal((N_STEPS, DIM))
    return precision, noise, state, innovations


@pytest.mark.parametrize("last_plain", [True, False])
def test_compiled_loop_matches_the_reference(last_plain):
    """Positions, momenta, gradients and both path curvatures agree to 1e-12 with the last
    estimate compiled (recorded by ``finished``) or measured in Python (``last_grad``
    called once, on the last step). Caught: an O-step before the first drift, the curvature
    sums differenced against the step's midpoint, the last step's kick left out."""
    precision, noise, state, innovations = _problem(0)
    state = state._replace(grad=-(precision @ state.position))
    reference = _Gradients(precision, noise, last_plain=True)
    expected, expected_info = baoab_steps(
        state, reference, 0.4, 1.0, N_STEPS, None, innovations=innovations
    )
    compiled = _Gradients(precision, noise, last_plain)
    measured = []

    def last_grad(z):
        measured.append(z)
        return compiled(z)

    got, info = compiled_baoab_steps(
        state, compiled, 0.4, 1.0, N_STEPS, None, last_grad=last_grad, innovations=innovations
    )
    for field in ("position", "momentum", "grad"):
        np.testing.assert_allclose(getattr(got, field), getattr(expected, field), rtol=1e-12)
    assert info.finite and info.n_steps == N_STEPS
    assert math.isclose(info.path_curvature, expected_info.path_curvature, rel_tol=1e-12)
    assert math.isclose(info.path_curvature_max, expected_info.path_curvature_max, rel_tol=1e-12)
    assert compiled.calls == N_STEPS
    assert len(measured) == (0 if last_plain else 1)
    if last_plain:
        np.testing.assert_array_equal(compiled.finished_at[0], got.position)
        np.testing.assert_array_equal(compiled.finished_at[1], got.grad)
    else:
        assert compiled.finished_at is None


def test_a_parameter_leaving_its_support_is_a_non_finite_draw():
    """A ParameterValueError raised inside the compiled loop (as PyTensor's parameter checks
    raise it) ends the draw non-finite, as the Python oracle's NaN gradient does; the last
    estimate is still recorded."""
    precision, noise, state, innovations = _problem(1)
    state = state._replace(position=np.full(DIM, 2e6))
    gradients = _Gradients(precision, noise, last_plain=True)
    got, info = compiled_baoab_steps(
        state, gradients, 0.4, 1.0, N_STEPS, None, innovations=innovations
    )
    assert not info.finite
    assert np.isnan(got.position).all() and np.isnan(gradients.finished_at[1]).all()
