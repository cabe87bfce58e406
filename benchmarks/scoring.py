"""What is measured of each method and how its draws are scored against the reference.

:class:`MethodResult` is one row of the tables; :func:`score_draws` fills its accuracy
(error of the means, ratio of the standard deviations) and efficiency (minimum bulk ESS per
second and per pass over the data) columns.  The helpers read PyMC's sample stats (rows
touched, leapfrog steps, divergences), count the rows of full-data passes, and quieten
PyMC while it samples.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import arviz as az
import numpy as np
import xarray as xr
from reference import Reference

import pymc_bigdata as pmbd


@dataclass
class MethodResult:
    """Everything measured for one method on one data set (None: not applicable)."""

    method: str
    cores: int | None = None
    status: str = "ok"
    setup_s: float | None = None
    compile_s: float | None = None
    wall_s: float | None = None
    passes: float | None = None
    setup_passes: float | None = None
    min_ess: float | None = None
    ess_per_s: float | None = None
    ess_per_pass: float | None = None
    ess_per_s_vs_nuts: float | None = None
    max_mean_err: float | None = None
    max_mean_z: float | None = None
    sd_ratio_min: float | None = None
    sd_ratio_max: float | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def failed(result: MethodResult, exc: Exception) -> MethodResult:
    """Mark ``result`` as failed with ``exc`` (a failure is a result to report).

    Parameters
    ----------
    result
        The row to mark.
    exc
        The exception that stopped the method.

    Returns
    -------
    MethodResult
        ``result`` itself.
    """
    result.status = f"failed: {type(exc).__name__}: {exc}"
    return result


def score_draws(
    result: MethodResult, draws: np.ndarray, ref: Reference, ess: np.ndarray | None = None
) -> MethodResult:
    """Fill accuracy and ESS columns from draws of shape (chains, draws, d).

    ``max_mean_z`` divides each mean error by its expected Monte Carlo error (sampler MCSE and
    reference MCSE combined): values up to about 3.5 are what noise alone gives over 30
    coefficients; larger ones point at bias.

    Parameters
    ----------
    result
        The row to fill; its ``wall_s`` and ``passes``, when set, give ESS/s and ESS/pass.
    draws
        Draws of the coefficients, (chains, draws, d).
    ref
        The reference posterior.
    ess
        Bulk ESS of each coefficient, if already known (else computed from ``draws``).

    Returns
    -------
    MethodResult
        ``result`` itself.
    """
    flat = draws.reshape(-1, draws.shape[-1])
    mean, sd = flat.mean(axis=0), flat.std(axis=0, ddof=1)
    if ess is None:
        ess = np.asarray(az.ess(draws, method="bulk"))
    mcse = np.asarray(az.mcse(draws, method="mean"))
    err = np.abs(mean - ref.mean)
    result.min_ess = float(np.min(ess))
    result.max_mean_err = float(np.max(err / ref.sd))
    result.max_mean_z = float(np.max(err / np.sqrt(mcse**2 + ref.mcse_mean**2)))
    ratio = sd / ref.sd
    result.sd_ratio_min, result.sd_ratio_max = float(ratio.min()), float(ratio.max())
    if result.wall_s:
        result.ess_per_s = result.min_ess / result.wall_s
    if result.passes:
        result.ess_per_pass = result.min_ess / result.passes
    return result


def add_nuts_ratios(results: list[MethodResult]) -> None:
    """Fill ``ess_per_s_vs_nuts`` from the NUTS row, if there is one.

    Parameters
    ----------
    results
        The rows of one data set, changed in place.
    """
    nuts = next((r for r in results if r.method.startswith("PyMC NUTS") and r.ess_per_s), None)
    if nuts is None:
        return
    for r in results:
        if r.ess_per_s is not None:
            r.ess_per_s_vs_nuts = r.ess_per_s / nuts.ess_per_s


# ---------------------------------------------------------------------------- PyMC's output
def idata_draws(idata: xr.DataTree) -> np.ndarray:
    """Posterior draws of ``beta`` as (chains, draws, d).

    Parameters
    ----------
    idata
        What ``pm.sample`` returned.

    Returns
    -------
    ndarray
    """
    return np.asarray(idata.posterior["beta"].values)


def idata_min_ess(idata: xr.DataTree) -> np.ndarray:
    """Bulk ESS of every coefficient, ``arviz.ess(idata, method="bulk")``.

    Parameters
    ----------
    idata
        What ``pm.sample`` returned.

    Returns
    -------
    ndarray, shape (d,)
    """
    return np.asarray(az.ess(idata, method="bulk")["beta"].values)


def stat_total(idata: xr.DataTree, name: str) -> float:
    """Sum of a sample stat over tuning (``warmup_sample_stats``) and kept draws.

    Parameters
    ----------
    idata
        What ``pm.sample(..., discard_tuned_samples=False)`` returned.
    name
        Name of the sample stat.

    Returns
    -------
    float
    """
    total = float(idata.sample_stats[name].values.sum())
    if "warmup_sample_stats" in idata.children:
        total += float(idata.warmup_sample_stats[name].values.sum())
    return total


def divergences(idata: xr.DataTree) -> tuple[int, int]:
    """Divergent transitions (during tuning, after tuning).

    Parameters
    ----------
    idata
        What ``pm.sample(..., discard_tuned_samples=False)`` returned.

    Returns
    -------
    during, after : int
    """
    after = int(idata.sample_stats["diverging"].values.sum())
    during = 0
    if "warmup_sample_stats" in idata.children:
        during = int(idata.warmup_sample_stats["diverging"].values.sum())
    return during, after


def divergence_note(during: int, after: int) -> str:
    """Table note for divergent transitions (empty when there were none).

    Parameters
    ----------
    during, after
        Divergent transitions during and after tuning.

    Returns
    -------
    str
    """
    if not during and not after:
        return ""
    return f", divergent: {after} after tuning, {during} during"


# ---------------------------------------------------------------------------- instruments
@contextlib.contextmanager
def counting_rows(layer: pmbd.MinibatchModel) -> Iterator[list[int]]:
    """Count the rows that full-data passes of ``layer`` read (wraps its row source).

    Parameters
    ----------
    layer
        The step method's minibatch layer.

    Yields
    ------
    list of int
        A one-element counter, updated as the passes read rows.
    """
    source = layer.rows
    original = source.chunks
    counter = [0]

    def chunks(chunk_rows: int, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for block in original(chunk_rows, *args, **kwargs):
            counter[0] += len(block[0])
            yield block

    source.chunks = chunks
    try:
        yield counter
    finally:
        del source.chunks


@contextlib.contextmanager
def quiet_sampling() -> Iterator[None]:
    """Silence PyMC's progress logging and the short-chain warnings of warm-up runs.

    Yields
    ------
    None
    """
    logger = logging.getLogger("pymc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)
