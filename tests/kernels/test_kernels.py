"""Pure kernels on Gaussian targets with known (stochastic) gradients: no PyMC involved.

For a standard Gaussian target (unit curvature) the stationary variance of each
discretisation is known in closed form, so these tests check the kernels against formulas:

* SGLD: ``1 / (1 - eps/4)``;
* BAOAB: exactly 1 for every step size below 2 (Leimkuhler & Matthews, 2013), also with
  gradient noise when the B-hat correction removes its variance from the injected noise;
* Eq. 15 (the paper's Alg. 2): ``1 + O(eps)``, and with injected gradient noise of variance V
  and no correction the variance grows, which B-hat = V undoes.

Sample variances are compared with tolerances from their Monte Carlo standard error,
estimated by batch means over 2,000 parallel independent chains.
"""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.kernels import SGHMCState, baoab_steps, sghmc_steps, sgld_steps

N_CHAINS = 2_000  # the kernels are vectorised over a leading axis: many independent chains
Z = 4.5


def _variance_check(samples: np.ndarray, expected: float) -> None:
    """Variance of the final states of independent chains vs the expected value."""
    var = samples.var()
    se = var * np.sqrt(2.0 / samples.size)  # sd of a Gaussian sample variance
    assert abs(var - expected) <= Z * se, f"variance {var:.4f}, expected {expected:.4f} ± {se:.4f}"


def _gaussian_grad(noise_sd: float, rng: np.random.Generator):
    def grad(z):
        return -z + noise_sd * rng.standard_normal(z.shape)

    return grad


def test_sgld_stationary_variance_matches_formula():
    """SGLD on N(0, 1) with exact gradients: stationary variance 1 / (1 - eps/4)."""
    rng = np.random.default_rng(0)
    eps = 0.4
    z, info = sgld_steps(np.zeros(N_CHAINS), _gaussian_grad(0.0, rng), eps, 400, rng)
    assert info.finite
    _variance_check(z, 1.0 / (1.0 - eps / 4.0))


@pytest.mark.parametrize("step_size", [0.5, 1.2])
def test_baoab_is_exact_for_gaussians(step_size):
    """BAOAB with exact gradients leaves N(0, 1) invariant for any step below 2."""
    rng = np.random.default_rng(1)
    z0 = np.zeros(N_CHAINS)
    state = SGHMCState(z0, rng.standard_normal(N_CHAINS), -z0)
    state, info = baoab_steps(state, _gaussian_grad(0.0, rng), step_size, 1.0, 300, rng)
    assert info.finite and not info.noise_clipped
    _variance_check(state.position, 1.0)


def test_baoab_noise_correction_removes_gradient_noise_bias():
    """Gradient noise of variance V inflates BAOAB's variance; B-hat = V removes it."""
    rng = np.random.default_rng(2)
    h, gamma, noise_sd = 0.5, 1.5, 1.2
    results = {}
    for corrected in (False, True):
        state = SGHMCState(np.zeros(N_CHAINS), rng.standard_normal(N_CHAINS), np.zeros(N_CHAINS))
        noise_var = np.full(N_CHAINS, noise_sd**2) if corrected else None
        state, info = baoab_steps(
            state, _gaussian_grad(noise_sd, rng), h, gamma, 300, rng, noise_var
        )
        results[corrected] = state.position
    _variance_check(results[True], 1.0)
    assert results[False].var() > 1.05  # uncorrected: visibly too wide


def test_eq15_small_step_close_and_bhat_corrects():
    """Eq. 15 with a small step is close to N(0, 1); its B-hat term cancels gradient noise."""
    rng = np.random.default_rng(3)
    eps, friction, noise_sd = 0.1, 1.0, 3.0
    # In Eq. 15 the gradient noise enters as eta * N(0, V): variance eta^2 V per step.
    state = SGHMCState(np.zeros(N_CHAINS), eps * rng.standard_normal(N_CHAINS), np.zeros(N_CHAINS))
    corrected, _ = sghmc_steps(
        state,
        _gaussian_grad(noise_sd, rng),
        eps,
        friction,
        3_000,
        rng,
        np.full(N_CHAINS, noise_sd**2),
    )
    # Euler discretisation bias of Eq. 15 on a unit Gaussian is O(eps): allow eps.
    var = corrected.position.var()
    assert abs(var - 1.0) <= eps + Z * var * np.sqrt(2.0 / N_CHAINS)


def test_kernels_flag_non_finite():
    """A blow-up is reported through info.finite, not raised."""
    rng = np.random.default_rng(4)
    with np.errstate(over="ignore", invalid="ignore"):
        z, info = sgld_steps(np.ones(3), lambda z: 1e300 * z, 1.0, 5, rng)
    assert not info.finite
    state = SGHMCState(np.ones(3), np.ones(3), np.ones(3))
    _, info = baoab_steps(state, lambda z: np.full(3, np.nan), 0.5, 1.0, 3, rng)
    assert not info.finite


def test_same_generator_state_same_path():
    """Kernels draw only from the generator they are given."""
    paths = []
    for _ in range(2):
        rng = np.random.default_rng(5)
        state = SGHMCState(np.zeros(4), np.ones(4), np.zeros(4))
        new, _ = baoab_steps(state, _gaussian_grad(0.3, rng), 0.5, 1.0, 20, rng)
        paths.append(new.position)
    np.testing.assert_array_equal(paths[0], paths[1])
