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
from pymc_bigdata.kernels.sghmc import split_innovations
from pymc_bigdata.kernels.sgld import split_increments

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


@pytest.mark.parametrize("kernel", [baoab_steps, sghmc_steps])
def test_path_curvature_is_the_curvature_of_a_quadratic(kernel):
    """On ``N(0, I / 3)`` every move sees curvature 3: the path's Rayleigh quotient is 3."""
    rng = np.random.default_rng(6)
    state = SGHMCState(rng.standard_normal(20), 0.3 * rng.standard_normal(20), np.zeros(20))
    state = state._replace(grad=-3.0 * state.position)
    _, info = kernel(state, lambda z: -3.0 * z, 0.3, 1.0, 10, rng)
    assert info.path_curvature == pytest.approx(3.0, rel=1e-9)


def test_path_curvature_follows_an_unstable_mode():
    """Curvatures 1 and 50 at step 0.5 (``eps^2 50 > 4``: the stiff mode grows): the path's
    curvature approaches 50, where at equilibrium it would be near their mean."""
    rng = np.random.default_rng(7)
    curvature = np.array([1.0] * 9 + [50.0])
    z = rng.standard_normal(10) / np.sqrt(curvature)
    state = SGHMCState(z, rng.standard_normal(10), -curvature * z)
    _, info = baoab_steps(state, lambda z: -curvature * z, 0.5, 1.0, 30, rng)
    assert info.path_curvature > 40.0


def test_split_innovations_sum_to_the_coarse_steps():
    """Two O-steps at ``eps / 2`` inject what one at ``eps`` did (``h xi_1 + xi_2 =
    sqrt(1 + h^2) xi``), and the halves are independent standard normals. Caught (watched):
    the halves swapped."""
    rng = np.random.default_rng(8)
    eps, friction = 0.6, 1.0
    coarse = rng.standard_normal((50_000, 2))
    fine = split_innovations(coarse, eps, friction, rng)
    h = np.exp(-0.5 * friction * eps)
    first, second = fine[0::2], fine[1::2]
    np.testing.assert_allclose(h * first + second, np.sqrt(1 + h * h) * coarse, atol=1e-12)
    se = np.sqrt(2.0 / first.size)
    for half in (first, second):
        assert abs(half.var() - 1.0) < Z * se
    assert abs(np.mean(first * second)) < Z / np.sqrt(first.size)


def test_refined_baoab_follows_the_coarse_brownian_path():
    """From one state, BAOAB at ``eps`` and at ``eps / 2`` on split innovations end close
    together (the same Brownian path, the integrators' difference only); on fresh
    innovations they end an O(1) distance apart. Caught (watched): fresh draws in
    ``split_innovations`` (gap 1.93)."""
    rng = np.random.default_rng(9)
    eps, friction, n_steps, d = 0.4, 1.0, 8, 5_000
    start = rng.standard_normal(d)
    state = SGHMCState(start, rng.standard_normal(d), -start)
    coarse_xi = rng.standard_normal((n_steps, d))
    coarse, _ = baoab_steps(state, lambda z: -z, eps, friction, n_steps, rng, innovations=coarse_xi)
    gaps = {}
    for label, xi in [
        ("split", split_innovations(coarse_xi, eps, friction, rng)),
        ("fresh", rng.standard_normal((2 * n_steps, d))),
    ]:
        fine, _ = baoab_steps(
            state, lambda z: -z, eps / 2, friction, 2 * n_steps, rng, innovations=xi
        )
        gaps[label] = np.mean((fine.position - coarse.position) ** 2)
    assert gaps["split"] < 0.02 and gaps["fresh"] > 0.5, gaps


def test_the_largest_path_curvature_shows_one_stiff_coordinate_the_mean_dilutes():
    """Curvatures 1 (38 coordinates) and 80 (one), a stable step: the mean quotient is near
    ``(38 + 80) / 39 = 3``, the largest per-coordinate one is 80 (exact for a diagonal
    quadratic)."""
    rng = np.random.default_rng(10)
    curvature = np.array([1.0] * 38 + [80.0])
    z = rng.standard_normal(39) / np.sqrt(curvature)
    state = SGHMCState(z, rng.standard_normal(39), -curvature * z)
    _, info = baoab_steps(state, lambda z: -curvature * z, 0.1, 1.0, 20, rng)
    assert info.path_curvature < 10.0
    assert info.path_curvature_max == pytest.approx(80.0, rel=1e-9)


def test_sgld_path_curvature_is_the_curvature_of_a_quadratic():
    """On ``N(0, I / 3)`` every move of SGLD sees curvature 3 (exact gradients): the path's
    quotient is 3, in all and in every coordinate; untracked, both are NaN. Caught
    (watched): each gradient paired with the position after the move."""
    rng = np.random.default_rng(11)
    z = rng.standard_normal(20)
    _, info = sgld_steps(z, lambda z: -3.0 * z, 0.1, 10, rng)
    assert info.path_curvature == pytest.approx(3.0, rel=1e-9)
    assert info.path_curvature_max == pytest.approx(3.0, rel=1e-9)
    _, info = sgld_steps(z, lambda z: -3.0 * z, 0.1, 10, rng, track_curvature=False)
    assert np.isnan(info.path_curvature) and np.isnan(info.path_curvature_max)


def test_split_increments_sum_to_the_coarse_steps():
    """Two Euler steps at ``eps / 2`` inject what one at ``eps`` did (``xi_1 + xi_2 =
    sqrt(2) xi``), and the halves are independent standard normals; it is
    :func:`split_innovations` at zero friction. Caught (watched): both halves
    ``(xi + u) / sqrt(2)``; fresh draws for ``xi``."""
    rng = np.random.default_rng(12)
    coarse = rng.standard_normal((50_000, 2))
    fine = split_increments(coarse, np.random.default_rng(13))
    first, second = fine[0::2], fine[1::2]
    np.testing.assert_allclose(first + second, np.sqrt(2.0) * coarse, atol=1e-12)
    se = np.sqrt(2.0 / first.size)
    for half in (first, second):
        assert abs(half.var() - 1.0) < Z * se
    assert abs(np.mean(first * second)) < Z / np.sqrt(first.size)
    np.testing.assert_array_equal(
        fine, split_innovations(coarse, 0.7, 0.0, np.random.default_rng(13))
    )


def test_refined_sgld_follows_the_coarse_brownian_path():
    """From one position, SGLD at ``eps`` and at ``eps / 2`` on split increments end close
    together (the same Brownian path; Euler's difference only); on fresh increments an O(1)
    distance apart. Caught (watched): fresh draws for ``xi`` in ``split_increments``."""
    rng = np.random.default_rng(14)
    eps, n_steps, d = 0.2, 10, 5_000
    start = rng.standard_normal(d)
    coarse_xi = rng.standard_normal((n_steps, d))
    coarse, _ = sgld_steps(start, lambda z: -z, eps, n_steps, rng, innovations=coarse_xi)
    gaps = {}
    for label, xi in [
        ("split", split_increments(coarse_xi, rng)),
        ("fresh", rng.standard_normal((2 * n_steps, d))),
    ]:
        fine, _ = sgld_steps(start, lambda z: -z, eps / 2, 2 * n_steps, rng, innovations=xi)
        gaps[label] = np.mean((fine - coarse) ** 2)
    assert gaps["split"] < 0.02 and gaps["fresh"] > 0.5, gaps


def test_injected_noise_subtracts_a_gradient_noise_matrix():
    """The injected noise's covariance is ``thermal I - V`` for a matrix ``V`` (Sec. 3.3's
    matrix B-hat): a diagonal matrix gives the vector path's noise exactly, a correlated one
    its own covariance (within 3 % on 200,000 draws), one larger than the thermal part its
    projection on the positive semidefinite matrices, flagged as clipped.

    Catches the matrix's off-diagonal ignored, or a factor that is not the covariance's."""
    from pymc_bigdata.kernels.sghmc import _injected

    innovations = np.random.default_rng(3).standard_normal((200_000, 2))
    diagonal = np.array([0.2, 0.5])
    by_vector, clipped_vector = _injected(innovations, 1.0, diagonal)
    by_matrix, clipped_matrix = _injected(innovations, 1.0, np.diag(diagonal))
    assert np.array_equal(by_vector, by_matrix) and not clipped_vector and not clipped_matrix

    correlated = np.array([[0.5, -0.45], [-0.45, 0.5]])
    noise, clipped = _injected(innovations, 1.0, correlated)
    assert not clipped
    np.testing.assert_allclose(np.cov(noise.T), np.eye(2) - correlated, atol=0.03)

    too_large = np.array([[1.5, 0.0], [0.0, 0.5]])
    noise, clipped = _injected(innovations, 1.0, too_large)
    assert clipped
    np.testing.assert_allclose(np.cov(noise.T), np.diag([0.0, 0.5]), atol=0.03)
