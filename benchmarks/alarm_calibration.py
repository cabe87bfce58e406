"""The alarms, right both ways: quiet on in-band runs, firing on off-target ones (issue 26).

On ``scale_regression`` of ``tests/hard_models.py`` (5,000 rows, 25 equicorrelated
coefficients, rho = 0.9, and a noise scale: d = 26; NUTS reference in ``tests/references``),
every sampler runs with ``pm.sample``'s defaults (2 chains, 1,000 + 1,000 draws) at seeds
1, 2 and 3, and with two deliberate changes that may put it off target: a step 10 times too
large at seed 1, and 10-row minibatches at seeds 1, 2 and 3:

* ``step x10``: the step its tuning chose (the defaults' run at seed 1), times 10, fixed
  (``adapt=False``); SBPS, which has no step, gets a band far too narrow (``k=0.3``) instead;
* ``batch 10``: 10-row minibatches (HMC-ECS: ``subsample_size=10``, signed ``minibatch=10``),
  everything else default.

For each run: the worst mean error in reference sds and the sd ratios (unconstrained
coordinates), min bulk ESS, whether it is **in band** (min bulk ESS at least
``MIN_ESS`` = 100, max error at most ``max(0.1, 4 / sqrt(min ESS))`` and every sd ratio
within ``1 +- max(0.1, 4 / sqrt(2 min ESS))``: the issue's bars for the defaults, widened
where the Monte Carlo error is larger; a chain with fewer effective draws is no sample),
the sampler's alarms (a ``BiasWarning``, or divergences) and ``pmbd.score_check``'s
verdict::

    .venv/bin/python benchmarks/alarm_calibration.py   # writes results/alarm_calibration.md
    .venv/bin/python benchmarks/alarm_calibration.py --samplers SGLD SBPS
    .venv/bin/python benchmarks/alarm_calibration.py --target hier_logistic_noncentred \
        --out alarm_calibration_hier   # another hard target (its defaults' batch size)
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from functools import partial
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from hard_targets import MODELS, reference, unconstrained  # noqa: E402
from report import git_revision  # noqa: E402

TARGET = "scale_regression"
SAMPLERS = {
    "SGHMC": pmbd.SGHMC,
    "SGLD": pmbd.SGLD,
    "SBPS": pmbd.SBPS,
    "HMCECS": pmbd.HMCECS,
    "HMCECS-signed": partial(pmbd.HMCECS, estimator="signed"),
    "EWSG": pmbd.EWSG,
    "AusterityMH": pmbd.AusterityMH,
}
SEEDS = (1, 2, 3)
#: fewer effective draws than this (of 2,000) are no usable sample: off target
MIN_ESS = 100


def accuracy(idata, model, ref) -> tuple[float, float, float, float]:
    """Worst mean error / sd, sd-ratio range and min bulk ESS, unconstrained coordinates."""
    errs, ratios, ess = [], [], []
    for value in model.value_vars:
        draws = unconstrained(idata, value.name)
        mean, sd = draws.mean((0, 1)), draws.std((0, 1))
        errs.append(np.abs(mean - ref[f"{value.name}__mean"]) / ref[f"{value.name}__sd"])
        ratios.append(sd / ref[f"{value.name}__sd"])
        ess.append(az.ess(az.from_dict({"posterior": {"x": draws}}))["x"].values.ravel())
    errs, ratios, ess = (np.concatenate(x) for x in (errs, ratios, ess))
    return float(errs.max()), float(ratios.min()), float(ratios.max()), float(ess.min())


def run(model, ref, make, seed: int) -> dict:
    """One run: accuracy, alarms and the score check."""
    step = make()
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pm.sample(
            step=step,
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    err, low, high, ess = accuracy(idata, model, ref)
    alarm = any(issubclass(w.category, pmbd.BiasWarning) for w in caught)
    divergences = int(idata.sample_stats["diverging"].values.sum())
    try:
        check = pmbd.score_check(idata, model, layer=step.layer, warn=False, store=False)
        score = f"{'flags' if check.off_target else 'quiet'} ({check.virial_ratio:.2f})"
    except ValueError as error:  # too few effective draws
        score = f"n/a ({str(error).split(':')[0]})"
    ess_floor = max(ess, 1.0)
    sd_band = max(0.1, 4 / math.sqrt(2 * ess_floor))
    in_band = (
        ess >= MIN_ESS
        and err <= max(0.1, 4 / math.sqrt(ess_floor))
        and max(1 - low, high - 1) <= sd_band
    )
    return {
        "err": err,
        "ratios": (low, high),
        "ess": ess,
        "in_band": in_band,
        "alarm": alarm,
        "divergences": divergences,
        "score": score,
        "step": float(idata.sample_stats["step_size"].values[0, -1]),
    }


def off_target(name: str, make, tuned_step: float):
    """The two deliberate off-target variants of a sampler."""
    if name == "SBPS":
        too_large = partial(make, k=0.3)
    else:
        too_large = partial(make, adapt=False, step_size=10 * tuned_step)
    if name == "HMCECS-signed":
        small = partial(make, minibatch=10)
    elif name == "HMCECS":
        small = partial(make, subsample_size=10)
    else:
        small = partial(make, batch_size=10)
    return {"step x10" if name != "SBPS" else "k 0.3": too_large, "batch 10": small}


def main(argv=None) -> None:
    """Run every sampler's five runs and write ``results/alarm_calibration.md``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", nargs="+", choices=list(SAMPLERS), default=list(SAMPLERS))
    parser.add_argument("--out", default="alarm_calibration")
    parser.add_argument("--target", default=TARGET, choices=list(MODELS))
    args = parser.parse_args(argv)
    model, ref = reference(args.target)
    layer = pmbd.MinibatchModel(model)
    lines = [
        "| sampler | run | seed | max \\|Δmean\\|/sd | sd ratio | min ESS | in band | alarm "
        "| divergences | score_check (virial ratio) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.samplers:
        make = partial(SAMPLERS[name], model=model, layer=layer)
        runs = [("defaults", make, seed) for seed in SEEDS]
        first = None
        for label, factory, seed in runs:
            result = run(model, ref, factory, seed)
            first = first or result
            lines.append(_row(name, label, seed, result))
            print(lines[-1], flush=True)
        for label, factory in off_target(name, make, first["step"]).items():
            for seed in SEEDS if label == "batch 10" else SEEDS[:1]:
                result = run(model, ref, factory, seed)
                lines.append(_row(name, label, seed, result))
                print(lines[-1], flush=True)
    text = "\n".join(
        [
            "# Alarms on in-band and off-target runs",
            "",
            f"At {git_revision()}; `benchmarks/alarm_calibration.py` on `{args.target}` "
            f"(d = {layer.dim}).",
            "",
            *lines,
            "",
        ]
    )
    (ROOT / "results" / f"{args.out}.md").write_text(text)
    print(text)


def _row(name: str, label: str, seed: int, r: dict) -> str:
    low, high = r["ratios"]
    return (
        f"| {name} | {label} | {seed} | {r['err']:.3f} | [{low:.3f}, {high:.3f}] "
        f"| {r['ess']:,.0f} | {'yes' if r['in_band'] else 'no'} | {'yes' if r['alarm'] else 'no'} "
        f"| {r['divergences']} | {r['score']} |"
    )


if __name__ == "__main__":
    main()
