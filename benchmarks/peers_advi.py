"""Peer: PyMC's minibatch ADVI (mean-field), the usual PyMC route for many rows.

The benchmark's model with its rows (``pm.Data``) read through
``pm.Minibatch(X, y, batch_size=BATCH_SIZE)`` and ``total_size=N`` on the likelihood, fitted by
``pm.fit(n, method="advi", random_seed=..., obj_optimizer=pm.adagrad_window(learning_rate=lr),
callbacks=[...])`` from PyMC's default start (means 0, sds 1), then ``approx.sample`` for
``chains x ours_draws`` independent draws.

Iterations: ``n = chains x peer_steps`` (the minibatch gradients of the BlackJAX peers: 40,000,
8,000 with ``--quick``), a fixed count rather than ``CheckParametersConvergence``: with
minibatch and Monte Carlo noise in every gradient the parameters keep moving at a constant
learning rate, so a tolerance on their change decides little, and a fixed count gives a known
cost.  PyMC's default optimizer (``adagrad_window``) has a constant rate; at N = 1e5 its
final iterate wandered 2-4 posterior sds from the reference means at 1e-2 and 0.6-0.8 at
1e-3 (the default), which also took over 50,000 iterations to shrink the sds from 1.  So the
rate decays in three equal stages, :data:`LEARNING_RATES` (1e-2, 1e-3, 1e-4: ADVI's own
step-size sequence decreases too, Kucukelbir et al. 2017), set by a callback on a shared
variable.

*Compile* = the ``pm.fit`` call up to the end of its first iteration (the graph's compilation)
plus the ``approx.sample`` call (it compiles its sampling function; drawing takes
milliseconds); *wall* = the remaining iterations; *passes* = iterations x ``BATCH_SIZE`` / N
(one minibatch gradient each, ``obj_n_mc=1``).  Accuracy by ``score_draws`` on the draws
(the errors of the approximation's exact means and sds are kept in the JSON as well).  The draws are
independent draws of the approximation, not of the posterior: their ESS is their number and
says nothing of the posterior, so the row leaves min bulk ESS, ESS/s and ESS/pass empty
(their ESS is in the JSON) and is judged on time, passes and accuracy.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pymc as pm
import pytensor
from protocol import BATCH_SIZE, Config, Dataset
from reference import Reference
from scoring import MethodResult, failed, idata_draws, quiet_sampling, score_draws

#: the peer's name in the tables
NAME = "PyMC ADVI mean-field (minibatch)"
#: learning rates of ``adagrad_window`` in equal stages of the iterations
LEARNING_RATES = (1e-2, 1e-3, 1e-4)
#: added to the run's seed
SEED_OFFSET = 83


class StepDecay:
    """``pm.fit`` callback: the learning rate of each stage, and the time of the first step.

    Parameters
    ----------
    iterations
        Iterations of the fit.
    rates
        Learning rates of equal stages.
    """

    def __init__(self, iterations: int, rates: tuple[float, ...] = LEARNING_RATES) -> None:
        self.iterations = iterations
        self.rates = rates
        self.learning_rate = pytensor.shared(rates[0], name="learning_rate")
        self.first_step_at: float | None = None

    def stage(self, i: int) -> int:
        """Stage of iteration ``i`` (0-based)."""
        return min(len(self.rates) - 1, i * len(self.rates) // self.iterations)

    def __call__(self, approx: Any, losses: Any, i: int) -> None:
        """After iteration ``i`` (1-based): note the time of the first, set the next's rate."""
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()
        self.learning_rate.set_value(self.rates[self.stage(i)])


def minibatch_model(data: Dataset) -> pm.Model:
    """The benchmark's model with ``pm.Minibatch`` rows of ``pm.Data`` and ``total_size=N``.

    Parameters
    ----------
    data
        The data set.

    Returns
    -------
    pm.Model
    """
    with pm.Model() as model:
        # shared data: numpy arrays would become constants of the compiled graph (numba
        # freezes those into the function)
        X = pm.Data("X", data.X)
        y = pm.Data("y_data", data.y)
        X_mb, y_mb = pm.Minibatch(X, y, batch_size=BATCH_SIZE)
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.X.shape[1])
        pm.Bernoulli("y", logit_p=X_mb @ beta, observed=y_mb, total_size=data.n_rows)
    return model


def fit_advi(data: Dataset, config: Config) -> tuple[Any, float, float]:
    """Fit the mean-field approximation on minibatches, timing compilation and iterations.

    Parameters
    ----------
    data, config
        The data set and the benchmark's settings.

    Returns
    -------
    approx : pymc.variational.approximations.MeanField
        The fitted approximation.
    compile_s, wall_s : float
        Seconds up to the end of the first iteration, and of the remaining ones.
    """
    iterations = config.chains * config.peer_steps
    schedule = StepDecay(iterations)
    with minibatch_model(data), quiet_sampling():
        t0 = time.perf_counter()
        approx = pm.fit(
            n=iterations,
            method="advi",
            random_seed=config.seed + SEED_OFFSET,
            obj_optimizer=pm.adagrad_window(learning_rate=schedule.learning_rate),
            callbacks=[schedule],
            progressbar=False,
        )
        end = time.perf_counter()
    return approx, schedule.first_step_at - t0, end - schedule.first_step_at


def advi_extra(approx: Any, ref: Reference, config: Config) -> dict[str, Any]:
    """The fit's details kept in the JSON output (settings, losses, the exact moments' errors).

    Parameters
    ----------
    approx
        The fitted approximation.
    ref, config
        The reference posterior and the benchmark's settings.

    Returns
    -------
    dict
        ``stage_losses``: mean loss over the last tenth of each stage.
    """
    losses = np.asarray(approx.hist)
    stages = np.array_split(losses, len(LEARNING_RATES))
    mean, sd = approx.mean.eval(), approx.std.eval()
    ratio = sd / ref.sd
    return {
        "iterations": int(losses.size),
        "batch_size": BATCH_SIZE,
        "learning_rates": list(LEARNING_RATES),
        "stage_losses": [float(s[-max(1, s.size // 10) :].mean()) for s in stages],
        "draws": config.chains * config.ours_draws,
        "exact_max_mean_err": float(np.max(np.abs(mean - ref.mean) / ref.sd)),
        "exact_sd_ratio": [float(ratio.min()), float(ratio.max())],
    }


def blank_efficiency(res: MethodResult) -> MethodResult:
    """Move the ESS of independent draws to ``extra`` and leave the ESS columns empty.

    Parameters
    ----------
    res
        A scored row.

    Returns
    -------
    MethodResult
        ``res`` itself.
    """
    res.extra["draws_min_bulk_ess"] = res.min_ess
    res.min_ess = res.ess_per_s = res.ess_per_pass = None
    return res


def run_advi(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """PyMC's mean-field ADVI on minibatches, scored on independent draws of the fit.

    Parameters
    ----------
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        One row.
    """
    res = MethodResult(method=NAME, cores=1)
    draws = config.chains * config.ours_draws
    try:
        approx, res.compile_s, res.wall_s = fit_advi(data, config)
        t0 = time.perf_counter()
        idata = approx.sample(draws, random_seed=config.seed + SEED_OFFSET)
        res.compile_s += time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        return [failed(res, exc)]
    res.extra = advi_extra(approx, ref, config)
    res.passes = res.extra["iterations"] * BATCH_SIZE / data.n_rows
    blank_efficiency(score_draws(res, idata_draws(idata), ref))
    res.notes = (
        f"{res.extra['iterations']:,} iterations of {BATCH_SIZE} rows, learning rate "
        f"{' → '.join(f'{lr:g}' for lr in LEARNING_RATES)}; {draws} independent draws of the "
        "fitted approximation: no ESS columns (its ESS is its number of draws)"
    )
    return [res]
