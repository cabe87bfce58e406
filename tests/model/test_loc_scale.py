"""Loc-scale group effects: detection in a model's graph and the centring bijection.

What each test proves: the non-centred and centred hierarchical logistic models of
``hard_models`` are found, with their slices of ``theta``, the scale's log transform, the
Deterministic's name and the per-group row counts; either order of ``loc + scale * z``, an
inline expression, an untransformed scale and a constant ``loc`` are found too; priors,
shapes and uses that are not a loc-scale effect give no record. The bijection inverts
exactly, moves the model's variable to the centring asked for (``w = a`` at ``c = 1``,
``w = z`` at ``c = 0``), its log-Jacobian is the numerical log-determinant, its pullback is
the finite-difference gradient of the real model's log density in ``phi``, and the density in
``phi`` keeps the model's normalisation. Each test names, in a comment, a one-line mutation of
``pymc_bigdata/model/loc_scale.py`` it was seen to fail on.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pymc as pm
import pytest
from hard_models import hier_logistic, make_hier_logistic_data, make_t_effects_data, t_effects_model

from pymc_bigdata.model.loc_scale import LocScaleEffect, find_loc_scale_effects
from pymc_bigdata.model.reparam import LocScaleReparam, LocScaleReparams

N_GROUPS = 5


def _variants_model(seed: int = 3) -> pm.Model:
    """Two effects written unlike the hard models: ``b = z_b * s_b + mu_b`` inline (swapped
    orders, untransformed scale) and a centred ``c ~ Normal(0.5, sd_c)`` (constant loc)."""
    rng = np.random.default_rng(seed)
    g_b = rng.integers(N_GROUPS, size=60)
    g_c = rng.integers(4, size=60)
    with pm.Model() as model:
        mu_b = pm.Normal("mu_b", 0.0, 1.0)
        s_b = pm.HalfNormal("s_b", 1.0, default_transform=None)
        z_b = pm.Normal("z_b", 0.0, 1.0, shape=N_GROUPS)
        sd_c = pm.Exponential("sd_c", 1.0)
        c = pm.Normal("c", 0.5, sd_c, shape=4)
        b = z_b * s_b + mu_b
        pm.Normal("y", mu=b[g_b] + c[g_c], sigma=1.0, observed=rng.standard_normal(60))
    return model


#: each group's parent in ``_nested_model``
PARENT = np.array([0, 0, 1, 1, 2, 2])


def _nested_model(centred: bool, seed: int = 6) -> pm.Model:
    """Two levels: 6 groups in 3 parents, ``b ~ Normal(mu, tau_b)`` and
    ``a ~ Normal(b[PARENT], tau_a)`` (centred), or ``b = mu + tau_b z_b`` and
    ``a = b[PARENT] + tau_a z_a`` (non-centred, Deterministics); 60 Gaussian rows."""
    rng = np.random.default_rng(seed)
    group = rng.integers(len(PARENT), size=60)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        if centred:
            b = pm.Normal("b", mu, tau_b, shape=3)
            a = pm.Normal("a", b[PARENT], tau_a, shape=len(PARENT))
        else:
            b = pm.Deterministic("b", mu + tau_b * pm.Normal("z_b", 0.0, 1.0, shape=3))
            z_a = pm.Normal("z_a", 0.0, 1.0, shape=len(PARENT))
            a = pm.Deterministic("a", b[PARENT] + tau_a * z_a)
        pm.Normal("y", mu=a[group], sigma=1.0, observed=rng.standard_normal(60))
    return model


#: each region's country and each group's region in ``_three_level_model``
COUNTRY_OF, REGION_OF = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2, 3, 3, 3, 0])


def _three_level_model(centred: bool, seed: int = 8) -> pm.Model:
    """Three levels: 8 groups in 4 regions in 2 countries, ``c ~ Normal(mu, tc)``,
    ``r ~ Normal(c[COUNTRY_OF], tr)``, ``a ~ Normal(r[REGION_OF], tg)`` (centred), or each
    ``loc + scale * z`` (non-centred, Deterministics); 80 Gaussian rows."""
    rng = np.random.default_rng(seed)
    group = rng.integers(len(REGION_OF), size=80)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        tc, tr, tg = (pm.HalfNormal(name, 1.0) for name in ("tc", "tr", "tg"))
        if centred:
            c = pm.Normal("c", mu, tc, shape=2)
            r = pm.Normal("r", c[COUNTRY_OF], tr, shape=4)
            a = pm.Normal("a", r[REGION_OF], tg, shape=8)
        else:
            c = pm.Deterministic("c", mu + tc * pm.Normal("zc", 0.0, 1.0, shape=2))
            r = pm.Deterministic("r", c[COUNTRY_OF] + tr * pm.Normal("zr", 0.0, 1.0, shape=4))
            a = pm.Deterministic("a", r[REGION_OF] + tg * pm.Normal("zg", 0.0, 1.0, shape=8))
        pm.Normal("y", mu=a[group], sigma=1.0, observed=rng.standard_normal(80))
    return model


class _Compiled:
    """A model with its effects and its compiled ``logp`` and ``dlogp`` of raveled theta."""

    def __init__(self, model: pm.Model):
        self.model = model
        self.effects = find_loc_scale_effects(model)
        point = model.initial_point()
        self.names = [v.name for v in model.value_vars]
        self.shapes = [np.shape(point[n]) for n in self.names]
        self.theta0 = np.concatenate([np.ravel(point[n]) for n in self.names])
        self._logp, self._dlogp = model.compile_logp(), model.compile_dlogp()

    def point(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        out, start = {}, 0
        for name, shape in zip(self.names, self.shapes):
            size = int(np.prod(shape))
            out[name] = theta[start : start + size].reshape(shape)
            start += size
        return out

    def logp(self, theta: np.ndarray) -> float:
        return float(self._logp(self.point(theta)))

    def dlogp(self, theta: np.ndarray) -> np.ndarray:
        return np.asarray(self._dlogp(self.point(theta)), dtype=np.float64)

    def random_theta(self, rng: np.random.Generator) -> np.ndarray:
        theta = self.theta0 + 0.4 * rng.standard_normal(self.theta0.size)
        for e in self.effects:  # keep an untransformed scale positive
            if e.scale_transform is None:
                theta[e.scale_slice] = 0.5 + rng.uniform(size=1)
        return theta


@pytest.fixture(scope="module")
def noncentred() -> _Compiled:
    return _Compiled(hier_logistic(False, n_groups=N_GROUPS))


@pytest.fixture(scope="module")
def centred() -> _Compiled:
    return _Compiled(hier_logistic(True, n_groups=N_GROUPS))


@pytest.fixture(scope="module")
def variants() -> _Compiled:
    return _Compiled(_variants_model())


@pytest.fixture(scope="module")
def nested_noncentred() -> _Compiled:
    return _Compiled(_nested_model(False))


@pytest.fixture(scope="module")
def nested_centred() -> _Compiled:
    return _Compiled(_nested_model(True))


@pytest.fixture(scope="module")
def three_noncentred() -> _Compiled:
    return _Compiled(_three_level_model(False))


@pytest.fixture(scope="module")
def three_centred() -> _Compiled:
    return _Compiled(_three_level_model(True))


@pytest.fixture(
    params=[
        "noncentred",
        "centred",
        "variants",
        "nested_noncentred",
        "nested_centred",
        "three_noncentred",
        "three_centred",
    ]
)
def compiled(request) -> _Compiled:
    return request.getfixturevalue(request.param)


def _centrednesses(effect: LocScaleEffect, rng: np.random.Generator) -> list[np.ndarray]:
    """All non-centred, all centred, a mixture of both, and partial centring."""
    j = effect.n_groups
    return [
        np.zeros(j),
        np.ones(j),
        (np.arange(j) % 2).astype(float),
        rng.uniform(size=j),
    ]


def _numerical_jacobian(fn: Callable, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences of ``fn`` at ``x``, ``out[i, k] = d fn_i / d x_k``."""
    cols = []
    for k in range(x.size):
        dx = np.zeros_like(x)
        dx[k] = step
        cols.append((np.asarray(fn(x + dx)) - np.asarray(fn(x - dx))) / (2 * step))
    return np.stack(cols, axis=-1)


# ---------------------------------------------------------------------------------------------
# detection


def test_detects_hard_models(noncentred, centred):
    """Both forms of ``hier_logistic``: kind, slices, log-scale, name and group counts.

    Mutation: ``_peel`` stops peeling ``ViewOp`` (``isinstance(op, ViewOp)`` -> ``False``):
    the Deterministic ``a`` is no longer seen as the expression, so the name and the group
    index of the non-centred effect are lost."""
    names = noncentred.names
    assert names == ["mu_a", "tau_log__", "slope", "z"]
    group = make_hier_logistic_data(N_GROUPS)[0]
    expected_counts = np.bincount(group, minlength=N_GROUPS)
    for compiled, is_centred, effect_name in ((noncentred, False, "z"), (centred, True, "a")):
        [effect] = compiled.effects
        assert effect.name == "a"
        assert effect.centred is is_centred
        assert effect.effect == effect_name
        assert effect.effect_slice == slice(3, 3 + N_GROUPS)
        assert (effect.loc, effect.loc_slice) == ("mu_a", slice(0, 1))
        assert (effect.scale, effect.scale_slice) == ("tau_log__", slice(1, 2))
        assert effect.scale_transform == "log"
        assert effect.n_groups == N_GROUPS
        np.testing.assert_array_equal(effect.group_counts(), expected_counts)


def test_detects_groups_nested_in_parents(nested_noncentred, nested_centred):
    """Two levels: the groups' ``loc`` is the parents' effect at each group's parent, a free
    vector ``b`` (centred) or the non-centred ``mu + tau_b z_b`` (itself an effect).

    Mutation: ``return self.parent(var)`` -> ``return None`` in ``_Layout.loc``: neither
    form's group effect is found (the non-centred one falls back to ``tau_a z_a`` about 0)."""
    assert nested_noncentred.names == ["mu", "tau_b_log__", "tau_a_log__", "z_b", "z_a"]
    parent_b, groups = nested_noncentred.effects
    assert (parent_b.name, parent_b.loc, parent_b.parent) == ("b", "mu", None)
    assert (groups.name, groups.effect, groups.centred, groups.loc) == ("a", "z_a", False, None)
    p = groups.parent
    assert (p.name, p.values_slice, p.loc_slice, p.scale_slice) == (
        "b",
        slice(3, 6),
        slice(0, 1),
        slice(1, 2),
    )
    np.testing.assert_array_equal(p.index, PARENT)
    assert nested_centred.names == ["mu", "tau_b_log__", "tau_a_log__", "b", "a"]
    centred_b, groups = nested_centred.effects
    assert (groups.name, groups.centred, groups.scale) == ("a", True, "tau_a_log__")
    p = groups.parent
    assert (p.values_slice, p.scale_slice) == (slice(3, 6), None)
    np.testing.assert_array_equal(p.index, PARENT)
    rng = np.random.default_rng(0)
    theta = nested_noncentred.random_theta(rng)
    b = theta[0] + np.exp(theta[1]) * theta[3:6]
    np.testing.assert_allclose(groups.parent.value(theta), theta[3:6][PARENT])
    np.testing.assert_allclose(nested_noncentred.effects[1].parent.value(theta), b[PARENT])


def test_parents_effects_are_read_through_their_groups(nested_noncentred, nested_centred):
    """The parents' effect ``b`` is an effect of its own in both forms, marked as read only
    through its children's ``loc`` (``children``), with each group's parent as its index:
    written centred (``b ~ Normal(mu, tau_b)``, which the likelihood never reads) it is
    found only this way.

    Mutation: ``_mark_parents`` returning at once: the centred ``b`` is not found and the
    non-centred one has no ``children``."""
    for compiled, centred in ((nested_noncentred, False), (nested_centred, True)):
        parent_b, groups = compiled.effects
        assert (parent_b.name, parent_b.centred, parent_b.children) == ("b", centred, "a")
        assert (parent_b.loc, parent_b.scale, parent_b.parent) == ("mu", "tau_b_log__", None)
        assert parent_b.effect_slice == groups.parent.values_slice == slice(3, 6)
        np.testing.assert_array_equal(parent_b.group, PARENT)
        assert groups.children is None


def test_detects_three_levels(three_noncentred, three_centred):
    """Groups in regions in countries: each level is an effect about the one above, read at
    each entry's parent, and each parents' effect is marked with its children, in both
    forms; the groups' ``loc`` follows the regions' own ``loc`` up to the countries.

    Mutations: ``isinstance(match[1], LinearLoc)`` -> ``isinstance(match[1], ParentLoc |
    LinearLoc)`` in ``_Layout.parent`` (the two-level rule): the non-centred groups are
    found as ``tg * zg`` about 0 with no parent; ``isinstance(match[0], LinearLoc)`` ->
    ``isinstance(match[0], ParentLoc | LinearLoc)`` in ``_mark_parents``: the centred
    regions and countries are not found; ``pending.append(found[rv])`` dropped: the centred
    countries are not found."""
    for compiled, centred, values in (
        (three_noncentred, False, ("zc", "zr", "zg")),
        (three_centred, True, ("c", "r", "a")),
    ):
        countries, regions, groups = compiled.effects
        assert [e.name for e in compiled.effects] == ["c", "r", "a"]
        assert [e.effect for e in compiled.effects] == list(values)
        assert all(e.centred is centred for e in compiled.effects)
        assert [e.children for e in compiled.effects] == ["r", "a", None]
        assert (countries.loc, countries.parent) == ("mu", None)
        assert (regions.parent.name, groups.parent.name) == ("c", "r")
        np.testing.assert_array_equal(countries.group, COUNTRY_OF)
        np.testing.assert_array_equal(regions.group, REGION_OF)
        np.testing.assert_array_equal(groups.parent.index, REGION_OF)
        assert regions.parent.slots() == ({4, 5} if centred else {0, 1, 4, 5})
    rng = np.random.default_rng(0)
    theta = three_noncentred.random_theta(rng)  # mu, tc, tr, tg (logs), zc, zr, zg
    scales = np.exp(theta[1:4])
    c = theta[0] + scales[0] * theta[4:6]
    r = c[COUNTRY_OF] + scales[1] * theta[6:10]
    groups = three_noncentred.effects[2]
    assert groups.parent.loc_parent.name == "c"
    np.testing.assert_allclose(groups.parent.value(theta), r[REGION_OF])


def test_detects_swapped_inline_and_constant_loc(variants):
    """``z_b * s_b + mu_b`` without a Deterministic and with an untransformed scale, and a
    centred effect with a constant loc.

    Mutation: ``for scale_factor, z_factor in (factors, factors[::-1])`` ->
    ``in (factors,)`` (only ``scale * z`` is tried): ``b`` is no longer found."""
    b, c = variants.effects
    assert (b.name, b.centred, b.effect) == ("z_b", False, "z_b")
    assert (b.loc, b.scale, b.scale_transform) == ("mu_b", "s_b", None)
    assert (c.name, c.centred, c.effect, c.loc, c.loc_value) == ("c", True, "c", None, 0.5)
    assert (c.scale, c.scale_transform) == ("sd_c_log__", "log")
    theta = variants.theta0
    for effect in (b, c):
        name = effect.effect
        assert theta[effect.effect_slice].shape == variants.point(theta)[name].shape
    assert b.group_counts().sum() == c.group_counts().sum() == 60


@pytest.mark.parametrize("sampled_df", [False, True], ids=["nu_4", "nu_sampled"])
@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_detects_student_t_effects(centred, sampled_df):
    """Student-t effects (``hard_models.t_effects``): ``z ~ StudentT(nu, 0, 1)`` read through
    ``mu + tau * z``, and ``a ~ StudentT(nu, mu, tau)``, are the same loc-scale effects,
    ``nu`` a constant or sampled.

    Mutation: the ``StudentTRV`` branch of ``_loc_scale_params`` returns None: neither form
    is found."""
    group, x, y = make_t_effects_data(n_rows=2_000, n_groups=8)
    model = t_effects_model(group, x, y, centred=centred, sampled_df=sampled_df)
    [effect] = find_loc_scale_effects(model)
    assert (effect.name, effect.centred, effect.effect) == ("a", centred, "a" if centred else "z")
    assert (effect.loc, effect.scale, effect.scale_transform) == ("mu", "tau_log__", "log")
    first = 3 if sampled_df else 2  # after mu, tau_log__ (and nu_log__)
    assert effect.effect_slice == slice(first, first + 8)
    np.testing.assert_array_equal(effect.group_counts(), np.bincount(group))


def test_detects_through_minibatch_and_data():
    """``(z * tau)[g]`` with ``g`` a ``pm.Data`` read through ``pm.Minibatch``: loc 0, and
    the group index found behind the minibatch.

    Mutation: ``data.add(strip_minibatch(index))`` -> ``data.add(index)``: the minibatch
    output is no data variable, so no group index is recorded."""
    group = np.repeat(np.arange(4), [1, 2, 3, 6])
    with pm.Model() as model:
        g = pm.Data("g", group)
        tau = pm.HalfNormal("tau")
        z = pm.Normal("z", shape=4)
        g_batch, y_batch = pm.Minibatch(g, np.zeros(12), batch_size=4)
        pm.Normal("y", mu=(z * tau)[g_batch], sigma=1, observed=y_batch, total_size=12)
    [effect] = find_loc_scale_effects(model)
    assert (effect.centred, effect.loc, effect.loc_value, effect.scale) == (
        False,
        None,
        0.0,
        "tau_log__",
    )
    np.testing.assert_array_equal(effect.group_counts(), [1, 2, 3, 6])


def _not_effects(kind: str) -> pm.Model:
    """Models whose group effects are no loc-scale effect (or not one this module handles)."""
    rng = np.random.default_rng(0)
    group = rng.integers(4, size=30)
    y = rng.standard_normal(30)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        tau = pm.HalfNormal("tau")
        if kind == "z_sigma_2":
            a = mu + tau * pm.Normal("z", 0.0, 2.0, shape=4)
        elif kind == "studentt_z_sigma_2":
            a = mu + tau * pm.StudentT("z", nu=4, mu=0.0, sigma=2.0, shape=4)
        elif kind == "laplace":
            a = pm.Laplace("a", mu=mu, b=tau, shape=4)
        elif kind == "z_read_elsewhere":
            z = pm.Normal("z", 0.0, 1.0, shape=4)
            a = mu + tau * z
            pm.Normal("y2", mu=z[group], sigma=1.0, observed=y)
        elif kind == "vector_scale":
            tau_g = pm.HalfNormal("tau_g", shape=4)
            a = pm.Deterministic("a", mu + tau_g * pm.Normal("z", shape=4))
        elif kind == "interval_scale":
            s = pm.Uniform("s", 0.0, 5.0)
            a = pm.Normal("a", mu, s, shape=4)
        elif kind == "not_read":
            a = pm.Normal("a", mu, tau, shape=4)
            pm.Normal("b", a, 1.0, shape=4)
            a = mu * np.ones(4)
        pm.Normal("y", mu=a[group], sigma=1.0, observed=y)
    return model


# Mutations each case was seen to fail on:
#   z_sigma_2:        ``np.all(sigma == 1.0)`` -> ``True``
#   studentt_z_sigma_2: ``np.all(sigma == 1.0)`` -> ``True``
#   laplace:          ``_loc_scale_params``' last ``return None`` ->
#                     ``return tuple(op.dist_params(rv.owner))[-2:]`` (any family accepted)
#   z_read_elsewhere: ``if z_rv in _walk(...)`` -> ``if False``
#   vector_scale:     ``sl.stop - sl.start != 1`` -> ``False``
#   interval_scale:   ``transform is None or isinstance(transform, LogTransform)`` -> ``True``
#   not_read:         ``if match is None or rv not in read`` -> ``if match is None``
@pytest.mark.parametrize(
    "kind",
    [
        "z_sigma_2",
        "studentt_z_sigma_2",
        "laplace",
        "z_read_elsewhere",
        "vector_scale",
        "interval_scale",
        "not_read",
    ],
)
def test_does_not_detect_other_effects(kind):
    """Only loc-scale effects are reported: other priors (a Laplace, a Student-t about 0 with
    sd 2), shapes, transforms and uses give no record (never a wrong one)."""
    assert find_loc_scale_effects(_not_effects(kind)) == []


def test_held_variables_are_not_effects(noncentred):
    """Raveled over the sampled variables only, an effect whose scale is held is dropped and
    the slices follow the given order.

    Mutation: ``if sl is None or sl.stop - sl.start != 1`` -> ``if sl.stop - sl.start != 1``
    (a held scale is then looked up: a TypeError)."""
    model = noncentred.model
    mu_a, tau_log, slope, z = model.value_vars
    [effect] = find_loc_scale_effects(model, [z, slope, tau_log, mu_a])
    assert (effect.effect_slice, effect.scale_slice, effect.loc_slice) == (
        slice(0, N_GROUPS),
        slice(N_GROUPS + 1, N_GROUPS + 2),
        slice(N_GROUPS + 2, N_GROUPS + 3),
    )
    assert find_loc_scale_effects(model, [mu_a, slope, z]) == []


# ---------------------------------------------------------------------------------------------
# the bijection


def test_round_trip(compiled):
    """``to_model(from_model(theta)) == theta`` and back, for every centring.

    Mutation: ``/ self._factor(theta)`` -> ``* self._factor(theta)`` in ``from_model``."""
    rng = np.random.default_rng(1)
    for effect in compiled.effects:
        for c in _centrednesses(effect, rng):
            reparam = LocScaleReparam(effect, c)
            theta = compiled.random_theta(rng)
            np.testing.assert_allclose(reparam.to_model(reparam.from_model(theta)), theta)
            phi = compiled.random_theta(rng)
            np.testing.assert_allclose(reparam.from_model(reparam.to_model(phi)), phi)


def test_centring_means_what_it_says(noncentred, centred):
    """At ``c = 1`` the sampler's ``w`` is the group effect ``a = mu + tau z``; at ``c = 0`` it
    is ``z = (a - mu) / tau``, in either model.

    Mutation: ``self.power = effect.model_centredness - self.centredness`` ->
    ``self.centredness - effect.model_centredness`` (a consistent bijection, inverse and
    Jacobian, but to the wrong coordinates)."""
    rng = np.random.default_rng(2)
    for compiled in (noncentred, centred):
        [effect] = compiled.effects
        theta = compiled.random_theta(rng)
        mu, tau = theta[effect.loc_slice], np.exp(theta[effect.scale_slice])
        t = theta[effect.effect_slice]
        a, z = (t, (t - mu) / tau) if effect.centred else (mu + tau * t, t)
        for c, expected in ((1.0, a), (0.0, z)):
            phi = LocScaleReparam(effect, c).from_model(theta)
            np.testing.assert_allclose(phi[effect.effect_slice], expected, rtol=1e-12)
            rest = np.ones(theta.size, dtype=bool)
            rest[effect.effect_slice] = False
            np.testing.assert_array_equal(phi[rest], theta[rest])


def test_log_jacobian_is_numerical_log_det(compiled):
    """``log_jacobian`` equals ``slogdet`` of the finite-difference Jacobian of ``to_model``.

    Mutation: ``out = log_scale * self.power.sum()`` -> ``out = -log_scale *
    self.power.sum()``."""
    rng = np.random.default_rng(3)
    for effect in compiled.effects:
        for c in _centrednesses(effect, rng):
            reparam = LocScaleReparam(effect, c)
            phi = compiled.random_theta(rng)
            sign, logdet = np.linalg.slogdet(_numerical_jacobian(reparam.to_model, phi))
            assert sign != 0
            np.testing.assert_allclose(reparam.log_jacobian(phi), logdet, atol=1e-7)


def _phi_logp(compiled: _Compiled, reparam) -> Callable[[np.ndarray], float]:
    return lambda phi: compiled.logp(reparam.to_model(phi)) + reparam.log_jacobian(phi)


def test_pullback_is_gradient_of_phi_density(compiled):
    """``pullback(phi, dlogp(to_model(phi)))`` is the finite-difference gradient of
    ``logp(to_model(phi)) + log_jacobian(phi)``, the model's compiled ``logp``/``dlogp``.

    Mutations: ``np.sum(g_t * (m - c * factor), ...)`` -> ``np.sum(g_t * (m - c), ...)``
    (loc); ``+ self.power.sum()`` dropped (the Jacobian's gradient); ``1.0 / value`` ->
    ``np.ones_like(value)`` (an untransformed scale: the ``variants`` case)."""
    rng = np.random.default_rng(4)
    for effect in compiled.effects:
        for c in _centrednesses(effect, rng):
            reparam = LocScaleReparam(effect, c)
            phi = reparam.from_model(compiled.random_theta(rng))
            grad = reparam.pullback(phi, compiled.dlogp(reparam.to_model(phi)))
            numerical = _numerical_jacobian(_phi_logp(compiled, reparam), phi, step=1e-5)
            np.testing.assert_allclose(grad, numerical, rtol=1e-5, atol=1e-4)


def _assert_layer_density(layer, moved, maps, rng: np.random.Generator) -> None:
    """At two random ``phi``: the layer ``moved`` (``layer`` in the coordinates of ``maps``)
    has ``layer``'s log density at ``maps.to_model(phi)`` plus the log-Jacobian, and its
    compiled gradient is the numpy pullback."""
    for _ in range(2):
        phi = 0.5 * rng.standard_normal(layer.dim)
        lp, grad = moved.full_logp_grad(phi)
        lp_model, grad_model = layer.full_logp_grad(maps.to_model(phi))
        assert lp == pytest.approx(lp_model + maps.log_jacobian(phi), rel=1e-10)
        np.testing.assert_allclose(grad, maps.pullback(phi, grad_model), atol=1e-8)


def _assert_composition(compiled: _Compiled, both: LocScaleReparams, theta: np.ndarray) -> None:
    """The composition inverts at ``theta``; its log-Jacobian is the numerical
    log-determinant and its pullback the finite-difference gradient of the density in phi."""
    np.testing.assert_allclose(both.to_model(both.from_model(theta)), theta)
    phi = both.from_model(theta)
    _, logdet = np.linalg.slogdet(_numerical_jacobian(both.to_model, phi))
    np.testing.assert_allclose(both.log_jacobian(phi), logdet, atol=1e-7)
    grad = both.pullback(phi, compiled.dlogp(both.to_model(phi)))
    numerical = _numerical_jacobian(_phi_logp(compiled, both), phi, step=1e-5)
    np.testing.assert_allclose(grad, numerical, rtol=1e-5, atol=1e-4)


def test_several_effects_compose(variants):
    """Both effects of the variants model at once: inverse, log-Jacobian and pullback of the
    composition; overlapping effects are refused.

    Mutation: ``sum((r.log_jacobian(phi) for r in self.reparams), 0.0)`` ->
    ``self.reparams[0].log_jacobian(phi)``."""
    rng = np.random.default_rng(5)
    b, c = variants.effects
    both = LocScaleReparams(
        [LocScaleReparam(b, rng.uniform(size=b.n_groups)), LocScaleReparam(c, [1, 0, 1, 0])]
    )
    _assert_composition(variants, both, variants.random_theta(rng))
    with pytest.raises(ValueError, match="share entries"):
        LocScaleReparams([LocScaleReparam(b, 0.0), LocScaleReparam(b, 1.0)])


def test_nested_effects_compose(nested_noncentred):
    """The parents' effect and the groups nested in them, given children first: the maps
    run parents first, so the composition inverts, its log-Jacobian is the numerical
    log-determinant and its pullback the finite-difference gradient.

    Mutation: ``self._order = _parents_first(self._feeds)`` -> ``list(range(...))`` in
    ``LocScaleReparams``: the groups read their parents in the sampler's coordinates."""
    rng = np.random.default_rng(7)
    parent_b, groups = nested_noncentred.effects
    both = LocScaleReparams(
        [
            LocScaleReparam(groups, rng.uniform(size=groups.n_groups)),
            LocScaleReparam(parent_b, [1.0, 0.3, 0.8]),
        ]
    )
    assert both.parents_first == [1, 0]
    theta = nested_noncentred.random_theta(rng)
    centred_groups = LocScaleReparams(
        [LocScaleReparam(groups, 1.0), LocScaleReparam(parent_b, [1.0, 0.3, 0.8])]
    )
    b = theta[0] + np.exp(theta[1]) * theta[3:6]
    a = b[PARENT] + np.exp(theta[2]) * theta[6:]
    np.testing.assert_allclose(centred_groups.from_model(theta)[6:], a)  # w = a at c = 1
    _assert_composition(nested_noncentred, both, theta)


@pytest.mark.parametrize("form", ["three_noncentred", "three_centred"])
def test_three_levels_compose(form, request):
    """Countries, regions and groups at random centrednesses, given in any order: the maps
    run top level first, so the composition inverts, its log-Jacobian is the numerical
    log-determinant and its pullback (through the groups' ``loc``, up two levels) the
    finite-difference gradient.

    Mutation: ``self.loc_parent.add_pullback(x, per_parent, out)`` dropped in
    ``ParentLoc.add_pullback`` (the non-centred groups' ``loc`` read the countries, whose
    gradient is then lost); ``_parents_first`` replaced by the given order."""
    compiled = request.getfixturevalue(form)
    rng = np.random.default_rng(9)
    countries, regions, groups = compiled.effects
    three = LocScaleReparams(
        [LocScaleReparam(e, rng.uniform(size=e.n_groups)) for e in (groups, countries, regions)]
    )
    assert three.parents_first == [1, 2, 0]
    _assert_composition(compiled, three, compiled.random_theta(rng))


def test_density_in_phi_keeps_normalisation(noncentred):
    """Integrated over one group's ``w_j`` (everything else fixed, the other groups left in
    the model's coordinates) the density in ``phi`` has the model density's integral over
    ``z_j`` (trapezoid rule on wide grids).

    Mutation: ``out = log_scale * self.power.sum()`` -> ``out = 0.0 * log_scale``."""
    [effect] = noncentred.effects
    theta = noncentred.theta0.copy()
    theta[effect.scale_slice] = np.log(0.5)
    group = int(np.argmin(effect.group_counts()))
    j = effect.effect_slice.start + group
    for c in (1.0, 0.5):
        reparam = LocScaleReparam(effect, np.where(np.arange(N_GROUPS) == group, c, 0.0))
        phi = reparam.from_model(theta)
        log_integrals = []
        for density, centre, x in (
            (noncentred.logp, theta[j], theta),
            (_phi_logp(noncentred, reparam), phi[j], phi),
        ):
            grid = centre + np.linspace(-12.0, 12.0, 2001)
            values = []
            for v in grid:
                x = x.copy()
                x[j] = v
                values.append(density(x))
            values = np.asarray(values)
            top = values.max()
            log_integrals.append(top + np.log(np.trapezoid(np.exp(values - top), grid)))
        np.testing.assert_allclose(log_integrals[1], log_integrals[0], atol=1e-6)


def test_batches_and_settings(noncentred):
    """Leading batch axes map row by row; a centredness outside [0, 1] is refused.

    Mutation: ``return float(out) if np.ndim(out) == 0 else out`` -> ``return
    float(np.sum(out))``."""
    [effect] = noncentred.effects
    rng = np.random.default_rng(6)
    reparam = LocScaleReparam(effect, rng.uniform(size=N_GROUPS))
    phis = np.stack([noncentred.random_theta(rng) for _ in range(3)])
    grads = rng.standard_normal(phis.shape)
    np.testing.assert_allclose(reparam.to_model(phis), [reparam.to_model(p) for p in phis])
    np.testing.assert_allclose(reparam.from_model(phis), [reparam.from_model(p) for p in phis])
    np.testing.assert_allclose(reparam.log_jacobian(phis), [reparam.log_jacobian(p) for p in phis])
    np.testing.assert_allclose(
        reparam.pullback(phis, grads), [reparam.pullback(p, g) for p, g in zip(phis, grads)]
    )
    with pytest.raises(ValueError, match="centredness"):
        LocScaleReparam(effect, 1.5)
