"""What SGHMC's re-runs of stiff draws cost where the targets have no stiff region.

On the hard targets whose draws SGHMC re-runs most often (``rare_event_logistic``: 21 % of
its draws; ``sbps_paper_logistic``; ``scale_few_rows``), runs SGHMC's defaults and
``max_refinements=0`` at ``pm.sample``'s defaults (2 chains, ``random_seed=2026``) and reports
the sampling time, rows read per draw (tuning's choice of step and inner steps included),
draws re-run and the min bulk ESS.

    .venv/bin/python benchmarks/refinement_cost.py   # about a minute
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import arviz as az
import pymc as pm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import hard_models as hm  # noqa: E402

import pymc_bigdata as pmbd  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: name: (model builder, batch size or None for the default), as in ``hard_targets.py``
TARGETS = {
    "rare_event_logistic": (hm.rare_event_logistic, None),
    "sbps_paper_logistic": (hm.sbps_paper_logistic, 100),
    "scale_few_rows": (hm.scale_few_rows, 10),
}


def run(name: str, settings: dict) -> dict:
    """SGHMC on one target with the given settings."""
    build, batch = TARGETS[name]
    model = build()
    kwargs = settings | ({} if batch is None else {"batch_size": batch})
    step = pmbd.SGHMC(model=model, **kwargs)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(
            step=step,
            chains=2,
            cores=1,
            random_seed=2026,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    ess = min(float(v.values.min()) for v in az.ess(idata).data_vars.values())
    return {
        "target": name,
        "settings": "defaults" if not settings else "max_refinements=0",
        "sampling_s": float(idata.posterior.attrs["sampling_time"]),
        "rows_per_draw": float(stats["rows_touched"].mean()),
        "step_size": float(stats["step_size"].values[0, -1]),
        "inner_steps": int(step.inner_steps),
        "refined_draws": int((stats["step_refinements"].values > 0).sum()),
        "min_bulk_ess": ess,
    }


def main() -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows = [run(name, settings) for name in TARGETS for settings in ({}, {"max_refinements": 0})]
    lines = [
        f"# SGHMC's re-runs of stiff draws: cost (pymc_bigdata at {commit})",
        "",
        "| target | settings | sampling (s) | rows / draw | ε × steps | re-run | min bulk ESS |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['target']} | {r['settings']} | {r['sampling_s']:.2f} | {r['rows_per_draw']:,.0f} "
        f"| {r['step_size']:.3g} × {r['inner_steps']} | {r['refined_draws']} "
        f"| {r['min_bulk_ess']:,.0f} |"
        for r in rows
    ]
    text = "\n".join(lines) + "\n"
    (RESULTS / "refinement_cost.md").write_text(text)
    (RESULTS / "refinement_cost.json").write_text(
        json.dumps({"commit": commit, "rows": rows}, indent=1)
    )
    print(text)


if __name__ == "__main__":
    main()
