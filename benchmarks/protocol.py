"""The benchmark's protocol: run settings, the command line, the methods, the data and the model.

Everything a run of ``benchmarks/run.py`` holds fixed lives here: the simulated logistic
regression (``d = 30`` equicorrelated features), the minibatch size every subsampling method
gets, the registry of methods (ours with their keyword arguments and seed offsets, then the
peers), and the :class:`Config` read from the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pymc as pm

import pymc_bigdata as pmbd

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: number of coefficients, feature equicorrelation, sd of the true coefficients
DIM = 30
RHO = 0.5
BETA_SD = 0.3
#: rows per minibatch for every subsampling method (ours' default; the peers get the same)
BATCH_SIZE = 1000

DESCRIPTION = (
    "Side-by-side benchmark of the subsampling samplers against full-data NUTS (and peers)."
)


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


# ---------------------------------------------------------------------------- methods
class OurMethod(NamedTuple):
    """One of our step methods as the benchmark runs it."""

    #: name in the tables
    label: str
    #: the step method's class
    cls: type
    #: keyword arguments of its constructor
    kwargs: dict[str, Any]
    #: added to the run's seed
    seed_offset: int


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
    "sghmc_nocv": OurMethod("ours SGHMC, no control variates", pmbd.SGHMC, {}, 11),
    "sghmc_nocv_iid": OurMethod(
        "ours SGHMC, no control variates, independent minibatches",
        pmbd.SGHMC,
        {"reshuffle": False},
        11,
    ),
    # SGHMC reading as many rows per step as EWSG (both candidates' rows in one minibatch)
    "sghmc_nocv_rows2": OurMethod(
        "ours SGHMC, no control variates, 2 x BATCH_SIZE rows per step",
        pmbd.SGHMC,
        {"batch_size": 2 * BATCH_SIZE},
        11,
    ),
    "sghmc_nocv_iid_rows2": OurMethod(
        "ours SGHMC, no control variates, independent minibatches, 2 x BATCH_SIZE rows per step",
        pmbd.SGHMC,
        {"batch_size": 2 * BATCH_SIZE, "reshuffle": False},
        11,
    ),
    "ewsg_nocv": OurMethod(
        "ours EWSG, no control variates, reshuffled minibatches",
        pmbd.EWSG,
        {"index_weights": "linear"},
        53,
    ),
    "ewsg_nocv_iid": OurMethod(
        "ours EWSG, no control variates, independent minibatches",
        pmbd.EWSG,
        {"index_weights": "linear", "reshuffle": False},
        53,
    ),
    "ewsg_nocv_paper": OurMethod(
        "ours EWSG, no control variates, the paper's index weights, independent minibatches",
        pmbd.EWSG,
        {"index_weights": "paper", "reshuffle": False},
        53,
    ),
}
NOCV = tuple(f"{kind}_eps{eps:g}" for eps in NOCV_STEPS for kind in NOCV_VARIANTS)


def _nocv_methods() -> dict[str, OurMethod]:
    """Every variant of :data:`NOCV_VARIANTS` at every fixed step of :data:`NOCV_STEPS`."""
    return {
        f"{kind}_eps{eps:g}": OurMethod(
            f"{label}, eps={eps:g}",
            cls,
            {"control_variates": False, "step_size": eps, "batch_size": BATCH_SIZE, **kwargs},
            offset,
        )
        for eps in NOCV_STEPS
        for kind, (label, cls, kwargs, offset) in NOCV_VARIANTS.items()
    }


def _austerity_methods() -> dict[str, OurMethod]:
    """AusterityMH on :data:`AUSTERITY_GRID`, then its random-walk and SGLD proposals."""
    grid = {
        f"austerity_{test}_eps{eps:g}": OurMethod(
            f"ours AusterityMH eps={eps:g}, {test} test",
            pmbd.AusterityMH,
            {"epsilon": eps, "test": test},
            61,
        )
        for eps, test in AUSTERITY_GRID
    }
    # the default's Langevin proposal (drift: the Taylor model, no rows) against the paper's
    proposals = {
        "austerity_rw": OurMethod(
            "ours AusterityMH, random walk", pmbd.AusterityMH, {"proposal": "rw"}, 61
        ),
        "austerity_sgld": OurMethod(
            "ours AusterityMH, SGLD", pmbd.AusterityMH, {"proposal": "sgld"}, 61
        ),
    }
    return grid | proposals


#: our step methods by command-line name
OURS: dict[str, OurMethod] = {
    "sghmc": OurMethod("ours SGHMC", pmbd.SGHMC, {}, 11),
    "sghmc_local": OurMethod("ours SGHMC, local_batch=True", pmbd.SGHMC, {"local_batch": True}, 11),
    "sgld": OurMethod("ours SGLD", pmbd.SGLD, {}, 23),
    "sbps": OurMethod("ours SBPS", pmbd.SBPS, {}, 3),
    "hmcecs": OurMethod("ours HMCECS perturbed", pmbd.HMCECS, {}, 41),
    "hmcecs_signed": OurMethod("ours HMCECS signed", pmbd.HMCECS, {"estimator": "signed"}, 43),
    "hmcecs_m1000": OurMethod(
        "ours HMCECS perturbed m=1000 G=100",
        pmbd.HMCECS,
        {"subsample_size": BATCH_SIZE, "blocks": 100},
        41,
    ),
    "ewsg": OurMethod("ours EWSG", pmbd.EWSG, {}, 53),
    **_nocv_methods(),
    **_austerity_methods(),
}

#: every method the command line accepts, in the order of the default run
ALL_METHODS = (
    "sghmc",
    "sghmc_local",
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
    "nutpie",
    "advi",
)


# ---------------------------------------------------------------------------- command line
def build_parser(description: str = DESCRIPTION) -> argparse.ArgumentParser:
    """The benchmark's command-line parser.

    Parameters
    ----------
    description
        Text of ``--help``'s header.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(description=description)
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
        help="NUTS (PyMC and nutpie) tuning steps per chain (default 300; 100 with --quick)",
    )
    parser.add_argument(
        "--nuts-draws",
        type=int,
        default=None,
        help="NUTS (PyMC and nutpie) draws per chain (default 300; 100 with --quick)",
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
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """The :class:`Config` of parsed arguments, with ``--quick``'s shorter defaults.

    Parameters
    ----------
    args
        What :func:`build_parser`'s parser returned.

    Returns
    -------
    Config
    """
    quick = args.quick
    nuts_default = 100 if quick else 300
    return Config(
        sizes=(20_000,) if quick else tuple(int(s) for s in args.sizes),
        seed=args.seed,
        quick=quick,
        ours_tune=args.ours_tune or (200 if quick else 1000),
        ours_draws=args.ours_draws or (200 if quick else 1000),
        chains=2,
        nuts_tune=nuts_default if args.nuts_tune is None else args.nuts_tune,
        nuts_draws=nuts_default if args.nuts_draws is None else args.nuts_draws,
        is_samples=args.is_samples or (5000 if quick else 20_000),
        is_df=10.0,
        peer_steps=4000 if quick else 20_000,
        methods=tuple(args.methods),
        cores=tuple(args.cores),
        out_stem=args.out or ("quick" if quick else "latest"),
    )


def parse_args(argv: Sequence[str] | None = None, description: str = DESCRIPTION) -> Config:
    """Read the command line into a :class:`Config`.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).
    description
        Text of ``--help``'s header.

    Returns
    -------
    Config
    """
    return config_from_args(build_parser(description).parse_args(argv))


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
    """Equicorrelated Gaussian features ``X = Z chol(C)^T``, ``beta ~ N(0, 0.3^2)``, Bernoulli y.

    Parameters
    ----------
    n_rows
        Number of rows N.
    seed
        Seed of the data (with ``n_rows``: every size has its own stream).
    dim
        Number of features d.
    rho
        Correlation of every pair of features.

    Returns
    -------
    Dataset
    """
    rng = np.random.default_rng([seed, n_rows])
    corr = np.full((dim, dim), rho) + (1.0 - rho) * np.eye(dim)
    beta_true = rng.normal(0.0, BETA_SD, size=dim)
    X = rng.standard_normal((n_rows, dim)) @ np.linalg.cholesky(corr).T
    eta = X @ beta_true
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-eta))).astype(np.int64)
    return Dataset(X=X, y=y, beta_true=beta_true, seed=seed)


def build_model(data: Dataset) -> pm.Model:
    """``beta ~ N(0, 1)``, ``y ~ Bernoulli(logit_p = X beta)`` with X as ``pm.Data``.

    Parameters
    ----------
    data
        The data set.

    Returns
    -------
    pm.Model
    """
    with pm.Model() as model:
        X = pm.Data("X", data.X)
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=data.y)
    return model
