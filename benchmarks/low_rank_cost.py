"""What ``low_rank="auto"`` (a diagonal preconditioner corrected along 2 + 2 directions) costs
and gives beyond the crossed ratings it was chosen on.

For each target, runs a step's defaults (``low_rank="auto"``: 2 there) and ``low_rank=0`` at
``pm.sample``'s defaults (2 chains, ``cores=1``, ``random_seed=2026``), one after the other,
and reports the set-up and sampling times, the min bulk ESS, the largest |Δmean|/sd and the
sd ratios against a reference, and the full-data Hessian-vector products and seconds one
reading takes at the step's Laplace fit (both ends from one Lanczos run, as the step reads
it, and from two runs, one per end, as before 736e5aa):

- ``many_groups_linear`` (``tests/hard_models.py``: 10^6 rows, 1,000 groups, d = 1,003; the
  exact posterior): a diagonal that leaves no flat direction (curvatures 0.97-1.03);
- ``correlated_linear`` (generated here: 100,000 rows, d = 300 dense covariates sharing two
  latent factors, so the diagonal leaves stiff directions; the exact posterior).

    .venv/bin/python benchmarks/low_rank_cost.py   # about 3 minutes, nothing else running
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import scipy.sparse.linalg as sla

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import hard_models as hm  # noqa: E402

import pymc_bigdata as pmbd  # noqa: E402
from pymc_bigdata.step_methods.low_rank import LANCZOS_TOLERANCE, curvature_in_z  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SEED = 2026


def correlated_linear(
    n_rows: int = 100_000, dim: int = 300, seed: int = 13
) -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """A linear regression (unit noise) whose covariates share two latent factors (loadings
    1 and 0.5 on every covariate, plus unit noise), and its exact posterior mean and sds."""
    rng = np.random.default_rng(seed)
    factors = rng.normal(size=(n_rows, 2))
    X = factors @ np.vstack([np.ones(dim), np.full(dim, 0.5)]) + rng.normal(size=(n_rows, dim))
    X /= np.sqrt(dim)
    y = X @ rng.normal(0.0, 1.0, dim) + rng.normal(size=n_rows)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=dim)
        pm.Normal("y", pm.math.dot(X, b), 1.0, observed=y)
    covariance = np.linalg.inv(X.T @ X + np.eye(dim) / 4.0)
    return model, covariance @ (X.T @ y), np.sqrt(np.diag(covariance))


def many_groups() -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """``many_groups_linear`` and its exact posterior mean and sds (``a`` then ``b``)."""
    group, x, y = hm.make_many_groups_linear_data()
    exact = hm.many_groups_linear_posterior(group, x, y)
    mean = np.concatenate([exact["a__mean"], exact["b__mean"]])
    sd = np.concatenate([exact["a__sd"], exact["b__sd"]])
    return hm.many_groups_linear_model(group, x, y), mean, sd


TARGETS = {"many_groups_linear": many_groups, "correlated_linear": correlated_linear}


def reading_cost(step, two_runs: bool) -> tuple[int, float]:
    """Hessian-vector products and seconds of one reading of 2 + 2 eigenpairs at the step's
    Laplace fit: one Lanczos run for both ends (``"BE"``, as the step reads it) or two."""
    curvature_z, passes = curvature_in_z(step.laplace, step.layer)
    op = sla.LinearOperator((step.layer.dim,) * 2, matvec=curvature_z, dtype=np.float64)
    start = time.perf_counter()
    for which, k in (("SA", 2), ("LA", 2)) if two_runs else (("BE", 4),):
        sla.eigsh(op, k=k, which=which, tol=LANCZOS_TOLERANCE)
    return passes[0], time.perf_counter() - start


def run(name: str, sampler: str, model, mean, sd, low_rank) -> dict:
    """One run of ``sampler`` with ``low_rank`` on a target."""
    start = time.perf_counter()
    step = getattr(pmbd, sampler)(model=model, low_rank=low_rank)
    setup = time.perf_counter() - start
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(
            step=step,
            chains=2,
            cores=1,
            random_seed=SEED,
            progressbar=False,
            compute_convergence_checks=False,
        )
    post = idata.posterior
    draws = np.concatenate(
        [post[v.name].values.reshape(2, post.sizes["draw"], -1) for v in model.free_RVs], axis=-1
    )
    ess = az.ess(az.from_dict({"posterior": {"x": draws}}))["x"].values
    ratios = draws.std((0, 1)) / sd
    row = {
        "target": name,
        "sampler": sampler,
        "low_rank": low_rank,
        "resolved": step.low_rank,
        "corrected": step.precond.correction is not None,
        "setup_s": setup,
        "sampling_s": float(post.attrs["sampling_time"]),
        "min_bulk_ess": float(ess.min()),
        "max_err_sd": float((np.abs(draws.mean((0, 1)) - mean) / sd).max()),
        "sd_ratios": [float(ratios.min()), float(ratios.max())],
    }
    if low_rank == "auto":
        row["reading_one_run"] = reading_cost(step, two_runs=False)
        row["reading_two_runs"] = reading_cost(step, two_runs=True)
    return row


def table(rows: list[dict], commit: str) -> str:
    """The results as markdown."""
    lines = [
        f'# What `low_rank="auto"` costs beyond the crossed ratings (pymc_bigdata at {commit})',
        "",
        "`benchmarks/low_rank_cost.py`: `pm.sample` defaults (2 chains, `cores=1`, seed "
        f"{SEED}); one reading at the Laplace fit: Hessian-vector products and seconds, one "
        "Lanczos run for both ends / one per end.",
        "",
        "| target | sampler | low_rank | corrected at the end | set-up (s) | sampling (s) | "
        "min bulk ESS | max \\|Δmean\\|/sd | sd ratios | one reading |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reading = ""
        if "reading_one_run" in r:
            (one, one_s), (two, two_s) = r["reading_one_run"], r["reading_two_runs"]
            reading = f"{one} in {one_s:.2f} s / {two} in {two_s:.2f} s"
        lines.append(
            f"| {r['target']} | {r['sampler']} | {r['low_rank']} ({r['resolved']}) | "
            f"{'yes' if r['corrected'] else 'no'} | {r['setup_s']:.1f} | {r['sampling_s']:.1f} | "
            f"{r['min_bulk_ess']:,.0f} | {r['max_err_sd']:.3f} | "
            f"[{r['sd_ratios'][0]:.3f}, {r['sd_ratios'][1]:.3f}] | {reading} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every target with SGHMC and SGLD, ``low_rank`` ``"auto"`` then 0."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows = []
    for name, build in TARGETS.items():
        model, mean, sd = build()
        for sampler in ("SGHMC", "SGLD"):
            for low_rank in ("auto", 0):
                rows.append(run(name, sampler, model, mean, sd, low_rank))
                print(table(rows, commit), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "low_rank_cost.md").write_text(table(rows, commit))
    payload = {"commit": commit, "rows": rows}
    (RESULTS / "low_rank_cost.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
