"""The baseline: PyMC's own NUTS on the full data (``pm.sample(nuts_sampler="pymc")``)."""

from __future__ import annotations

import time
from typing import Any

import pymc as pm
import xarray as xr
from protocol import Config, Dataset, build_model
from reference import Reference
from scoring import (
    MethodResult,
    divergence_note,
    divergences,
    idata_draws,
    idata_min_ess,
    quiet_sampling,
    score_draws,
    stat_total,
)

#: added to the run's seed
SEED_OFFSET = 37


def nuts_extra(idata: xr.DataTree, config: Config, call_s: float) -> dict[str, Any]:
    """The run's details kept in the JSON output (timings, lengths, steps, divergences).

    Parameters
    ----------
    idata
        What ``pm.sample`` returned.
    config
        The benchmark's settings.
    call_s
        Wall time of the whole ``pm.sample`` call.

    Returns
    -------
    dict
    """
    div_tune, div_draws = divergences(idata)
    return {
        "sample_call_s": call_s,
        "sampling_s": float(idata.posterior.attrs["sampling_time"]),
        "tune": config.nuts_tune,
        "draws": config.nuts_draws,
        "chains": config.chains,
        "mean_n_steps": float(idata.sample_stats["n_steps"].values.mean()),
        "diverging_tuning": div_tune,
        "diverging_draws": div_draws,
        "step_size": float(idata.sample_stats["step_size"].values.mean()),
    }


def run_nuts(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """Full-data PyMC NUTS (``jitter+adapt_diag``); compile = a 5+5-draw warm-up call.

    Wall = ``pm.sample``'s own sampling time (tuning included, initialisation excluded);
    passes = leapfrog steps (``n_steps``, tuning included), one full-data gradient each.

    Parameters
    ----------
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        One row.
    """
    tune, draws = config.nuts_tune, config.nuts_draws
    seed = config.seed + SEED_OFFSET
    common = dict(
        model=build_model(data),
        nuts_sampler="pymc",
        progressbar=False,
        compute_convergence_checks=False,
    )
    res = MethodResult(method="PyMC NUTS (full data)", cores=1)
    with quiet_sampling():
        t0 = time.perf_counter()
        pm.sample(tune=5, draws=5, chains=1, cores=1, random_seed=seed, **common)
        res.compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        idata = pm.sample(
            tune=tune,
            draws=draws,
            chains=config.chains,
            cores=1,
            random_seed=seed,
            discard_tuned_samples=False,
            **common,
        )
        call_s = time.perf_counter() - t0
    res.extra = nuts_extra(idata, config, call_s)
    res.wall_s = res.extra["sampling_s"]
    res.passes = stat_total(idata, "n_steps")
    score_draws(res, idata_draws(idata), ref, idata_min_ess(idata))
    res.notes = f"tune={tune}, draws={draws}, {res.extra['mean_n_steps']:.0f} steps/draw" + (
        divergence_note(res.extra["diverging_tuning"], res.extra["diverging_draws"])
    )
    return [res]
