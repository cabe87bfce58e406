"""Side-by-side benchmark of the subsampling samplers against full-data NUTS (and peers).

One process, one data set per size: a logistic regression with ``d = 30`` correlated
features, sampled by

* ``pymc_bigdata.SGHMC``, ``SGLD``, ``SBPS``, ``HMCECS`` (perturbed and signed) and ``EWSG``
  with their defaults (``cores=1`` and ``cores=2``), and perturbed ``HMCECS`` at NumPyro's subsample
  size and blocks (``m = 1000``, ``G = 100``: ``hmcecs_m1000``),
* PyMC's own NUTS on the full data (``pm.sample(nuts_sampler="pymc")``),
* optional peers, when importable: BlackJAX SGLD / SGHMC (control-variate gradients,
  step size picked on a grid) and NumPyro HMCECS.

Every method is scored against a reference posterior (Laplace fit refined by importance
sampling, cached under ``benchmarks/results/``) on accuracy (error of the means and ratio
of the standard deviations) and efficiency (minimum bulk ESS per second and per pass over
the data).  See ``docs/benchmarks.md`` for the protocol.

Usage::

    .venv/bin/python benchmarks/run.py                 # N = 1e5 and 1e6
    .venv/bin/python benchmarks/run.py --sizes 1e5     # one size
    .venv/bin/python benchmarks/run.py --quick         # smoke run, N = 2e4, short chains
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmb

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: number of coefficients, feature equicorrelation, sd of the true coefficients
DIM = 30
RHO = 0.5
BETA_SD = 0.3
#: rows per minibatch for every subsampling method (ours' default; the peers get the same)
BATCH_SIZE = 1000
#: step-size grid of the BlackJAX peers, as fractions of the stability limit scale
PEER_GRID = (0.03, 0.1, 0.2, 0.5, 1.0)
PEER_INSTALL_HINT = "pip install blackjax jax"
HMCECS_INSTALL_HINT = "pip install numpyro jax"


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Config:
    """Run lengths and seeds of one benchmark run."""

    sizes: tuple[int, ...]
    seed: int
    quick: bool
    ours_tune: int
    ours_draws: int
    chains: int
    nuts_tune: int
    nuts_draws: int
    is_samples: int
    is_df: float
    peer_steps: int
    methods: tuple[str, ...]
    cores: tuple[int, ...]
    out_stem: str


#: AusterityMH at the issue's grid: epsilon in {0, 0.01, 0.05, 0.1}, residual and plain tests
#: (the plain test with the same Langevin proposal, so that only the test differs)
AUSTERITY_GRID = [(eps, test) for test in ("residuals", "plain") for eps in (0.0, 0.01, 0.05, 0.1)]
AUSTERITY = (
    *(f"austerity_{test}_eps{eps:g}" for eps, test in AUSTERITY_GRID),
    "austerity_rw",
    "austerity_sgld",
)

#: the EWSG paper's claim (closer than SGHMC without B-hat at the same step size, control
#: variates off): plain minibatch sums of BATCH_SIZE rows per candidate, fixed steps at which
#: the gradient noise of N = 1e5 feeds about 30 %, 60 % and 120 % of the variance; SGHMC with
#: its reshuffled minibatches (the default) and with independent ones (the paper's uniform
#: subsampling), EWSG with its defaults (reshuffled), independent minibatches, and the paper's
#: index weights (independent). In results/ewsg_nocv_n1e5.md (at 5f9464d, when EWSG drew
#: independent minibatches by default) "ours EWSG, no control variates" is today's
#: ewsg_nocv_iid, and the paper's weights' rows were independent too
NOCV_STEPS = (0.005, 0.01, 0.02)
NOCV_VARIANTS = {
    "sghmc_nocv": ("ours SGHMC, no control variates", pmb.SGHMC, {}, 11),
    "sghmc_nocv_iid": (
        "ours SGHMC, no control variates, independent minibatches",
        pmb.SGHMC,
        {"reshuffle": False},
        11,
    ),
    # SGHMC reading as many rows per step as EWSG (both candidates' rows in one minibatch)
    "sghmc_nocv_rows2": (
        "ours SGHMC, no control variates, 2 x BATCH_SIZE rows per step",
        pmb.SGHMC,
        {"batch_size": 2 * BATCH_SIZE},
        11,
    ),
    "sghmc_nocv_iid_rows2": (
        "ours SGHMC, no control variates, independent minibatches, 2 x BATCH_SIZE rows per step",
        pmb.SGHMC,
        {"batch_size": 2 * BATCH_SIZE, "reshuffle": False},
        11,
    ),
    "ewsg_nocv": (
        "ours EWSG, no control variates, reshuffled minibatches",
        pmb.EWSG,
        {"index_weights": "linear"},
        53,
    ),
    "ewsg_nocv_iid": (
        "ours EWSG, no control variates, independent minibatches",
        pmb.EWSG,
        {"index_weights": "linear", "reshuffle": False},
        53,
    ),
    "ewsg_nocv_paper": (
        "ours EWSG, no control variates, the paper's index weights, independent minibatches",
        pmb.EWSG,
        {"index_weights": "paper", "reshuffle": False},
        53,
    ),
}
NOCV = tuple(f"{kind}_eps{eps:g}" for eps in NOCV_STEPS for kind in NOCV_VARIANTS)

ALL_METHODS = (
    "sghmc",
    "sgld",
    "sbps",
    "hmcecs",
    "hmcecs_signed",
    "hmcecs_m1000",
    "ewsg",
    *NOCV,
    *AUSTERITY,
    "nuts",
    "blackjax",
    "numpyro",
)

#: our step methods: (label, class, keyword arguments, seed offset)
OURS = {
    "sghmc": ("ours SGHMC", pmb.SGHMC, {}, 11),
    "sgld": ("ours SGLD", pmb.SGLD, {}, 23),
    "sbps": ("ours SBPS", pmb.SBPS, {}, 3),
    "hmcecs": ("ours HMCECS perturbed", pmb.HMCECS, {}, 41),
    "hmcecs_signed": ("ours HMCECS signed", pmb.HMCECS, {"estimator": "signed"}, 43),
    "hmcecs_m1000": (
        "ours HMCECS perturbed m=1000 G=100",
        pmb.HMCECS,
        {"subsample_size": BATCH_SIZE, "blocks": 100},
        41,
    ),
    "ewsg": ("ours EWSG", pmb.EWSG, {}, 53),
    **{
        f"{kind}_eps{eps:g}": (
            f"{label}, eps={eps:g}",
            cls,
            {"control_variates": False, "step_size": eps, "batch_size": BATCH_SIZE, **kwargs},
            offset,
        )
        for eps in NOCV_STEPS
        for kind, (label, cls, kwargs, offset) in NOCV_VARIANTS.items()
    },
    **{
        f"austerity_{test}_eps{eps:g}": (
            f"ours AusterityMH eps={eps:g}, {test} test",
            pmb.AusterityMH,
            {"epsilon": eps, "test": test},
            61,
        )
        for eps, test in AUSTERITY_GRID
    },
    # the default's Langevin proposal (drift: the Taylor model, no rows) against the paper's
    "austerity_rw": ("ours AusterityMH, random walk", pmb.AusterityMH, {"proposal": "rw"}, 61),
    "austerity_sgld": ("ours AusterityMH, SGLD", pmb.AusterityMH, {"proposal": "sgld"}, 61),
}


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """Read the command line into a :class:`Config`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=float,
        default=[1e5, 1e6],
        help="numbers of rows N (default: 1e5 1e6)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 2e4, short chains")
    parser.add_argument("--seed", type=int, default=0, help="seed of data and samplers")
    parser.add_argument(
        "--nuts-tune",
        type=int,
        default=None,
        help="NUTS tuning steps per chain (default 300; 100 with --quick)",
    )
    parser.add_argument(
        "--nuts-draws",
        type=int,
        default=None,
        help="NUTS draws per chain (default 300; 100 with --quick)",
    )
    parser.add_argument(
        "--is-samples",
        type=int,
        default=None,
        help="importance samples of the reference (default 20000; 5000 with --quick)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=ALL_METHODS,
        default=list(ALL_METHODS),
        help="methods to run (default: all)",
    )
    parser.add_argument(
        "--cores",
        nargs="+",
        type=int,
        default=[1, 2],
        help="our samplers' pm.sample cores values (default: 1 2)",
    )
    parser.add_argument("--ours-tune", type=int, default=None, help="our tuning steps per chain")
    parser.add_argument("--ours-draws", type=int, default=None, help="our draws per chain")
    parser.add_argument(
        "--out",
        default=None,
        help="stem of the output files in benchmarks/results/ (default: latest; quick with "
        "--quick)",
    )
    args = parser.parse_args(argv)
    sizes = (20_000,) if args.quick else tuple(int(s) for s in args.sizes)

    def nuts_len(given: int | None) -> int:
        if given is not None:
            return given
        return 100 if args.quick else 300

    return Config(
        sizes=sizes,
        seed=args.seed,
        quick=args.quick,
        ours_tune=args.ours_tune or (200 if args.quick else 1000),
        ours_draws=args.ours_draws or (200 if args.quick else 1000),
        chains=2,
        nuts_tune=nuts_len(args.nuts_tune),
        nuts_draws=nuts_len(args.nuts_draws),
        is_samples=args.is_samples or (5000 if args.quick else 20_000),
        is_df=10.0,
        peer_steps=4000 if args.quick else 20_000,
        methods=tuple(args.methods),
        cores=tuple(args.cores),
        out_stem=args.out or ("quick" if args.quick else "latest"),
    )


# ---------------------------------------------------------------------------- data and model
@dataclass(frozen=True)
class Dataset:
    """A simulated logistic-regression data set."""

    X: np.ndarray
    y: np.ndarray
    beta_true: np.ndarray
    seed: int

    @property
    def n_rows(self) -> int:
        """Number of rows N."""
        return int(self.X.shape[0])


def make_data(n_rows: int, seed: int, dim: int = DIM, rho: float = RHO) -> Dataset:
    """Equicorrelated Gaussian features ``X = Z chol(C)^T``, ``beta ~ N(0, 0.3^2)``, Bernoulli y."""
    rng = np.random.default_rng([seed, n_rows])
    corr = np.full((dim, dim), rho) + (1.0 - rho) * np.eye(dim)
    beta_true = rng.normal(0.0, BETA_SD, size=dim)
    X = rng.standard_normal((n_rows, dim)) @ np.linalg.cholesky(corr).T
    eta = X @ beta_true
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-eta))).astype(np.int64)
    return Dataset(X=X, y=y, beta_true=beta_true, seed=seed)


def build_model(data: Dataset) -> pm.Model:
    """``beta ~ N(0, 1)``, ``y ~ Bernoulli(logit_p = X beta)`` with X as ``pm.Data``."""
    with pm.Model() as model:
        X = pm.Data("X", data.X)
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=data.y)
    return model


def logistic_loglik(
    X: np.ndarray, y: np.ndarray, betas: np.ndarray, max_elements: int = 1 << 23
) -> np.ndarray:
    """Full-data logistic log-likelihood ``sum_i y_i eta_i - softplus(eta_i)`` of many betas.

    Parameters
    ----------
    X, y
        Features (N, d) and 0/1 outcomes (N,).
    betas
        Coefficient vectors (S, d).
    max_elements
        Size of the (rows x S) block of linear predictors held at once.

    Returns
    -------
    ndarray, shape (S,)
    """
    betas = np.atleast_2d(betas)
    rows = max(1, max_elements // betas.shape[0])
    y = y.astype(np.float64)
    total = np.zeros(betas.shape[0])
    for start in range(0, X.shape[0], rows):
        eta = X[start : start + rows] @ betas.T
        total += y[start : start + rows] @ eta
        total -= np.logaddexp(0.0, eta).sum(axis=0)  # stable softplus
    return total


def log_prior(betas: np.ndarray) -> np.ndarray:
    """``N(0, 1)`` log prior of each row of ``betas``, up to a constant."""
    return -0.5 * np.sum(np.atleast_2d(betas) ** 2, axis=1)


def newton_map(data: Dataset, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Independent numpy MAP (Newton's method) and negative Hessian, to check the layer's."""
    beta = np.zeros(data.X.shape[1])
    y = data.y.astype(np.float64)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(data.X @ beta)))
        grad = data.X.T @ (y - p) - beta
        hess = (data.X * (p * (1.0 - p))[:, None]).T @ data.X + np.eye(len(beta))
        step = np.linalg.solve(hess, grad)
        beta = beta + step
        if np.abs(step).max() < 1e-12:
            break
    p = 1.0 / (1.0 + np.exp(-(data.X @ beta)))
    hess = (data.X * (p * (1.0 - p))[:, None]).T @ data.X + np.eye(len(beta))
    return beta, hess


# ---------------------------------------------------------------------------- reference
@dataclass(frozen=True)
class Reference:
    """Reference posterior summary from importance sampling around the Laplace fit."""

    mean: np.ndarray
    sd: np.ndarray
    map_theta: np.ndarray
    precision: np.ndarray
    ess: float
    n_samples: int
    df: float
    seconds: float
    map_check: float
    cached: bool

    @property
    def mcse_mean(self) -> np.ndarray:
        """Approximate Monte Carlo standard error of the reference means."""
        return self.sd / math.sqrt(self.ess)


def _reference_path(n_rows: int, seed: int) -> Path:
    return RESULTS_DIR / f"reference_N{n_rows}_seed{seed}.npz"


def compute_reference(data: Dataset, model: pm.Model, n_samples: int, df: float) -> Reference:
    """Laplace fit (the layer's MAP and Hessian) refined by Student-t importance sampling.

    Proposal: multivariate t with ``df`` degrees of freedom centred at the MAP with the
    Laplace covariance; weights ``exp(log posterior - log proposal)`` self-normalised.
    """
    t0 = time.perf_counter()
    fit = pmb.MinibatchModel(model).map_estimate()
    theta, precision = fit.theta, fit.hessian
    cov = np.linalg.inv(precision)
    chol = np.linalg.cholesky(0.5 * (cov + cov.T))
    newton_theta, _ = newton_map(data)
    map_check = float(np.max(np.abs(newton_theta - theta) / np.sqrt(np.diag(cov))))

    rng = np.random.default_rng([data.seed, data.n_rows, 7])
    z = rng.standard_normal((n_samples, len(theta)))
    scale = np.sqrt(df / rng.chisquare(df, size=n_samples))
    samples = theta + (z @ chol.T) * scale[:, None]
    mahalanobis = np.sum(z**2, axis=1) * scale**2
    log_q = -0.5 * (df + len(theta)) * np.log1p(mahalanobis / df)
    log_target = logistic_loglik(data.X, data.y, samples) + log_prior(samples)
    log_w = log_target - log_q
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ samples
    sd = np.sqrt(w @ (samples - mean) ** 2)
    ess = float(1.0 / np.sum(w**2))
    return Reference(
        mean=mean,
        sd=sd,
        map_theta=theta,
        precision=precision,
        ess=ess,
        n_samples=n_samples,
        df=df,
        seconds=time.perf_counter() - t0,
        map_check=map_check,
        cached=False,
    )


def load_or_compute_reference(
    data: Dataset, model: pm.Model, n_samples: int, df: float
) -> Reference:
    """The cached reference for (N, seed) if it matches the settings, else compute and cache."""
    path = _reference_path(data.n_rows, data.seed)
    if path.exists():
        saved = np.load(path)
        if (
            int(saved["n_samples"]) == n_samples
            and float(saved["df"]) == df
            and saved["mean"].shape == (data.X.shape[1],)
        ):
            return Reference(
                mean=saved["mean"],
                sd=saved["sd"],
                map_theta=saved["map_theta"],
                precision=saved["precision"],
                ess=float(saved["ess"]),
                n_samples=n_samples,
                df=df,
                seconds=float(saved["seconds"]),
                map_check=float(saved["map_check"]),
                cached=True,
            )
    ref = compute_reference(data, model, n_samples, df)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        mean=ref.mean,
        sd=ref.sd,
        map_theta=ref.map_theta,
        precision=ref.precision,
        ess=ref.ess,
        n_samples=ref.n_samples,
        df=ref.df,
        seconds=ref.seconds,
        map_check=ref.map_check,
    )
    return ref


# ---------------------------------------------------------------------------- scoring
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


def score_draws(
    result: MethodResult, draws: np.ndarray, ref: Reference, ess: np.ndarray | None = None
) -> MethodResult:
    """Fill accuracy and ESS columns from draws of shape (chains, draws, d).

    ``max_mean_z`` divides each mean error by its expected Monte Carlo error (sampler MCSE and
    reference MCSE combined): values up to about 3.5 are what noise alone gives over 30
    coefficients; larger ones point at bias.
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


def idata_draws(idata) -> np.ndarray:
    """Posterior draws of ``beta`` as (chains, draws, d)."""
    return np.asarray(idata.posterior["beta"].values)


def idata_min_ess(idata) -> np.ndarray:
    """Bulk ESS of every coefficient, ``arviz.ess(idata, method="bulk")``."""
    return np.asarray(az.ess(idata, method="bulk")["beta"].values)


def stat_total(idata, name: str) -> float:
    """Sum of a sample stat over tuning (``warmup_sample_stats``) and kept draws."""
    total = float(idata.sample_stats[name].values.sum())
    if "warmup_sample_stats" in idata.children:
        total += float(idata.warmup_sample_stats[name].values.sum())
    return total


def divergences(idata) -> tuple[int, int]:
    """Divergent transitions (during tuning, after tuning)."""
    after = int(idata.sample_stats["diverging"].values.sum())
    during = 0
    if "warmup_sample_stats" in idata.children:
        during = int(idata.warmup_sample_stats["diverging"].values.sum())
    return during, after


def divergence_note(during: int, after: int) -> str:
    """Table note for divergent transitions (empty when there were none)."""
    if not during and not after:
        return ""
    return f", divergent: {after} after tuning, {during} during"


@contextlib.contextmanager
def counting_rows(layer: pmb.MinibatchModel) -> Iterator[list[int]]:
    """Count the rows that full-data passes of ``layer`` read (wraps its row source)."""
    source = layer.rows
    original = source.chunks
    counter = [0]

    def chunks(chunk_rows: int, *args, **kwargs):
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
    """Silence PyMC's progress logging and the short-chain warnings of warm-up runs."""
    logger = logging.getLogger("pymc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)


# ---------------------------------------------------------------------------- our samplers
def run_ours(kind: str, data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """SGHMC or SGLD with defaults: setup, warm-up (compile), then ``cores=1`` and ``cores=2``.

    ``setup`` is the step's construction (compilation + MAP search + Hessian); the MAP alone
    is timed by re-running it on the compiled layer, and compile = setup - MAP + warm-up.
    Wall = MAP + ``pm.sample``'s own sampling time (tuning included).
    """
    label, cls, kwargs, offset = OURS[kind]
    model = build_model(data)
    seed = config.seed + offset
    t0 = time.perf_counter()
    step = cls(model=model, **kwargs)
    setup_s = time.perf_counter() - t0
    with counting_rows(step.layer) as rows_read:
        t0 = time.perf_counter()
        step.layer.find_map()
        map_s = time.perf_counter() - t0
    setup_passes = rows_read[0] / data.n_rows
    common = dict(
        step=step,
        model=model,
        progressbar=False,
        compute_convergence_checks=False,
    )
    with quiet_sampling():
        t0 = time.perf_counter()
        pm.sample(tune=5, draws=5, chains=1, cores=1, random_seed=seed, **common)
        warm_s = time.perf_counter() - t0
    compile_s = (setup_s - map_s) + warm_s
    results = []
    for cores in config.cores:
        res = MethodResult(method=label, cores=cores, setup_s=setup_s, compile_s=compile_s)
        try:
            with quiet_sampling():
                t0 = time.perf_counter()
                idata = pm.sample(
                    tune=config.ours_tune,
                    draws=config.ours_draws,
                    chains=config.chains,
                    cores=cores,
                    random_seed=seed,
                    discard_tuned_samples=False,
                    **common,
                )
                call_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a failure is a result to report
            res.status = f"failed: {type(exc).__name__}: {exc}"
            results.append(res)
            continue
        sampling_s = float(idata.posterior.attrs["sampling_time"])
        res.wall_s = map_s + sampling_s
        res.passes = stat_total(idata, "rows_touched") / data.n_rows
        res.setup_passes = setup_passes
        score_draws(res, idata_draws(idata), ref, idata_min_ess(idata))
        div_tune, div_draws = divergences(idata)
        res.extra = {
            "map_s": map_s,
            "warmup_call_s": warm_s,
            "sample_call_s": call_s,
            "sampling_s": sampling_s,
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
            res.extra["noise_clipped"] = int(stat_total(idata, "noise_clipped"))
        res.notes = f"eps={step.step_size:.3g}, {step.inner_steps} steps/draw"
        if kind == "sbps":
            res.notes = _sbps_notes(idata, res, res.extra)
        if kind.startswith("hmcecs"):
            res.notes = _hmcecs_notes(idata, res, res.extra)
        if kind.startswith("ewsg"):
            res.notes = _ewsg_notes(idata, res, res.extra)
        if kind.startswith("austerity"):
            res.notes = _austerity_notes(idata, res, res.extra)
        res.notes += divergence_note(div_tune, div_draws)
        results.append(res)
    return results


def _sbps_notes(idata, res: MethodResult, extra: dict) -> str:
    """Travel per draw, proposals and rows per effective draw, violations (kept draws)."""
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


def _ewsg_notes(idata, res: MethodResult, extra: dict) -> str:
    """Step size x steps, rows per candidate minibatch, index acceptance, noise share (of
    uniform minibatches: an upper bound for EWSG's) and rows per effective draw."""
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


def _austerity_notes(idata, res: MethodResult, extra: dict) -> str:
    """Proposal scale x decisions per draw, rows per decision, acceptance, the share of
    decisions that read every row, and rows per effective draw (kept draws)."""
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


def _hmcecs_notes(idata, res: MethodResult, extra: dict) -> str:
    """Step size x leapfrog steps, subsample size (lambda), acceptances, mean sigma_hat^2, rows
    per effective draw (kept draws) and negative signs."""
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


# ---------------------------------------------------------------------------- PyMC NUTS
def run_nuts(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """Full-data PyMC NUTS (``jitter+adapt_diag``); compile = a 5+5-draw warm-up call.

    Wall = ``pm.sample``'s own sampling time (tuning included, initialisation excluded);
    passes = leapfrog steps (``n_steps``, tuning included), one full-data gradient each.
    """
    tune, draws = config.nuts_tune, config.nuts_draws
    model = build_model(data)
    seed = config.seed + 37
    common = dict(
        model=model,
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
    sampling_s = float(idata.posterior.attrs["sampling_time"])
    res.wall_s = sampling_s
    res.passes = stat_total(idata, "n_steps")
    score_draws(res, idata_draws(idata), ref, idata_min_ess(idata))
    div_tune, div_draws = divergences(idata)
    mean_steps = float(idata.sample_stats["n_steps"].values.mean())
    res.extra = {
        "sample_call_s": call_s,
        "sampling_s": sampling_s,
        "tune": tune,
        "draws": draws,
        "chains": config.chains,
        "mean_n_steps": mean_steps,
        "diverging_tuning": div_tune,
        "diverging_draws": div_draws,
        "step_size": float(idata.sample_stats["step_size"].values.mean()),
    }
    res.notes = f"tune={tune}, draws={draws}, {mean_steps:.0f} steps/draw" + (
        divergence_note(div_tune, div_draws)
    )
    return [res]


# ---------------------------------------------------------------------------- BlackJAX peers
def run_blackjax(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """BlackJAX SGLD and SGHMC with control-variate gradients, if blackjax and jax import.

    Minibatches of ``BATCH_SIZE`` rows drawn with replacement inside a ``lax.scan``; 2 chains
    (``vmap``) from zero; second half kept, thinned to 1000 draws per chain.  The step size
    is picked on ``PEER_GRID`` (scaled by the largest eigenvalue of the Laplace precision,
    given to the peers for free) by the error against the reference.  Reported twice: the
    best run alone, and with the time of the whole scan.
    """
    names = ("BlackJAX SGLD (CV)", "BlackJAX SGHMC (CV)")
    try:
        import blackjax
        import jax
        import jax.numpy as jnp
        from blackjax.sgmcmc import gradients
    except ImportError:
        print(f"  blackjax/jax not installed; to include them: {PEER_INSTALL_HINT}")
        return [
            MethodResult(method=n, status="not installed", notes=f"`{PEER_INSTALL_HINT}`")
            for n in names
        ]
    jax.config.update("jax_enable_x64", True)
    n_rows, dim = data.X.shape
    X, y = jnp.asarray(data.X), jnp.asarray(data.y, dtype=jnp.float64)
    lam_max = float(np.linalg.eigvalsh(ref.precision)[-1])

    def logprior(beta):
        return -0.5 * jnp.sum(beta**2)

    def loglik(beta, row):
        x, yi = row
        eta = x @ beta
        return yi * eta - jnp.logaddexp(0.0, eta)

    make_estimator = getattr(gradients, "grad_estimator", None) or gradients.estimator
    t0 = time.perf_counter()
    centre = jnp.asarray(ref.map_theta)
    cv_grad = gradients.control_variates(make_estimator(logprior, loglik, n_rows), centre, (X, y))
    cv_setup_s = time.perf_counter() - t0
    n_inner = 10
    specs = {
        names[0]: (blackjax.sgld(cv_grad), config.peer_steps, 1, 1.0 / lam_max),
        names[1]: (
            blackjax.sghmc(cv_grad, num_integration_steps=n_inner),
            config.peer_steps // n_inner,
            n_inner,
            1.0 / math.sqrt(lam_max),
        ),
    }
    results = []
    for name, (algorithm, n_steps, grads_per_step, unit) in specs.items():
        keep = n_steps // 2
        thin = max(1, keep // 1000)

        def run_chain(key, position, step_size, algorithm=algorithm, n_steps=n_steps):
            def body(pos, k):
                k_rows, k_step = jax.random.split(k)
                idx = jax.random.randint(k_rows, (BATCH_SIZE,), 0, n_rows)
                pos = algorithm.step(k_step, pos, (X[idx], y[idx]), step_size)
                return pos, pos

            _, trace = jax.lax.scan(body, position, jax.random.split(key, n_steps))
            return trace

        run_chains = jax.vmap(run_chain, in_axes=(0, 0, None))
        keys = jax.random.split(jax.random.PRNGKey(config.seed + 53), config.chains)
        inits = jnp.zeros((config.chains, dim))
        res = MethodResult(method=name, cores=1)
        try:
            t0 = time.perf_counter()
            compiled = jax.jit(run_chains).lower(keys, inits, 1.0).compile()
            res.compile_s = time.perf_counter() - t0
            grid = []
            for factor in PEER_GRID:
                t0 = time.perf_counter()
                trace = np.asarray(compiled(keys, inits, factor * unit))
                run_s = time.perf_counter() - t0
                draws = trace[:, n_steps - keep :: thin]
                score = math.inf
                if np.isfinite(draws).all():
                    trial = score_draws(MethodResult(method=name), draws, ref)
                    score = max(
                        trial.max_mean_err,
                        abs(math.log(trial.sd_ratio_min)),
                        abs(math.log(trial.sd_ratio_max)),
                    )
                grid.append((score, factor, run_s, draws))
        except Exception as exc:  # noqa: BLE001 - a failure is a result to report
            res.status = f"failed: {type(exc).__name__}: {exc}"
            results.append(res)
            continue
        score, factor, run_s, best_draws = min(grid, key=lambda g: g[0])
        scan_s = sum(g[2] for g in grid)
        passes = config.chains * n_steps * grads_per_step * BATCH_SIZE / n_rows
        for with_scan in (False, True):
            out = MethodResult(
                method=name + (" incl. step-size scan" if with_scan else ""),
                cores=1,
                setup_s=cv_setup_s,
                compile_s=res.compile_s,
                wall_s=(scan_s if with_scan else run_s) + cv_setup_s,
                passes=passes * (len(grid) if with_scan else 1),
                setup_passes=1.0,
            )
            if math.isfinite(score):
                score_draws(out, best_draws, ref)
            else:
                out.status = "failed: every step size on the grid diverged"
            out.notes = f"step={factor:g}x{unit:.3g}, {n_steps} steps/chain" + (
                f", {len(grid)} grid runs" if with_scan else ""
            )
            out.extra = {
                "grid": [{"factor": g[1], "score": g[0], "run_s": g[2]} for g in grid],
                "step_size": factor * unit,
                "n_steps": n_steps,
                "thin": thin,
            }
            results.append(out)
    return results


# ---------------------------------------------------------------------------- NumPyro HMCECS
def run_hmcecs(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """NumPyro HMCECS (NUTS inner kernel, Taylor proxy at the MAP), if numpyro imports.

    Compile is measured by a 5+5-draw warm-up call; wall is the full call after it (NumPyro
    compiles inside ``run``; part of that compile may be cached from the warm-up call), and
    the notes give ESS per second over wall + compile as well.  Passes ~ (leapfrog steps +
    one block update per iteration) x subsample / N, with the tuning phase counted at the
    mean steps of the kept draws.
    """
    name = "NumPyro HMCECS"
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import HMCECS, MCMC, NUTS
    except ImportError:
        print(f"  numpyro/jax not installed; to include HMCECS: {HMCECS_INSTALL_HINT}")
        return [MethodResult(method=name, status="not installed", notes=f"`{HMCECS_INSTALL_HINT}`")]
    taylor_proxy = HMCECS.taylor_proxy  # second-order Taylor proxy around the reference point
    jax.config.update("jax_enable_x64", True)
    n_rows, dim = data.X.shape
    X, y = jnp.asarray(data.X), jnp.asarray(data.y, dtype=jnp.float64)

    def model(X, y, subsample_size):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(dim), 1.0).to_event(1))
        with numpyro.plate("N", n_rows, subsample_size=subsample_size):
            xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            numpyro.sample("obs", dist.Bernoulli(logits=xb @ beta), obs=yb)

    def sample(tune: int, draws: int) -> tuple[Any, float]:
        kernel = HMCECS(
            NUTS(model), num_blocks=100, proxy=taylor_proxy({"beta": jnp.asarray(ref.map_theta)})
        )
        mcmc = MCMC(
            kernel,
            num_warmup=tune,
            num_samples=draws,
            num_chains=config.chains,
            chain_method="sequential",
            progress_bar=False,
        )
        t0 = time.perf_counter()
        mcmc.run(
            jax.random.PRNGKey(config.seed + 71),
            X,
            y,
            BATCH_SIZE,
            extra_fields=("hmc_state.num_steps",),
        )
        return mcmc, time.perf_counter() - t0

    res = MethodResult(method=name, cores=1)
    tune, draws = config.ours_tune, config.ours_draws
    try:
        _, res.compile_s = sample(5, 5)
        mcmc, res.wall_s = sample(tune, draws)
        samples = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"])
        steps = np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"])
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        res.status = f"failed: {type(exc).__name__}: {exc}"
        return [res]
    iterations = config.chains * (tune + draws)
    res.passes = (float(steps.mean()) + 1.0) * iterations * BATCH_SIZE / n_rows
    res.setup_passes = 1.0
    score_draws(res, samples, ref)
    with_compile = res.min_ess / (res.wall_s + res.compile_s) if res.min_ess else math.nan
    res.extra = {"ess_per_s_with_compile": with_compile, "mean_steps": float(steps.mean())}
    res.notes = (
        f"{with_compile:.1f} ESS/s counting the warm-up call's compile as well; passes "
        f"approximate; {steps.mean():.0f} steps/draw; m={BATCH_SIZE}, G=100"
    )
    return [res]


# ---------------------------------------------------------------------------- report
def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


TABLE_HEADER = (
    "| method | cores | setup (s) | compile (s) | wall (s) | data passes (setup) | min bulk ESS "
    "| ESS/s | ESS/pass | ESS/s vs NUTS | max \\|Δmean\\|/sd (z) | sd ratio [min, max] "
    "| notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def format_table(results: list[MethodResult]) -> str:
    """Markdown table of the results of one data set."""
    lines = [TABLE_HEADER]
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.method} | | | | | | | | | | | | {r.status} {r.notes} |")
            continue
        passes = _fmt(r.passes) + (f" ({_fmt(r.setup_passes)})" if r.setup_passes else "")
        err = f"{_fmt(r.max_mean_err, 2)} ({_fmt(r.max_mean_z, 2)})"
        ratio = f"[{r.sd_ratio_min:.3f}, {r.sd_ratio_max:.3f}]"
        lines.append(
            f"| {r.method} | {r.cores or ''} | {_fmt(r.setup_s)} | {_fmt(r.compile_s)} "
            f"| {_fmt(r.wall_s)} | {passes} | {_fmt(r.min_ess)} | {_fmt(r.ess_per_s)} "
            f"| {_fmt(r.ess_per_pass)} | {_fmt(r.ess_per_s_vs_nuts)} | {err} | {ratio} "
            f"| {r.notes} |"
        )
    return "\n".join(lines)


def format_reference(n_rows: int, ref: Reference) -> str:
    """One line describing the reference posterior of a data set."""
    source = "cached" if ref.cached else "computed"
    return (
        f"Reference: Laplace + Student-t(df={ref.df:g}) importance sampling, "
        f"{ref.n_samples:,} samples, weight ESS {ref.ess:,.0f} "
        f"({100 * ref.ess / ref.n_samples:.0f}%), {ref.seconds:.0f} s ({source}); "
        f"layer MAP vs numpy Newton: max diff {ref.map_check:.1e} Laplace sd."
    )


def git_revision() -> str:
    """Commit of the checkout, with ``+dirty`` if pymc_bigdata/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "pymc_bigdata"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


#: the revision of pymc_bigdata when this script imported it (the code that actually runs)
REVISION_AT_IMPORT = git_revision()


def environment() -> dict[str, str]:
    """Versions and machine facts recorded with the results."""
    import arviz
    import pytensor

    now = git_revision()
    return {
        "pymc_bigdata_commit": REVISION_AT_IMPORT,
        "pymc_bigdata_commit_at_end": now,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "pymc": pm.__version__,
        "pytensor": pytensor.__version__,
        "arviz": arviz.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": str(os.cpu_count()),
    }


def write_outputs(config: Config, sections: list[tuple[int, Reference, list[MethodResult]]]) -> str:
    """Write ``<stem>.md`` and ``<stem>.json`` under benchmarks/results/; return the markdown."""
    env = environment()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"# pymc-bigdata benchmark ({stamp})",
        "",
        f"Logistic regression, d = {DIM}, equicorrelation {RHO}, seed {config.seed}; "
        f"pymc_bigdata at {env['pymc_bigdata_commit']}; python {env['python']}, "
        f"pymc {env['pymc']}, pytensor {env['pytensor']}, "
        f"{env['cpu_count']} CPUs.",
    ]
    if env["pymc_bigdata_commit_at_end"] != env["pymc_bigdata_commit"]:
        parts.append(
            f"(The checkout moved to {env['pymc_bigdata_commit_at_end']} during the run; the "
            "numbers are for the code imported at the start.)"
        )
    for n_rows, ref, results in sections:
        parts += [
            "",
            f"## N = {n_rows:,}",
            "",
            format_reference(n_rows, ref),
            "",
            format_table(results),
        ]
    markdown = "\n".join(parts) + "\n"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{config.out_stem}.md").write_text(markdown)
    payload = {
        "created": stamp,
        "config": asdict(config),
        "environment": env,
        "sizes": [
            {
                "n_rows": n_rows,
                "reference": {
                    "mean": ref.mean.tolist(),
                    "sd": ref.sd.tolist(),
                    "ess": ref.ess,
                    "n_samples": ref.n_samples,
                    "df": ref.df,
                    "seconds": ref.seconds,
                    "map_check": ref.map_check,
                    "cached": ref.cached,
                },
                "results": [asdict(r) for r in results],
            }
            for n_rows, ref, results in sections
        ],
    }
    (RESULTS_DIR / f"{config.out_stem}.json").write_text(json.dumps(payload, indent=1))
    return markdown


def add_nuts_ratios(results: list[MethodResult]) -> None:
    """Fill ``ess_per_s_vs_nuts`` from the NUTS row, if there is one."""
    nuts = next((r for r in results if r.method.startswith("PyMC NUTS") and r.ess_per_s), None)
    if nuts is None:
        return
    for r in results:
        if r.ess_per_s is not None:
            r.ess_per_s_vs_nuts = r.ess_per_s / nuts.ess_per_s


def run_size(n_rows: int, config: Config) -> tuple[Reference, list[MethodResult]]:
    """Generate the data of one size, get its reference and run every selected method."""
    data = make_data(n_rows, config.seed)
    print(f"\n=== N = {n_rows:,}: reference posterior", flush=True)
    ref = load_or_compute_reference(data, build_model(data), config.is_samples, config.is_df)
    print("  " + format_reference(n_rows, ref), flush=True)
    runners: dict[str, Callable[[Dataset, Reference, Config], list[MethodResult]]] = {
        **{kind: partial(run_ours, kind) for kind in OURS},
        "nuts": run_nuts,
        "blackjax": run_blackjax,
        "numpyro": run_hmcecs,
    }
    results: list[MethodResult] = []
    for name in config.methods:
        print(f"--- N = {n_rows:,}: {name}", flush=True)
        t0 = time.perf_counter()
        new = runners[name](data, ref, config)
        results += new
        print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    add_nuts_ratios(results)
    return ref, results


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark for every requested size and write the report."""
    config = parse_args(argv)
    sections = []
    for n_rows in config.sizes:
        ref, results = run_size(n_rows, config)
        sections.append((n_rows, ref, results))
        markdown = write_outputs(config, sections)  # keep partial results if a later size fails
    print()
    print(markdown)
    print(f"written: {RESULTS_DIR / (config.out_stem + '.md')} and .json")


if __name__ == "__main__":
    main()
