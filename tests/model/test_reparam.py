"""A layer in per-group centred coordinates, the groups' information and the centring rule.

What each test proves (and the one-line mutation of the package it was seen to fail on):

* the layer of :meth:`MinibatchModel.reparameterised` has, at every ``phi``, the model's log
  density at ``theta(phi)`` plus ``log |det dtheta/dphi|`` and its gradient is the pullback,
  at several centrednesses set after the layer compiled (the shared input follows);
* :func:`group_information` is ``kappa_j tau^2`` exactly on a Gaussian likelihood, for both
  parameterisations;
* :func:`fit_groups` finds the scale of the bulk: on a Gaussian likelihood, from any point
  (each parameterisation's MAP, a point off every mode), the mode of the exact marginal
  posterior of ``log tau`` computed here from the groups' means; :func:`bulk_point` puts
  each effect at its conditional mode given that scale;
* :func:`fit_parent` finds the parents' scale of a two-level Gaussian model: the mode of
  the exact marginal posterior of ``log tau_b`` given the groups' scale, computed here from
  the groups' means with the full covariance of groups sharing a parent, either way the
  model is written;
* :func:`choose_centredness` makes the conditional posterior sd of each ``w_j`` stationary in
  ``log tau`` (no funnel, no ridge in the scale) on a Gaussian model, where all-centred and
  all-non-centred coordinates do not;
* the step samples in those coordinates on a data-rich non-centred model and returns the
  model's own variables.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy.optimize import minimize
from scipy.stats import norm
from test_loc_scale import _assert_layer_density

from pymc_bigdata.model.group_fit import (
    bulk_point,
    fit_groups,
    fit_parent,
    group_information,
    scale_at,
)
from pymc_bigdata.model.loc_scale import find_loc_scale_effects
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams, choose_centredness

SIGMA = 1.5
SIZES = np.array([2, 5, 20, 80, 300])


def _gaussian_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The group of each row and ``y``."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(SIZES)), SIZES)
    return group, rng.normal(0.3 + 0.8 * rng.standard_normal(len(SIZES))[group], SIGMA)


def _gaussian(centred: bool, seed: int = 0) -> pm.Model:
    """``y ~ Normal(a[g], 1.5)`` with ``a ~ Normal(mu, tau)``, written either way."""
    group, y = _gaussian_data(seed)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        if centred:
            a = pm.Normal("a", mu, tau, shape=len(SIZES))
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=len(SIZES))
            a = mu + tau * z
        pm.Normal("y", a[group], SIGMA, observed=y)
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["noncentred", "centred"])
def gaussian(request):
    model = _gaussian(request.param)
    layer = MinibatchModel(model)
    [effect] = find_loc_scale_effects(model, layer.value_vars)
    reparam = LocScaleReparams([LocScaleReparam(effect, effect.model_centredness)])
    return layer, effect, reparam, layer.reparameterised(reparam)


def test_layer_density_in_phi(gaussian):
    """Mutation: ``new.prior_graph = prior`` (no ``symbolic_log_jacobian``) in
    ``ModelGraph.reparameterised``: the log densities differ by ``log|J|``."""
    layer, effect, reparam, centred = gaussian
    rng = np.random.default_rng(1)
    for c in (np.zeros(len(SIZES)), np.ones(len(SIZES)), rng.uniform(size=len(SIZES))):
        reparam.reparams[0].set_centredness(c)
        _assert_layer_density(layer, centred, reparam, rng)
    reparam.reparams[0].set_centredness(effect.model_centredness)


def test_group_information_is_kappa_tau_squared(gaussian):
    """``kappa_j = n_j / sigma^2`` for a Gaussian likelihood, so ``h_j = n_j tau^2 / 1.5^2``.

    Mutation: ``info = curvature`` for both forms (no ``* scale**2`` when centred): the
    centred model's information is off by ``tau^2``."""
    layer, effect, _, _ = gaussian
    theta = np.full(layer.dim, 0.2)
    tau = np.exp(0.2)
    info = group_information(effect, theta, layer.full_loglik_hvp)
    np.testing.assert_allclose(info, SIZES * tau**2 / SIGMA**2, rtol=1e-10)


def test_centring_rule_removes_the_funnel(gaussian):
    """The conditional precision of ``w_j`` given ``(mu, tau)`` is ``tau^(-2c) + kappa
    tau^(2 - 2c)``; at ``c = h / (1 + h)`` its derivative in ``log tau`` vanishes, so the
    sd of ``w_j`` does not follow ``tau`` (neither a funnel nor a ridge in the scale).

    Mutation: ``h / (1.0 + h)`` -> ``h / (2.0 + h)`` in ``choose_centredness``: the
    derivative no longer vanishes."""
    layer, effect, reparam, centred = gaussian
    log_tau = 0.1
    theta = np.zeros(layer.dim)
    theta[effect.scale_slice] = log_tau
    rule = choose_centredness(group_information(effect, theta, layer.full_loglik_hvp))
    slope = {}
    for name, c in (("rule", rule), ("centred", 1.0), ("noncentred", 0.0)):
        reparam.reparams[0].set_centredness(c)
        precision = []
        for shift in (-1e-4, 1e-4):
            phi = np.zeros(layer.dim)
            phi[effect.scale_slice] = log_tau + shift
            hessian = centred.full_loglik_hessian(phi) + centred.prior_hessian(phi)
            precision.append(-np.diag(hessian)[effect.effect_slice])
        slope[name] = np.log(precision[1] / precision[0]) / 2e-4
    reparam.reparams[0].set_centredness(effect.model_centredness)
    np.testing.assert_allclose(slope["rule"], 0.0, atol=1e-5)
    # centred: a funnel at the group of 2 rows (-2 / (1 + h)); non-centred: a ridge at the
    # group of 300 rows (2 h / (1 + h))
    assert slope["centred"][0] < -0.5 and slope["noncentred"][-1] > 1.5


def _exact_bulk_scale() -> float:
    """The mode in ``log tau`` of ``p(log tau) prod_j Normal(ybar_j; mu, tau^2 + 1.5^2 / n_j)``
    over ``(mu, log tau)``, ``tau ~ HalfNormal(1)``: the Gaussian model's exact marginal
    posterior with ``mu`` at its best, from the groups' means alone."""
    group, y = _gaussian_data()
    means = np.bincount(group, weights=y) / SIZES

    def neg(x: np.ndarray) -> float:
        mu, log_tau = x
        sd = np.sqrt(np.exp(2 * log_tau) + SIGMA**2 / SIZES)
        return -(np.sum(norm.logpdf(means, mu, sd)) - np.exp(2 * log_tau) / 2 + log_tau)

    return float(np.exp(minimize(neg, [0.0, 0.0], method="Nelder-Mead", tol=1e-12).x[1]))


PARENT_OF = np.array([0, 0, 1, 1, 1, 2, 3])
N_PARENTS = 4
NESTED_SIZES = np.array([3, 40, 6, 200, 15, 4, 900])


def _nested_gaussian_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    group = np.repeat(np.arange(len(NESTED_SIZES)), NESTED_SIZES)
    b = 0.4 + 0.7 * rng.standard_normal(N_PARENTS)
    a = b[PARENT_OF] + 0.5 * rng.standard_normal(len(PARENT_OF))
    return group, rng.normal(a[group], SIGMA)


def _nested_gaussian(centred: bool) -> pm.Model:
    """``y ~ Normal(a[g], 1.5)``, ``a ~ Normal(b[k], tau_a)``, ``b ~ Normal(mu, tau_b)``."""
    group, y = _nested_gaussian_data()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        if centred:
            b = pm.Normal("b", mu, tau_b, shape=N_PARENTS)
            a = pm.Normal("a", b[PARENT_OF], tau_a, shape=len(PARENT_OF))
        else:
            b = mu + tau_b * pm.Normal("z_b", 0.0, 1.0, shape=N_PARENTS)
            a = b[PARENT_OF] + tau_a * pm.Normal("z_a", 0.0, 1.0, shape=len(PARENT_OF))
        pm.Normal("y", a[group], SIGMA, observed=y)
    return model


def _exact_scale_mode(means: np.ndarray, fixed: np.ndarray, shared: np.ndarray) -> float:
    """The mode in ``log tau`` (``mu`` at its best) of ``p(log tau)`` (``tau ~
    HalfNormal(1)``) times the density of the groups' means,
    ``ybar ~ Normal(mu, fixed + tau^2 shared)``."""

    def neg(x: np.ndarray) -> float:
        mu, log_tau = x
        cov = fixed + np.exp(2 * log_tau) * shared
        resid = means - mu
        _, logdet = np.linalg.slogdet(cov)
        loglik = -0.5 * (logdet + resid @ np.linalg.solve(cov, resid))
        return -(loglik - np.exp(2 * log_tau) / 2 + log_tau)

    return float(np.exp(minimize(neg, [0.0, 0.0], method="Nelder-Mead", tol=1e-12).x[1]))


def _same(index: np.ndarray) -> np.ndarray:
    """``S_ij = 1`` where entries ``i`` and ``j`` share ``index``."""
    return (index[:, None] == index[None, :]).astype(float)


def _exact_parent_scale(scale_a: float) -> float:
    """:func:`_exact_scale_mode` of ``tau_b``: ``D = diag(scale_a^2 + 1.5^2 / n_j)`` and
    ``tau_b^2`` shared by groups of one parent."""
    group, y = _nested_gaussian_data()
    means = np.bincount(group, weights=y) / NESTED_SIZES
    diagonal = np.diag(scale_a**2 + SIGMA**2 / NESTED_SIZES)
    return _exact_scale_mode(means, diagonal, _same(PARENT_OF))


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_fit_parent_finds_the_parents_scale_through_the_groups(centred):
    """The parents' scale is the exact marginal mode given the groups' bulk scale, from the
    MAP (where the centred model's ``tau_b`` collapses) and from points off every mode.

    Mutations, each seen failing: ``variance = 1 / kappa`` (the groups' spread about their
    parent left out of ``kappa_k``); no shift of centred children in ``_scale_prior`` (the
    centred model's scale prior then carries the groups' prior)."""
    model = _nested_gaussian(centred)
    layer = MinibatchModel(model)
    parent, groups = find_loc_scale_effects(model, layer.value_vars)
    assert parent.children == groups.name
    spread = np.random.default_rng(1).normal(0.0, 1.0, layer.dim)  # b away from mu
    for theta in (layer.map_estimate().theta, np.full(layer.dim, 0.2), spread):
        groups_fit = fit_groups(
            groups, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp
        )
        fit = fit_parent(parent, theta, groups, groups_fit, layer.prior_logp)
        assert fit.scale == pytest.approx(_exact_parent_scale(groups_fit.scale), rel=1e-4)


#: ``_three_level``: each group's region, each region's country, rows per group
REGION_OF_GROUP = np.array([0, 0, 1, 1, 2, 2, 3, 4, 4, 5])
COUNTRY_OF_REGION = np.array([0, 0, 1, 1, 2, 2])
THREE_LEVEL_SIZES = np.array([3, 60, 8, 300, 5, 40, 900, 12, 4, 150])


def _three_level_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    group = np.repeat(np.arange(len(THREE_LEVEL_SIZES)), THREE_LEVEL_SIZES)
    c = 0.3 + 0.8 * rng.standard_normal(3)
    r = c[COUNTRY_OF_REGION] + 0.5 * rng.standard_normal(6)
    a = r[REGION_OF_GROUP] + 0.4 * rng.standard_normal(10)
    return group, rng.normal(a[group], SIGMA)


def _three_level(centred: bool) -> pm.Model:
    """``y ~ Normal(a[g], 1.5)``, ``a ~ Normal(r[k], tg)``, ``r ~ Normal(c[m], tr)``,
    ``c ~ Normal(mu, tc)``, written either way."""
    group, y = _three_level_data()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tc, tr, tg = (pm.HalfNormal(name, 1.0) for name in ("tc", "tr", "tg"))
        if centred:
            c = pm.Normal("c", mu, tc, shape=3)
            r = pm.Normal("r", c[COUNTRY_OF_REGION], tr, shape=6)
            a = pm.Normal("a", r[REGION_OF_GROUP], tg, shape=10)
        else:
            c = mu + tc * pm.Normal("zc", 0.0, 1.0, shape=3)
            r = c[COUNTRY_OF_REGION] + tr * pm.Normal("zr", 0.0, 1.0, shape=6)
            a = r[REGION_OF_GROUP] + tg * pm.Normal("zg", 0.0, 1.0, shape=10)
        pm.Normal("y", a[group], SIGMA, observed=y)
    return model


def _exact_top_scale(scale_g: float, scale_r: float) -> float:
    """:func:`_exact_scale_mode` of ``tc``: ``D = diag(tg^2 + 1.5^2 / n_j)`` plus ``tr^2``
    shared by groups of one region, ``tc^2`` by groups of one country, at the groups' and
    regions' scales ``tg``, ``tr``."""
    group, y = _three_level_data()
    means = np.bincount(group, weights=y) / THREE_LEVEL_SIZES
    fixed = np.diag(scale_g**2 + SIGMA**2 / THREE_LEVEL_SIZES)
    fixed = fixed + scale_r**2 * _same(REGION_OF_GROUP)
    return _exact_scale_mode(means, fixed, _same(COUNTRY_OF_REGION[REGION_OF_GROUP]))


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_three_levels_fit_and_layer(centred):
    """Three levels: the countries' scale, read through the regions' fit read through the
    groups', is the exact marginal mode given the groups' and regions' bulk scales, from
    the MAP and from points off every mode; and the layer in coordinates centred at random
    per entry of every level has the model's density plus ``log|J|``, with the pullback as
    its compiled gradient (the parents' values reach their children's ``loc`` symbolically).

    Mutations, each seen failing: ``for below in nested:`` -> ``for below in nested[:1]:``
    in ``_scale_prior`` (the centred groups stay put while the countries move the regions:
    the centred model's scale is off); ``written[r.effect.effect_slice.start] = value``
    dropped in ``symbolic_effects`` (the children read their parents' ``w``: the layer's
    density is off)."""
    model = _three_level(centred)
    layer = MinibatchModel(model)
    countries, regions, groups = find_loc_scale_effects(model, layer.value_vars)
    assert (countries.children, regions.children) == (regions.name, groups.name)
    spread = np.random.default_rng(1).normal(0.0, 1.0, layer.dim)
    for theta in (layer.map_estimate().theta, np.full(layer.dim, 0.2), spread):
        groups_fit = fit_groups(
            groups, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp
        )
        regions_fit = fit_parent(regions, theta, groups, groups_fit, layer.prior_logp)
        fit = fit_parent(countries, theta, regions, regions_fit, layer.prior_logp, [groups])
        expected = _exact_top_scale(groups_fit.scale, regions_fit.scale)
        assert fit.scale == pytest.approx(expected, rel=1e-4)
    rng = np.random.default_rng(2)
    maps = LocScaleReparams(
        [LocScaleReparam(e, rng.uniform(size=e.n_groups)) for e in (groups, regions, countries)]
    )
    _assert_layer_density(layer, layer.reparameterised(maps), maps, rng)


def test_fit_groups_finds_the_bulks_scale_from_any_point(gaussian):
    """From either parameterisation's MAP and from a point off every mode, the scale is the
    exact marginal mode (the Gaussian likelihood makes the fit exact), and
    :func:`bulk_point` puts each effect where its gradient given ``(mu, tau)`` vanishes.

    Mutations, each seen failing: ``estimate = a`` (no Newton step from ``theta``): the
    point off the modes gives another scale; no ``+ effect.n_groups * log_scale`` in
    ``_scale_prior``: the centred model's scale is off; ``scale_prior`` left out of the
    objective: both are off; ``prior_precision = fit.scale**2`` in :func:`bulk_point`: the
    gradient does not vanish."""
    layer, effect, _, _ = gaussian
    expected = _exact_bulk_scale()
    for theta in (layer.map_estimate().theta, np.full(layer.dim, 0.2)):
        fit = fit_groups(
            effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp
        )
        assert fit.scale == pytest.approx(expected, rel=1e-4)
        bulk = bulk_point(effect, theta, fit)
        assert scale_at(effect, bulk) == pytest.approx(fit.scale)
        grad = layer.full_logp_grad(bulk)[1][effect.effect_slice]
        np.testing.assert_allclose(grad, 0.0, atol=1e-8)
