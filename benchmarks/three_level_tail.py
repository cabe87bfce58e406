"""The left tail of ``log tc`` in ``tests/hard_models.py::three_level`` (4 countries).

With 4 countries the countries' scale reaches down to 0: its density falls like ``tc``, an
exponential left tail, as ``sparse_regions``' ``log tau_b`` (``sparse_regions_tail.py``).
This script reports, from the exact marginal (``tests/references/three_level_scales.py``),
its moments, tail shares and how far the sd of ``n`` independent exact draws strays; and,
from SGHMC on the non-centred model (2 chains, ``random_seed=7``), ``log tc``'s sd ratio and
tail shares with the defaults and with the step or the gradient noise changed: a fixed step
of 0.1 (the two chains tune 0.22 and 0.60), full-data gradients (``batch_size`` N), or both.

    .venv/bin/python benchmarks/three_level_tail.py            # about 6 minutes
    .venv/bin/python benchmarks/three_level_tail.py --no-runs  # the exact part only

Results: ``results/three_level_tail.{md,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "references"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import three_level_scales as exact  # noqa: E402
from hard_models import three_level  # noqa: E402
from sparse_regions_tail import (  # noqa: E402
    exact_summary,
    long_run,
    short_commit,
    tail_report,
    write_tail_results,
)

RESULTS = ROOT / "benchmarks" / "results"
THRESHOLDS = (-1.5, -2.0, -3.0, -4.0)
N_ROWS = 60_000
#: (label, draws per chain, SGHMC keywords)
RUNS = (
    ("defaults", 3_000, {}),
    ("step_size=0.1", 2_000, {"step_size": 0.1}),
    ("batch_size=N", 2_000, {"batch_size": N_ROWS}),
    ("batch_size=N, step_size=0.1", 2_000, {"batch_size": N_ROWS, "step_size": 0.1}),
)


def report(summary: dict, runs: list[dict], commit: str) -> str:
    """The results as markdown."""
    title = f"# `log tc` of `three_level`: the exact tail, and SGHMC (pymc_bigdata at {commit})"
    caption = "SGHMC on the non-centred model, 2 chains, random_seed=7, 1,000 tuning draws each"
    return tail_report(title, summary, runs, "tc", caption, THRESHOLDS)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-runs", action="store_true", help="the exact part only")
    parser.add_argument("--out", default="three_level_tail")
    args = parser.parse_args(argv)
    commit = short_commit()
    grid, weights = exact.reference_marginals()["tc_log__"]
    summary = exact_summary(grid, weights, THRESHOLDS)
    runs = []
    if not args.no_runs:
        for label, draws, kwargs in RUNS:
            runs.append(
                long_run(
                    label,
                    draws,
                    kwargs,
                    None,
                    summary,
                    build=three_level,
                    scale="tc",
                    thresholds=THRESHOLDS,
                )  # fmt: skip
            )
            print(runs[-1], flush=True)
    text = report(summary, runs, commit)
    write_tail_results(args.out, text, {"commit": commit, "exact": summary, "runs": runs})


if __name__ == "__main__":
    main()
