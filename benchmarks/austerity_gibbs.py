"""Approximate Gibbs on the variable-selection example: wrong updates, rows read, accuracy, time.

Run from the repository root, with nothing else running::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/austerity_gibbs.py

Data: ``variable_selection_data(100_000, seed=0)`` (six correlated covariates, three near the
evidence threshold), ``variable_selection_model`` (slab sd 0.02, noise sd 1), exact inclusion
probabilities by enumeration (``variable_selection_exact``).

1. **Updates against exact Gibbs.** 300 states (indicators drawn from the exact inclusion
   probabilities, included coefficients around the least-squares fit, excluded ones from the
   slab), every coordinate, the same ``u``: the share of updates whose value differs from
   exact Gibbs's, and the rows read per update, for each epsilon of the plain test
   (``gibbs_decision``, minibatches of 500).
2. **Sampling.** ``pm.sample`` (1000 tune, 1000 draws, 2 chains, one core) with
   ``[AusterityGibbs(), AusterityMH()]`` at the default epsilon (0.001), and PyMC's exact
   route ``[BinaryGibbsMetropolis, NUTS]`` on the full data: wall time, max |inclusion
   probability - exact|, ESS of the indicators (bulk, smallest over the covariates whose
   exact probability is in (0.05, 0.95)) per second.

Writes ``benchmarks/results/austerity_gibbs.md`` and ``.json`` (with the commit), or
``<STEM>.md|json`` with ``--out STEM``; ``--uniform-rows-too`` adds the compound steps with
``window_gathers=False`` (uniform rows: the permutation the paper's test reads), and
``--windows-table`` the updates' table with windows too (``--decisions-only``: the table
alone)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/austerity_gibbs.py --uniform-rows-too \
        --out austerity_gibbs_windows
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/austerity_gibbs.py --decisions-only \
        --windows-table --out austerity_gibbs_windows_table
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.datasets import (
    variable_selection_data,
    variable_selection_exact,
    variable_selection_model,
)
from pymc_bigdata.kernels.austerity import gibbs_decision
from pymc_bigdata.row_windows import RowWindow, ShuffledRows, WindowPermutation
from pymc_bigdata.rows import LazyPermutation, window_rows_for_tests

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
N_ROWS, SLAB_SD, BATCH = 100_000, 0.02, 500
EPSILONS = (0.05, 0.01, 0.001, 0.0001, 0.0)
NO_SAMPLING = "--decisions-only" in sys.argv
#: ``--out STEM``: the results' file names (default ``austerity_gibbs``)
OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "austerity_gibbs"
#: ``--uniform-rows-too``: also the compound steps with ``window_gathers=False`` (each test
#: reads a uniform permutation's rows instead of a window of the shuffled copy)
UNIFORM_TOO = "--uniform-rows-too" in sys.argv
#: ``--windows-table``: the updates' table also with each test's rows one window of the
#: shuffled order, and a window of N/100 rows then uniform ones (the same states, epsilons
#: and ``u`` draws' seed)
WINDOWS_TABLE = "--windows-table" in sys.argv


def _permutation(n_rows: int, rng: np.random.Generator, windows: str | None):
    """A test's rows: a lazy uniform permutation; with ``windows="pure"`` one window of the
    rows in the fixed shuffled order of window gathers (``WINDOW_ORDER_SEED``) from a random
    start (``AusterityGibbs`` at 81a00e7); with ``"then uniform"`` such a window for the first
    ``N / WINDOW_MIN_BATCHES`` rows, then uniform rows among the rest (``AusterityGibbs``
    since then)."""
    if windows is None:
        return LazyPermutation(n_rows, rng), lambda drawn: drawn
    shuffled = ShuffledRows(lambda order: [order], n_rows)
    limit = None if windows == "pure" else window_rows_for_tests(shuffled, BATCH)
    permutation = WindowPermutation(shuffled, rng, window_rows=limit)
    return permutation, lambda drawn: drawn.indices if isinstance(drawn, RowWindow) else drawn


def decision_table(
    X, y, exact, n_states: int = 300, seed: int = 5, windows: str | None = None
) -> list[dict]:
    """Wrong updates and rows read per update, against exact Gibbs on the same ``u``."""
    rng = np.random.default_rng(seed)
    fit = np.linalg.lstsq(X, y, rcond=None)[0]
    se = np.sqrt(np.diag(np.linalg.inv(X.T @ X)))
    k = X.shape[1]
    states = []
    for _ in range(n_states):
        include = (rng.uniform(size=k) < exact).astype(float)
        beta = np.where(
            include > 0, fit + se * rng.standard_normal(k), SLAB_SD * rng.normal(size=k)
        )
        states.append((include, beta))
    rows_out = []
    for epsilon in EPSILONS:
        wrong = rows = updates = 0
        for include, beta in states:
            for j in range(k):
                one, zero = include.copy(), include.copy()
                one[j], zero[j] = 1.0, 0.0

                def differences(idx, one=one, zero=zero, beta=beta):
                    r1 = y[idx] - X[idx] @ (one * beta)
                    r0 = y[idx] - X[idx] @ (zero * beta)
                    return 0.5 * (r0 * r0 - r1 * r1)

                full = float(differences(slice(None)).sum())  # equal prior odds: p = 0.5
                permutation, rows_of = _permutation(len(y), rng, windows)
                permutation.start(rng)
                decision = gibbs_decision(
                    0.0,
                    lambda m, p=permutation, r=rows_of: differences(r(p.next(m))),
                    len(y),
                    BATCH,
                    epsilon,
                    rng,
                )
                wrong += bool(decision.test.accept) != (decision.log_u < full)
                rows += decision.test.rows
                updates += 1
        rows_out.append(
            {"epsilon": epsilon, "wrong": wrong / updates, "rows_fraction": rows / updates / len(y)}
        )
        print(rows_out[-1], flush=True)
    return rows_out


def _rows_read(stats, n_rows: int, n_binary: int) -> float:
    """Rows read by both steps over the kept draws (tuning left out, as ``sample_stats``
    holds only those). PyMC's steps record none: NUTS reads every row once per leapfrog
    step (``n_steps``) and BinaryGibbsMetropolis once per indicator per draw."""
    if "rows_touched" in stats:
        return float(stats["rows_touched"].sum())
    draws = stats["n_steps"].size
    return float(stats["n_steps"].sum() + n_binary * draws) * n_rows


def sampling_runs(X, y, exact) -> list[dict]:
    """The compound steps and PyMC's exact route: time, accuracy, ESS per second."""
    model = variable_selection_model(X, y, slab_sd=SLAB_SD)
    mixed = (exact > 0.05) & (exact < 0.95)
    runs = {
        "AusterityGibbs(0.001) + AusterityMH (defaults)": lambda: [
            pmbd.AusterityGibbs([model["include"]]),
            pmbd.AusterityMH([model["beta"]]),
        ],
        **(
            {
                "the same, uniform rows (window_gathers=False)": lambda: [
                    pmbd.AusterityGibbs([model["include"]], window_gathers=False),
                    pmbd.AusterityMH([model["beta"]], window_gathers=False),
                ]
            }
            if UNIFORM_TOO
            else {}
        ),
        "BinaryGibbsMetropolis + NUTS (PyMC, full data)": lambda: [
            pm.BinaryGibbsMetropolis([model["include"]]),
            pm.NUTS([model["beta"]]),
        ],
    }
    out = []
    for label, make in runs.items():
        start = time.perf_counter()
        with model:
            steps = make()
            idata = pm.sample(
                step=steps,
                chains=2,
                cores=1,
                random_seed=11,
                progressbar=False,
                compute_convergence_checks=False,
            )
        wall = time.perf_counter() - start
        found = idata.posterior["include"].values.mean(axis=(0, 1))
        ess = np.asarray(az.ess(idata.posterior["include"].astype(float), method="bulk"))
        rows_read = _rows_read(idata.sample_stats, len(y), X.shape[1])
        row = {
            "run": label,
            "wall_s": wall,
            "data_passes": rows_read / len(y),
            "max_abs_error": float(np.max(np.abs(found - exact))),
            "inclusion": found.tolist(),
            "min_ess_mixed": float(np.min(ess[mixed])),
            "ess_per_s": float(np.min(ess[mixed]) / wall),
        }
        row["ess_per_pass"] = row["min_ess_mixed"] / row["data_passes"]
        stats = idata.sample_stats
        if "decision_fraction" in stats:  # both steps record it: index 0 is the Gibbs step's
            fraction = stats["decision_fraction"]
            if fraction.ndim == 3:
                fraction = fraction.isel({fraction.dims[2]: 0})
            row["gibbs_rows_fraction"] = float(fraction.mean())
        out.append(row)
        print(row, flush=True)
    return out


def main() -> None:
    X, y, _ = variable_selection_data(N_ROWS, seed=0)
    exact = variable_selection_exact(X, y, slab_sd=SLAB_SD)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    decisions = decision_table(X, y, exact)
    if WINDOWS_TABLE:
        for kind, key in (("pure", "windows"), ("then uniform", "window_then_uniform")):
            for row, window_row in zip(decisions, decision_table(X, y, exact, windows=kind)):
                row[f"wrong_{key}"] = window_row["wrong"]
                row[f"rows_fraction_{key}"] = window_row["rows_fraction"]
    runs = sampling_runs(X, y, exact) if not NO_SAMPLING else []
    RESULTS.mkdir(exist_ok=True)
    payload = {"commit": commit, "exact": exact.tolist(), "decisions": decisions, "runs": runs}
    (RESULTS / f"{OUT}.json").write_text(json.dumps(payload, indent=1))
    lines = [
        f"# Approximate Gibbs on the variable-selection example (commit {commit})",
        "",
        f"100,000 rows, 6 covariates; exact inclusion probabilities {np.round(exact, 3).tolist()}.",
        "",
        "## Updates against exact Gibbs (same u), plain test, minibatches of 500",
        "",
        "| epsilon | wrong updates | rows read per update | one window: wrong, rows "
        "| a window of N/100 rows, then uniform: wrong, rows |",
        "|---|---|---|---|---|",
        *(
            f"| {d['epsilon']:g} | {d['wrong']:.2%} | {d['rows_fraction']:.1%} | "
            + " | ".join(
                f"{d[f'wrong_{key}']:.2%}, {d[f'rows_fraction_{key}']:.1%}"
                if f"wrong_{key}" in d
                else "—"
                for key in ("windows", "window_then_uniform")
            )
            + " |"
            for d in decisions
        ),
        "",
        "## pm.sample, 1000 tune + 1000 draws, 2 chains, one core",
        "",
        "| run | wall s | max abs error | min ESS (mixed) | ESS/s | data passes | ESS/pass "
        "| Gibbs rows per update |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['run']} | {r['wall_s']:.0f} | {r['max_abs_error']:.3f} | "
            f"{r['min_ess_mixed']:.0f} | {r['ess_per_s']:.2f} | {r['data_passes']:.0f} | "
            f"{r['ess_per_pass']:.3g} | "
            f"{r.get('gibbs_rows_fraction', float('nan')):.1%} |"
            for r in runs
        ),
        "",
    ]
    (RESULTS / f"{OUT}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
