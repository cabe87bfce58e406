"""The left tail of ``log tau_b`` in ``tests/hard_models.py::sparse_regions``.

With 12 regions, ``tau_b``'s posterior reaches down to 0: as ``tau_b -> 0`` the rows'
density tends to a constant, so ``log tau_b``'s density falls only like ``tau_b`` (the
prior's Jacobian), an exponential tail. This script reports, from the exact marginal (the
grid of ``tests/references/make_sparse_regions_reference.py``):

* its skewness, kurtosis and tail probabilities;
* how far the sd of ``n`` independent exact draws strays (quantiles of the sd ratio over
  4,000 repetitions), the best any sampler can do with ``n`` effective draws;

and, from long SGHMC runs on the non-centred model (2 chains, ``random_seed=7``), the sd
ratio and tail shares of ``log tau_b`` with the defaults and with one setting changed each:
less gradient noise (``batch_size`` N or 5,000, ``noise_bound=0.01``), a small fixed step
(``step_size=0.1``), or every region non-centred (``PARENT_SCALE_SDS = 10``).

    .venv/bin/python benchmarks/sparse_regions_tail.py            # about 10 minutes
    .venv/bin/python benchmarks/sparse_regions_tail.py --no-runs  # the exact part only
    .venv/bin/python benchmarks/sparse_regions_tail.py --nuts     # full-data NUTS instead
    .venv/bin/python benchmarks/sparse_regions_tail.py --refinement  # about 10 minutes

``--refinement`` runs SGHMC's defaults with and without the re-run of stiff draws
(``max_refinements=0``) on both forms of the model at seeds 1-4, 2 chains of 10,000 draws each
(``results/sparse_regions_tail_refinement.{md,json}``); with ``--sgld``, SGLD at
``max_refinements=6`` and 0, one form per run of the script (``--form centred`` or
``non-centred``; ``results/sparse_regions_tail_refinement_sgld_<form>.{md,json}``, about 25
minutes each).

``--nuts`` runs PyMC's own NUTS on the non-centred model as written, at ``pm.sample``'s
defaults (2 chains of 1,000 draws after 1,000 tuning draws) and seeds 2026-2028: what an exact
sampler reads of the tail at the draw count the hard targets use
(``results/sparse_regions_tail_nuts.{md,json}``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "references"))

import make_sparse_regions_reference as exact  # noqa: E402
from hard_models import make_sparse_regions_data, sparse_regions  # noqa: E402

import pymc_bigdata as pmbd  # noqa: E402
from pymc_bigdata.step_methods import coordinates  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
THRESHOLDS = (-1.5, -2.0, -3.0, -4.0)
SAMPLE_SIZES = (250, 500, 1000, 2000)
#: (label, draws per chain, SGHMC keywords, PARENT_SCALE_SDS)
RUNS = (
    ("defaults", 20_000, {}, None),
    ("batch_size=N", 10_000, {"batch_size": 22_646}, None),
    ("batch_size=5000", 10_000, {"batch_size": 5000}, None),
    ("noise_bound=0.01", 10_000, {"noise_bound": 0.01}, None),
    ("step_size=0.1", 10_000, {"step_size": 0.1}, None),
    ("regions non-centred", 10_000, {}, 10.0),
)


def exact_marginal() -> tuple[np.ndarray, np.ndarray]:
    """The grid of ``log tau_b`` and its exact marginal weights."""
    ref = np.load(ROOT / "tests" / "references" / "sparse_regions.npz")
    slope, sigma = float(ref["slope__mean"][0]), float(np.exp(ref["sigma_log____mean"][0]))
    group, region, x, y = make_sparse_regions_data()
    n = np.bincount(group)
    ybar = np.bincount(group, weights=y - slope * x) / n
    weights = exact.log_scales_density(ybar, n, region, sigma)
    return exact.LOG_TAU_B, weights.sum(axis=1)


def exact_summary(
    grid: np.ndarray, weights: np.ndarray, thresholds: tuple[float, ...] = THRESHOLDS
) -> dict:
    """Moments, tail probabilities (below each of ``thresholds``) and the sd ratios of
    independent exact draws."""
    mean = float(weights @ grid)
    centred = grid - mean
    var = float(weights @ centred**2)
    out = {
        "mean": mean,
        "sd": var**0.5,
        "skewness": float(weights @ centred**3) / var**1.5,
        "kurtosis": float(weights @ centred**4) / var**2,
        "below": {str(t): float(weights[grid < t].sum()) for t in thresholds},
        "iid_sd_ratio": {},
    }
    rng = np.random.default_rng(0)
    spacing = np.gradient(grid)  # each point's cell width (a grid may be coarse in a tail)
    for size in SAMPLE_SIZES:
        picked = rng.choice(len(grid), size=(4000, size), p=weights)
        draws = grid[picked] + spacing[picked] * rng.uniform(-0.5, 0.5, picked.shape)
        ratio = draws.std(axis=1) / out["sd"]
        out["iid_sd_ratio"][str(size)] = {
            "q2.5": float(np.quantile(ratio, 0.025)),
            "median": float(np.median(ratio)),
            "q97.5": float(np.quantile(ratio, 0.975)),
            "outside_bars": float(np.mean((ratio < 0.9) | (ratio > 1.1))),
        }
    return out


def long_run(
    label: str,
    draws: int,
    kwargs: dict,
    parent_scale_sds: float | None,
    ref,
    *,
    centred: bool = False,
    seed: int = 7,
    sampler: type = pmbd.SGHMC,
    build: Callable[..., pm.Model] = sparse_regions,
    scale: str = "tau_b",
    thresholds: tuple[float, ...] = THRESHOLDS,
    inspect: Callable[[object], None] | None = None,
) -> dict:
    """One run of ``sampler`` (by default SGHMC on the non-centred model that ``build``
    makes, ``sparse_regions``); ``log scale``'s sd ratio and tail shares. ``inspect``, if
    given, is called with the run's draws."""
    default = coordinates.PARENT_SCALE_SDS
    if parent_scale_sds is not None:
        coordinates.PARENT_SCALE_SDS = parent_scale_sds
    try:
        model = build(centred=centred)
        start = time.perf_counter()
        step = sampler(model=model, **kwargs)
    finally:
        coordinates.PARENT_SCALE_SDS = default
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pm.sample(
            step=step,
            draws=draws,
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    alarms = [str(w.message)[:120] for w in caught if issubclass(w.category, pmbd.BiasWarning)]
    if inspect is not None:
        inspect(idata)
    stats = idata.sample_stats
    seconds = time.perf_counter() - start
    return tail_row(f"{sampler.__name__}, {label}", idata, seconds, ref, scale, thresholds) | {
        "alarms": alarms,
        "divergences": int(stats["diverging"].values.sum()),
        "refined_draws": int((stats["step_refinements"].values > 0).sum())
        if "step_refinements" in stats
        else 0,
    }


def refinement_runs(
    ref: dict, sampler: type = pmbd.SGHMC, forms: tuple[bool, ...] = (True, False)
) -> list[dict]:
    """``sampler``'s defaults (SGHMC) or ``max_refinements=6`` (SGLD) against
    ``max_refinements=0``, the forms given (centred: True), seeds 1-4."""
    settings = (("defaults", {}), ("max_refinements=0", {"max_refinements": 0}))
    if sampler is not pmbd.SGHMC:
        settings = (("max_refinements=6", {"max_refinements": 6}),) + settings[1:]
    runs = []
    for centred in forms:
        for seed in (1, 2, 3, 4):
            for label, kwargs in settings:
                form = "centred" if centred else "non-centred"
                label = f"{label}, {form}, seed {seed}"
                runs.append(
                    long_run(
                        label,
                        10_000,
                        kwargs,
                        None,
                        ref,
                        centred=centred,
                        seed=seed,
                        sampler=sampler,
                    )  # fmt: skip
                )
                print(runs[-1], flush=True)
    return runs


def nuts_run(seed: int, ref: dict) -> dict:
    """PyMC's NUTS at ``pm.sample``'s defaults on the non-centred model."""
    model = sparse_regions(centred=False)
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            nuts_sampler="pymc",
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    divergences = int(idata.sample_stats["diverging"].values.sum())
    return tail_row(f"NUTS, seed {seed}", idata, time.perf_counter() - start, ref) | {
        "divergences": divergences,
        "alarms": [],
    }


def tail_row(
    label: str,
    idata,
    seconds: float,
    ref: dict,
    scale: str = "tau_b",
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> dict:
    """``log scale``'s mean error, sd ratios and tail shares in a run's kept draws."""
    x = np.log(idata.posterior[scale].values)
    return {
        "run": label,
        "draws": int(x.size),
        "seconds": seconds,
        "step_size": float(idata.sample_stats["step_size"].values[0, -1]),
        "err_sd": float((x.mean() - ref["mean"]) / ref["sd"]),
        "sd_ratio": float(x.std() / ref["sd"]),
        "chain_sd_ratios": [float(c.std() / ref["sd"]) for c in x],
        "below": {str(t): float(np.mean(x < t)) for t in thresholds},
    }


def share_lines(
    summary: dict, runs: list[dict], scale: str, thresholds: tuple[float, ...] = THRESHOLDS
) -> list[str]:
    """The exact and the runs' shares of ``log scale`` below each threshold, as a table."""
    lines = [
        f"| P(log {scale} < t) | " + " | ".join(f"t = {t}" for t in thresholds) + " |",
        "|---|" + "---|" * len(thresholds),
        "| exact | " + " | ".join(f"{summary['below'][str(t)]:.4f}" for t in thresholds) + " |",
    ]
    return lines + [
        f"| {r['run']} | " + " | ".join(f"{r['below'][str(t)]:.4f}" for t in thresholds) + " |"
        for r in runs
    ]


def iid_lines(summary: dict) -> list[str]:
    """The sd ratios of independent exact draws, as a table."""
    lines = [
        "sd ratio of n independent exact draws (4,000 repetitions):",
        "",
        "| n | 2.5 % | median | 97.5 % | outside [0.9, 1.1] |",
        "|---|---|---|---|---|",
    ]
    return lines + [
        f"| {int(size):,} | {q['q2.5']:.3f} | {q['median']:.3f} | {q['q97.5']:.3f} "
        f"| {q['outside_bars']:.1%} |"
        for size, q in summary["iid_sd_ratio"].items()
    ]


def run_lines(runs: list[dict], caption: str) -> list[str]:
    """Each run's step, errors, sd ratios, share below -3, divergences, re-runs, alarms and
    time, as a table under ``caption``."""
    lines = [
        f"{caption} (div.: divergences; re-run: draws re-run at a finer step):",
        "",
        "| run | draws | step | mean error / sd | sd ratio (per chain) | below -3 | div. "
        "| re-run | alarms | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        chains = ", ".join(f"{c:.3f}" for c in r["chain_sd_ratios"])
        lines.append(
            f"| {r['run']} | {r['draws']:,} | {r['step_size']:.3g} | {r['err_sd']:.3f} "
            f"| {r['sd_ratio']:.3f} ({chains}) | {r['below']['-3.0']:.4f} "
            f"| {r.get('divergences', '')} | {r.get('refined_draws', '')} "
            f"| {len(r['alarms'])} | {r['seconds']:.0f} |"
        )
    return lines


def tail_report(
    title: str,
    summary: dict,
    runs: list[dict],
    scale: str,
    caption: str,
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> str:
    """A tail benchmark's results as markdown: the exact marginal's moments, the tail shares,
    the sd ratios of independent exact draws and the runs (under ``caption``)."""
    lines = [
        title,
        "",
        f"Exact marginal: mean {summary['mean']:.4f}, sd {summary['sd']:.4f}, skewness "
        f"{summary['skewness']:.2f}, kurtosis {summary['kurtosis']:.1f}.",
        "",
        *share_lines(summary, runs, scale, thresholds),
        "",
        *iid_lines(summary),
    ]
    if runs:
        lines += ["", *run_lines(runs, caption)]
    return "\n".join(lines) + "\n"


def report(summary: dict, runs: list[dict], commit: str) -> str:
    """The results as markdown."""
    title = (
        f"# `log tau_b` of `sparse_regions`: the exact tail, and runs (pymc_bigdata at {commit})"
    )
    caption = (
        "2 chains, 1,000 tuning draws each; the non-centred model at random_seed=7 unless "
        "the run names its form and seed"
    )
    return tail_report(title, summary, runs, "tau_b", caption)


def short_commit() -> str:
    """The checkout's short commit hash (the results say which code they measured)."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def write_tail_results(out: str, text: str, payload: dict) -> None:
    """Write ``results/<out>.md`` (``text``) and ``results/<out>.json`` (``payload``), and
    print the markdown."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out}.md").write_text(text)
    (RESULTS / f"{out}.json").write_text(json.dumps(payload, indent=1))
    print(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-runs", action="store_true", help="the exact part only")
    parser.add_argument("--nuts", action="store_true", help="PyMC's NUTS at seeds 2026-2028")
    parser.add_argument(
        "--refinement", action="store_true", help="SGHMC with and without re-runs, seeds 1-4"
    )
    parser.add_argument("--sgld", action="store_true", help="with --refinement: SGLD")
    parser.add_argument("--form", choices=("centred", "non-centred"), help="with --sgld")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.sgld and not (args.refinement and args.form):
        parser.error("--sgld needs --refinement and --form")
    out = args.out or (
        "sparse_regions_tail_nuts"
        if args.nuts
        else "sparse_regions_tail_refinement"
        if args.refinement
        else "sparse_regions_tail"
    )
    if args.sgld:
        out = args.out or f"sparse_regions_tail_refinement_sgld_{args.form}"
    commit = short_commit()
    summary = exact_summary(*exact_marginal())
    runs = []
    if args.nuts:
        for seed in (2026, 2027, 2028):
            runs.append(nuts_run(seed, summary))
            print(runs[-1], flush=True)
    elif args.sgld:
        runs = refinement_runs(summary, pmbd.SGLD, (args.form == "centred",))
    elif args.refinement:
        runs = refinement_runs(summary)
    elif not args.no_runs:
        for label, draws, kwargs, parent_scale_sds in RUNS:
            runs.append(long_run(label, draws, kwargs, parent_scale_sds, summary))
            print(runs[-1], flush=True)
    text = report(summary, runs, commit)
    write_tail_results(out, text, {"commit": commit, "exact": summary, "runs": runs})


if __name__ == "__main__":
    main()
