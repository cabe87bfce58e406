"""Where a step samples: whitened or per-group centred coordinates for loc-scale effects.

What each test proves (and the one-line mutation of the package it was seen to fail on):

* ``sampling_layer`` re-centres a non-centred model's data-rich groups with the rule's
  centredness at the model's MAP (``"centre"``), or whitens them with the same fit's
  precisions and estimates (``"whiten"``), keeps the model's coordinates where
  the rule agrees with them (data-poor groups) and when asked to (``reparameterize=False``);
* a regions' effect whose groups the rule cannot measure is dropped (centred) or read from
  its rows (non-centred);
* a step sampling in those coordinates returns draws of the model's own variables, which
  match full-data NUTS on the same model within their Monte Carlo error.
"""

from __future__ import annotations

import warnings

import arviz as az
import cloudpickle
import numpy as np
import pymc as pm
import pytest
from hard_models import crossed_ratings_model, make_crossed_ratings_data

import pymc_bigdata as pmbd
from pymc_bigdata.model.group_fit import fit_groups, scale_at
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.reparam import choose_centredness
from pymc_bigdata.step_methods.coordinates import (
    NON_CENTRED_BELOW,
    REPARAM_MIN_CHANGE,
    REPARAMETERIZE_AUTO,
    check_reparameterize,
    loc_scale_effects,
    sampling_layer,
)


def _noncentred(
    sizes: list[int], tau: float, seed: int = 0, tau_prior: float = 1.0, centred: bool = False
) -> pm.Model:
    """``y ~ Normal(mu + tau * z[g], 1)``, groups of ``sizes`` rows, true sd ``tau``,
    ``tau ~ HalfNormal(tau_prior)`` (or ``y ~ Normal(a[g], 1)``, ``a ~ Normal(mu, tau)``)."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(sizes)), sizes)
    y = rng.normal(0.5 + tau * rng.standard_normal(len(sizes))[group], 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        scale = pm.HalfNormal("tau", tau_prior)
        if centred:
            a = pm.Normal("a", mu, scale, shape=len(sizes))
            pm.Normal("y", a[group], 1.0, observed=y)
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=len(sizes))
            pm.Normal("y", mu + scale * z[group], 1.0, observed=y)
    return model


RICH = [3, 30, 300, 3000]


def test_data_rich_groups_are_recentred_by_the_rule():
    """Mutation: ``if max(moves) <= REPARAM_MIN_CHANGE ...: return searched`` ->
    ``if True: return searched`` (never re-centre): the layer keeps ``c = 0``."""
    model = _noncentred(RICH, 0.7)
    layer = MinibatchModel(model)
    sampled = sampling_layer(layer, "centre")
    [reparam] = sampled.reparam.reparams
    [effect] = loc_scale_effects(layer)
    theta = layer.map_estimate().theta  # the model's MAP, where the fit starts
    fit = fit_groups(effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp)
    expected = choose_centredness(fit.information)
    expected[expected < NON_CENTRED_BELOW] = 0.0  # the group of 3 rows
    np.testing.assert_allclose(reparam.centredness, expected, rtol=1e-6)
    assert reparam.centredness[-1] > 0.99 and reparam.centredness.max() > REPARAM_MIN_CHANGE
    assert sampled.model_layer is layer
    assert sampling_layer(layer, check_reparameterize(False)) is layer


def test_data_rich_groups_are_whitened_with_the_fit():
    """``"whiten"`` moves the same groups as the rule would, each whitened by
    its fit's precision and estimate (their centredness at the bulk's scale the rule's), and
    starts its MAP search in those coordinates from the bulk's point: the cached MAP is a
    mode of the whitened density near the bulk's scale, ``w`` near 0. Mutations, each seen
    failing: ``WhitenedLocScale(e, f.kappa, f.estimate, f.scale)`` -> ``(e, f.kappa, 0.0,
    f.scale)`` (the estimates dropped: ``w`` of the data-rich groups far from 0);
    ``searched = layer.reparameterised(moved)`` -> ``searched = layer`` (no new layer)."""
    layer = MinibatchModel(_noncentred(RICH, 0.7))
    assert check_reparameterize("auto") == check_reparameterize(True) == REPARAMETERIZE_AUTO
    sampled = sampling_layer(layer, "whiten")
    [whitened] = sampled.reparam.reparams
    [effect] = loc_scale_effects(layer)
    theta = layer.map_estimate().theta
    fit = fit_groups(effect, theta, layer.full_loglik_grad, layer.full_loglik_hvp, layer.prior_logp)
    np.testing.assert_allclose(whitened.kappa, fit.kappa, rtol=1e-6)
    np.testing.assert_allclose(whitened.centredness, choose_centredness(fit.information), rtol=1e-6)
    assert sampled.model_layer is layer and sampled.reparam.moves_coordinates
    phi = sampled.map_estimate().theta
    assert np.max(np.abs(phi[effect.effect_slice])) < 0.5, phi
    assert abs(np.log(scale_at(effect, sampled.reparam.to_model(phi)) / fit.scale)) < 0.5


def test_steps_on_one_layer_share_its_sampling_layer(monkeypatch):
    """A second step on the same layer gets the same re-centred layer, with no second
    compile or MAP search (``MinibatchModel.derived``), and a pickled layer does not carry
    it. Mutations, each watched failing: ``sampling_layer`` returning
    ``_moved_layer(layer, coordinates)`` (built per step: another layer and a MAP search); no
    ``MinibatchModel.__getstate__`` (the pickle carries the re-centred layer)."""
    layer = MinibatchModel(_noncentred(RICH, 0.7))
    first = pmbd.SGHMC(model=layer.model, layer=layer).layer
    assert first.reparam is not None
    searches = []
    find_map = MinibatchModel.find_map
    monkeypatch.setattr(
        MinibatchModel, "find_map", lambda self, start=None: searches.append(1) or find_map(self)
    )
    second = pmbd.SGLD(model=layer.model, layer=layer).layer
    assert second is first and not searches
    # the pickle does not carry the moved layer (since whitening searches the MAP on the
    # model's own layer, its size grows by that layer's compiled functions: not compared)
    assert layer._derived and cloudpickle.loads(cloudpickle.dumps(layer))._derived == {}


def test_coordinates_do_not_depend_on_how_the_model_is_written():
    """200 groups of 10 rows, true sd 0.5: the joint MAP's scale is about 5x too large when
    the model is written non-centred and collapses towards 0 when centred; the coordinates
    come from the bulk's scale either way, so both writings get the same centredness
    (``h = 10 tau^2 ~ 2.5``, ``c ~ 0.7``) and a MAP in them whose scale is the bulk's.

    Mutation: ``chosen = [choose_centredness(group_information(e, theta, ...))]`` (the
    centredness at the MAP's scale, as first built): ``c = 0.99`` non-centred."""
    centredness, map_scales = [], []
    for centred in (False, True):
        layer = MinibatchModel(_noncentred([10] * 200, 0.5, seed=3, centred=centred))
        sampled = sampling_layer(layer, "centre")
        [reparam] = sampled.reparam.reparams
        centredness.append(reparam.centredness)
        theta = sampled.reparam.to_model(sampled.map_estimate().theta)
        map_scales.append(scale_at(reparam.effect, theta))
    assert 0.55 < centredness[0][0] < 0.85
    np.testing.assert_allclose(centredness[0], centredness[1], atol=0.02)
    assert 0.35 < min(map_scales) and max(map_scales) < 0.7, map_scales


def test_map_in_partially_centred_coordinates_of_a_crossed_model_is_a_mode():
    """Crossed ratings, 1,000 raters x 1,000 items of 20 ratings (d = 2,004, beyond the
    dense Hessian): in the rule's coordinates (``c`` ~ 0.85 and 0.93) L-BFGS stops on its
    relative-reduction rule with a Newton decrement of 0.0065, short of the mode, and the
    step would start at the model's initial point (SGHMC then crawled, 2,000 x 2,000).

    Mutation: ``_polish`` returning its ``result`` unchanged: ``problem`` is set."""
    rater, item, y = make_crossed_ratings_data(1000, 1000)
    layer = MinibatchModel(crossed_ratings_model(rater, item, y, centred=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampled = sampling_layer(layer, "centre")
    assert [r.centredness.min() > 0.8 for r in sampled.reparam.reparams] == [True, True]
    fit = sampled.map_estimate()
    assert fit.problem is None and fit.newton_decrement < 1e-6


def test_model_coordinates_kept_where_the_rule_agrees():
    """Groups of one or two rows and a ``tau`` held small by its prior: the rule's ``c_j``
    stay near 0, so the model's own non-centred coordinates are kept (the layer samples the
    model's density unchanged).

    Mutation: ``REPARAM_MIN_CHANGE = 0.0``: the groups are moved to ``c_j ~ 0.01``."""
    layer = MinibatchModel(_noncentred([1, 1, 2, 1], 0.1, seed=1, tau_prior=0.1))
    sampled = sampling_layer(layer, "centre")
    [reparam] = sampled.reparam.reparams
    np.testing.assert_array_equal(reparam.centredness, 0.0)
    theta = np.linspace(-0.5, 0.5, layer.dim)
    assert sampled.full_logp_grad(theta)[0] == pytest.approx(layer.full_logp_grad(theta)[0])
    assert sampling_layer(layer, "whiten") is layer  # no second layer where nothing moves


@pytest.mark.filterwarnings("ignore")
def test_draws_are_the_models_variables_and_match_nuts():
    """SGHMC in the re-centred coordinates against full-data NUTS on the same model: every
    variable's mean within 4 combined Monte Carlo standard errors, and its sd within 4
    combined MCSEs of the sd of NUTS's (up to SGHMC's noise knob, ``sqrt(1 + noise_bound)``).

    The sd bound was first a flat 15 %: on a cold compile cache (other bits, CI) tau's ratio
    came out 1.20, while NUTS's 2 x 1,000 draws put tau's sd at 0.268 with an MCSE of 0.023
    (8.5 %); a 4 x 5,000-draw NUTS run gives 0.281 +- 0.010 and SGHMC at three seeds
    0.293-0.306 (one-off runs), so the flat bound ignored the reference's own error.

    Mutation: ``self._last_output = output = theta`` in ``astep`` (the draws left in the
    sampler's coordinates): ``z`` of the data-rich groups comes back as ``w = a``, several
    sds off."""
    model = _noncentred(RICH, 0.7)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC(batch_size=300)
        assert step.layer.reparam is not None
        ours = pm.sample(step=step, chains=2, random_seed=11, progressbar=False)
        nuts = pm.sample(chains=2, random_seed=12, progressbar=False, target_accept=0.95)
    knob = np.sqrt(1.0 + step.noise_bound)
    for name in ("mu", "tau", "z"):
        a, b = ours.posterior[name], nuts.posterior[name]
        se = np.hypot(az.mcse(a).values, az.mcse(b).values)  # each mean's MCSE
        err = np.abs(a.mean(("chain", "draw")).values - b.mean(("chain", "draw")).values)
        assert np.all(err < 4 * se), (name, err, se)
        sd_a, sd_b = (x.std(("chain", "draw")).values for x in (a, b))
        sd_se = np.hypot(az.mcse(a, method="sd").values, az.mcse(b, method="sd").values)
        assert np.all(sd_a > sd_b - 4 * sd_se), (name, sd_a, sd_b, sd_se)
        assert np.all(sd_a < knob * sd_b + 4 * sd_se), (name, sd_a, sd_b, sd_se)


@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_regions_whose_groups_cannot_be_measured(centred):
    """Groups nested in regions but read through two indexes per row (``a[g1] + a[g2]``):
    the rule cannot measure the groups, so a centred regions' effect (read only through
    them) is dropped, and a non-centred one is read from its rows as before.

    Mutation: the filter keeping every ``indexed_only`` effect as it is (the centred ``b``
    stays, marked as read through groups that are not there)."""
    rng = np.random.default_rng(0)
    region = np.array([0, 0, 1, 1, 2])
    g1, g2 = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    with pm.Model() as model:
        mu, tau_b, tau_a = pm.Normal("mu"), pm.HalfNormal("tau_b"), pm.HalfNormal("tau_a")
        if centred:
            b = pm.Normal("b", mu, tau_b, shape=3)
            a = pm.Normal("a", b[region], tau_a, shape=5)
        else:
            b = pm.Deterministic("b", mu + tau_b * pm.Normal("z_b", shape=3))
            a = pm.Deterministic("a", b[region] + tau_a * pm.Normal("z_a", shape=5))
        pm.Normal("y", a[g1] + a[g2], 1.0, observed=rng.normal(size=200))
    effects = loc_scale_effects(MinibatchModel(model))
    if centred:
        assert effects == []
    else:
        [regions] = effects
        assert (regions.name, regions.children) == ("b", None)
