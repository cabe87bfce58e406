"""Statistical tests where the Laplace fit is not the answer (slow; CI runs them).

Targets (``tests/hard_models.py``) against exact references:

* the varying-intercept regression with 1,000 groups of 28 to 4,851 rows (10^6 rows,
  d = 1,003): analytic Gaussian posterior. First-order control variates make it unstable (a
  small group's stochastic curvature is ~36x its true one when its rows enter a minibatch);
  second-order ones make it exact;
* small or skewed posteriors (a scale parameter from 30 rows, a 400-row skewed logistic
  regression, hierarchical logistic models) against long NUTS references stored in
  ``tests/references/<name>.npz`` (made by ``tests/references/make_references.py``), in the
  unconstrained coordinates the samplers move in.

Tolerances: ``conftest.check_posterior`` (4.5 combined MCSE of the chain and the reference),
the SGLD sd band widened on one side by its documented ``1/sqrt(1 - eps/4)`` and both by the
step-size rule's documented noise-share bound (sd at most ``sqrt(1 + 0.05)`` too wide).  The
power check replaces the minibatch gradient by the Laplace fit's gradient: that sampler draws
from the Laplace approximation, and the same check must fail.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import check_posterior, sample_two_chains
from hard_models import (
    crossed_ratings,
    hier_logistic,
    make_many_groups_linear_data,
    make_sparse_regions_data,
    many_groups_linear_model,
    many_groups_linear_posterior,
    rare_event_logistic,
    sbps_paper_logistic,
    scale_few_rows,
    scale_regression,
    skewed_logistic,
    sparse_regions,
    two_level_logistic,
)

import pymc_bigdata as pmbd
from pymc_bigdata.adaptation import NOISE_SHARE_BOUND
from pymc_bigdata.step_methods.alarms import SUBSAMPLE_ACCEPT_ALARM
from pymc_bigdata.step_methods.gradient_oracle import MinibatchEstimator

pytestmark = pytest.mark.slow

REFERENCES = Path(__file__).parent.parent / "references"
NOISE_SD_BIAS = float(np.sqrt(1.0 + NOISE_SHARE_BOUND))
SD_BIAS = {
    pmbd.SGHMC: NOISE_SD_BIAS,
    pmbd.SGLD: NOISE_SD_BIAS / np.sqrt(1.0 - pmbd.SGLD.default_step_size / 4.0),
    pmbd.SBPS: 1.0,  # no discretisation; bound violations are reported, not budgeted for
}
#: the issue's bars for defaults: max |mean err| / sd and the sd-ratio band
BARS = {
    pmbd.SGHMC: (0.10, (0.90, 1.10)),
    pmbd.SGLD: (0.15, (0.85, 1.20)),
    pmbd.SBPS: (0.10, (0.90, 1.10)),
    pmbd.EWSG: (0.10, (0.90, 1.10)),
    pmbd.AusterityMH: (0.15, (0.85, 1.20)),
}
SAMPLERS = [pmbd.SGHMC, pmbd.SGLD, pmbd.SBPS]
IDS = ["sghmc", "sgld", "sbps"]


def _assert_bars(cls, mean, sd, ref_mean, ref_sd):
    max_err, (lo, hi) = BARS[cls]
    err = np.abs(mean - ref_mean) / ref_sd
    ratio = sd / ref_sd
    assert err.max() <= max_err, f"max |mean err| {err.max():.3f} sd > {max_err}"
    assert lo <= ratio.min() and ratio.max() <= hi, f"sd ratio [{ratio.min()}, {ratio.max()}]"


# ---------------------------------------------------------------------- 1,000 groups
@pytest.fixture(scope="module")
def many_groups():
    group, x, y = make_many_groups_linear_data()
    model = many_groups_linear_model(group, x, y)
    exact = many_groups_linear_posterior(group, x, y)
    mean = np.concatenate([exact["a__mean"], exact["b__mean"]])
    sd = np.concatenate([exact["a__sd"], exact["b__sd"]])
    return model, pmbd.MinibatchModel(model), mean, sd


@pytest.mark.parametrize("cls", [pmbd.SGHMC, pmbd.SGLD, pmbd.EWSG], ids=["sghmc", "sgld", "ewsg"])
def test_thousand_groups_with_defaults(cls, many_groups):
    """Defaults on 10^6 rows and d = 1,003 (groups of 28 to 4,851 rows) meet the bars against
    the exact posterior, with no divergence; second-order control variates are chosen."""
    model, layer, ref_mean, ref_sd = many_groups
    idata = sample_two_chains(model, cls(model=model, layer=layer), seed=11)
    post = idata.posterior
    draws = np.concatenate([post["a"].values, post["b"].values], axis=-1)
    _assert_bars(cls, draws.mean((0, 1)), draws.std((0, 1)), ref_mean, ref_sd)
    assert not idata.sample_stats["diverging"].values.any()
    assert (idata.sample_stats["cv_order"].values == 2).all()


# ---------------------------------------------------------------------- NUTS references
HARD = {
    # name: (model builder, batch size, sampler)
    "scale_few_rows": (scale_few_rows, 10),
    "skewed_logistic": (skewed_logistic, 100),
    "scale_regression": (scale_regression, None),
    "hier_logistic_centred": (lambda: hier_logistic(centred=True), None),
    # the SBPS paper's Sec. 7.1 logistic regression at its n = 100: nearly separable labels
    # stretch the posterior along the coefficients' common scale
    "sbps_paper_logistic": (sbps_paper_logistic, 100),
}


def _reference(name: str) -> dict[str, np.ndarray]:
    with np.load(REFERENCES / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def _unconstrained_draws(model, idata, value_name: str) -> np.ndarray:
    """Draws of a value variable (``sigma_log__`` = log sigma) from the constrained trace."""
    rv_name = value_name.removesuffix("_log__")
    draws = idata.posterior[rv_name].values
    draws = np.log(draws) if value_name.endswith("_log__") else draws
    return draws.reshape(draws.shape[0], draws.shape[1], -1)


def _assert_bars_everywhere(cls, model, idata, ref, sd_unjudged: tuple[str, ...] = ()) -> None:
    """Every coordinate of every value variable within ``cls``'s bars (``BARS``); the sds of
    the value variables named in ``sd_unjudged`` are left to a test of their own."""
    names = [v.name for v in model.value_vars]
    draws = np.concatenate([_unconstrained_draws(model, idata, n) for n in names], axis=-1)
    draws = draws.reshape(-1, draws.shape[-1])
    ref_mean = np.concatenate([np.atleast_1d(ref[f"{n}__mean"]) for n in names])
    ref_sd = np.concatenate([np.atleast_1d(ref[f"{n}__sd"]) for n in names])
    sd = draws.std(0)
    judged = np.concatenate(
        [np.full(np.size(ref[f"{n}__mean"]), n not in sd_unjudged) for n in names]
    )
    sd = np.where(judged, sd, ref_sd)
    _assert_bars(cls, draws.mean(0), sd, ref_mean, ref_sd)


def _check_against_reference(model, idata, ref, sd_bias):
    """Every value variable of the model against the reference, coordinate by coordinate."""
    results = {}
    for value in model.value_vars:
        name = value.name
        draws = _unconstrained_draws(model, idata, name)
        unconstrained = az.from_dict({"posterior": {name: draws}})
        results[name] = check_posterior(
            unconstrained,
            name,
            ref[f"{name}__mean"],
            ref[f"{name}__sd"],
            ref_mean_se=ref[f"{name}__mean_se"],
            ref_sd_se=ref[f"{name}__sd_se"],
            sd_bias_ratio=sd_bias,
        )
    return results


def _available(names):
    return [n for n in names if (REFERENCES / f"{n}.npz").exists()]


@pytest.mark.parametrize("name", _available(HARD))
@pytest.mark.parametrize("cls", SAMPLERS, ids=IDS)
def test_skewed_targets_against_nuts(cls, name):
    """Long chains (2 x 6,000 draws, sd bands of a few %) match the NUTS reference in the
    unconstrained coordinates, where the Laplace fit is measurably off."""
    builder, batch_size = HARD[name]
    model = builder()
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    idata = sample_two_chains(model, cls(model=model, **kwargs), seed=13, draws=6000)
    _check_against_reference(model, idata, _reference(name), SD_BIAS[cls])


@pytest.mark.parametrize("name", _available(HARD))
def test_laplace_gradient_sampler_fails(name, monkeypatch):
    """Power: SGLD driven by the Laplace fit's gradient instead of the minibatch gradient
    samples the Laplace approximation, and the same check rejects it."""
    builder, batch_size = HARD[name]
    model = builder()
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    step = pmbd.SGLD(model=model, adapt=False, **kwargs)
    fit = step.layer.map_estimate()

    def laplace_gradient(estimator, theta, rows, weights=None):
        return -fit.hessian @ (theta - fit.theta)

    def measured(estimator, theta, rows):
        return 0.0, laplace_gradient(estimator, theta, rows), None

    monkeypatch.setattr(MinibatchEstimator, "gradient", laplace_gradient)
    monkeypatch.setattr(MinibatchEstimator, "measured", measured)
    idata = sample_two_chains(model, step, seed=13, draws=6000)
    with pytest.raises(AssertionError):
        _check_against_reference(model, idata, _reference(name), SD_BIAS[pmbd.SGLD])


@pytest.mark.skipif(
    not (REFERENCES / "sbps_paper_logistic.npz").exists(), reason="reference not computed"
)
def test_psbps_with_the_papers_settings_on_the_papers_target():
    """The paper's own pSBPS (plain minibatch estimates of 100 rows, k = 3, no refreshment,
    Eq. 12's band, metric adapted throughout) on its Sec. 7.1 logistic regression, with
    pm.sample's defaults, meets the issue's bars for it: max |mean err| <= 0.15 sd, sd ratios
    in [0.85, 1.2]. (It is biased by its bound violations, so no MCSE band.)"""
    model = sbps_paper_logistic()
    step = pmbd.pSBPS(model=model, **pmbd.pSBPS.PAPER_SETTINGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=23)
    ref = _reference("sbps_paper_logistic")
    draws = idata.posterior["w"].values.reshape(-1, 20)
    mean_err, (lo, hi) = 0.15, (0.85, 1.2)
    err = np.abs(draws.mean(0) - ref["w__mean"]) / ref["w__sd"]
    ratio = draws.std(0) / ref["w__sd"]
    assert err.max() <= mean_err, f"max |mean err| {err.max():.3f} sd"
    assert lo <= ratio.min() and ratio.max() <= hi, f"sd ratio [{ratio.min()}, {ratio.max()}]"


# ---------------------------------------------------------------------- rare events
@pytest.fixture(scope="module")
def rare_event():
    """500,000 rows, 0.1 % events, a 250-row binary feature with no event (skewed)."""
    model = rare_event_logistic()
    return model, pmbd.MinibatchModel(model)


def test_rare_event_heating_is_flagged(rare_event):
    """The issue's failure, reproduced with the foundation's settings (no adaptation, first
    order, no census): the chain heats up, and its own statistics now say so (a bias alarm,
    and divergences where the log density falls by more than the threshold)."""
    model, layer = rare_event
    step = pmbd.SGHMC(model=model, layer=layer, adapt=False, control_variates="first", census=False)
    with pytest.warns(pmbd.BiasWarning, match="off its target"):
        idata = sample_two_chains(model, step, seed=17)
    # the noise-kicked excursions past the flag's likelihood wall are divergences too
    assert idata.sample_stats["diverging"].values.any()


@pytest.mark.parametrize("cls", SAMPLERS, ids=IDS)
def test_rare_event_defaults(cls, rare_event):
    """Defaults: the feature's 255 rows form the census stratum; against the importance-
    sampling reference the bars hold, and no sampler raises a bias alarm. SBPS's band is
    violated on 0.5-1 % of its proposals (about one event enters each 1,000-row minibatch,
    so Ĝ's noise is far from the Gaussian of Eq. 11), far beyond the regression's
    prediction but below the alarm's 1.25 % share: its sds come out 1-5 % wide, inside the
    bars, and its alarm stays quiet (it fired here before the share was required)."""
    if not (REFERENCES / "rare_event_logistic.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model, layer = rare_event
    step = cls(model=model, layer=layer)
    assert len(step.census) >= 250
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmbd.BiasWarning)
        idata = sample_two_chains(model, step, seed=19)
    ref = _reference("rare_event_logistic")
    draws = idata.posterior["beta"].values.reshape(-1, 5)
    _assert_bars(cls, draws.mean(0), draws.std(0), ref["beta__mean"], ref["beta__sd"])


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
    draws = np.concatenate([_unconstrained_draws(model, idata, n) for n in names], axis=-1)
    draws = draws.reshape(-1, draws.shape[-1])
    ref = _reference("hier_logistic_noncentred")
    ref_mean = np.concatenate([np.atleast_1d(ref[f"{n}__mean"]) for n in names])
    ref_sd = np.concatenate([np.atleast_1d(ref[f"{n}__sd"]) for n in names])
    _assert_bars(cls, draws.mean(0), draws.std(0), ref_mean, ref_sd)


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
    ref = _reference("hier_logistic_noncentred")
    _check_against_reference(model, idata, ref, SD_BIAS[cls])
    _assert_bars_everywhere(cls, model, idata, ref)


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
    ref = _reference("hier_logistic_noncentred")
    _assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


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
    ref = _reference("crossed_ratings")
    _assert_bars_everywhere(pmbd.SGHMC, model, idata, ref)


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
    _assert_bars_everywhere(pmbd.SGHMC, model, idata, _reference("two_level_logistic"))


@pytest.fixture(scope="module")
def sparse_regions_centred_run():
    """SGHMC's defaults on the centred ``sparse_regions`` (seed 2026), a BiasWarning an error."""
    model = sparse_regions(centred=True)
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
    _assert_bars_everywhere(
        pmbd.SGHMC, model, idata, _reference("sparse_regions"), sd_unjudged=("tau_b_log__",)
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
    ref = _reference("sparse_regions")
    ratio = _unconstrained_draws(model, idata, "tau_b_log__").std() / ref["tau_b_log____sd"][0]
    assert 0.9 <= ratio <= 1.1, f"log tau_b's sd ratio {ratio:.3f}"


def _exact_share_below(threshold: float) -> float:
    """The exact posterior's share of ``log tau_b < threshold`` on ``sparse_regions`` (the
    grid of ``tests/references/make_sparse_regions_reference.py``, at the reference's
    ``slope`` and ``sigma``)."""
    spec = importlib.util.spec_from_file_location(
        "make_sparse_regions_reference", REFERENCES / "make_sparse_regions_reference.py"
    )
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    ref = _reference("sparse_regions")
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


def test_sgld_reaches_the_regions_scales_far_tail():
    """Over 2 x 10,000 draws of the centred ``sparse_regions`` (seed 2026), SGLD with
    ``max_refinements=6`` (off by default) draws ``log tau_b`` below -4 at least a fifth as
    often as the exact posterior (0.20 %), without a divergence: as SGHMC's, its too-stiff
    draws are re-run at a finer step (``StepRefinement(order=1)``); 0.43 % here. Caught
    (watched): ``max_refinements=0`` (no draw below -4 here; none at seeds 1-4 either, where
    the re-runs drew 0.08-0.13 % there,
    ``benchmarks/results/sparse_regions_tail_refinement_sgld_centred.md``)."""
    _check_reaches_the_regions_scales_tail(partial(pmbd.SGLD, max_refinements=6), -4.0)


def _check_reaches_the_regions_scales_tail(sampler: Callable, threshold: float) -> None:
    """``sampler(model=...)``, 2 x 10,000 draws of the centred ``sparse_regions`` at seed
    2026: no divergence, and ``log tau_b`` below ``threshold`` at least a fifth as often as
    in the exact posterior."""
    model = sparse_regions(centred=True)
    idata = sample_two_chains(model, sampler(model=model), seed=2026, draws=10_000)
    share = float(np.mean(_unconstrained_draws(model, idata, "tau_b_log__") < threshold))
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
    _check_against_reference(model, idata, _reference("two_level_logistic"), 1.0)


# ---------------------------------------------------------------------- HMC-ECS
def _sign_corrected_check(model, idata, ref):
    """Signed HMC-ECS: sign-corrected moments (Eq. 5.3) against the reference. The bands are
    ``check_posterior``'s, with the chain's MCSE divided by the mean sign (the sign
    correction's ESS factor ``(2 tau - 1)^2``, Eq. 5.4)."""
    signs = idata.sample_stats["sign"].values.astype(float)
    mean_sign = signs.mean()
    assert mean_sign > 0.8, f"{(signs < 0).mean():.1%} negative signs"
    weights = (signs / signs.sum())[:, :, None]
    for value in model.value_vars:
        name = value.name
        draws = _unconstrained_draws(model, idata, name)
        mean = (weights * draws).sum((0, 1))
        sd = np.sqrt(np.maximum((weights * draws**2).sum((0, 1)) - mean**2, 0.0))
        plain = az.from_dict({"posterior": {name: draws}})
        mcse_mean = az.mcse(plain, method="mean")[name].values.ravel() / mean_sign
        mcse_sd = az.mcse(plain, method="sd")[name].values.ravel() / mean_sign
        z = 4.5
        mean_band = z * np.sqrt(mcse_mean**2 + ref[f"{name}__mean_se"] ** 2)
        sd_band = z * np.sqrt(mcse_sd**2 + ref[f"{name}__sd_se"] ** 2)
        assert np.all(np.abs(mean - ref[f"{name}__mean"]) <= mean_band), name
        assert np.all(np.abs(sd - ref[f"{name}__sd"]) <= sd_band), name


@pytest.mark.parametrize("name", _available(HARD))
@pytest.mark.parametrize("estimator", ["perturbed", "signed"])
def test_hmcecs_skewed_targets_against_nuts(estimator, name):
    """HMC-ECS with defaults (both estimators; 2 x 6,000 draws) matches the NUTS references
    where the Laplace fit is measurably off (``test_laplace_gradient_sampler_fails`` shows
    the same bands reject the Laplace approximation). No sd widening: the accept test uses
    the same estimate as the dynamics, and the perturbed estimator's mean sigma_hat^2 is held
    small (checked below)."""
    builder, _ = HARD[name]
    model = builder()
    # the perturbed estimator's bias knob is sigma_hat^2 (via m): at 12,000 draws the MCSE
    # bands resolve its perturbation (defaults: a data-poor group of the centred model 0.064 sd
    # off, 4.6 MCSE; within the bars, see docs/hmcecs.md), so this check of the algorithm
    # turns the knob down tenfold; the defaults are judged by the bars in the benchmarks
    knob = {"loglik_var_target": 0.1} if estimator == "perturbed" else {}
    idata = sample_two_chains(
        model, pmbd.HMCECS(model=model, estimator=estimator, **knob), seed=13, draws=6000
    )
    stats = idata.sample_stats
    # the subsample chain moves (the sampler's own alarm level). Signed on scale_few_rows
    # (m = N = 30, lambda = 1) its mean alpha_u varies with the tuned a: 0.67-0.89 over seeds
    # 1-6 and 13 (a chain tuned to a = -2.5 gave 0.44), 0.585 in one CI run whose floating-
    # point history differed; the bands below passed for every seed tried, the low ones too
    assert float(stats["subsample_accept"].mean()) > SUBSAMPLE_ACCEPT_ALARM
    if estimator == "perturbed":
        assert float(np.nanmean(stats["loglik_var"].values)) < 1.0
        _check_against_reference(model, idata, _reference(name), 1.0)
    else:
        _sign_corrected_check(model, idata, _reference(name))


def test_signed_hmcecs_noncentred_expands_in_the_group_effects():
    """Signed HMC-ECS with defaults on the non-centred hierarchical model in its own
    coordinates (2 x 6,000 draws, sign-corrected) against the NUTS reference. Expanded in
    ``theta = (mu, tau, z)`` its control variates fail over most of this posterior (one
    30-row estimate's variance runs to 10^2-10^6 at posterior draws; at e1225ce the chains
    gave 33 sd errors, all draws diverging); ``taylor_space="auto"`` expands in the group
    effects ``a = mu + tau z``, whose Taylor terms hold wherever ``a`` is in its posterior."""
    if not (REFERENCES / "hier_logistic_noncentred.npz").exists():
        pytest.skip("reference not computed (tests/references/make_references.py)")
    model = hier_logistic(centred=False)
    step = pmbd.HMCECS(model=model, estimator="signed", reparameterize=False)
    idata = sample_two_chains(model, step, seed=13, draws=6000)
    stats = idata.sample_stats
    assert stats["taylor_inputs"].values[:, -1].all()
    assert float(stats["subsample_accept"].mean()) > SUBSAMPLE_ACCEPT_ALARM
    _sign_corrected_check(model, idata, _reference("hier_logistic_noncentred"))


# ---------------------------------------------------------------------- EWSG
def _all_coordinates(model, idata, ref):
    names = [v.name for v in model.value_vars]
    draws = np.concatenate([_unconstrained_draws(model, idata, n) for n in names], axis=-1)
    ref_mean = np.concatenate([np.atleast_1d(ref[f"{n}__mean"]) for n in names])
    ref_sd = np.concatenate([np.atleast_1d(ref[f"{n}__sd"]) for n in names])
    ref_mean_se = np.concatenate([np.atleast_1d(ref[f"{n}__mean_se"]) for n in names])
    return draws, ref_mean, ref_sd, ref_mean_se


EWSG_TARGETS = {
    **{name: builder for name, (builder, _) in HARD.items()},
    "hier_logistic_noncentred": lambda: hier_logistic(centred=False),
    "rare_event_logistic": rare_event_logistic,
}


@pytest.mark.parametrize("name", _available(EWSG_TARGETS))
def test_ewsg_defaults_against_nuts(name):
    """EWSG with every default (its own batch size too; the linear index weights) and
    pm.sample's defaults meets the issue's bars against the references, and its means are
    within 4.5 MCSE of them. Its sds are judged by the bars only. The non-centred target at
    this seed is the one that caught a loose blow-up bound: with BLOWUP_TEMPERATURE at 1e4
    a chain kept a draw at temperature 3.4e3 with tau at 6e-14 in its fifth tuning draw,
    every later draw diverged and its mean virial stayed at 4.35e3."""
    model = EWSG_TARGETS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pmbd.ModeWarning)  # the non-centred model's MAP
        idata = sample_two_chains(model, pmbd.EWSG(model=model), seed=13)
    draws, ref_mean, ref_sd, ref_mean_se = _all_coordinates(model, idata, _reference(name))
    flat = draws.reshape(-1, draws.shape[-1])
    _assert_bars(pmbd.EWSG, flat.mean(0), flat.std(0), ref_mean, ref_sd)
    mcse = az.mcse(az.from_dict({"posterior": {"x": draws}}), method="mean")["x"].values
    z = np.abs(flat.mean(0) - ref_mean) / np.sqrt(mcse**2 + ref_mean_se**2)
    assert z.max() <= 4.5, f"mean off by {z.max():.2f} MCSE"


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
