"""Correlated group effects with their data-rich groups centred
(``pymc_bigdata/model/correlated_reparam.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* the map is a bijection whose log-Jacobian is the log determinant of its Jacobian, read
  here by central differences (Eq. 3), at every centredness, with leading batch axes;
* the layer of :meth:`MinibatchModel.reparameterised` has, at every ``phi``, the model's log
  density at ``theta(phi)`` plus ``log |det dtheta/dphi|``, and its gradient (PyTensor's) is
  the numpy pullback, at centrednesses set after the layer compiled;
* :func:`group_information` is ``L' K_j L`` exactly on a Gaussian likelihood, with ``K_j`` the
  group's rows' ``X_j' X_j``; :func:`choose_correlated_centredness` is the scalar rule's
  ``h_j > 1`` for one effect per group and reads every direction of a group for several;
* with every group centred, the second-order control variates are exact on a Gaussian
  likelihood (what a PyTensor miscompilation broke);
* a scalar loc-scale effect and a correlated one compose in one :class:`LocScaleReparams`.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from test_loc_scale import _assert_composition, _assert_layer_density, _Compiled

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.correlated_effects import find_correlated_effects
from pymc_bigdata.model.correlated_reparam import (
    CorrelatedReparam,
    choose_correlated_centredness,
    group_information,
)
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams

SIZES = np.array([1, 3, 10, 40, 200])


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(SIZES)), SIZES)
    x = rng.standard_normal(group.size)
    return group, x, 0.5 - 0.3 * x + 0.4 * rng.standard_normal(group.size)


def _model(centred: bool = False) -> pm.Model:
    """Correlated intercepts and slopes on the rows of :func:`_data`, non-centred (``mu +
    (L @ z).T``) or centred (``pm.MvNormal``)."""
    group, x, y = _data()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=2)
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0, sd_dist=pm.HalfNormal.dist(1.0))
        if centred:
            ab = pm.MvNormal("ab", mu, chol=chol, shape=(len(SIZES), 2))
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=(2, len(SIZES)))
            ab = pm.Deterministic("ab", mu + pt.dot(chol, z).T)
        pm.Normal("y", ab[group, 0] + ab[group, 1] * x, 1.0, observed=y)
    return model


def _layers(centred: bool):
    model = _model(centred)
    layer = MinibatchModel(model)
    [effect] = find_correlated_effects(model, layer.value_vars)
    reparam = CorrelatedReparam(effect, effect.model_centredness)
    maps = LocScaleReparams([reparam])
    return layer, effect, reparam, maps, layer.reparameterised(maps)


@pytest.fixture(scope="module")
def layers():
    return _layers(centred=False)


@pytest.fixture(scope="module")
def centred_layers():
    return _layers(centred=True)


def _centrednesses(rng) -> list[np.ndarray]:
    return [np.zeros(len(SIZES)), np.ones(len(SIZES)), (rng.uniform(size=len(SIZES)) < 0.5)]


def _jacobian(f, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences of ``f`` at ``x``, shape (d_out, d_in)."""
    cols = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = step
        cols.append((f(x + e) - f(x - e)) / (2 * step))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("form", ["layers", "centred_layers"])
def test_map_is_a_bijection_with_its_log_jacobian(form, request):
    """Mutations: ``np.sum(m - c)`` -> ``np.sum(c - m)`` in ``_moved_groups`` (Eq. 3's sign;
    both forms fail); ``c * effects`` -> ``c * self._factor(theta) @ z`` in ``from_model``
    (no ``mu``: not the inverse); centred: ``(1.0 - c) * z`` -> ``(1.0 - c) * ab``."""
    layer, effect, reparam, _, _ = request.getfixturevalue(form)
    rng = np.random.default_rng(2)
    for c in _centrednesses(rng):
        reparam.set_centredness(c)
        phi = 0.5 * rng.standard_normal(layer.dim)
        np.testing.assert_allclose(reparam.from_model(reparam.to_model(phi)), phi, atol=1e-12)
        logdet = np.linalg.slogdet(_jacobian(reparam.to_model, phi))[1]
        assert reparam.log_jacobian(phi) == pytest.approx(logdet, abs=1e-6)
        batch = 0.5 * rng.standard_normal((3, 2, layer.dim))
        np.testing.assert_allclose(
            reparam.to_model(batch)[1, 0], reparam.to_model(batch[1, 0]), atol=1e-12
        )
        np.testing.assert_allclose(
            reparam.log_jacobian(batch)[2, 1], reparam.log_jacobian(batch[2, 1]), atol=1e-12
        )
    reparam.set_centredness(effect.model_centredness)


@pytest.mark.slow  # compiles both layers' logp and gradient: 32 s per form from a cold cache
@pytest.mark.parametrize("form", ["layers", "centred_layers"])
def test_layer_density_in_phi(form, request):
    """Mutations: ``value - chol[i, j] * rows[j]`` -> ``value + ...`` in
    ``_forward_substitution`` (the layer's graph no longer the numpy map);
    ``grad_packed[..., e.log_entries] += self._moved_groups()`` removed from ``pullback``
    (both forms); centred: ``chol[i, 0] * rhs[0]`` -> ``chol[0, i] * rhs[0]`` in
    ``_lower_product``, ``np.swapaxes(chol, -1, -2) @ moved`` -> ``chol @ moved`` in
    ``pullback``."""
    layer, effect, reparam, maps, moved = request.getfixturevalue(form)
    rng = np.random.default_rng(1)
    for c in _centrednesses(rng):
        reparam.set_centredness(c)
        _assert_layer_density(layer, moved, maps, rng)
    reparam.set_centredness(effect.model_centredness)


def test_group_information_is_the_rows_precision_through_the_factor(layers):
    """``-d^2 loglik / dz_j^2 = L' X_j' X_j L`` for ``y ~ Normal(X_j ab_j, 1)``. Mutation:
    ``direction[sl.start + row * j : ...]`` -> ``direction[sl.start + row : ...]`` (the
    directions straddle the rows of ``z``)."""
    layer, effect, reparam, _, _ = layers
    group, x, _ = _data()
    theta = 0.3 * np.random.default_rng(3).standard_normal(layer.dim)
    chol = reparam._factor(theta)
    expected = []
    for j in range(len(SIZES)):
        design = np.column_stack([np.ones(SIZES[j]), x[group == j]])
        expected.append(chol.T @ design.T @ design @ chol)
    got = group_information(effect, theta, layer.full_loglik_hvp)
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-9, atol=1e-12)


def test_group_information_of_a_centred_model_is_the_rows_precision(centred_layers):
    """``-d^2 loglik / d ab_j^2 = X_j' X_j`` for ``y ~ Normal(X_j ab_j, 1)``, read from the
    ``(J, K)`` layout. Mutation: ``effect.with_matrix`` writing ``matrix`` without its
    transpose for a centred effect (the directions straddle the groups)."""
    layer, effect, _, _, _ = centred_layers
    group, x, _ = _data()
    theta = 0.3 * np.random.default_rng(3).standard_normal(layer.dim)
    expected = []
    for j in range(len(SIZES)):
        design = np.column_stack([np.ones(SIZES[j]), x[group == j]])
        expected.append(design.T @ design)
    got = group_information(effect, theta, layer.full_loglik_hvp)
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-9, atol=1e-12)


def test_centring_rule():
    """One effect per group: centred exactly where ``h_j > 1`` (the scalar rule's
    ``c_j = h_j / (1 + h_j) > 1/2``). Two: the geometric mean of ``1 + h`` over the
    eigenvalues, so a group pinned in one direction only and barely in the other
    (eigenvalues 8 and 0.1: ``sqrt(9 * 1.1) = 3.1``) is centred and one at (2.5, 0.05) is not
    (``1.91``). Mutation: ``np.mean(np.log1p(eigenvalues))`` -> ``np.log1p(np.min(...))``."""
    h = np.array([0.2, 0.99, 1.01, 50.0])
    np.testing.assert_array_equal(choose_correlated_centredness(h[:, None, None]), [0, 0, 1, 1])
    rotation = np.array([[0.6, -0.8], [0.8, 0.6]])
    blocks = np.array([rotation @ np.diag(d) @ rotation.T for d in ([8.0, 0.1], [2.5, 0.05])])
    np.testing.assert_array_equal(choose_correlated_centredness(blocks), [1, 0])


@pytest.mark.slow  # compiles the second-order residuals: 46 s from a cold cache
def test_second_order_control_variates_are_exact_on_a_gaussian_likelihood(layers):
    """With every group centred the row log-likelihood is a quadratic function of ``w``
    alone, so the second-order Taylor residuals that HMC-ECS and AusterityMH subsample are 0
    at every point. Mutation: ``L`` built as ``pt.zeros((K, K))[e.rows, e.cols].set(...)``
    of the packed value with ``pt.set_subtensor(packed[e.log_entries], pt.exp(...))`` (what
    ``pm.expand_packed_triangular`` and the transform build): PyTensor's rewrites then
    miscompile ``delta' H_k delta``, residuals up to 0.8 (AusterityMH diverged on every
    draw of ``correlated_slopes``)."""
    layer, _, reparam, _, moved = layers
    reparam.set_centredness(1.0)
    rng = np.random.default_rng(4)
    rows = moved.take_rows(np.arange(int(SIZES.sum())))
    star, curvature_point = 0.3 * rng.standard_normal((2, layer.dim))
    hessian = moved.full_loglik_hessian(curvature_point)
    anchor = Anchor(star, *moved.full_loglik_grad(star), curvature_point, hessian)
    for scale in (0.01, 0.3):
        phi = anchor.theta + scale * rng.standard_normal(layer.dim)
        residuals = moved.difference_terms.residuals(phi, rows, anchor, 2)
        np.testing.assert_allclose(residuals, 0.0, atol=1e-10)
    reparam.set_centredness(0.0)


def _with_a_scalar_effect() -> pm.Model:
    """:func:`_model` plus a non-centred intercept per site (3 sites), a scalar loc-scale
    effect that :class:`LocScaleReparams` composes with the correlated one."""
    group, x, y = _data()
    site = np.arange(group.size) % 3
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=2)
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0, sd_dist=pm.HalfNormal.dist(1.0))
        z = pm.Normal("z", 0.0, 1.0, shape=(2, len(SIZES)))
        ab = pm.Deterministic("ab", mu + pt.dot(chol, z).T)
        tau = pm.HalfNormal("tau", 1.0)
        u = pm.Normal("u", 0.0, 1.0, shape=3)
        s = pm.Deterministic("s", tau * u)
        pm.Normal("y", ab[group, 0] + ab[group, 1] * x + s[site], 1.0, observed=y)
    return model


@pytest.mark.slow  # compiles the model's logp and dlogp: 20 s from a cold cache
def test_scalar_and_correlated_effects_compose():
    """Both kinds of effect in one model, both moved: the composition inverts, its
    log-Jacobian is the numerical log-determinant, its pullback the finite-difference
    gradient of the model's density in ``phi``. Mutation: ``out = self._set(g, (1.0 - c) *
    g_z + v)`` -> ``out = self._set(g, g_z)`` in ``CorrelatedReparam.pullback``."""
    compiled = _Compiled(_with_a_scalar_effect())
    [scalar] = compiled.effects
    [correlated] = find_correlated_effects(compiled.model)
    both = LocScaleReparams(
        [LocScaleReparam(scalar, [1.0, 0.0, 1.0]), CorrelatedReparam(correlated, [1, 0, 1, 1, 0])]
    )
    rng = np.random.default_rng(6)
    theta = compiled.theta0 + 0.3 * rng.standard_normal(compiled.theta0.size)
    _assert_composition(compiled, both, theta)
