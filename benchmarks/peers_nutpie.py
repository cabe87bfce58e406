"""Peer: nutpie's NUTS on the full data (``nutpie.compile_pymc_model`` + ``nutpie.sample``).

The same PyMC model as the PyMC NUTS baseline, compiled by nutpie (its default numba backend)
and sampled with its defaults (diagonal mass matrix adaptation) at the baseline's lengths
(``nuts_tune`` + ``nuts_draws`` per chain, ``chains`` chains) and, like the baseline, one
core (``cores=1``: the chains run one after the other).  *Compile* = the
``compile_pymc_model`` call; *wall* = the ``nutpie.sample`` call (tuning and draws of every
chain); *passes* = the leapfrog steps of tuning and draws (``n_steps`` of
``warmup_sample_stats`` and ``sample_stats``), one full-data gradient each.  Divergences go to
the notes.  nutpie returns an ``xarray.DataTree`` (ArviZ 1) with the groups ``posterior``,
``sample_stats``, ``warmup_posterior`` and ``warmup_sample_stats``, which the helpers of
``scoring.py`` read as they read PyMC's.  Scored like the baseline (``score_draws``).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import xarray as xr
from protocol import Config, Dataset, build_model
from reference import Reference
from scoring import (
    MethodResult,
    divergence_note,
    divergences,
    failed,
    idata_draws,
    idata_min_ess,
    quiet_sampling,
    score_draws,
    stat_total,
)

NUTPIE_INSTALL_HINT = "pip install nutpie"
#: the peer's name in the tables
NAME = "nutpie NUTS (full data)"
#: threads of ``nutpie.sample`` (the PyMC NUTS baseline's ``cores``)
CORES = 1
#: added to the run's seed
SEED_OFFSET = 79


def import_nutpie() -> ModuleType | None:
    """``nutpie``, if installed.

    Returns
    -------
    module or None
        None if nutpie is not installed; any other import error propagates.
    """
    try:
        import nutpie
    except ModuleNotFoundError:
        return None
    return nutpie


def sample_nutpie(
    nutpie: ModuleType, data: Dataset, config: Config
) -> tuple[xr.DataTree, float, float]:
    """Compile the benchmark's model with nutpie and sample it, timing both.

    Parameters
    ----------
    nutpie
        What :func:`import_nutpie` returned.
    data, config
        The data set and the benchmark's settings.

    Returns
    -------
    idata : xarray.DataTree
        What ``nutpie.sample`` returned (tuning draws kept).
    compile_s, sample_s : float
        Seconds of ``compile_pymc_model`` and of ``nutpie.sample``.
    """
    model = build_model(data)
    with quiet_sampling():
        t0 = time.perf_counter()
        compiled = nutpie.compile_pymc_model(model)
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        idata = nutpie.sample(
            compiled,
            draws=config.nuts_draws,
            tune=config.nuts_tune,
            chains=config.chains,
            seed=config.seed + SEED_OFFSET,
            cores=CORES,
            save_warmup=True,
            progress_bar=False,
        )
        sample_s = time.perf_counter() - t0
    return idata, compile_s, sample_s


def nutpie_extra(nutpie: ModuleType, idata: xr.DataTree, config: Config) -> dict[str, Any]:
    """The run's details kept in the JSON output (lengths, steps, step size, divergences).

    Parameters
    ----------
    nutpie
        What :func:`import_nutpie` returned.
    idata
        What ``nutpie.sample`` returned.
    config
        The benchmark's settings.

    Returns
    -------
    dict
    """
    div_tune, div_draws = divergences(idata)
    return {
        "nutpie": nutpie.__version__,
        "tune": config.nuts_tune,
        "draws": config.nuts_draws,
        "chains": config.chains,
        "cores": CORES,
        "mean_n_steps": float(idata.sample_stats["n_steps"].values.mean()),
        "diverging_tuning": div_tune,
        "diverging_draws": div_draws,
        "step_size": float(idata.sample_stats["step_size"].values.mean()),
    }


def run_nutpie(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """Full-data NUTS through nutpie, if nutpie imports and compiles the model.

    Parameters
    ----------
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        One row ("not installed" or failed, with the reason, if nutpie cannot run).
    """
    res = MethodResult(method=NAME, cores=CORES)
    try:
        nutpie = import_nutpie()
        if nutpie is None:
            print(f"  nutpie not installed; to include it: {NUTPIE_INSTALL_HINT}")
            return [
                MethodResult(method=NAME, status="not installed", notes=f"`{NUTPIE_INSTALL_HINT}`")
            ]
        idata, res.compile_s, res.wall_s = sample_nutpie(nutpie, data, config)
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        return [failed(res, exc)]
    res.extra = nutpie_extra(nutpie, idata, config)
    res.passes = stat_total(idata, "n_steps")
    score_draws(res, idata_draws(idata), ref, idata_min_ess(idata))
    res.notes = (
        f"nutpie {res.extra['nutpie']}, numba backend, tune={config.nuts_tune}, "
        f"draws={config.nuts_draws}, {res.extra['mean_n_steps']:.0f} steps/draw"
        + divergence_note(res.extra["diverging_tuning"], res.extra["diverging_draws"])
    )
    return [res]
