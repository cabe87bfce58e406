"""Our step methods (``pymc_bigdata``) as the benchmark runs and describes them.

Each method of :data:`protocol.OURS` is built with its keyword arguments, warmed up (compiled)
once, then sampled at every ``cores`` value of the run.  The table's notes depend on the
sampler: :data:`NOTES` maps a step method's class to the function that writes them (and adds
its sample stats to the row's ``extra``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr
from protocol import OURS, Config, Dataset, OurMethod, build_model
from reference import Reference
from scoring import (
    MethodResult,
    counting_rows,
    divergence_note,
    divergences,
    failed,
    idata_draws,
    idata_min_ess,
    quiet_sampling,
    score_draws,
    stat_total,
)

import pymc_bigdata as pmbd

#: a notes function: (kept and warm-up draws, the scored row, its ``extra``) -> the notes
Notes = Callable[[xr.DataTree, MethodResult, dict[str, Any]], str]


# ---------------------------------------------------------------------------- notes
def default_notes(idata: xr.DataTree, res: MethodResult, extra: dict[str, Any]) -> str:
    """Step size and steps per draw (SGHMC, SGLD).

    Parameters
    ----------
    idata
        What ``pm.sample`` returned.
    res
        The scored row.
    extra
        Its ``extra`` (step size, inner steps, batch size, ...).

    Returns
    -------
    str
    """
    return f"eps={extra['step_size']:.3g}, {extra['inner_steps']} steps/draw"


def sbps_notes(idata: xr.DataTree, res: MethodResult, extra: dict[str, Any]) -> str:
    """Travel per draw, proposals and rows per effective draw, violations (kept draws).

    Parameters, returns: as :func:`default_notes`.
    """
    kept = idata.sample_stats  # tuning's stats are in warmup_sample_stats
    proposals = float(kept["proposals"].sum())
    rows = float(kept["rows_touched"].sum())
    violations = int(kept["violations"].sum())
    extra.update(proposals=proposals, violations=violations, kept_rows=rows)
    per_ess = f"{proposals / res.min_ess:.1f} proposals, {rows / res.min_ess:,.0f} rows"
    return (
        f"travel={extra['step_size']:.3g}, {per_ess} per ESS (kept draws), "
        f"{violations} violations in {proposals:,.0f} proposals"
    )


def ewsg_notes(idata: xr.DataTree, res: MethodResult, extra: dict[str, Any]) -> str:
    """Step size x steps, rows per candidate minibatch, index acceptance, noise share (of
    uniform minibatches: an upper bound for EWSG's) and rows per effective draw.

    Parameters, returns: as :func:`default_notes`.
    """
    kept = idata.sample_stats
    rows = float(kept["rows_touched"].sum())
    extra.update(
        kept_rows=rows,
        index_accept=float(kept["index_accept"].mean()),
        noise_share=float(np.nanmean(kept["noise_share"].values)),
    )
    return (
        f"eps={extra['step_size']:.3g} x {extra['inner_steps']}, 2 x {extra['batch_size']} "
        f"rows per step, index accept {extra['index_accept']:.2f}, noise share "
        f"{extra['noise_share']:.2g}, {rows / res.min_ess:,.0f} rows per ESS (kept draws)"
    )


def austerity_notes(idata: xr.DataTree, res: MethodResult, extra: dict[str, Any]) -> str:
    """Proposal scale x decisions per draw, rows per decision, acceptance, the share of
    decisions that read every row, and rows per effective draw (kept draws).

    Parameters, returns: as :func:`default_notes`.
    """
    kept = idata.sample_stats
    rows = float(kept["rows_touched"].sum())
    extra.update(
        kept_rows=rows,
        rows_per_decision=float(kept["test_rows"].mean()),
        accept=float(kept["accept_rate"].mean()),
        exact_fraction=float(kept["exact_fraction"].mean()),
        minibatches=float(kept["minibatches"].mean()),
    )
    return (
        f"h={extra['step_size']:.3g} x {extra['inner_steps']}, "
        f"{extra['rows_per_decision']:,.0f} rows ({extra['minibatches']:.2g} minibatches) per "
        f"decision, accept {extra['accept']:.2f}, {extra['exact_fraction']:.1%} decisions "
        f"read all rows, {rows / res.min_ess:,.0f} rows per ESS (kept draws)"
    )


def hmcecs_notes(idata: xr.DataTree, res: MethodResult, extra: dict[str, Any]) -> str:
    """Step size x leapfrog steps, subsample size (lambda), acceptances, mean sigma_hat^2, rows
    per effective draw (kept draws) and negative signs.

    Parameters, returns: as :func:`default_notes`.
    """
    kept = idata.sample_stats
    rows = float(kept["rows_touched"].sum())
    products = int(kept["products"].values[0, -1])
    extra.update(
        kept_rows=rows,
        subsample_size=int(kept["subsample_size"].values[0, -1]),
        products=products,
        accept=float(kept["accept_prob"].mean()),
        subsample_accept=float(kept["subsample_accept"].mean()),
        loglik_var=float(np.nanmean(kept["loglik_var"].values)),
        negative_signs=float((kept["sign"].values < 0).mean()),
    )
    size = f"m={extra['subsample_size']}" + (f", λ={products}" if products else "")
    return (
        f"eps={extra['step_size']:.3g} x {extra['inner_steps']}, {size}, "
        f"accept {extra['accept']:.2f}, α_u {extra['subsample_accept']:.3f}, "
        f"σ̂² {extra['loglik_var']:.2g}, {rows / res.min_ess:,.0f} rows per ESS (kept draws)"
        + (f", {extra['negative_signs']:.1%} negative signs" if products else "")
    )


#: the notes of each step method's class (others: :func:`default_notes`)
NOTES: dict[type, Notes] = {
    pmbd.SBPS: sbps_notes,
    pmbd.HMCECS: hmcecs_notes,
    pmbd.EWSG: ewsg_notes,
    pmbd.AusterityMH: austerity_notes,
}


# ---------------------------------------------------------------------------- runs
@dataclass
class Prepared:
    """A constructed and warmed-up step method, with what its preparation cost."""

    step: Any
    model: pm.Model
    seed: int
    setup_s: float
    map_s: float
    warm_s: float
    setup_passes: float

    @property
    def compile_s(self) -> float:
        """Compilation: construction minus the MAP search, plus the warm-up call."""
        return (self.setup_s - self.map_s) + self.warm_s

    def sample_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every ``pm.sample`` call of this step."""
        return dict(
            step=self.step,
            model=self.model,
            progressbar=False,
            compute_convergence_checks=False,
        )


def prepare(method: OurMethod, data: Dataset, seed: int) -> Prepared:
    """Construct the step, time its MAP search alone, and warm it up with a 5+5-draw call
    (then release the window gathers' copy of the rows it read, so that each measured run
    reads the copy again, in its sampling time, as a user's first ``pm.sample`` call does).

    Parameters
    ----------
    method
        The step method, its keyword arguments and seed offset.
    data
        The data set.
    seed
        Seed of the warm-up call (and of the runs after it).

    Returns
    -------
    Prepared
    """
    model = build_model(data)
    t0 = time.perf_counter()
    step = method.cls(model=model, **method.kwargs)
    setup_s = time.perf_counter() - t0
    with counting_rows(step.layer) as rows_read:
        t0 = time.perf_counter()
        step.layer.find_map()
        map_s = time.perf_counter() - t0
    setup_passes = rows_read[0] / data.n_rows
    prepared = Prepared(step, model, seed, setup_s, map_s, 0.0, setup_passes)
    with quiet_sampling():
        t0 = time.perf_counter()
        pm.sample(tune=5, draws=5, chains=1, cores=1, random_seed=seed, **prepared.sample_kwargs())
        prepared.warm_s = time.perf_counter() - t0
    # the window gathers' copy of the rows, read by the warm-up: a measured run reads its own
    # (with cores=2 each process reads one; cores=1 runs up to 4dd61b8 did not count it)
    step.layer.rows.release_copies()
    return prepared


def run_extra(
    prepared: Prepared, idata: xr.DataTree, config: Config, call_s: float
) -> dict[str, Any]:
    """The per-run details kept in the JSON output (timings, step settings, divergences).

    Parameters
    ----------
    prepared
        The step and its preparation's timings.
    idata
        What the run's ``pm.sample`` returned.
    config
        The benchmark's settings.
    call_s
        Wall time of the whole ``pm.sample`` call.

    Returns
    -------
    dict
    """
    step = prepared.step
    div_tune, div_draws = divergences(idata)
    extra = {
        "map_s": prepared.map_s,
        "warmup_call_s": prepared.warm_s,
        "sample_call_s": call_s,
        "sampling_s": float(idata.posterior.attrs["sampling_time"]),
        "step_size": step.step_size,
        "inner_steps": step.inner_steps,
        "batch_size": step.batch_size,
        "diverging_tuning": div_tune,
        "diverging_draws": div_draws,
        "tune": config.ours_tune,
        "draws": config.ours_draws,
        "chains": config.chains,
    }
    if "noise_clipped" in idata.sample_stats:
        extra["noise_clipped"] = int(stat_total(idata, "noise_clipped"))
    return extra


def sample_ours(
    method: OurMethod, prepared: Prepared, cores: int, data: Dataset, ref: Reference, config: Config
) -> MethodResult:
    """One ``pm.sample`` run of a prepared step at ``cores``, scored against the reference.

    Wall = MAP + ``pm.sample``'s own sampling time (tuning included).

    Parameters
    ----------
    method
        The step method (its label and class).
    prepared
        The constructed, warmed-up step.
    cores
        ``pm.sample``'s ``cores``.
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    MethodResult
    """
    res = MethodResult(
        method=method.label, cores=cores, setup_s=prepared.setup_s, compile_s=prepared.compile_s
    )
    try:
        with quiet_sampling():
            t0 = time.perf_counter()
            idata = pm.sample(
                tune=config.ours_tune,
                draws=config.ours_draws,
                chains=config.chains,
                cores=cores,
                random_seed=prepared.seed,
                discard_tuned_samples=False,
                **prepared.sample_kwargs(),
            )
            call_s = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        return failed(res, exc)
    res.extra = run_extra(prepared, idata, config, call_s)
    res.wall_s = prepared.map_s + res.extra["sampling_s"]
    res.passes = stat_total(idata, "rows_touched") / data.n_rows
    res.setup_passes = prepared.setup_passes
    score_draws(res, idata_draws(idata), ref, idata_min_ess(idata))
    res.notes = NOTES.get(method.cls, default_notes)(idata, res, res.extra)
    res.notes += divergence_note(res.extra["diverging_tuning"], res.extra["diverging_draws"])
    return res


def run_ours(kind: str, data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """One of our step methods with its settings: setup, warm-up (compile), then every cores.

    ``setup`` is the step's construction (compilation + MAP search + Hessian); the MAP alone
    is timed by re-running it on the compiled layer, and compile = setup - MAP + warm-up.
    Wall = MAP + ``pm.sample``'s own sampling time (tuning included).

    Parameters
    ----------
    kind
        Its name in :data:`protocol.OURS`.
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        One row per value of ``config.cores``.
    """
    method = OURS[kind]
    prepared = prepare(method, data, config.seed + method.seed_offset)
    return [sample_ours(method, prepared, cores, data, ref, config) for cores in config.cores]
