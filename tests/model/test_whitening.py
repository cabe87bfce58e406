"""Conditional whitening of loc-scale group effects (``pymc_bigdata/model/whitening.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* the map inverts exactly, its log-Jacobian is the numerical log-determinant and its
  pullback the finite-difference gradient of the model's density in ``phi``, for one-level
  effects written either way, an untransformed scale, a constant ``loc`` and groups nested
  in parents, with some groups' ``kappa_j = 0``;
* a layer in these coordinates (:meth:`MinibatchModel.reparameterised`: the symbolic map)
  has the model's log density at ``theta(phi)`` plus the log-Jacobian, and its gradient is
  the pullback, after the fit moved (the shared inputs follow);
* on a Gaussian likelihood, with each group's exact precision and data mean, every ``w_j``
  is standard normal given ``(mu, tau)`` at every scale from ``e^-6`` to ``e^2``, where the
  per-group centredness fixed at one scale is a funnel below it;
* with groups nested in parents, the parents whitened through their groups at the groups'
  scale of the point (:class:`ChildrenReading`): the map inverts with its Jacobian and
  pullback, and on a two-level Gaussian likelihood every ``w`` of both levels is standard
  normal and independent given the scales, at every pair of scales;
* ``kappa_j = 0`` is the non-centred form, and a bad fit is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_loc_scale import (
    _assert_composition,
    _assert_layer_density,
    _Compiled,
    _nested_model,
    _variants_model,
)
from test_reparam import (
    NESTED_SIZES,
    SIGMA,
    SIZES,
    _gaussian,
    _gaussian_data,
    _nested_gaussian,
    _nested_gaussian_data,
)

from pymc_bigdata.model.loc_scale import find_loc_scale_effects
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams
from pymc_bigdata.model.whitening import ChildrenReading, WhitenedLocScale


@pytest.fixture(scope="module", params=["variants", "nested_noncentred", "nested_centred"])
def compiled(request) -> _Compiled:
    if request.param == "variants":
        return _Compiled(_variants_model())
    return _Compiled(_nested_model(request.param == "nested_centred"))


def _random_fit(effect, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``kappa_j`` (every third group without rows) and ``a_j^``."""
    kappa = rng.uniform(0.0, 5.0, effect.n_groups) * (np.arange(effect.n_groups) % 3 != 0)
    return kappa, rng.standard_normal(effect.n_groups)


def test_the_map_inverts_with_its_jacobian_and_pullback(compiled):
    """Mutations, each seen failing: ``scale * w / (2.0 * root**3)`` -> ``scale * w / (2.0 *
    root)`` in the centred pullback's ``d_h``; ``- 0.5 * np.sum(np.log1p(h))`` -> ``- np.sum(...)``
    in ``log_jacobian``; ``np.sqrt(1.0 + h) * (...)`` -> ``(1.0 + h) * (...)`` in
    ``from_model``."""
    rng = np.random.default_rng(11)
    for _ in range(2):
        maps = LocScaleReparams(
            [WhitenedLocScale(e, *_random_fit(e, rng)) for e in compiled.effects]
        )
        _assert_composition(compiled, maps, compiled.random_theta(rng))


@pytest.fixture(scope="module", params=[False, True], ids=["noncentred", "centred"])
def gaussian(request):
    model = _gaussian(request.param)
    layer = MinibatchModel(model)
    [effect] = find_loc_scale_effects(model, layer.value_vars)
    group, y = _gaussian_data()
    kappa = SIZES / SIGMA**2
    means = np.bincount(group, weights=y) / SIZES
    whitened = WhitenedLocScale(effect, kappa, means)
    maps = LocScaleReparams([whitened])
    return layer, effect, whitened, maps, layer.reparameterised(maps), (kappa, means)


def test_layer_density_in_phi(gaussian):
    """The compiled layer's density and gradient in ``phi`` at two fits (the second set after
    the compile). Mutation: ``out + self.effect.n_groups * log_scale`` -> ``out`` in
    ``symbolic_log_jacobian`` (centred)."""
    layer, _, whitened, maps, moved, (kappa, means) = gaussian
    rng = np.random.default_rng(12)
    for fit in ((kappa, means), (0.3 * kappa, means + 1.0)):
        whitened.set_fit(*fit)
        _assert_layer_density(layer, moved, maps, rng)
    whitened.set_fit(kappa, means)


def _w_conditional(layer, effect, log_tau: float) -> tuple[np.ndarray, np.ndarray]:
    """The gradient of the log density in ``w`` at ``w = 0`` and the diagonal of its Hessian
    there, at ``mu = 0.3`` and ``log tau``."""
    phi = np.zeros(layer.dim)
    phi[effect.loc_slice], phi[effect.scale_slice] = 0.3, log_tau
    _, grad = layer.full_logp_grad(phi)
    hessian = layer.full_loglik_hessian(phi) + layer.prior_hessian(phi)
    return grad[effect.effect_slice], np.diag(hessian)[effect.effect_slice]


def test_every_group_is_standard_normal_at_every_scale(gaussian):
    """On ``y ~ Normal(a[g], 1.5)`` the conditional of ``a_j`` given ``(mu, tau)`` is Gaussian
    with precision ``n_j / 1.5^2 + tau^-2`` about its mean, so with the exact ``kappa_j`` and
    data means each ``w_j`` has mean 0 and precision 1 at every ``tau``; the per-group
    centredness chosen at ``tau = 1`` has its precision vary 10-fold over the same range
    (a funnel as the scale shrinks). Mutations, in ``symbolic_effect``: ``h * offset *
    pt.exp(-log_scale) / (1.0 + h)`` without ``/ (1.0 + h)`` (the mean moves);
    ``/ pt.sqrt(1.0 + h)`` -> ``/ (1.0 + h)`` (the precision moves)."""
    layer, effect, _, _, moved, (kappa, _) = gaussian
    for log_tau in np.linspace(-6.0, 2.0, 5):
        grad, curvature = _w_conditional(moved, effect, log_tau)
        np.testing.assert_allclose(grad, 0.0, atol=1e-8)
        np.testing.assert_allclose(curvature, -1.0, rtol=1e-8)
    partial = LocScaleReparams([LocScaleReparam(effect, kappa / (1.0 + kappa))])
    partial_layer = layer.reparameterised(partial)
    precisions = [-_w_conditional(partial_layer, effect, t)[1] for t in (-6.0, 0.0, 2.0)]
    assert np.max(precisions[0] / precisions[1]) > 10.0


def test_no_rows_is_non_centred_and_a_bad_fit_is_refused(gaussian):
    """``kappa = 0``: ``w = z`` in either model; a negative or non-finite ``kappa`` or
    estimate is refused. Mutation: ``np.all(kappa >= 0.0)`` dropped from ``set_fit``."""
    layer, effect, _, _, _, _ = gaussian
    rng = np.random.default_rng(13)
    theta = rng.standard_normal(layer.dim)
    phi = WhitenedLocScale(effect, 0.0, 0.0).from_model(theta)
    mu, tau = theta[effect.loc_slice], np.exp(theta[effect.scale_slice])
    t = theta[effect.effect_slice]
    z = (t - mu) / tau if effect.centred else t
    np.testing.assert_allclose(phi[effect.effect_slice], z, rtol=1e-12)
    for kappa, estimate in ((-1.0, 0.0), (np.inf, 0.0), (1.0, np.nan)):
        with pytest.raises(ValueError, match="kappa|estimates"):
            WhitenedLocScale(effect, kappa, estimate)


def _two_levels(effects, kappa, estimate) -> LocScaleReparams:
    """The groups whitened by ``kappa`` and ``estimate``, their parents through them."""
    parents = next(e for e in effects if e.children is not None)
    groups = next(e for e in effects if e.parent is not None)
    children = ChildrenReading(
        groups.parent.index,
        kappa,
        estimate,
        groups.scale_slice,
        groups.scale_transform,
        parents.n_groups,
    )
    ones = np.ones(parents.n_groups)
    return LocScaleReparams(
        [
            WhitenedLocScale(groups, kappa, estimate),
            WhitenedLocScale(parents, ones, 0.0 * ones, children=children),
        ]
    )


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_parents_read_through_their_groups_invert_with_jacobian_and_pullback(centred):
    """Mutation: ``by_h * d_kappa * scale**2`` -> ``by_h * d_kappa`` in the pullback (the
    children's scale's share)."""
    compiled = _Compiled(_nested_model(centred))
    groups = next(e for e in compiled.effects if e.parent is not None)
    rng = np.random.default_rng(14)
    maps = _two_levels(compiled.effects, *_random_fit(groups, rng))
    _assert_composition(compiled, maps, compiled.random_theta(rng))


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_two_levels_are_standard_normal_at_every_pair_of_scales(centred):
    """``y ~ Normal(a[g], 1.5)``, ``a ~ Normal(b[k], tau_a)``, ``b ~ Normal(mu, tau_b)``:
    given the scales, ``(a, b)`` is Gaussian; with the groups' exact precisions and means,
    the groups whitened about their parents and the parents through the groups (``a``
    integrated out at the point's ``tau_a``), every ``w`` of both levels has mean 0 and the
    block of the Hessian is ``-I``, at ``(log tau_b, log tau_a)`` from -5 to 1. Mutations,
    each seen failing: ``if self.children is None`` -> ``if True`` in ``_symbolic_parts``
    (the parents whitened at fixed ``kappa``); ``ChildrenReading.symbolic``'s ``u`` at
    ``kappa_j`` (no ``1 + kappa_j scale_a^2``)."""
    model = _nested_gaussian(centred)
    layer = MinibatchModel(model)
    effects = find_loc_scale_effects(model, layer.value_vars)
    group, y = _nested_gaussian_data()
    maps = _two_levels(
        effects, NESTED_SIZES / SIGMA**2, np.bincount(group, weights=y) / NESTED_SIZES
    )
    moved = layer.reparameterised(maps)
    slots = np.concatenate([np.arange(e.effect_slice.start, e.effect_slice.stop) for e in effects])
    parents = next(e for e in effects if e.children is not None)
    groups = next(e for e in effects if e.parent is not None)
    for log_b, log_a in ((-5.0, 0.0), (0.0, -5.0), (-1.0, -2.0), (1.0, 1.0)):
        phi = np.zeros(layer.dim)
        phi[parents.loc_slice] = 0.3
        phi[parents.scale_slice], phi[groups.scale_slice] = log_b, log_a
        _, grad = moved.full_logp_grad(phi)
        hessian = moved.full_loglik_hessian(phi) + moved.prior_hessian(phi)
        np.testing.assert_allclose(grad[slots], 0.0, atol=1e-7)
        np.testing.assert_allclose(hessian[np.ix_(slots, slots)], -np.eye(slots.size), atol=1e-7)
