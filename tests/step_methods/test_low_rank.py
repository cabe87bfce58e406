"""A diagonal preconditioner corrected along its extreme directions (``low_rank.py``)."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.errors import ModeWarning
from pymc_bigdata.step_methods.low_rank import extreme_eigenpairs, low_rank_corrected
from pymc_bigdata.step_methods.preconditioner import Preconditioner
from pymc_bigdata.step_methods.settings import LOW_RANK_AUTO, check_low_rank

DIM = 30


def _orthonormal(rng: np.random.Generator, dim: int, k: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((dim, k)))[0]


def _dense_map(precond: Preconditioner) -> np.ndarray:
    """``L`` as a matrix, column by column from ``direction``."""
    return np.column_stack([precond.direction(e) for e in np.eye(len(precond.center))])


def test_corrected_maps_are_inverse_and_transposed():
    """theta and z invert each other, grad_z is direction's transpose, covariance is the
    diagonal of L L^T, grad_z_rows is grad_z per row; compiled code cannot use it."""
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.1, 3.0, DIM)
    base = Preconditioner(rng.standard_normal(DIM), scale, "diag", None)
    corrected = base.with_correction(_orthonormal(rng, DIM, 3), np.array([0.01, 0.2, 25.0]))
    z, g, v = rng.standard_normal((3, DIM))
    np.testing.assert_allclose(corrected.z(corrected.theta(z)), z, atol=1e-12)
    assert g @ corrected.direction(v) == pytest.approx(corrected.grad_z(g) @ v, rel=1e-12)
    matrix = _dense_map(corrected)
    np.testing.assert_allclose(corrected.covariance(), np.diag(matrix @ matrix.T), rtol=1e-12)
    rows = rng.standard_normal((4, DIM))
    np.testing.assert_allclose(
        corrected.grad_z_rows(rows), np.array([corrected.grad_z(r) for r in rows]), rtol=1e-12
    )
    np.testing.assert_allclose(_dense_map(base), np.diag(scale))  # the base is unchanged
    with pytest.raises(ValueError, match="compiled code"):
        corrected.linear_map()


class _QuadraticLayer:
    """A Gaussian posterior of precision ``A``: what :func:`low_rank_corrected` reads."""

    def __init__(self, precision: np.ndarray):
        self.precision, self.dim = precision, len(precision)

    def prior_hessian(self, theta: np.ndarray) -> np.ndarray:
        return np.zeros((self.dim, self.dim))

    def full_loglik_hvp(self, theta: np.ndarray, direction: np.ndarray) -> np.ndarray:
        return -self.precision @ direction


def _posterior(spectrum: np.ndarray, scale: np.ndarray, seed: int) -> np.ndarray:
    """A precision whose curvature in the coordinates ``theta = scale * z`` has ``spectrum``."""
    basis = _orthonormal(np.random.default_rng(seed), len(spectrum), len(spectrum))
    curvature_z = basis @ np.diag(spectrum) @ basis.T
    return curvature_z / np.outer(scale, scale)


def test_correction_makes_the_extreme_directions_unit():
    """Two flat directions (0.01, 0.05) and two stiff ones (30, 60) among curvatures in
    [0.5, 2]: corrected along the 2 + 2 extremes, the curvature in the new z spans
    [0.5, 2] (condition 6,000 -> 4)."""
    rng = np.random.default_rng(1)
    spectrum = np.concatenate([[0.01, 0.05, 30.0, 60.0], rng.uniform(0.5, 2.0, DIM - 4)])
    scale = rng.uniform(0.2, 5.0, DIM)
    layer = _QuadraticLayer(_posterior(spectrum, scale, seed=2))
    base = Preconditioner(np.zeros(DIM), scale, "diag", None)
    corrected, passes = low_rank_corrected(base, layer, 2)
    matrix = _dense_map(corrected)
    eigenvalues = np.linalg.eigvalsh(matrix.T @ layer.precision @ matrix)
    inner = spectrum[4:]
    assert eigenvalues.min() == pytest.approx(min(inner.min(), 1.0), rel=1e-2)
    assert eigenvalues.max() == pytest.approx(max(inner.max(), 1.0), rel=1e-2)
    assert passes > 0
    assert low_rank_corrected(base, layer, 0) == (base, 0)


def test_a_corrected_map_reads_its_curvature_range_again_where_it_is_exact():
    """With the dense precision at hand (d <= 2,000) the corrected map's ``curvature_range``
    is that of ``M D P D M`` (the steps size their step and inner steps on it), not the
    diagonal's; without it, the diagonal's estimate is kept."""
    rng = np.random.default_rng(9)
    spectrum = np.concatenate([[0.02, 0.1, 25.0, 40.0], rng.uniform(0.5, 2.0, DIM - 4)])
    scale = rng.uniform(0.5, 2.0, DIM)
    precision = _posterior(spectrum, scale, seed=10)
    layer = _QuadraticLayer(precision)
    base = Preconditioner(np.zeros(DIM), scale, "diag", precision)
    assert base.curvature_range == pytest.approx((0.02, 40.0), rel=1e-6)
    corrected, _ = low_rank_corrected(base, layer, 2)
    matrix = _dense_map(corrected)
    exact = np.linalg.eigvalsh(matrix.T @ precision @ matrix)
    assert corrected.curvature_range == pytest.approx((exact[0], exact[-1]), rel=1e-6)
    assert corrected.curvature_range[1] < 2.5
    blind = Preconditioner(np.zeros(DIM), scale, "diag", None)
    assert low_rank_corrected(blind, layer, 2)[0].curvature_range == blind.curvature_range


def test_directions_without_a_mode_are_not_corrected():
    """A negative curvature (a centre that is no mode along it) keeps the diagonal's map
    there; the positive extremes are corrected."""
    rng = np.random.default_rng(3)
    spectrum = np.concatenate([[-0.5, 0.02, 40.0], rng.uniform(0.5, 2.0, DIM - 3)])
    layer = _QuadraticLayer(_posterior(spectrum, np.ones(DIM), seed=4))
    corrected, _ = low_rank_corrected(
        Preconditioner(np.zeros(DIM), np.ones(DIM), "diag", None), layer, 1
    )
    eigenvalues = np.linalg.eigvalsh(
        _dense_map(corrected).T @ layer.precision @ _dense_map(corrected)
    )
    assert eigenvalues.min() == pytest.approx(-0.5, rel=1e-2)
    assert corrected.correction[0].shape[1] == 1  # only the stiff one: 40 -> 1
    assert eigenvalues.max() == pytest.approx(max(spectrum[3:].max(), 1.0), rel=1e-2)


def test_curvatures_near_one_are_left_as_the_diagonal_maps_them():
    """Only curvatures beyond a factor ``UNCORRECTED_WITHIN`` (2) of 1 are corrected: with
    the extremes 0.3, 0.7 and 1.8, 1.9 only 0.3 is; with every curvature within [0.55, 1.9]
    the diagonal comes back itself (no O(d k) maps), though the reading was paid."""
    rng = np.random.default_rng(6)
    base = Preconditioner(np.zeros(DIM), np.ones(DIM), "diag", None)
    spectrum = np.concatenate([[0.3, 0.7, 1.8, 1.9], rng.uniform(0.8, 1.2, DIM - 4)])
    corrected, _ = low_rank_corrected(
        base, _QuadraticLayer(_posterior(spectrum, np.ones(DIM), 7)), 2
    )
    assert corrected.correction[0].shape[1] == 1
    np.testing.assert_allclose(corrected.correction[1], [0.3**-0.5 - 1.0], rtol=1e-3)
    spectrum = np.concatenate([[0.55, 1.9], rng.uniform(0.8, 1.2, DIM - 2)])
    same, passes = low_rank_corrected(
        base, _QuadraticLayer(_posterior(spectrum, np.ones(DIM), 8)), 2
    )
    assert same is base and passes > 0


def test_unreadable_curvature_warns_and_keeps_the_diagonal():
    layer = _QuadraticLayer(np.full((DIM, DIM), np.nan))
    base = Preconditioner(np.zeros(DIM), np.ones(DIM), "diag", None)
    with pytest.warns(ModeWarning, match="could not be read"):
        corrected, _ = low_rank_corrected(base, layer, 2)
    assert corrected is base


def test_extreme_eigenpairs_of_a_small_operator_are_all_of_them():
    matrix = _posterior(np.arange(1.0, 6.0), np.ones(5), seed=5)
    values, vectors = extreme_eigenpairs(lambda v: matrix @ v, 5, 2)
    np.testing.assert_allclose(values, np.arange(1.0, 6.0), rtol=1e-10)
    np.testing.assert_allclose(vectors.T @ matrix @ vectors, np.diag(values), atol=1e-10)


def _crossed_gaussian() -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """100 raters x 100 items, 10 ratings per rater, known effect and noise scales: a
    Gaussian posterior (its mean and sds exact) with d = 201 (a diagonal preconditioner) and
    two flat directions, ``mu`` against each effect's mean."""
    rng = np.random.default_rng(3)
    raters, items, per = 100, 100, 10
    rater = np.repeat(np.arange(raters), per)
    item = rng.permutation(np.tile(np.arange(items), per))
    sd_r, sd_i = 0.5, 0.8
    y = 3.0 + rng.normal(0, sd_r, raters)[rater] + rng.normal(0, sd_i, items)[item]
    y = y + rng.normal(0.0, 1.0, len(y))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        r = pm.Normal("r", 0.0, sd_r, shape=raters)
        i = pm.Normal("i", 0.0, sd_i, shape=items)
        pm.Normal("y", mu + r[rater] + i[item], 1.0, observed=y)
    design = np.zeros((len(y), 1 + raters + items))
    design[:, 0] = 1.0
    design[np.arange(len(y)), 1 + rater] = 1.0
    design[np.arange(len(y)), 1 + raters + item] = 1.0
    prior = np.r_[1 / 25.0, np.full(raters, 1 / sd_r**2), np.full(items, 1 / sd_i**2)]
    covariance = np.linalg.inv(design.T @ design + np.diag(prior))
    return model, covariance @ (design.T @ y), np.sqrt(np.diag(covariance))


@pytest.mark.slow
def test_sgld_mixes_mu_with_low_rank_and_stays_on_target():
    """SGLD's defaults on the crossed Gaussian (``pm.sample``'s defaults, 2 chains): with
    the default ``low_rank="auto"`` (2 here, d = 201) ``mu``'s bulk ESS is at least 3 times
    that with ``low_rank=0`` (one-off at this seed: 157 -> 856), and the draws are within
    SGLD's bars widened by their Monte Carlo error (mean 0.15 or 4/sqrt(ESS) sds; sd ratios
    within [0.85, 1.2] or 1 +- 4/sqrt(2 ESS))."""
    model, mean, sd = _crossed_gaussian()
    runs = {}
    for k in (0, "auto"):
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = pmbd.SGLD() if k == "auto" else pmbd.SGLD(low_rank=k)
            idata = pm.sample(step=step, chains=2, cores=1, random_seed=11, progressbar=False)
        runs[k] = idata.posterior
    ess = {k: float(az.ess(post["mu"])) for k, post in runs.items()}
    assert ess["auto"] >= 3.0 * ess[0], ess
    post = runs["auto"]
    draws = np.concatenate(
        [post[name].values.reshape(-1, size) for name, size in (("mu", 1), ("r", 100), ("i", 100))],
        axis=1,
    )
    min_ess = min(float(az.ess(post)[name].min()) for name in ("mu", "r", "i"))
    errors = np.abs(draws.mean(axis=0) - mean) / sd
    ratios = draws.std(axis=0) / sd
    width = 4.0 / np.sqrt(2.0 * min_ess)
    assert errors.max() <= max(0.15, 4.0 / np.sqrt(min_ess)), errors.max()
    assert min(0.85, 1.0 - width) <= ratios.min(), ratios.min()
    assert ratios.max() <= max(1.2, 1.0 + width), ratios.max()


def test_low_rank_settings_are_checked():
    model, _, _ = _crossed_gaussian()
    for bad in (-1, True, 1.5, "two"):
        with pytest.raises(ValueError, match="low_rank must be 'auto' or an int"):
            pmbd.SGLD(model=model, low_rank=bad)
    with pytest.raises(ValueError, match="diagonal preconditioner"):
        pmbd.SGLD(model=model, low_rank=1, preconditioner="dense")
    with pytest.raises(ValueError, match="compiled code"):
        pmbd.SGHMC(model=model, low_rank=1, compiled_loop=True)
    with pytest.raises(ValueError, match="compiled code"):
        pmbd.HMCECS(model=model, low_rank=1)


def test_low_rank_auto_corrects_diagonal_maps_in_python_only():
    """``low_rank="auto"`` (the default) is 2 with a diagonal preconditioner mapped in
    Python, and 0 where a correction cannot apply or would be read at every switch of held
    variables' values."""
    model, _, _ = _crossed_gaussian()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert pmbd.SGLD(model=model).low_rank == LOW_RANK_AUTO == 2
        assert pmbd.SGLD(model=model, preconditioner="dense").low_rank == 0
        assert pmbd.SGHMC(model=model, compiled_loop=True).low_rank == 0
    assert check_low_rank("auto", "diag", compiled_maps=True) == 0
    assert check_low_rank("auto", "diag", compiled_maps=False, held=True) == 0
    assert check_low_rank("auto", "identity", compiled_maps=False) == 0
    assert check_low_rank("auto", "diag", compiled_maps=False) == 2
