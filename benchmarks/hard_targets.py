"""Accuracy of the defaults on the hard targets of ``tests/hard_models.py``.

For each model with an exact reference (``tests/references/<name>.npz``: long NUTS runs or
importance sampling; the 1,000-group regression's analytic posterior), samples with the
defaults of ``pmbd.SGHMC()``, ``pmbd.SGLD()`` and ``pmbd.SBPS()`` (``--samplers`` picks others:
``HMCECS``, ``HMCECS-signed``, ``EWSG``, ``AusterityMH``, and HMC-ECS with its Taylor space
forced, ``HMCECS-inputs``, ``HMCECS-inputs-m1000``, ``HMCECS-signed-parameters``,
``HMCECS-parameters``; on the SBPS paper's logistic regression every sampler but these runs,
with ``pmbd.pSBPS()``
and the paper's own ``pSBPS(**pSBPS.PAPER_SETTINGS)``)
and ``pm.sample``'s defaults (1000 tune, 1000 draws, 2 chains, ``cores=1``) and reports, in
the samplers' unconstrained coordinates: max |mean error| / reference sd, the range of sd
ratios, min bulk ESS, data passes (rows read over N, tuning included) and ESS per data pass,
set-up and sampling time, the step size (SBPS: travel per draw) and control-variate order
chosen (HMC-ECS: "(φ)" when expanded in the likelihood's inputs), the census size,
divergences, SBPS's proposals per ESS and bound violations, and whether a bias alarm was
raised (with PyMC's own convergence warnings beside it, since their column exists: a bulk
ESS per chain below 100 or an R-hat above 1.01, which ``pm.sample`` reports with its default
``compute_convergence_checks=True``). The Laplace fit's own errors are listed beside them,
and the largest errors in units of the run's own Monte Carlo standard errors (ArviZ's
``mcse`` of the mean and of the sd): a coordinate with heavy tails (``sparse_regions``'
``log tau_b``, kurtosis 25) has an sd that 2,000 draws cannot pin to 10 %. ``--seeds``
repeats each run at other seeds, ``--draws`` lengthens it (kept draws per chain: a longer run
tells a bias from Monte Carlo error); the json rows keep every coordinate's errors for models
of at most ``PER_COORDINATE_UP_TO`` coordinates, and those of the scalar variables (the
global parameters: a crossed model's scales) for larger ones.

    .venv/bin/python benchmarks/hard_targets.py            # writes results/hard_targets.{md,json}
    .venv/bin/python benchmarks/hard_targets.py --only scale_few_rows --samplers SBPS
    .venv/bin/python benchmarks/hard_targets.py --only sparse_regions_centred --seeds 1 2 3
    .venv/bin/python benchmarks/hard_targets.py --samplers SGHMC --gather windows
    .venv/bin/python benchmarks/hard_targets.py --only group_logistic_noncentred \
        --samplers HMCECS --seeds 2026 7 --draws 5000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
from pymc.stats.convergence import run_convergence_checks

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods.crawl import split_chain_ess, watched_coordinates

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import correlated_slopes as cs  # noqa: E402
import hard_models as hm  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from report import git_revision  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: the json rows keep every coordinate's errors for models of at most this many coordinates
PER_COORDINATE_UP_TO = 100
REFERENCES = ROOT / "tests" / "references"

#: name: (model builder, batch size or None for the default)
MODELS = {
    "scale_few_rows": (hm.scale_few_rows, 10),
    "skewed_logistic": (hm.skewed_logistic, 100),
    "scale_regression": (hm.scale_regression, None),
    "hier_logistic_centred": (lambda: hm.hier_logistic(centred=True), None),
    "hier_logistic_noncentred": (lambda: hm.hier_logistic(centred=False), None),
    "rare_event_logistic": (hm.rare_event_logistic, None),
    "many_groups_linear": (None, None),
    # the SBPS paper's Sec. 7.1 setting: N = 1000, d = 20, n = 100
    "sbps_paper_logistic": (hm.sbps_paper_logistic, 100),
    # 100,000 rows, 40 groups of 8 to 17,957 rows, 3 covariates (one reference for both)
    "big_hier_logistic_noncentred": (lambda: hm.big_hier_logistic(centred=False), None),
    "big_hier_logistic_centred": (lambda: hm.big_hier_logistic(centred=True), None),
    # 150,000 counts, 60 groups of 5 to 19,634 rows
    "hier_poisson_noncentred": (lambda: hm.hier_poisson(centred=False), None),
    "hier_poisson_centred": (lambda: hm.hier_poisson(centred=True), None),
    # 40,000 ratings, 2,000 raters x 2,000 items, 20 each (d = 4,004)
    "crossed_ratings_noncentred": (lambda: hm.crossed_ratings(centred=False), None),
    "crossed_ratings_centred": (lambda: hm.crossed_ratings(centred=True), None),
    # the same design with binary ratings and a covariate (d = 4,004)
    "crossed_logistic_noncentred": (lambda: hm.crossed_logistic(centred=False), None),
    "crossed_logistic_centred": (lambda: hm.crossed_logistic(centred=True), None),
    # 50,000 rows, 40 groups of 5 to 8,710 rows, Student-t effects (nu = 4), Gaussian rows
    "t_effects_noncentred": (lambda: hm.t_effects(centred=False), None),
    "t_effects_centred": (lambda: hm.t_effects(centred=True), None),
    # the same with the degrees of freedom sampled, nu ~ Gamma(2, 0.1)
    "t_effects_nu_noncentred": (lambda: hm.t_effects(centred=False, sampled_df=True), None),
    "t_effects_nu_centred": (lambda: hm.t_effects(centred=True, sampled_df=True), None),
    # 60,000 rows, 48 groups of 5 to 8,828 rows in 12 regions in 4 countries
    "three_level_noncentred": (lambda: hm.three_level(centred=False), None),
    "three_level_centred": (lambda: hm.three_level(centred=True), None),
    # 60,000 rows, 60 groups of 5 to 6,929 rows nested in 6 regions
    "two_level_logistic_noncentred": (lambda: hm.two_level_logistic(centred=False), None),
    "two_level_logistic_centred": (lambda: hm.two_level_logistic(centred=True), None),
    # 22,646 rows, 22 groups in 12 regions, 9 of them data-poor (1-2 groups of 3-8 rows)
    "sparse_regions_noncentred": (lambda: hm.sparse_regions(centred=False), None),
    "sparse_regions_centred": (lambda: hm.sparse_regions(centred=True), None),
    # 100,000 rows, 40 groups of 5 to 19,061 rows, loc a regression on a group covariate
    "group_regression_noncentred": (lambda: hm.group_regression(centred=False), None),
    "group_regression_centred": (lambda: hm.group_regression(centred=True), None),
    # 60,000 rows, 40 groups of 8 to ~11,000 rows, logistic, the same group-level regression
    "group_logistic_noncentred": (lambda: hm.group_logistic(centred=False), None),
    "group_logistic_centred": (lambda: hm.group_logistic(centred=True), None),
    # 100,000 rows, 40 groups of 5 to ~19,000 rows, an intercept and a slope per group
    "varying_slopes_noncentred": (lambda: hm.varying_slopes(centred=False), None),
    "varying_slopes_centred": (lambda: hm.varying_slopes(centred=True), None),
    # the same data's shape with correlated effects: an LKJ covariance (a matrix scale)
    "correlated_slopes_noncentred": (lambda: cs.correlated_slopes(centred=False), None),
    "correlated_slopes_centred": (lambda: cs.correlated_slopes(centred=True), None),
    # every group data-poor: 40 groups of 3 to 8 rows (209 rows), the same effects; 50-row
    # minibatches
    "correlated_poor_groups_noncentred": (lambda: cs.correlated_poor_groups(centred=False), 50),
    "correlated_poor_groups_centred": (lambda: cs.correlated_poor_groups(centred=True), 50),
}

#: models whose reference file is another's (both parameterisations of one posterior)
REFERENCE_FILE = {
    "big_hier_logistic_noncentred": "big_hier_logistic",
    "big_hier_logistic_centred": "big_hier_logistic",
    "hier_poisson_noncentred": "hier_poisson",
    "hier_poisson_centred": "hier_poisson",
    "crossed_ratings_noncentred": "crossed_ratings",
    "crossed_ratings_centred": "crossed_ratings",
    "crossed_logistic_noncentred": "crossed_logistic",
    "crossed_logistic_centred": "crossed_logistic",
    "t_effects_noncentred": "t_effects",
    "t_effects_centred": "t_effects",
    "t_effects_nu_noncentred": "t_effects_nu",
    "t_effects_nu_centred": "t_effects_nu",
    "three_level_noncentred": "three_level",
    "three_level_centred": "three_level",
    "two_level_logistic_noncentred": "two_level_logistic",
    "two_level_logistic_centred": "two_level_logistic",
    "sparse_regions_noncentred": "sparse_regions",
    "sparse_regions_centred": "sparse_regions",
    "group_regression_noncentred": "group_regression",
    "group_regression_centred": "group_regression",
    "group_logistic_noncentred": "group_logistic",
    "group_logistic_centred": "group_logistic",
    "varying_slopes_noncentred": "varying_slopes",
    "varying_slopes_centred": "varying_slopes",
    "correlated_slopes_noncentred": "correlated_slopes",
    "correlated_slopes_centred": "correlated_slopes",
    "correlated_poor_groups_noncentred": "correlated_poor_groups",
    "correlated_poor_groups_centred": "correlated_poor_groups",
}

#: sampler name: factory (keyword arguments as for the class)
SAMPLERS = {
    "SGHMC": pmbd.SGHMC,
    # each draw's minibatches sized from the noise measured where the last one ended
    "SGHMC-local": partial(pmbd.SGHMC, local_batch=True),
    "SGLD": pmbd.SGLD,
    # the same-commit baseline of SGLD's re-runs of too-stiff draws
    "SGLD-no-refinements": partial(pmbd.SGLD, max_refinements=0),
    # SGLD's bias knob turned down: the log-density shift its step may cause (default 0.5,
    # at most 0.1 sqrt(N / d): 0.316 on the crossed ratings)
    "SGLD-shift0.2": partial(pmbd.SGLD, noise_shift_bound=0.2),
    "SGLD-shift0.1": partial(pmbd.SGLD, noise_shift_bound=0.1),
    "SBPS": pmbd.SBPS,
    "pSBPS": pmbd.pSBPS,
    "pSBPS-paper": partial(pmbd.pSBPS, **pmbd.pSBPS.PAPER_SETTINGS),
    "HMCECS": pmbd.HMCECS,
    "HMCECS-signed": partial(pmbd.HMCECS, estimator="signed"),
    # the Taylor expansion's space forced (taylor_space="auto" picks it for the signed one)
    "HMCECS-inputs": partial(pmbd.HMCECS, taylor_space="likelihood_inputs"),
    "HMCECS-inputs-m1000": partial(
        pmbd.HMCECS, taylor_space="likelihood_inputs", subsample_size=1000
    ),
    "HMCECS-signed-parameters": partial(pmbd.HMCECS, estimator="signed", taylor_space="parameters"),
    "HMCECS-parameters": partial(pmbd.HMCECS, taylor_space="parameters"),
    "EWSG": pmbd.EWSG,
    "AusterityMH": pmbd.AusterityMH,
    # the paper's plain test on the paper's random walk, with our tuning and preconditioner
    "AusterityMH-plain": partial(
        pmbd.AusterityMH, test="plain", control_variates=False, proposal="rw"
    ),
}
DEFAULT_SAMPLERS = ["SGHMC", "SGLD", "SBPS"]
#: HMC-ECS with its Taylor space forced, the paper's plain Austerity test, SGLD without
#: re-runs or with a lower shift bound and SGHMC with local_batch: run only when named
FORCED_SPACE = {
    "SGHMC-local",
    "SGLD-no-refinements",
    "SGLD-shift0.2",
    "SGLD-shift0.1",
    "HMCECS-inputs",
    "HMCECS-inputs-m1000",
    "HMCECS-signed-parameters",
    "HMCECS-parameters",
    "AusterityMH-plain",
}
#: models on which every sampler of SAMPLERS (but FORCED_SPACE) runs by default
ALL_SAMPLERS_ON = {"sbps_paper_logistic"}


def many_groups():
    group, x, y = hm.make_many_groups_linear_data()
    return hm.many_groups_linear_model(group, x, y), hm.many_groups_linear_posterior(group, x, y)


def reference(name: str):
    if name == "many_groups_linear":
        return many_groups()
    path = REFERENCES / f"{REFERENCE_FILE.get(name, name)}.npz"
    if not path.exists():
        return None, None
    with np.load(path) as data:
        ref = {k: data[k] for k in data.files}
    return MODELS[name][0](), ref


def unconstrained(idata, value_name: str) -> np.ndarray:
    if value_name.endswith(cs.PACKED_SUFFIX):  # LKJCholeskyCov: log of the diagonal entries
        return cs.packed_cholesky(idata.posterior[value_name.removesuffix(cs.PACKED_SUFFIX)].values)
    draws = idata.posterior[value_name.removesuffix("_log__")].values
    draws = np.log(draws) if value_name.endswith("_log__") else draws
    return draws.reshape(draws.shape[0], draws.shape[1], -1)


def recentred(layer) -> bool:
    """Whether the step samples some group effect in other coordinates than the model's."""
    return layer.reparam is not None and layer.reparam.moves_coordinates


def crawl_ess(idata, layer) -> list[float]:
    """Each chain's smallest bulk ESS of its own kept draws over the coordinates the crawl
    alarm watches: the alarm's statistic, recomputed from the draws (``crawl.py``)."""
    draws = np.concatenate([unconstrained(idata, v.name) for v in layer.graph.value_vars], axis=2)
    watched = watched_coordinates(layer.var_sizes)
    return [float(split_chain_ess(chain[:, watched]).min()) for chain in draws]


def run_one(
    name: str,
    model,
    ref,
    sampler: str,
    reparameterize: bool | str = "auto",
    seed: int = 2026,
    gather: str | None = None,
    low_rank: int | None = None,
    kept_draws: int = 1000,
) -> dict:
    batch = MODELS[name][1]
    kwargs = {} if batch is None else {"batch_size": batch}
    if sampler == "pSBPS-paper" or sampler.startswith("HMCECS"):
        kwargs = {}  # the paper's batch size is part of its settings; HMC-ECS chooses its m
    if reparameterize != "auto":
        kwargs["reparameterize"] = reparameterize
    if low_rank is not None:
        kwargs["low_rank"] = low_rank
    start = time.perf_counter()
    if gather is not None:  # every row array read through this gather (the models' arrays
        # are in memory; pmbd.Data(..., gather=...) is the user's way to ask for it)
        kwargs["layer"] = pmbd.MinibatchModel(model)
        kwargs["layer"].rows.gather = gather
    with warnings.catch_warnings(record=True) as setup_caught:
        warnings.simplefilter("always")
        step = SAMPLERS[sampler](model=model, **kwargs)
    setup = time.perf_counter() - start
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pm.sample(
            step=step,
            draws=kept_draws,
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
            discard_tuned_samples=False,
        )
    errs, ratios, ess, laplace_errs, laplace_ratios, labels = [], [], [], [], [], []
    mean_z, sd_z = [], []
    signs = idata.sample_stats["sign"].values if "sign" in idata.sample_stats else None
    for value in model.value_vars:
        name_v = value.name
        draws = unconstrained(idata, name_v)
        mean, sd = draws.mean((0, 1)), draws.std((0, 1))
        if signs is not None:  # signed HMC-ECS: the sign-corrected moments (Eq. 5.3)
            w = (signs / signs.sum())[:, :, None]
            mean = (w * draws).sum((0, 1))
            sd = np.sqrt(np.maximum((w * draws**2).sum((0, 1)) - mean**2, 0.0))
        ref_mean, ref_sd = ref[f"{name_v}__mean"], ref[f"{name_v}__sd"]
        labels += [name_v] if np.size(mean) == 1 else [f"{name_v}[{i}]" for i in range(mean.size)]
        errs.append(np.abs(mean - ref_mean) / ref_sd)
        ratios.append(sd / ref_sd)
        posterior = az.from_dict({"posterior": {"x": draws}})
        ess.append(az.ess(posterior)["x"].values.ravel())
        mcse_mean = az.mcse(posterior, method="mean")["x"].values.ravel()
        mcse_sd = az.mcse(posterior, method="sd")["x"].values.ravel()
        mean_z.append(np.abs(mean - ref_mean) / mcse_mean)
        sd_z.append((sd - ref_sd) / mcse_sd)
        if f"{name_v}__laplace_mean" in ref:
            laplace_errs.append(np.abs(ref[f"{name_v}__laplace_mean"] - ref_mean) / ref_sd)
            laplace_ratios.append(ref[f"{name_v}__laplace_sd"] / ref_sd)
    errs, ratios, ess, mean_z, sd_z = (np.concatenate(x) for x in (errs, ratios, ess, mean_z, sd_z))
    worst_sd = int(np.argmax(np.abs(np.log(ratios))))
    stats = idata.sample_stats
    rows_read = float(stats["rows_touched"].sum() + idata.warmup_sample_stats["rows_touched"].sum())
    passes = rows_read / step.layer.n_rows
    out = {
        "model": name,
        "sampler": sampler,
        "seed": seed,
        "draws": kept_draws,
        "dim": step.layer.dim,
        "rows": step.layer.n_rows,
        "setup_s": setup,
        "sampling_s": float(idata.posterior.attrs["sampling_time"]),
        "max_err_sd": float(errs.max()),
        "sd_ratio_min": float(ratios.min()),
        "sd_ratio_max": float(ratios.max()),
        # the coordinates behind the worst mean error and the sd ratio furthest from 1
        "worst_mean_at": labels[int(np.argmax(errs))],
        "worst_sd_at": labels[worst_sd],
        "ess_at_worst_sd": float(ess[worst_sd]),
        # the same errors in Monte Carlo standard errors (ArviZ's, from the run's own draws)
        "max_mean_z": float(mean_z.max()),
        "max_sd_z": float(np.abs(sd_z).max()),
        "worst_sd_z_at": labels[int(np.argmax(np.abs(sd_z)))],
        "min_bulk_ess": float(ess.min()),
        "data_passes": passes,
        "ess_per_pass": float(ess.min()) / passes,
        "step_size": float(stats["step_size"].values[0, -1]),
        "inner_steps": int(step.inner_steps),
        "cv_order": int(stats["cv_order"].values[0, -1]),
        "census": len(step.census),
        "divergences": int(stats["diverging"].values.sum()),
        # HMC-ECS: kept draws whose trajectory blew up at the estimate's zeros or variance
        # wall (rejected, not divergences)
        "estimator_edges": sum(
            int(stats[name].values.sum())
            for name in ("estimator_zero", "variance_wall")
            if name in stats
        ),
        "bias_alarm": any(issubclass(w.category, pmbd.BiasWarning) for w in caught),
        # each BiasWarning's first sentence (which alarm fired)
        "alarm_texts": [
            str(w.message).split(". ")[0][:200]
            for w in caught
            if issubclass(w.category, pmbd.BiasWarning)
        ],
        # each ModeWarning's first sentence (the tuning windows found the starting fit's
        # centre outside the draws' bulk)
        "mode_warnings": [
            str(w.message).split(". ")[0][:200]
            for w in caught
            if issubclass(w.category, pmbd.ModeWarning)
        ],
        # ... and those of the set-up (the MAP search found no usable mode)
        "setup_mode_warnings": [
            str(w.message).split(". ")[0][:200]
            for w in setup_caught
            if issubclass(w.category, pmbd.ModeWarning)
        ],
        # a FullDataWarning (HMC-ECS at m = every row): a notice, not an alarm
        "full_data": any(issubclass(w.category, pmbd.FullDataWarning) for w in caught),
        "crawl_ess": crawl_ess(idata, step.layer),
        "pymc_warnings": pymc_convergence_warnings(idata, model),
        "map_problem": step.map_problem,
        "recentred": recentred(step.layer),
    }
    every = len(labels) <= PER_COORDINATE_UP_TO
    out["coordinates"] = {
        label: {
            "err_sd": float(e),
            "sd_ratio": float(r),
            "ess": float(n),
            "mean_z": float(mz),
            "sd_z": float(sz),
        }
        for label, e, r, n, mz, sz in zip(labels, errs, ratios, ess, mean_z, sd_z, strict=True)
        if every or "[" not in label
    }
    if "proposals" in stats:
        proposals = float(stats["proposals"].sum())
        out.update(
            proposals_per_ess=proposals / float(ess.min()),
            violations=int(stats["violations"].sum()),
            violation_share=float(stats["violations"].sum()) / max(proposals, 1.0),
            missed_share=float(stats["missed_bounces"].sum() / stats["bounces"].sum()),
            k=float(stats["k"].values[0, -1]),
        )
    if "subsample_accept" in stats:
        out.update(
            accept=float(stats["accept_prob"].mean()),
            subsample_accept=float(stats["subsample_accept"].mean()),
            loglik_var=float(np.nanmean(stats["loglik_var"].values)),
            subsample_size=int(stats["subsample_size"].values[0, -1]),
            products=int(stats["products"].values[0, -1]),
            negative_signs=float((stats["sign"].values < 0).mean()),
            taylor_inputs=bool(stats["taylor_inputs"].values[:, -1].all()),
        )
    if "index_accept" in stats:
        out.update(
            index_accept=float(stats["index_accept"].mean()),
            noise_share=float(np.nanmean(stats["noise_share"].values)),
        )
    if "local_noise_share" in stats:
        out["local_noise"] = local_noise_summary(stats["local_noise_share"].values)
    if "step_refinements" in stats:
        refinements = stats["step_refinements"].values
        out.update(refined_draws=int((refinements > 0).sum()), most_halvings=int(refinements.max()))
    if "audited" in stats:
        out.update(
            accept=float(stats["accept_rate"].mean()),
            audited=int(stats["audited"].sum()),
            audit_wrong=int(stats["audit_wrong"].sum()),
        )
    if laplace_errs:
        le, lr = np.concatenate(laplace_errs), np.concatenate(laplace_ratios)
        out.update(
            laplace_max_err_sd=float(le.max()),
            laplace_sd_ratio_min=float(lr.min()),
            laplace_sd_ratio_max=float(lr.max()),
        )
    return out


def local_noise_summary(shares: np.ndarray) -> list[dict]:
    """Per chain, the draws' own noise readings (``local_noise_share``, NaN where a draw
    measured nothing): how many, their quantiles, and the share of readings above 0.25 and
    0.5 (5 and 10 times the default ``noise_bound``)."""
    summary = []
    for chain in shares:
        read = chain[np.isfinite(chain)]
        if read.size == 0:
            summary.append({"measured": 0})
            continue
        q50, q90, q99 = np.quantile(read, [0.5, 0.9, 0.99])
        summary.append(
            {
                "measured": int(read.size),
                "q50": float(q50),
                "q90": float(q90),
                "q99": float(q99),
                "max": float(read.max()),
                "over_0.25": float((read > 0.25).mean()),
                "over_0.5": float((read > 0.5).mean()),
            }
        )
    return summary


def pymc_convergence_warnings(idata, model) -> list[str]:
    """What ``pm.sample``'s own convergence checks (``compute_convergence_checks=True``, its
    default) say of the kept draws: ``"ESS"`` (a bulk ESS per chain below 100) and
    ``"R-hat"`` (above 1.01); a user sees them beside our alarms."""
    found = []
    for warning in run_convergence_checks(idata, model):
        if "effective sample size" in warning.message:
            found.append("ESS")
        elif "rhat" in warning.message:
            found.append("R-hat")
    return found


def alarm_cell(row: dict) -> str:
    """Our alarm, and PyMC's convergence warnings (rows run since their column exists)."""
    ours = "yes" if row["bias_alarm"] else "no"
    if row.get("full_data"):  # rows run since 45b43d6 say whether HMC-ECS read every row
        ours += " (full data)"
    theirs = row.get("pymc_warnings")
    return f"{ours} (PyMC: {', '.join(theirs)})" if theirs else ours


def table(rows: list[dict]) -> str:
    head = (
        "| model | d | N | sampler | max \\|Δmean\\|/sd | sd ratio | min bulk ESS | data passes "
        "| ESS / pass | set-up (s) | sampling (s) | ε × steps | CV order | census | div. "
        "| SBPS: proposals / ESS, violations (k), missed bounces; HMC-ECS: accept, α_u, "
        "σ̂², m (λ), negative signs; EWSG: index accept, noise share; Austerity: accept, "
        "audited decisions wrong; SGHMC, SGLD: draws re-run at a finer step (most halvings) "
        "| alarm (PyMC's convergence warnings) "
        "| Laplace max err / sd ratio | recentred | MCSEs off: mean, sd | seed |"
    )
    lines = [head, "|" + "---|" * 21]
    for r in rows:
        laplace = (
            f"{r['laplace_max_err_sd']:.2f} / [{r['laplace_sd_ratio_min']:.3f}, "
            f"{r['laplace_sd_ratio_max']:.3f}]"
            if "laplace_max_err_sd" in r
            else "exact (Gaussian)"
        )
        sbps = (
            f"{r['proposals_per_ess']:.1f}, {r['violation_share']:.2%} (k {r['k']:.2g}), "
            f"{r['missed_share']:.2%}"
            if "proposals_per_ess" in r
            else ""
        )
        if "subsample_accept" in r:
            products = f" (λ {r['products']})" if r["products"] else ""
            sbps = (
                f"{r['accept']:.2f}, {r['subsample_accept']:.3f}, {r['loglik_var']:.2g}, "
                f"{r['subsample_size']}{products}, {r['negative_signs']:.1%}"
            )
        if "index_accept" in r:
            sbps = f"{r['index_accept']:.2f}, {r['noise_share']:.2g}"
        if "refined_draws" in r:
            sbps = f"{r['refined_draws']} re-run ({r['most_halvings']})"
        if "audited" in r:
            sbps = f"{r['accept']:.2f}, {r['audit_wrong']} of {r['audited']}"
        lines.append(
            f"| {r['model']} | {r['dim']} | {r['rows']:,} | {r['sampler']} | {r['max_err_sd']:.3f} "
            f"| [{r['sd_ratio_min']:.3f}, {r['sd_ratio_max']:.3f}] | {r['min_bulk_ess']:,.0f} "
            f"| {r['data_passes']:,.1f} | {r['ess_per_pass']:.3g} "
            f"| {r['setup_s']:.1f} | {r['sampling_s']:.1f} | {r['step_size']:.3g} × "
            f"{r['inner_steps']} | {r['cv_order']}{' (φ)' if r.get('taylor_inputs') else ''} "
            f"| {r['census']} | {r['divergences']} "
            f"| {sbps} | {alarm_cell(r)} | {laplace} "
            f"| {'yes' if r.get('recentred') else 'no'} "
            f"| {r['max_mean_z']:.1f}, {r['max_sd_z']:.1f} ({r['worst_sd_z_at']}) "
            f"| {r.get('seed', 2026)} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--samplers", nargs="+", choices=list(SAMPLERS), default=None)
    parser.add_argument("--out", default="hard_targets")
    parser.add_argument(
        "--model-coordinates",
        action="store_true",
        help="reparameterize=False: sample group effects in the model's own coordinates",
    )
    parser.add_argument(
        "--coordinates",
        choices=["whiten", "centre"],
        default=None,
        help="reparameterize='whiten' or 'centre' (default: the steps' own, 'auto')",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[2026], help="random_seed of each run"
    )
    parser.add_argument(
        "--gather",
        choices=["rows", "windows"],
        default=None,
        help="how minibatches read the rows (default: the row source's: windows for "
        "in-memory rows of at least 100 minibatches, else uniform rows)",
    )
    parser.add_argument(
        "--low-rank",
        type=int,
        default=None,
        help="low_rank: correct the diagonal preconditioner along this many flattest and "
        "stiffest directions (default: the step's own, 'auto'; 0: none)",
    )
    parser.add_argument(
        "--draws", type=int, default=1000, help="kept draws per chain (pm.sample's draws)"
    )
    args = parser.parse_args(argv)
    commit = git_revision()  # "+dirty" where pymc_bigdata/ has uncommitted changes
    coordinates = False if args.model_coordinates else (args.coordinates or "auto")
    rows = []
    for name in args.only:
        model, ref = reference(name)
        if model is None:
            print(f"{name}: no reference file, skipped", flush=True)
            continue
        samplers = args.samplers or (
            [s for s in SAMPLERS if s not in FORCED_SPACE]
            if name in ALL_SAMPLERS_ON
            else DEFAULT_SAMPLERS
        )
        for sampler in samplers:
            for seed in args.seeds:
                rows.append(
                    run_one(
                        name,
                        model,
                        ref,
                        sampler,
                        coordinates,
                        seed,
                        args.gather,
                        args.low_rank,
                        args.draws,
                    )
                )
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (
        f"# Hard targets, defaults (pymc_bigdata at {commit})\n\n"
        f"pm.sample defaults (1000 tune, {args.draws} draws, 2 chains, cores=1), random_seed "
        f"{', '.join(map(str, args.seeds))}; "
        "errors in the unconstrained coordinates against the references of tests/references "
        "(NUTS, importance sampling, or the analytic posterior)"
        + ("; reparameterize=False" if args.model_coordinates else "")
        + (f'; reparameterize="{args.coordinates}"' if args.coordinates else "")
        + (f'; gather="{args.gather}"' if args.gather else "")
        + (f"; low_rank={args.low_rank}" if args.low_rank is not None else "")
        + ".\n\n"
        + table(rows)
        + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(text)
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps({"commit": commit, "rows": rows}, indent=1)
    )
    print(text)


if __name__ == "__main__":
    main()
