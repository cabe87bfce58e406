"""Hierarchical models at big-data scale against NUTS or exact references (slow; CI runs
them): non-centred, crossed, two- and three-level and data-poor centred hierarchies, each sampled in
the coordinates the data pin down (``pymc_bigdata.step_methods.coordinates``), and the
alarms of the runs that cannot work. Bars and references: ``tests/hard_checks.py``.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import sample_two_chains
from correlated_slopes import correlated_poor_groups, correlated_slopes
from hard_checks import (
    REFERENCES,
    SD_BIAS,
    assert_bars,
    assert_bars_everywhere,
    check_against_reference,
    reference,
    unconstrained_draws,
)
from hard_models import (
    crossed_logistic,
    crossed_ratings,
    group_regression,
    hier_logistic,
    make_sparse_regions_data,
    sparse_regions,
    t_effects,
    three_level,
    two_level_logistic,
)

import pymc_bigdata as pmbd
from pymc_bigdata.model.whitening import WhitenedLocScale

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------- re-centred hierarchies
@pytest.mark.parametrize("cls", [pmbd.SBPS, pmbd.AusterityMH], ids=["sbps", "austerity"])
def test_noncentred_hierarchy_recentred(cls):
    """The two samplers that failed on the non-centred hierarchy in its own coordinates (at
    ca7cf3f, seed 2026: SBPS 0.180 sd with its alarm, AusterityMH 4.5 sd with its alarm,
    ``benchmarks/results/hard_targets_redesign.md``) meet their bars with defaults, which
    sample its data-rich groups centred (:mod:`pymc_bigdata.step_methods.coordinates`), with no
    alarm. Watched failing with ``reparameterize`` defaulting to False."""
    if not (REFERENCES / "hier_logistic_noncentred.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model = hier_logistic(centred=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, cls(model=model), seed=2026)
    names = [v.name for v in model.value_vars]
    draws = np.concatenate([unconstrained_draws(model, idata, n) for n in names], axis=-1)
    draws = draws.reshape(-1, draws.shape[-1])
    ref = reference("hier_logistic_noncentred")
    ref_mean = np.concatenate([np.atleast_1d(ref[f"{n}__mean"]) for n in names])
    ref_sd = np.concatenate([np.atleast_1d(ref[f"{n}__sd"]) for n in names])
    assert_bars(cls, draws.mean(0), draws.std(0), ref_mean, ref_sd)


# ---------------------------------------------------------------------- a MAP outside the bulk
@pytest.mark.parametrize("centred", [False, True], ids=["noncentred", "centred"])
def test_mode_outside_the_bulk_is_reported(centred):
    """In the model's own coordinates (``reparameterize=False``), the non-centred
    hierarchical model's joint mode is ~9 posterior sds from the bulk: the first window says
    so (a ModeWarning naming the coordinate and the fix). The centred model's MAP is within
    1 sd of the bulk: no such warning."""
    model = hier_logistic(centred=centred)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.sample(
            step=pmbd.SGHMC(reparameterize=False),
            tune=300,
            draws=5,
            chains=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    reported = [
        w
        for w in caught
        if issubclass(w.category, pmbd.ModeWarning) and "does not describe" in str(w.message)
    ]
    assert bool(reported) is not centred


@pytest.mark.parametrize("cls", [pmbd.SGHMC, pmbd.SGLD], ids=["sghmc", "sgld"])
@pytest.mark.parametrize("coordinates", ["recentred", "model"])
def test_noncentred_hierarchical_defaults(cls, coordinates):
    """The non-centred model, whose joint mode is ~9 sds from the bulk in its own
    coordinates. By default its data-rich groups are sampled centred (:mod:`.coordinates`),
    where the MAP is close to the bulk: no ModeWarning. In the model's own coordinates
    (``reparameterize=False``) the first settled window re-fits the Laplace fit at the draws'
    mean (full-data curvature and anchor there). Either way the chains meet the bars against
    the NUTS reference with no bias alarm (the MAP-based fit alone gave 5 sd errors and an
    ESS of 3)."""
    if not (REFERENCES / "hier_logistic_noncentred.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model = hier_logistic(centred=False)
    kwargs = {} if coordinates == "recentred" else {"reparameterize": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        if coordinates == "recentred":
            warnings.simplefilter("error", pmbd.ModeWarning)
            idata = sample_two_chains(model, cls(model=model), seed=2026)
        else:
            with pytest.warns(pmbd.ModeWarning, match="does not describe"):
                idata = sample_two_chains(model, cls(model=model, **kwargs), seed=2026)
    ref = reference("hier_logistic_noncentred")
    check_against_reference(model, idata, ref, SD_BIAS[cls])
    assert_bars_everywhere(cls, model, idata, ref)


def test_groups_about_a_regression_on_group_covariates():
    """Varying intercepts about ``gamma[0] + gamma[1] u_j`` written non-centred
    (``group_regression``: 100,000 rows, 40 groups of 5 to 19,061 rows), against the exact
    reference: the groups' ``loc`` is read as a regression (:mod:`pymc_bigdata.model.
    linear_loc`), so the data-rich groups are sampled centred about it, and SGHMC's defaults
    meet the bars on every coordinate with no alarm. Watched failing with ``linear_loc``
    returning None (the model's own coordinates: 2.4 sd off, min bulk ESS 2, a crawl alarm;
    ``benchmarks/results/hard_targets_group_regression_182b0c4.md``)."""
    model = group_regression(centred=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, pmbd.SGHMC(model=model), seed=2026)
    ref = reference("group_regression")
    check_against_reference(model, idata, ref, SD_BIAS[pmbd.SGHMC])
    assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


@pytest.mark.parametrize(
    ("centred", "sampled_df"),
    [(False, False), (True, False), (False, True)],
    ids=["noncentred", "centred", "noncentred_nu_sampled"],
)
def test_student_t_effects_with_defaults(centred, sampled_df):
    """Heavy-tailed effects, ``StudentT(4)`` or ``StudentT(nu)`` with ``nu ~ Gamma(2, 0.1)``
    (``t_effects``: 50,000 Gaussian rows, 40 groups of 5 to 8,710 rows), against NUTS on the
    groups' sufficient statistics: they are loc-scale effects, so the data-rich groups are
    sampled centred and the data-poor ones not, and SGHMC's defaults meet the bars on every
    coordinate with no alarm. Watched failing with the Student-t branch of
    ``loc_scale._loc_scale_params`` returning None (the model's own coordinates): the
    non-centred cases (a crawl alarm with ``nu = 4``; 0.227 sd off, silently, with ``nu``
    sampled: ``benchmarks/results/hard_targets_t_effects_nu_9d0f1a3.md``); the centred one
    passes in either coordinates."""
    model = t_effects(centred=centred, sampled_df=sampled_df)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, pmbd.SGHMC(model=model), seed=2026)
    ref = reference("t_effects_nu" if sampled_df else "t_effects")
    check_against_reference(model, idata, ref, SD_BIAS[pmbd.SGHMC])
    assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


def test_noncentred_correlated_effects_with_defaults():
    """Correlated intercepts and slopes written non-centred the way PyMC's primer writes them
    (``mu + pt.dot(chol, z).T``, ``correlated_slopes``: 100,000 rows, 40 groups of 5 to
    ~19,000 rows), against the exact reference: the data-rich groups are sampled centred
    (:mod:`pymc_bigdata.model.correlated_reparam`), and SGHMC's defaults meet the bars on
    every coordinate with no alarm. Watched failing with ``find_correlated_effects``
    returning ``[]`` (the model's own coordinates: 37 sd off, min bulk ESS 2, alarmed;
    ``benchmarks/results/hard_targets_correlated_slopes_b6b1d5a.md``)."""
    model = correlated_slopes(centred=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        warnings.simplefilter("error", pmbd.ModeWarning)
        idata = sample_two_chains(model, pmbd.SGHMC(model=model), seed=2026)
    ref = reference("correlated_slopes")
    check_against_reference(model, idata, ref, SD_BIAS[pmbd.SGHMC])
    assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


#: the least bulk ESS over two chains a run on ``correlated_poor_groups`` may hold: the crawl
#: alarm's floor of 50 effective draws per chain
POOR_GROUPS_MIN_ESS = 100.0


@pytest.mark.parametrize("centred", [False, True], ids=["non_centred", "centred"])
def test_data_poor_correlated_effects_with_defaults(centred):
    """Correlated effects on 40 data-poor groups (``correlated_poor_groups``: 3 to 8 rows each),
    written either way, against NUTS: the groups are sampled non-centred (the rule read at
    the bulk's ``(mu, L)``, :mod:`pymc_bigdata.model.correlated_fit`; a centred
    ``pm.MvNormal`` read and moved), and SGHMC's defaults match every coordinate within its
    Monte Carlo error, hold at least ``POOR_GROUPS_MIN_ESS`` effective draws and raise no
    alarm, not even a ``ModeWarning``: the MAP's ``L`` is 4.5-9 times the bulk's, and the
    chains start from the bulk (:mod:`pymc_bigdata.step_methods.bulk_start`; watched failing
    with ``bulk_start`` returning None: the start is the MAP's fit. Until the windows stopped
    warning in coordinates the step chose, the tuning windows' ``ModeWarning`` caught it
    too; without it the run from the MAP met these checks, so the start is asserted). Within Monte
    Carlo error, not the fixed bars: ``log L11``'s left tail is long, and the MCSE of its sd
    at this ESS is about 10 % (seed 2026 ended at 0.171 sd with its alarm in
    ``benchmarks/results/hard_targets_correlated_poor_f3dd62c.md`` and at 0.092 sd, sd ratio
    1.166, without one, in another process: the same seed, round-off apart). Watched failing
    with the rule read at the MAP (non-centred: every group centred, 0.95 sd off, ESS 5, its
    alarm) and with the centred ``pm.MvNormal`` not read (its own coordinates: 0.405 sd off,
    an sd 8.2 times the reference's, ESS 20, no alarm).
    """
    model = correlated_poor_groups(centred=centred)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.ModeWarning)
        warnings.simplefilter("error", pmbd.BiasWarning)
        step = pmbd.SGHMC(model=model, batch_size=50)
        assert np.array_equal(step.laplace.center, step.layer.bulk.point)
        idata = sample_two_chains(model, step, seed=2026)
    check_against_reference(model, idata, reference("correlated_poor_groups"), SD_BIAS[pmbd.SGHMC])
    names = [v.name for v in model.value_vars]
    draws = np.concatenate([unconstrained_draws(model, idata, n) for n in names], axis=-1)
    ess = az.ess(az.convert_to_dataset({"theta": draws}), method="bulk")["theta"].values
    assert ess.min() >= POOR_GROUPS_MIN_ESS, ess.min()


def test_ten_row_minibatches_measure_the_noise_on_enough_rows():
    """SGHMC with 10-row minibatches on the non-centred hierarchy (groups of 20 to 2,000
    rows; ``benchmarks/results/alarm_calibration_hier.md``, seed 1). A small group's rows
    enter a 10-row minibatch in one draw of ~50, with weight N/n: measured on the draw's own
    10 rows, tuning's mean of the noise came out low in one chain, whose step was 3 times
    its twin's and whose draws of one group effect were 23 % too wide (the pooled sd 12.5 %),
    with no alarm. Measured on ``MEASURE_ROWS`` = 100 rows (ten minibatches), the run meets
    the bars with no BiasWarning. Caught: ``measure_rows = 0`` (the draw's own minibatch;
    sd ratio 1.125, watched failing)."""
    if not (REFERENCES / "hier_logistic_noncentred.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model = hier_logistic(centred=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, pmbd.SGHMC(model=model, batch_size=10), seed=1)
    ref = reference("hier_logistic_noncentred")
    assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


def test_crossed_ratings_residual_scale_with_defaults():
    """Crossed ratings (2,000 raters x 2,000 items, 20 ratings per rater, d = 4,004, written
    non-centred): SGHMC's defaults meet the bars on the globals (the scales and mu, where a
    small excess spread of the 4,000 effects adds up) and on every effect, with no bias
    alarm. Caught: ``noise_shift_bound=None`` (the noisiest coordinate's share bounded alone:
    the residual scale 0.238 sd off, silently; watched failing)."""
    if not (REFERENCES / "crossed_ratings.npz").exists():
        pytest.skip("reference not computed (tests/references/make_hier_references.py)")
    model = crossed_ratings(centred=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, pmbd.SGHMC(model=model), seed=2026)
    ref = reference("crossed_ratings")
    assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


def test_crossed_binary_ratings_start_from_the_bulk():
    """Crossed binary ratings (2,000 raters x 2,000 items, 20 each, a covariate; d = 4,004,
    written centred): the per-group coordinates have no usable mode (the scales collapse),
    so SGHMC's defaults start from the diagonal Gaussian at the bulk's reading
    (:mod:`pymc_bigdata.step_methods.bulk_start`), meet the bars on every coordinate and
    raise no ``ModeWarning`` or ``BiasWarning``. Caught (watched failing): the large-d
    bulk start off (the fallback's "no usable mode" warning at the initial point); the
    windows' ``ModeWarning`` on a fit read at the bulk (5.6 and 6.3 sds in ``log s_i``)."""
    if not (REFERENCES / "crossed_logistic.npz").exists():
        pytest.skip("reference not computed (tests/references/make_hier_references.py)")
    model = crossed_logistic(centred=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        warnings.simplefilter("error", pmbd.ModeWarning)
        step = pmbd.SGHMC(model=model)
        np.testing.assert_array_equal(step.laplace.center, step.layer.bulk.point)
        idata = sample_two_chains(model, step, seed=2026)
    assert_bars_everywhere(pmbd.SGHMC, model, idata, reference("crossed_logistic"))


def test_whitened_crossed_ratings_are_read_at_a_mode():
    """The crossed ratings written centred, ``reparameterize="whiten"``: the model's own MAP
    is where the scales collapse (``log s`` near -21, the residual sd 2.2 times its
    posterior's), so the groups are read at the per-group centring's mode instead: every
    ``kappa_j`` is 20 ratings over the residual variance there (20 / 0.92), the whitened
    layer's MAP is a usable mode with every group's ``w_j`` at 0 and its curvature read
    near 1 (the exact value on this Gaussian model). Caught (watched failing): the groups
    read at the model's MAP (``kappa_j`` 4.2, ``w_j`` up to 2.5, no usable mode); the
    curvature read by plain probes only (some below 0: no usable mode); the scaled probes'
    pilot without the first read's sd (a group's curvature read 0.29)."""
    model = crossed_ratings(centred=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC(model=model, reparameterize="whiten")
    reparams = step.layer.reparam.reparams
    assert all(isinstance(r, WhitenedLocScale) for r in reparams)
    mode = step.layer.map_estimate()
    sigma = np.exp(mode.theta[3])  # mu, s_r, s_i, sigma, then r and i
    for r in reparams:
        np.testing.assert_allclose(r.kappa, 20.0 / sigma**2, rtol=0.05)
    assert mode.problem is None
    effects = np.concatenate([mode.theta[r.effect.effect_slice] for r in reparams])
    assert np.max(np.abs(effects)) < 0.05
    curvature = np.concatenate([mode.hessian[r.effect.effect_slice] for r in reparams])
    assert 0.6 < curvature.min() and curvature.max() < 1.5


def test_two_level_hierarchy_with_defaults():
    """Groups nested in regions, written non-centred (``two_level_logistic``: 60 groups of
    5 to 6,929 rows in 6 regions, 60,000 rows, ``a = b[region] + tau_a z_a`` with
    ``b = mu + tau_b z_b``): SGHMC's defaults sample the groups centred about their regions'
    effects (:mod:`pymc_bigdata.model.nested_loc`) and meet the bars everywhere against
    full-data NUTS, with no bias alarm. Caught: ``return self.parent(var)`` -> ``return
    None`` in ``loc_scale._Layout.loc`` (the groups centred about 0 instead: the chain
    crawls, min ESS 19, 0.253 sd off, its alarm raised; watched failing)."""
    if not (REFERENCES / "two_level_logistic.npz").exists():
        pytest.skip("reference not computed (tests/references/make_hier_references.py)")
    model = two_level_logistic(centred=False)
    step = pmbd.SGHMC(model=model)
    [nested] = [r for r in step.layer.reparam.reparams if r.effect.parent is not None]
    assert nested.effect.parent.name == "b"
    assert np.any(nested.centredness > 0.9)  # the data-rich groups sampled centred
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=2026)
    assert_bars_everywhere(pmbd.SGHMC, model, idata, reference("two_level_logistic"))


@pytest.fixture(scope="module")
def three_level_noncentred_run():
    """SGHMC's defaults on the non-centred ``three_level`` (seed 2026), a BiasWarning an
    error."""
    if not (REFERENCES / "three_level.npz").exists():
        pytest.skip("reference not computed (tests/references/make_hier_references.py)")
    return _sghmc_defaults_run(three_level(centred=False))


def test_three_level_hierarchy_with_defaults(three_level_noncentred_run):
    """Groups in regions in countries, written non-centred (``three_level``: 48 groups of 5
    to 8,828 rows in 12 regions in 4 countries, 60,000 rows, each level ``loc + scale * z``
    about the one above): SGHMC's defaults sample every level about its parents' effect (the
    groups' ``loc`` read through the regions' up to the countries,
    ``ParentLoc.loc_parent``) and meet the bars against full-data NUTS, with no bias alarm,
    on every coordinate but ``log tc``'s sd (the next test). Caught, watched failing:
    ``isinstance(match[1], LinearLoc)`` -> ``isinstance(match[1], ParentLoc | LinearLoc)``
    in ``loc_scale._Layout.parent`` (the two-level rule: the groups are not an effect, and
    the chain's bias alarm, an error here, is raised; 22 sd off at ESS 2 in the benchmark
    at 9e82bbb)."""
    model, step, idata = three_level_noncentred_run
    levels = {r.effect.name: r for r in step.layer.reparam.reparams}
    assert levels["a"].effect.parent.loc_parent.name == "c"
    assert np.any(levels["a"].centredness > 0.9)  # the data-rich groups sampled centred
    assert_bars_everywhere(
        pmbd.SGHMC, model, idata, reference("three_level"), sd_unjudged=("tc_log__",)
    )


@pytest.mark.xfail(strict=True, reason="known defect: log tc's left tail is under-sampled")
def test_the_countries_scale_keeps_its_left_tail(three_level_noncentred_run):
    """Known defect, kept as a strict xfail so that its fix shows: ``log tc`` of
    ``three_level`` (4 countries) has a long left tail (reference sd 0.688), which every
    sampler's defaults sample too little of (sd ratio 0.738-0.921 in 11 of 14 runs at
    f358780, ``benchmarks/results/hard_targets_three_level_f358780.md``; 0.870 for SGHMC
    here), as ``sparse_regions``' ``log tau_b`` below. A bias, not a short run: 0.814 over
    2 x 5,000 draws (``hard_targets_three_level_long_be66a06.md``). Full-data gradients
    restore most of the tail and a smaller step alone does not
    (``benchmarks/results/three_level_tail.md``: the exact marginal's share below -3, 1.06 %,
    against 0.25 % at the defaults, 0.25 % at a step of 0.1, 0.80 % at ``batch_size`` N).
    The control variates are 51 times noisier in that tail than in the bulk;
    ``local_batch=True`` (off by default) sizes each draw's minibatch from the noise measured
    where the last one ended: 5 of 6 seeds in band, 2026 not (0.821;
    ``benchmarks/results/local_batch.md``)."""
    model, _, idata = three_level_noncentred_run
    ref = reference("three_level")
    ratio = unconstrained_draws(model, idata, "tc_log__").std() / ref["tc_log____sd"][0]
    assert 0.9 <= ratio <= 1.1, f"log tc's sd ratio {ratio:.3f}"


def test_three_level_reference_agrees_with_the_exact_scales():
    """The full-data NUTS reference of ``three_level`` and the exact marginals of its three
    scales (``tests/references/three_level_scales.py``: the model integrated over its
    Gaussian effects given ``slope`` and ``sigma``, on a grid) agree within 3 of NUTS's
    MCSEs in each scale's mean and sd: the two references judge the tail of ``log tc``
    alike (exact sd 0.671, NUTS 0.688 +- 0.022;
    ``benchmarks/results/three_level_tail.md``). Caught (watched): the groups' countries
    read as ``region % 3`` (``log tc``'s mean 67 MCSEs off); the log transform's Jacobian
    left out of ``tc``'s prior (the grid's tail check refuses it)."""
    spec = importlib.util.spec_from_file_location(
        "three_level_scales", REFERENCES / "three_level_scales.py"
    )
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    ref = reference("three_level")
    for name, (grid, weights) in exact.reference_marginals().items():
        mean, sd = exact.moments(grid, weights)
        mean_z = (ref[f"{name}__mean"][0] - mean) / ref[f"{name}__mean_se"][0]
        sd_z = (ref[f"{name}__sd"][0] - sd) / ref[f"{name}__sd_se"][0]
        assert abs(mean_z) < 3 and abs(sd_z) < 3, (name, mean, sd, mean_z, sd_z)


@pytest.fixture(scope="module")
def sparse_regions_centred_run():
    """SGHMC's defaults on the centred ``sparse_regions`` (seed 2026), a BiasWarning an error."""
    return _sghmc_defaults_run(sparse_regions(centred=True))


def _sghmc_defaults_run(model: pm.Model) -> tuple:
    """The model, SGHMC's default step on it and its draws (seed 2026, a BiasWarning an
    error)."""
    step = pmbd.SGHMC(model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=2026)
    return model, step, idata


def test_data_poor_regions_of_a_centred_model_go_non_centred(sparse_regions_centred_run):
    """Two levels written centred with data-poor regions (``sparse_regions``: 12 regions,
    9 of them 1 or 2 groups of 3 to 8 rows; ``b ~ Normal(mu, tau_b)``, which the likelihood
    never reads): the regions' effect is re-centred through its groups
    (``group_fit.fit_parent``), data-poor regions less centred than data-rich ones, and
    SGHMC's defaults meet the bars against the exact posterior, with no bias alarm, on every
    coordinate but ``log tau_b``'s sd (the next test). Caught, each watched failing (the
    centredness checks removed, so that sampling decides): ``_mark_parents`` returning at
    once (``b`` left centred: the chain crawls, ESS 7 in ``mu``, its alarm raised); with the
    centredness checks, ``PARENT_SCALE_SDS = 0`` (data-poor regions' centredness up to
    0.89)."""
    model, step, idata = sparse_regions_centred_run
    [regions] = [r for r in step.layer.reparam.reparams if r.effect.children is not None]
    assert regions.effect.name == "b" and regions.effect.centred
    rich, poor = regions.centredness[:3], regions.centredness[3:]  # regions 0-2 data-rich
    assert np.all(poor < 0.5) and np.any(poor == 0.0) and np.all(rich > 0.5)
    assert_bars_everywhere(
        pmbd.SGHMC, model, idata, reference("sparse_regions"), sd_unjudged=("tau_b_log__",)
    )


@pytest.mark.xfail(strict=True, reason="known defect: log tau_b's left tail is under-sampled")
def test_the_regions_scale_keeps_its_left_tail(sparse_regions_centred_run):
    """Known defect, kept as a strict xfail so that its fix shows: ``log tau_b`` of
    ``sparse_regions`` has an exponential left tail (skew -2.8, kurtosis 25; 0.56 % of the
    mass below -3), and SGHMC's defaults sample too little of it: sd ratio 0.836 here, 0.87
    over 2 x 20,000 draws of the non-centred model (0.18 % of the draws below -3;
    ``benchmarks/results/sparse_regions_tail.md``, where single runs with less gradient
    noise or a smaller step are too short to show what fixes it). An exact sampler's 2,000
    independent draws land within [0.9, 1.1] 93 % of the time. Since the re-runs of stiff
    draws (``max_refinements``) 0.896 here; over 2 x 10,000 draws at seeds 1-4 the sd ratio
    is 0.86-1.05 (median 0.96) and the share below -4 0.6 times the exact one
    (``benchmarks/results/sparse_regions_tail_refinement.md``): better, not yet there."""
    model, _, idata = sparse_regions_centred_run
    ref = reference("sparse_regions")
    ratio = unconstrained_draws(model, idata, "tau_b_log__").std() / ref["tau_b_log____sd"][0]
    assert 0.9 <= ratio <= 1.1, f"log tau_b's sd ratio {ratio:.3f}"


def test_whitened_regions_keep_the_scales_left_tail():
    """The centred ``sparse_regions`` of the two tests above, sampled in whitened coordinates
    (``reparameterize="whiten"``): the regions' effect is whitened through its groups at
    their scale of the point (``whitening.ChildrenReading``), every data-poor region less
    centred at the bulk's scale than every data-rich one, and SGHMC's defaults meet the bars
    against the exact posterior on every coordinate, ``log tau_b``'s sd included (the known
    defect of the default coordinates, above), with no bias alarm.

    One seed of a kurtosis-25 coordinate is a weak judge (2,000 independent draws land
    within [0.9, 1.1] 93 % of the time); the three seeds of every sampler in
    ``benchmarks/results/sparse_regions_whitened_7197607_*.md`` are the measurement (the sd
    ratio's median over the runs 0.83 in the default coordinates, 0.92 whitened). Caught,
    each watched failing: ``reparameterize="centre"`` here (the sd of ``log tau_b`` 0.896);
    ``children`` not passed in ``coordinates._whitened`` (the regions whitened at the
    groups' bulk scale only: no children's reading, the first assertion)."""
    model = sparse_regions(centred=True)
    step = pmbd.SGHMC(model=model, reparameterize="whiten")
    [regions] = [r for r in step.layer.reparam.reparams if r.effect.children is not None]
    assert isinstance(regions, WhitenedLocScale) and regions.children is not None
    rich, poor = regions.centredness[:3], regions.centredness[3:]  # regions 0-2 data-rich
    assert rich.min() > poor.max(), (rich, poor)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=2026)
    assert_bars_everywhere(pmbd.SGHMC, model, idata, reference("sparse_regions"))


def _exact_share_below(threshold: float) -> float:
    """The exact posterior's share of ``log tau_b < threshold`` on ``sparse_regions`` (the
    grid of ``tests/references/make_sparse_regions_reference.py``, at the reference's
    ``slope`` and ``sigma``)."""
    spec = importlib.util.spec_from_file_location(
        "make_sparse_regions_reference", REFERENCES / "make_sparse_regions_reference.py"
    )
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    ref = reference("sparse_regions")
    slope, sigma = float(ref["slope__mean"][0]), float(np.exp(ref["sigma_log____mean"][0]))
    group, region, x, y = make_sparse_regions_data()
    n = np.bincount(group)
    ybar = np.bincount(group, weights=y - slope * x) / n
    weights = exact.log_scales_density(ybar, n, region, sigma).sum(axis=1)
    return float(weights[exact.LOG_TAU_B < threshold].sum())


def test_sghmc_reaches_the_regions_scales_left_tail():
    """Over 2 x 10,000 draws of the centred ``sparse_regions`` (seed 2026), SGHMC's defaults
    draw ``log tau_b`` below -3 at least a fifth as often as the exact posterior (0.56 %),
    without a divergence: a draw whose path was too stiff for the bulk's step is re-run at a
    finer one (``StepRefinement``); 0.37 % here. Caught (watched): ``max_refinements=0``
    (2,353 divergences here; at seeds 1-4 its chains drew below -3 in 0.05-0.34 % of their
    draws or stuck there with thousands of divergences,
    ``benchmarks/results/sparse_regions_tail_refinement.md``)."""
    _check_reaches_the_regions_scales_tail(pmbd.SGHMC, -3.0)


def _check_reaches_the_regions_scales_tail(sampler: Callable, threshold: float) -> None:
    """``sampler(model=...)``, 2 x 10,000 draws of the centred ``sparse_regions`` at seed
    2026: no divergence, and ``log tau_b`` below ``threshold`` at least a fifth as often as
    in the exact posterior."""
    model = sparse_regions(centred=True)
    idata = sample_two_chains(model, sampler(model=model), seed=2026, draws=10_000)
    share = float(np.mean(unconstrained_draws(model, idata, "tau_b_log__") < threshold))
    exact = _exact_share_below(threshold)
    assert idata.sample_stats["diverging"].values.sum() == 0
    assert share >= exact / 5, f"{share:.4%} of the draws below {threshold}, exact {exact:.4%}"


def test_hmcecs_perturbed_on_recentred_groups_expands_in_their_inputs():
    """Perturbed HMC-ECS with defaults on the centred two-level hierarchy, whose groups the
    step samples partially centred: it expands its control variates in the likelihood's
    inputs there (``hmcecs_tuning.RECENTRED_SPACE``), and every coordinate is within the
    MCSE bands of full-data NUTS (``check_posterior``, no widening). Caught:
    ``recentred = False`` in ``SubsampleTuner`` (the expansion in the sampler's parameters:
    ``tau_a`` 0.416 sd high, about 10 MCSE, silently; watched failing)."""
    if not (REFERENCES / "two_level_logistic.npz").exists():
        pytest.skip("reference not computed (tests/references/make_hier_references.py)")
    model = two_level_logistic(centred=True)
    step = pmbd.HMCECS(model=model)
    idata = sample_two_chains(model, step, seed=2026)
    assert idata.sample_stats["taylor_inputs"].values.all()
    check_against_reference(model, idata, reference("two_level_logistic"), 1.0)


# ---------------------------------------------------------------------- Austerity
def test_austerity_crawling_chain_is_flagged():
    """AusterityMH's defaults on the non-centred model in its own coordinates crawl (the
    proposal scale tuned to 0.13 of its Gaussian optimum, the draws 4.5 sds off the NUTS reference:
    ``benchmarks/results/hard_targets_austerity.md``); the collapsed scale raises a
    BiasWarning naming it instead of passing silently."""
    model = hier_logistic(centred=False)
    step = pmbd.AusterityMH(model=model, reparameterize=False)  # the model's own coordinates
    with pytest.warns(pmbd.BiasWarning, match="shrank the proposal scale"):
        sample_two_chains(model, step, seed=2026)
