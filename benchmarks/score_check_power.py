"""Power and false alarms of ``pmbd.score_check`` (docs/score_check.md).

A conjugate linear regression (5,000 rows, 4 coefficients, the noise variance with an
inverse-gamma prior), whose exact posterior NumPy draws directly:

A. 20 seeds of exact draws (2 chains x 1,000) per row, and the same draws made 1.2 or 0.8
   times too wide, or with one coefficient 0.5 posterior sds off; the share flagged when the
   check reads 40, 100 (the default) or 200 draws.
B. ``pm.sample`` results (2 x (1,000 + 1,000), seed 1): SGHMC and SGLD with their defaults,
   both with 10-row minibatches, SGLD with fixed steps 0.5 and 1.0; their sd ratios against
   the exact posterior, the virial ratio, p-values and whether the check flags them::

    .venv/bin/python benchmarks/score_check_power.py   # writes results/score_check_power.md
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.datasets import conjugate_regression

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from report import git_revision  # noqa: E402

SEEDS = 20
CHANGES = {
    "exact": {},
    "sds x 1.2": {"scale": 1.2},
    "sds x 0.8": {"scale": 0.8},
    "one coefficient 0.5 sd off": {"shift_sd": 0.5},
}


def exact_draws(posterior, seed: int, **change):
    """2 x 1,000 exact draws, changed on purpose (``ConjugatePosterior.draws``)."""
    return az.from_dict({"posterior": posterior.draws(np.random.default_rng(seed), **change)})


def power_table(model, layer, posterior) -> list[str]:
    """Part A: flagged runs out of ``SEEDS`` per change and draws read."""
    lines = ["| draws read | " + " | ".join(CHANGES) + " |", "|---" * (len(CHANGES) + 1) + "|"]
    for draws in (40, 100, 200):
        cells = []
        for change in CHANGES.values():
            flagged = sum(
                pmbd.score_check(
                    exact_draws(posterior, seed, **change),
                    model,
                    layer=layer,
                    draws=draws,
                    warn=False,
                    store=False,
                ).off_target
                for seed in range(SEEDS)
            )
            cells.append(f"{flagged} / {SEEDS}")
        lines.append(f"| {draws} | " + " | ".join(cells) + " |")
    return lines


def sampler_runs(model, layer, posterior) -> list[str]:
    """Part B: the check on pm.sample results."""
    beta_sd = np.sqrt(np.diag(posterior.cov) * posterior.b_n / (posterior.a_n - 1))
    steps: dict[str, Callable[[], object]] = {
        "SGHMC defaults": lambda: pmbd.SGHMC(layer=layer),
        "SGLD defaults": lambda: pmbd.SGLD(layer=layer),
        "SGHMC, batch 10": lambda: pmbd.SGHMC(layer=layer, batch_size=10),
        "SGLD, batch 10, step 0.3": lambda: pmbd.SGLD(
            layer=layer, adapt=False, step_size=0.3, batch_size=10
        ),
        "SGLD, step 0.5": lambda: pmbd.SGLD(layer=layer, adapt=False, step_size=0.5),
        "SGLD, step 1.0": lambda: pmbd.SGLD(layer=layer, adapt=False, step_size=1.0),
    }
    lines = [
        "| run | beta sd ratios | virial ratio | p mean score | p virial | p coordinates "
        "| flagged | check s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, make in steps.items():
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(
                step=make(),
                draws=1000,
                tune=1000,
                chains=2,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
            )
        start = time.perf_counter()
        result = pmbd.score_check(idata, model, layer=layer, warn=False)
        seconds = time.perf_counter() - start
        ratios = idata.posterior["beta"].std(("chain", "draw")).values / beta_sd
        lines.append(
            f"| {name} | [{ratios.min():.3f}, {ratios.max():.3f}] | {result.virial_ratio:.3f} "
            f"| {result.p_mean_score:.2g} | {result.p_virial:.2g} | {result.p_coordinates:.2g} "
            f"| {result.off_target} | {seconds:.2f} |"
        )
    return lines


def main() -> None:
    """Run A and B and write ``results/score_check_power.md``."""
    model, posterior = conjugate_regression()
    layer = pmbd.MinibatchModel(model)
    lines = [
        "# score_check: power and false alarms",
        "",
        f"At {git_revision()}; `benchmarks/score_check_power.py`.",
        "",
        f"## A. Exact draws and deliberate errors ({SEEDS} seeds each)",
        "",
        *power_table(model, layer, posterior),
        "",
        "## B. pm.sample results (2 x (1,000 + 1,000), seed 1)",
        "",
        *sampler_runs(model, layer, posterior),
        "",
    ]
    out = ROOT / "results" / "score_check_power.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
