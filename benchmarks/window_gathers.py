"""Window gathers against uniform row gathers, in one run (``gather="windows"``, issue 27).

On the benchmark's logistic regression (``protocol.py``: d = 30, X in memory) at 100,000 and
1,000,000 rows, builds each sampler with its defaults twice, once on ``pmbd.Data("X", X)``
(uniform rows, the default) and once on ``pmbd.Data("X", X, gather="windows")`` (windows of
a shuffled copy, ``pymc_bigdata/row_windows.py``), times the copy's build (one pass), then
runs both alternately ``--repeats`` times: ``pm.sample`` with 2 chains of 1000 tuning and
1000 kept draws, ``cores=1``, the same ``random_seed``. Reports the sampling time per draw
(median of the repeats), the speed-up, the min bulk ESS and ESS/s of the last repeat, and
its accuracy against the cached reference (``reference.py``: Laplace + importance
sampling)::

    .venv/bin/python benchmarks/window_gathers.py   # ~10 min; results/window_gathers.{md,json}
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

from compiled_loop import sample  # noqa: E402 - one pm.sample call, timed
from protocol import Dataset, make_data  # noqa: E402
from reference import load_or_compute_reference  # noqa: E402
from report import git_revision  # noqa: E402
from scoring import MethodResult, score_draws  # noqa: E402

GATHERS = ("rows", "windows")
SAMPLERS = ("SGHMC", "SGLD", "SBPS", "EWSG")
#: the reference's importance samples and t degrees of freedom (``protocol.py``'s defaults)
IS_SAMPLES, IS_DF = 20_000, 10.0


def build(data: Dataset, gather: str) -> pm.Model:
    """The protocol's model, with ``X`` read through ``pmbd.Data`` and ``gather``."""
    with pm.Model() as model:
        X = pmbd.Data("X", data.X, gather=gather)
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=data.y)
    return model


def compare(data: Dataset, sampler: str, repeats: int, ref) -> dict:
    """One sampler on both gathers: the copy's build, sampling times, accuracy."""
    models = {g: build(data, g) for g in GATHERS}
    steps, setup = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for gather, model in models.items():
            t0 = time.perf_counter()
            steps[gather] = getattr(pmbd, sampler)(model=model)
            setup[gather] = time.perf_counter() - t0
    step = steps["windows"]
    t0 = time.perf_counter()
    step.layer.rows.shuffled_rows(step.minibatches.census).arrays  # noqa: B018 - the build
    copy_s = time.perf_counter() - t0
    for gather, model in models.items():  # compile the chains' functions
        sample(model, steps[gather], 5, 0)
    times: dict[str, list[float]] = {g: [] for g in GATHERS}
    draws: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for gather, model in models.items():
            seconds, draws[gather] = sample(model, steps[gather], 1000, 1)
            times[gather].append(seconds)
    rows = {}
    for gather in GATHERS:
        result = MethodResult(method=f"{sampler} {gather}", wall_s=times[gather][-1])
        score_draws(result, draws[gather], ref)
        rows[gather] = {
            "setup_s": setup[gather],
            "sampling_s": times[gather],
            "us_per_draw": statistics.median(times[gather]) / 4000 * 1e6,
            "min_ess": result.min_ess,
            "ess_per_s": result.ess_per_s,
            "max_mean_err": result.max_mean_err,
            "sd_ratio": [result.sd_ratio_min, result.sd_ratio_max],
        }
    speedup = rows["rows"]["us_per_draw"] / rows["windows"]["us_per_draw"]
    return {"n_rows": data.n_rows, "sampler": sampler, "copy_s": copy_s, "speedup": speedup, **rows}


def markdown(results: list[dict], revision: str) -> str:
    """The results as a Markdown table."""
    lines = [
        "# Window gathers against uniform row gathers",
        "",
        f"pymc_bigdata at {revision}; logistic regression d = 30 (`protocol.py`), X in "
        'memory as `pmbd.Data("X", X)` and as `pmbd.Data("X", X, gather="windows")`, '
        "each sampler's defaults, 2 chains x (1000 tuning + 1000 draws), cores=1; time per "
        "draw: median of the repeats (run alternately); ESS, ESS/s (sampling time) and "
        "accuracy of the last repeat against the Laplace + importance-sampling reference. "
        "Copy: building the shuffled copy (one pass).",
        "",
        "| rows | sampler | rows (µs/draw) | windows (µs/draw) | speed-up | copy (s) | "
        "min ESS rows / windows | ESS/s rows / windows | max \\|Δmean\\|/sd rows / windows | "
        "sd ratios rows / windows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a, b = r["rows"], r["windows"]
        lines.append(
            f"| {r['n_rows']:,} | {r['sampler']} | {a['us_per_draw']:.0f} | "
            f"{b['us_per_draw']:.0f} | {r['speedup']:.2f} | {r['copy_s']:.2f} | "
            f"{a['min_ess']:,.0f} / {b['min_ess']:,.0f} | {a['ess_per_s']:,.0f} / "
            f"{b['ess_per_s']:,.0f} | {a['max_mean_err']:.3f} / {b['max_mean_err']:.3f} | "
            f"[{a['sd_ratio'][0]:.3f}, {a['sd_ratio'][1]:.3f}] / "
            f"[{b['sd_ratio'][0]:.3f}, {b['sd_ratio'][1]:.3f}] |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every size and sampler and write ``results/<out>.{md,json}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="window_gathers")
    args = parser.parse_args()
    revision = git_revision()
    results = []
    for n_rows in args.sizes:
        data = make_data(int(n_rows), 0)
        ref = load_or_compute_reference(data, build(data, "rows"), IS_SAMPLES, IS_DF)
        for sampler in args.samplers:
            results.append(compare(data, sampler, args.repeats, ref))
            print(markdown(results[-1:], revision).splitlines()[-1], flush=True)
    out = ROOT / "results" / args.out
    out.with_suffix(".json").write_text(
        json.dumps({"revision": revision, "results": results}, indent=1)
    )
    out.with_suffix(".md").write_text(markdown(results, revision))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
