"""Parallel chains with pickled steps: the rows inside the pickle against shared rows.

Where PyMC's worker processes do not start by ``fork`` (``forkserver``: Linux's default from
Python 3.14, macOS on Intel; ``spawn``: Windows), ``pm.sample(cores=2)`` pickles the step and
every worker unpickles it (``pymc_bigdata/shared_rows.py``). One process generates the
benchmark's logistic regression (``protocol.py``: 10⁶ × 30 float64 rows in ``pmbd.Data``),
builds SGHMC with its defaults, runs its MAP search and a short warm-up, then calls
``pm.sample(chains=2, cores=2, mp_ctx="forkserver")`` (1000 tuning and 1000 kept draws per
chain) alternately with the rows travelling in the pickle (inside
``rows_travel_with_pickles()``, as before) and shared, three times each. It reports the
pickle's size and the time to make it (the first shared pickling writes the shared segment;
later ones reuse it), each call's wall time and PyMC's ``sampling_time``::

    .venv/bin/python benchmarks/shared_rows.py   # ~2 min; results/shared_rows.{md,json}
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path

import cloudpickle
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.shared_rows import rows_travel_with_pickles

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from protocol import make_data  # noqa: E402
from report import git_revision, write_results  # noqa: E402

MODES = ("rows in the pickle", "shared rows")


def one_call(step, model, travel: bool, seed: int) -> dict:
    """One ``pm.sample`` call with forkserver workers; its pickle size and times."""
    context = rows_travel_with_pickles() if travel else contextlib.nullcontext()
    with context, model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        pickle_bytes = len(cloudpickle.dumps(step, protocol=-1))
        pickle_s = time.perf_counter() - start
        start = time.perf_counter()
        idata = pm.sample(
            step=step,
            chains=2,
            cores=2,
            mp_ctx="forkserver",
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
        wall = time.perf_counter() - start
    return {
        "mode": MODES[0] if travel else MODES[1],
        "pickle_mb": pickle_bytes / 1e6,
        "pickle_s": pickle_s,
        "call_s": wall,
        "sampling_s": float(idata.posterior.attrs["sampling_time"]),
        "beta_mean": idata.posterior["beta"].values.mean(axis=(0, 1)).tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="calls per mode")
    args = parser.parse_args()
    data = make_data(1_000_000, seed=0)
    with pm.Model() as model:
        X = pmbd.Data("X", data.X)
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=data.y)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC()
        pm.sample(step=step, tune=5, draws=5, chains=1, cores=1, progressbar=False)
    runs = []
    for _ in range(args.repeats):
        for travel in (True, False):
            runs.append(one_call(step, model, travel, seed=1))
            print({k: v for k, v in runs[-1].items() if k != "beta_mean"}, flush=True)
    write(runs)


def write(runs: list[dict]) -> None:
    """The results table and the raw runs."""
    same = all(np.allclose(r["beta_mean"], runs[0]["beta_mean"], rtol=0, atol=0) for r in runs)
    lines = [
        "# Parallel chains with pickled steps: rows in the pickle against shared rows",
        "",
        f"pymc_bigdata at {git_revision()}; SGHMC defaults on 10⁶ × 30 float64 rows "
        '(`pmbd.Data`); `pm.sample(chains=2, cores=2, mp_ctx="forkserver")`, 1000 + 1000 '
        "draws per chain, the modes alternating in one process. Posterior means equal in "
        f"every call: {same}.",
        "",
        "| call | mode | pickle (MB) | pickling (s) | `pm.sample` wall (s) | `sampling_time` (s) |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['mode']} | {r['pickle_mb']:.1f} | {r['pickle_s']:.2f} | "
            f"{r['call_s']:.2f} | {r['sampling_s']:.2f} |"
        )
    write_results("shared_rows", lines, runs)


if __name__ == "__main__":
    main()
