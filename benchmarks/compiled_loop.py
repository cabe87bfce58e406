"""SGHMC's compiled transition loop against the Python loop, in one run.

On the benchmark's logistic regression (``protocol.py``: d = 30) at 100,000 and 1,000,000
rows, builds SGHMC with its defaults and with ``compiled_loop=True`` on one shared layer (one
MAP search), times the compiled loop's compilation (the first call's time over a warm call's)
and then runs both, alternately, ``--repeats`` times: ``pm.sample`` with 2 chains of 1000
tuning and 1000 kept draws, ``cores=1``, the same ``random_seed``. Reports each loop's
sampling time per draw, their ratio, and the largest difference between their draws (the
compiled loop must give the Python loop's draws)::

    .venv/bin/python benchmarks/compiled_loop.py   # ~3 min; results/compiled_loop.{md,json}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

import pymc_bigdata as pmbd

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from protocol import build_model, make_data  # noqa: E402
from report import git_revision  # noqa: E402

LOOPS = {"python": False, "compiled": True}


def sample(model: pm.Model, step: pmbd.SGHMC, draws: int, seed: int) -> tuple[float, np.ndarray]:
    """One ``pm.sample`` call (2 chains, cores=1): its sampling time and the draws."""
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(
            step=step,
            tune=draws,
            draws=draws,
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return float(idata.posterior.attrs["sampling_time"]), idata.posterior["beta"].values


def compare(n_rows: int, repeats: int) -> dict:
    """Both loops on one data set: compile time, sampling times, draws' difference."""
    data = make_data(n_rows, 0)
    model = build_model(data)
    layer = pmbd.MinibatchModel(model)
    steps = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, compiled in LOOPS.items():
            steps[name] = pmbd.SGHMC(model=model, layer=layer, compiled_loop=compiled)
    first = {}
    for name, step in steps.items():  # the first call compiles (PyTensor's functions first)
        t0 = time.perf_counter()
        sample(model, step, 5, 0)
        first[name] = time.perf_counter() - t0
    warm = {name: time.perf_counter() for name in steps}
    for name, step in steps.items():
        t0 = time.perf_counter()
        sample(model, step, 5, 0)
        warm[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in steps}
    draws = {}
    for _ in range(repeats):
        for name, step in steps.items():
            seconds, draws[name] = sample(model, step, 1000, 1)
            times[name].append(seconds)
    per_draw = {name: statistics.median(t) / 4000 * 1e6 for name, t in times.items()}
    return {
        "n_rows": n_rows,
        "inner_steps": steps["compiled"].inner_steps,
        "compile_s": first["compiled"] - warm["compiled"] - (first["python"] - warm["python"]),
        "sampling_s": times,
        "us_per_draw": per_draw,
        "speedup": per_draw["python"] / per_draw["compiled"],
        "max_draw_difference": float(np.abs(draws["python"] - draws["compiled"]).max()),
    }


def markdown(results: list[dict], revision: str) -> str:
    """The results as a Markdown table."""
    lines = [
        "# SGHMC: compiled transition loop vs Python loop",
        "",
        f"pymc_bigdata at {revision}; logistic regression d = 30 (`protocol.py`), SGHMC "
        "defaults, 2 chains x (1000 tuning + 1000 draws), cores=1, medians of the repeats "
        "(run alternately). Compile: the compiled loop's extra first-call time.",
        "",
        "| rows | inner steps | Python (µs/draw) | compiled (µs/draw) | speed-up | "
        "compile (s) | max draw difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        us = r["us_per_draw"]
        lines.append(
            f"| {r['n_rows']:,} | {r['inner_steps']} | {us['python']:.0f} | "
            f"{us['compiled']:.0f} | {r['speedup']:.2f} | {r['compile_s']:.1f} | "
            f"{r['max_draw_difference']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both sizes and write ``results/compiled_loop.{md,json}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="compiled_loop")
    args = parser.parse_args()
    revision = git_revision()
    results = [compare(int(n), args.repeats) for n in args.sizes]
    out = ROOT / "results" / args.out
    out.with_suffix(".json").write_text(
        json.dumps({"revision": revision, "results": results}, indent=1)
    )
    out.with_suffix(".md").write_text(markdown(results, revision))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
