"""SGHMC's noise correction B-hat as a matrix or as its diagonal, where the noise is correlated.

The paper's SGHMC (``SGHMC.PAPER_SETTINGS``: the model's own coordinates, plain minibatch
gradients) with ``noise_estimate="fisher"`` or ``"running"`` on a regression whose two
coefficients have unit posterior sds and correlation 0.9 (covariates drawn with covariance
``Sigma^-1``, scaled by ``1/sqrt(N)``; the gradient noise is then about ``(N/n) Sigma^-1``,
as correlated). Each run is judged against the exact Gaussian posterior: the largest mean
error in sds, the sd ratios, the min bulk ESS, the share of draws whose correction was
clipped, and the package's warnings. The diagonal is forced by setting
``sghmc.B_HAT_MATRIX_MAX_DIM = 0``.

    .venv/bin/python benchmarks/bhat_matrix.py   # writes results/bhat_matrix.md and .json

``--tuned NAME`` runs instead SGHMC's own tuning with a noise estimate (BAOAB, the model's
own coordinates, no control variates, ``pm.sample``'s defaults; B-hat as a matrix and as its
diagonal) at seeds 3 and 4, and reports the posterior's variance along its two axes (the
eigenvectors of the exact covariance) over the exact one, the share of draws whose
correction was clipped, and the step and batch size tuning chose: results/NAME.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods import sghmc

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT.parent / "tests"))

from correlated_regression import CORRELATION, correlated_regression  # noqa: E402
from report import git_revision  # noqa: E402

#: (rows, eps, friction C, steps per draw, draws per chain)
SETTINGS = [
    (5_000, 0.04, 1.5, 20, 1000),
    (5_000, 0.04, 1.5, 20, 4000),
    (20_000, 0.01, 2.0, 50, 1000),
]
BATCH = 1_000
SEED = 1


def run(model, mean, cov, estimate: str, matrix: bool, setting: tuple) -> dict:
    """One two-chain run of the paper's SGHMC with the given noise estimate and B-hat form."""
    rows, eps, friction, inner, draws = setting
    sghmc.B_HAT_MATRIX_MAX_DIM = 100 if matrix else 0
    settings = {**pmbd.SGHMC.PAPER_SETTINGS, "noise_estimate": estimate}
    start = time.perf_counter()
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pmbd.SGHMC(
            learning_rate=eps**2, alpha=eps * friction, inner_steps=inner, batch_size=BATCH,
            **settings,
        )  # fmt: skip
        idata = pm.sample(
            step=step, draws=draws, chains=2, cores=1, random_seed=SEED, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    wall = time.perf_counter() - start
    beta = idata.posterior["beta"].values.reshape(-1, 2)
    sd = np.sqrt(np.diag(cov))
    ours = sorted({type(w.message).__name__ for w in caught if "pymc_bigdata" in w.filename})
    return {
        "rows": rows,
        "eps": eps,
        "friction": friction,
        "inner_steps": inner,
        "draws": draws,
        "estimate": estimate,
        "b_hat": "matrix" if matrix else "diagonal",
        "max_err_sd": float(np.max(np.abs(beta.mean(axis=0) - mean) / sd)),
        "sd_ratios": (beta.std(axis=0) / sd).round(4).tolist(),
        "min_bulk_ess": float(az.ess(idata, var_names=["beta"])["beta"].min()),
        "clipped_share": float(idata.sample_stats["noise_clipped"].mean()),
        "warnings": ours,
        "wall_s": wall,
    }


def tuned(model, mean, cov, estimate: str, matrix: bool, seed: int) -> dict:
    """One two-chain run of SGHMC's tuning with a noise estimate (no control variates)."""
    sghmc.B_HAT_MATRIX_MAX_DIM = 100 if matrix else 0
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pmbd.SGHMC(
            noise_estimate=estimate, preconditioner="identity", reparameterize=False,
            control_variates=False,
        )  # fmt: skip
        idata = pm.sample(
            step=step, chains=2, cores=1, random_seed=seed, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    values, vectors = np.linalg.eigh(cov)
    along = (idata.posterior["beta"].values.reshape(-1, 2) - mean) @ vectors
    stats = idata.sample_stats
    return {
        "estimate": estimate,
        "b_hat": "matrix" if matrix else "diagonal",
        "seed": seed,
        "axis_variance_ratios": (along.var(axis=0) / values).round(4).tolist(),
        "min_bulk_ess": float(az.ess(idata, var_names=["beta"])["beta"].min()),
        "clipped_share": float(stats["noise_clipped"].mean()),
        "step_size": float(stats["step_size"].values[0, -1]),
        "batch_size": int(stats["batch_size"].values[0, -1]),
        "warnings": sorted(
            {type(w.message).__name__ for w in caught if "pymc_bigdata" in w.filename}
        ),
    }


def main_tuned(name: str) -> None:
    """The tuned runs (``--tuned``): both forms of B-hat, the fisher estimate, two seeds."""
    model, mean, cov = correlated_regression(5_000)
    rows_out = [
        tuned(model, mean, cov, "fisher", matrix, seed)
        for matrix in (False, True)
        for seed in (3, 4)
    ]
    sghmc.B_HAT_MATRIX_MAX_DIM = 100
    head = (
        f"pymc_bigdata at {git_revision()}; SGHMC's tuning with noise_estimate='fisher', "
        "the model's own coordinates, no control variates, 5,000 rows, posterior correlation "
        f"{CORRELATION}; variance along the posterior's (narrow, wide) axes over the exact\n\n"
        "| B-hat | seed | axis variance ratios | min ESS | clipped | step | batch | warnings |\n"
        + "|---" * 8
        + "|\n"
    )
    lines = [
        f"| {r['b_hat']} | {r['seed']} "
        f"| {', '.join(f'{v:.3f}' for v in r['axis_variance_ratios'])} "
        f"| {r['min_bulk_ess']:,.0f} | {r['clipped_share']:.3f} | {r['step_size']:.4f} "
        f"| {r['batch_size']:,} | {', '.join(r['warnings']) or 'none'} |"
        for r in rows_out
    ]
    results = ROOT / "results"
    (results / f"{name}.md").write_text(head + "\n".join(lines) + "\n")
    (results / f"{name}.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    print(head + "\n".join(lines))


def main() -> None:
    """Run every setting with both estimates and both forms; write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuned", metavar="NAME", help="the tuned runs, into results/NAME")
    args = parser.parse_args()
    if args.tuned:
        main_tuned(args.tuned)
        return
    rows_out = []
    for setting in SETTINGS:
        model, mean, cov = correlated_regression(setting[0])
        for estimate in ("fisher", "running"):
            for matrix in (False, True):
                if setting[4] > 1000 and not matrix:
                    continue  # the long runs check the matrix's residual error
                rows_out.append(run(model, mean, cov, estimate, matrix, setting))
                print(rows_out[-1], flush=True)
    sghmc.B_HAT_MATRIX_MAX_DIM = 100
    head = (
        f"pymc_bigdata at {git_revision()}; the paper's SGHMC with a noise estimate, "
        f"seed {SEED}, {BATCH}-row minibatches, posterior correlation {CORRELATION}\n\n"
        "| rows | eps | C | steps | draws | estimate | B-hat | max err (sd) | sd ratios "
        "| min ESS | clipped | warnings | wall s |\n" + "|---" * 13 + "|\n"
    )
    lines = [
        f"| {r['rows']:,} | {r['eps']} | {r['friction']} | {r['inner_steps']} | {r['draws']:,} "
        f"| {r['estimate']} | {r['b_hat']} | {r['max_err_sd']:.3f} "
        f"| {', '.join(f'{v:.3f}' for v in r['sd_ratios'])} | {r['min_bulk_ess']:,.0f} "
        f"| {r['clipped_share']:.3f} | {', '.join(r['warnings']) or 'none'} | {r['wall_s']:.1f} |"
        for r in rows_out
    ]
    results = ROOT / "results"
    (results / "bhat_matrix.md").write_text(head + "\n".join(lines) + "\n")
    (results / "bhat_matrix.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    print(head + "\n".join(lines))


if __name__ == "__main__":
    main()
