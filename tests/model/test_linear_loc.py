"""Group effects whose ``loc`` is a regression on group-level covariates
(``pymc_bigdata/model/linear_loc.py``, read by ``loc_scale.find_loc_scale_effects``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* the radon-style forms are found, centred and non-centred: ``g[0] + g[1] * u`` of a free
  vector, ``alpha + beta * u`` of two scalars, ``c + dot(U, gamma)`` with a constant matrix,
  each with its design, offset and entries of ``theta`` as the data give them, and the same
  regression written per row (``u[group]``), but not a covariate that varies within groups;
* a ``loc`` that is not affine in the free variables (a square, an ``exp``, a product of
  two coefficients, a log-transformed coefficient) gives no effect about it, and neither
  does a regression on another effect's entries;
* the centring and whitening maps about such a ``loc`` invert, with the numerical
  log-determinant as log-Jacobian and the finite-difference gradient of the model's density
  in ``phi`` as pullback;
* the bulk's fit (``group_fit.fit_groups``) of a Gaussian model finds the scale and the
  coefficients that maximise the groups' exact marginal density, computed here by a joint
  numerical optimisation, and ``bulk_point`` writes the coefficients.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
import scipy.optimize
from test_loc_scale import _assert_composition, _centrednesses, _Compiled

from pymc_bigdata.model.group_fit import bulk_point, fit_groups
from pymc_bigdata.model.loc_scale import find_loc_scale_effects
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams
from pymc_bigdata.model.whitening import WhitenedLocScale

N_GROUPS = 6
#: a covariate per group, and a second one for the matrix form
U = np.array([0.3, -1.2, 0.8, 1.5, -0.4, 0.1])
U2 = np.array([1.0, 0.0, -1.0, 2.0, 0.5, -0.5])


def _rows(seed: int, n_rows: int = 80) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = np.concatenate([np.arange(N_GROUPS), rng.integers(N_GROUPS, size=n_rows)])
    return group, rng.standard_normal(group.size)


def _radon(form: str, centred: bool, seed: int = 1) -> pm.Model:
    """Varying intercepts about a regression on ``U`` (and ``U2``), written as ``form``:
    ``"vector"`` ``g[0] + g[1] * U``, ``"scalars"`` ``alpha + beta * U``, ``"primer"``
    the first in a ``pm.Deterministic`` of a ``pm.Data`` (as PyMC's multilevel primer writes
    the radon model), ``"matrix"`` ``0.5 + dot([U, U2], gamma)``."""
    group, y = _rows(seed)
    with pm.Model() as model:
        if form == "vector":
            g = pm.Normal("g", 0.0, 1.0, shape=2)
            loc = g[0] + g[1] * U
        elif form == "scalars":
            loc = pm.Normal("alpha", 0.0, 1.0) + pm.Normal("beta", 0.0, 1.0) * U
        elif form == "primer":  # PyMC's multilevel primer: pm.Data and a Deterministic
            g = pm.Normal("g", 0.0, 10.0, shape=2)
            loc = pm.Deterministic("loc", g[0] + g[1] * pm.Data("uranium", U))
        else:
            gamma = pm.Normal("gamma", 0.0, 1.0, shape=2)
            loc = 0.5 + pm.math.dot(np.column_stack([U, U2]), gamma)
        tau = pm.HalfNormal("tau", 1.0)
        if centred:
            a = pm.Normal("a", loc, tau, shape=N_GROUPS)
        else:
            a = pm.Deterministic("a", loc + tau * pm.Normal("z", 0.0, 1.0, shape=N_GROUPS))
        pm.Normal("y", a[group], 1.0, observed=y)
    return model


FORMS = {
    "vector": (np.column_stack([np.ones(N_GROUPS), U]), 0.0),
    "scalars": (np.column_stack([np.ones(N_GROUPS), U]), 0.0),
    "primer": (np.column_stack([np.ones(N_GROUPS), U]), 0.0),
    "matrix": (np.column_stack([U, U2]), 0.5),
}


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
@pytest.mark.parametrize("form", list(FORMS))
def test_detects_a_regression_on_group_covariates(form, centred):
    """Mutations: ``_affine`` refusing ``Dot`` (``isinstance(op, Dot) or`` dropped): the
    matrix form is not found; ``linear_loc`` returning None: none is."""
    model = _radon(form, centred)
    [effect] = find_loc_scale_effects(model)
    design, offset = FORMS[form]
    regression = effect.linear_loc
    assert (effect.name, effect.centred, effect.loc, effect.parent) == ("a", centred, None, None)
    assert effect.indexed_only and effect.scale == "tau_log__"
    names = [v.name for v in model.value_vars]
    coefficient_names = ["g"] if form in ("vector", "primer") else ["alpha", "beta"]
    coefficient_names = ["gamma"] if form == "matrix" else coefficient_names
    point = model.initial_point()
    starts = np.cumsum([0] + [np.size(point[n]) for n in names])
    expected = np.concatenate(
        [np.arange(starts[i], starts[i + 1]) for i, n in enumerate(names) if n in coefficient_names]
    )
    np.testing.assert_array_equal(regression.coefficients, expected)
    np.testing.assert_allclose(regression.design, design, atol=1e-12)
    np.testing.assert_allclose(regression.offset, offset, atol=1e-12)


@pytest.mark.parametrize("covariate", ["per_group", "per_row"])
def test_a_regression_written_per_row_is_read_per_group(covariate):
    """``g[0] + g[1] * U[group] + tau * z[group]``: the rows of a group share their ``loc``,
    which is read as the groups' regression; a covariate that varies within a group is no
    ``loc`` of the groups (only ``tau * z[group]`` about 0 is found, as before).

    Mutation: ``per_group`` skipping its equality check (``same = True``): the row-level
    covariate is read as a group's, from each group's first row."""
    group, y = _rows(4)
    x = U[group] if covariate == "per_group" else np.random.default_rng(0).normal(size=y.size)
    with pm.Model() as model:
        g = pm.Normal("g", 0.0, 1.0, shape=2)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=N_GROUPS)
        pm.Normal("y", g[0] + g[1] * x + tau * z[group], 1.0, observed=y)
    [effect] = find_loc_scale_effects(model)
    assert effect.indexed_only and effect.effect == "z"
    if covariate == "per_row":
        assert effect.linear_loc is None and effect.loc_value == 0.0
        return
    np.testing.assert_array_equal(effect.linear_loc.coefficients, [0, 1])
    np.testing.assert_allclose(effect.linear_loc.design, FORMS["vector"][0], atol=1e-12)
    np.testing.assert_array_equal(effect.group, group)


def _not_affine(kind: str) -> pm.Model:
    group, y = _rows(2)
    with pm.Model() as model:
        g = pm.Normal("g", 0.0, 1.0, shape=2)
        sd = pm.HalfNormal("sd", 1.0)
        loc = {
            "square": g[0] + g[1] ** 2 * U,
            "exp": pm.math.exp(g[0]) + g[1] * U,
            "product": g[0] * g[1] * U,
            "transformed": g[0] + sd * U,
        }[kind]
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Deterministic("a", loc + tau * pm.Normal("z", 0.0, 1.0, shape=N_GROUPS))
        pm.Normal("y", a[group], 1.0, observed=y)
    return model


@pytest.mark.parametrize("kind", ["square", "exp", "product", "transformed"])
def test_a_loc_not_affine_in_the_free_variables_is_not_read(kind):
    """Mutations: ``len(varying) == 1`` -> ``len(varying) >= 1`` for products (the product
    of two coefficients is read); ``_AFFINE_SCALARS`` with ``Exp`` added (the ``exp`` is)."""
    found = find_loc_scale_effects(_not_affine(kind))
    # at most ``tau * z`` about 0, read other than as ``a[g]`` (what was found before)
    assert all(e.linear_loc is None and e.name != "a" and not e.indexed_only for e in found)


def test_a_regression_on_another_effect_is_not_read():
    """``a``'s ``loc`` reads the effect ``c`` (also read by the likelihood): the maps would
    have to run in order; only ``c`` is reported.

    Mutation: the ``_drop_regressions_on_effects`` call removed: ``a`` is reported too."""
    group, y = _rows(3)
    with pm.Model() as model:
        sd_c = pm.HalfNormal("sd_c", 1.0)
        c = pm.Normal("c", 0.0, sd_c, shape=N_GROUPS)
        beta = pm.Normal("beta", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", c[::-1] + beta * U, tau, shape=N_GROUPS)
        pm.Normal("y", a[group] + c[group], 1.0, observed=y)
    assert [e.name for e in find_loc_scale_effects(model)] == ["c"]


@pytest.fixture(scope="module", params=[False, True], ids=["noncentred", "centred"])
def compiled(request) -> _Compiled:
    return _Compiled(_radon("matrix", request.param))


def test_the_maps_invert_with_their_jacobian_and_pullback(compiled):
    """Centring at several centrednesses and whitening, about the regression; fully centred
    the sampler's ``w`` is ``a``, non-centred ``z = (a - loc) / tau``.

    Mutations: ``add_pullback`` adding ``cotangent @ self.design[:, ::-1]``;
    ``nested_loc._vector_loc`` ignoring ``linear_loc`` (the maps read ``loc`` 0)."""
    rng = np.random.default_rng(4)
    [effect] = compiled.effects
    theta = compiled.random_theta(rng)
    design, offset = FORMS["matrix"]
    loc = offset + design @ theta[effect.linear_loc.coefficients]
    tau, t = np.exp(theta[effect.scale_slice]), theta[effect.effect_slice]
    a, z = (t, (t - loc) / tau) if effect.centred else (loc + tau * t, t)
    for c, expected in ((1.0, a), (0.0, z)):  # w = a centred, w = z non-centred
        phi = LocScaleReparam(effect, c).from_model(theta)
        np.testing.assert_allclose(phi[effect.effect_slice], expected, rtol=1e-12)
    for c in _centrednesses(effect, rng):
        maps = LocScaleReparams([LocScaleReparam(effect, c)])
        _assert_composition(compiled, maps, compiled.random_theta(rng))
    kappa = rng.uniform(0.0, 5.0, N_GROUPS) * (np.arange(N_GROUPS) % 3 != 0)
    whitened = LocScaleReparams([WhitenedLocScale(effect, kappa, rng.standard_normal(N_GROUPS))])
    _assert_composition(compiled, whitened, compiled.random_theta(rng))


def test_the_bulk_fit_maximises_the_groups_marginal_density():
    """A Gaussian model (unit residual sd): each group's mean ``ybar_j ~ Normal(loc_j,
    tau^2 + 1 / n_j)`` once ``a_j`` is integrated out; the fit's ``tau`` and coefficients
    are that density's joint maximiser with ``tau``'s prior (HalfNormal(1), in ``log tau``),
    found here by Nelder-Mead over all three at once.

    Mutations: the least squares without weights (``root = np.sqrt(weight)`` ->
    ``np.ones_like(weight)``); ``bulk_point`` not writing the coefficients."""
    rng = np.random.default_rng(5)
    sizes = np.array([2, 5, 40, 200, 3, 900])
    group = np.repeat(np.arange(N_GROUPS), sizes)
    design = np.column_stack([U, U2])
    a = 0.5 + design @ np.array([0.7, -0.4]) + 0.6 * rng.standard_normal(N_GROUPS)
    y = a[group] + rng.standard_normal(group.size)
    with pm.Model() as model:
        gamma = pm.Normal("gamma", 0.0, 1.0, shape=2)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=N_GROUPS)
        a_var = pm.Deterministic("a", 0.5 + pm.math.dot(design, gamma) + tau * z)
        pm.Normal("y", a_var[group], 1.0, observed=y)
    layer = MinibatchModel(model)
    [effect] = find_loc_scale_effects(model, layer.value_vars)
    theta = np.concatenate([[0.1, -0.2], [np.log(2.0)], np.zeros(N_GROUPS)])
    fit = fit_groups(effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp)
    ybar, var = np.bincount(group, weights=y) / sizes, 1.0 / sizes

    def neg_log_density(x: np.ndarray) -> float:
        total = np.exp(2.0 * x[2]) + var
        resid = ybar - 0.5 - design @ x[:2]
        log_prior = -0.5 * np.exp(2.0 * x[2]) + x[2]
        return 0.5 * np.sum(np.log(total) + resid**2 / total) - log_prior

    best = scipy.optimize.minimize(
        neg_log_density,
        [0.0, 0.0, 0.0],
        method="Nelder-Mead",
        options={"xatol": 1e-9, "fatol": 1e-12},
    )
    np.testing.assert_allclose(fit.coefficients, best.x[:2], atol=1e-4)
    np.testing.assert_allclose(np.log(fit.scale), best.x[2], atol=1e-3)
    np.testing.assert_allclose(fit.loc, 0.5 + design @ fit.coefficients)
    moved = bulk_point(effect, theta, fit)
    np.testing.assert_allclose(moved[effect.linear_loc.coefficients], fit.coefficients)


def test_a_graph_too_deep_to_read_is_left_alone():
    """A ``loc`` built from thousands of chained sums: not read (no RecursionError).

    Mutation: the ``except RecursionError`` in ``linear_loc`` removed (the search raises)."""
    group, y = _rows(6)
    with pm.Model() as model:
        g = pm.Normal("g", 0.0, 1.0, shape=2)
        loc = g[0] + g[1] * U
        for _ in range(3000):
            loc = loc + 0.0
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Deterministic("a", loc + tau * pm.Normal("z", 0.0, 1.0, shape=N_GROUPS))
        pm.Normal("y", a[group], 1.0, observed=y)
    assert all(e.linear_loc is None for e in find_loc_scale_effects(model))
