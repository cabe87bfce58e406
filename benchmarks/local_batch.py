"""``local_batch=True`` against the defaults on ``log tc``'s left tail in ``three_level``.

SGHMC on the non-centred ``tests/hard_models.py::three_level`` (60,000 rows, 4 countries),
2 chains of 2,000 draws after 1,000 tuning draws, at six seeds, with the defaults and with
``local_batch=True`` (:mod:`pymc_bigdata.step_methods.local_batch`): ``log tc``'s sd ratio
and tail shares against the exact marginal (``tests/references/three_level_scales.py``),
and the rows each draw's minibatches read, relative to the tuned batch size.

    .venv/bin/python benchmarks/local_batch.py     # about 11 minutes on 2 cores
    .venv/bin/python benchmarks/local_batch.py --settings local_batch=True --out NAME

Results: ``results/local_batch.{md,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

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
    write_tail_results,
)

RESULTS = ROOT / "benchmarks" / "results"
THRESHOLDS = (-2.0, -3.0)
SEEDS = (1, 2, 3, 4, 7, 2026)
DRAWS = 2_000
SETTINGS = (("defaults", {}), ("local_batch=True", {"local_batch": True}))
#: bins of log tc in which the draws' own noise readings are summarised
BINS = ((-np.inf, -2.0), (-2.0, -1.0), (-1.0, 0.0), (0.0, np.inf))


def run_row(label: str, kwargs: dict, seed: int, summary: dict) -> dict:
    """One run's tail row, with its batch sizes relative to the chains' tuned ones."""
    captured = {}

    def keep(idata) -> None:
        captured["batch"] = idata.sample_stats["batch_size"].values
        captured["local"] = idata.sample_stats["local_noise_share"].values.ravel()
        captured["log_tc"] = np.log(idata.posterior["tc"].values).ravel()

    row = long_run(
        label, DRAWS, kwargs, None, summary, seed=seed, build=three_level, scale="tc",
        thresholds=THRESHOLDS, inspect=keep,
    )  # fmt: skip
    batch = captured["batch"]
    tuned = np.array([np.min(chain) for chain in batch])  # the base: never gone below
    row |= {
        "seed": seed,
        "tuned_batch": [int(b) for b in tuned],
        "rows_per_draw_ratio": float(np.mean(batch / tuned[:, None])),
        "share_grown": float(np.mean(batch > tuned[:, None])),
        "local_noise_share": local_shares(captured["log_tc"], captured["local"], batch.ravel()),
    }
    return row


def local_shares(log_tc: np.ndarray, local: np.ndarray, batch: np.ndarray) -> list[dict]:
    """Per bin of ``log tc``: the measuring draws' count, the median and 90th percentile of
    their ``local_noise_share`` stat, and the draws' median batch size."""
    out = []
    for lo, hi in BINS:
        inside = (log_tc >= lo) & (log_tc < hi)
        measured = inside & np.isfinite(local)
        shares = local[measured]
        out.append(
            {
                "bin": [lo, hi],
                "measured": int(measured.sum()),
                "median": float(np.median(shares)) if shares.size else float("nan"),
                "q90": float(np.quantile(shares, 0.9)) if shares.size else float("nan"),
                "batch_median": float(np.median(batch[inside])) if inside.any() else float("nan"),
            }
        )
    return out


def bin_lines(rows: list[dict], labels: list[str]) -> list[str]:
    """The draws' own noise shares by bin of ``log tc``, every seed's run of a setting
    pooled (medians of the runs' medians)."""
    lines = [
        "`local_noise_share` (each measuring draw's own noise share, at the batch it read) by "
        "`log tc`, pooled over the seeds (median over the runs of each run's median and 90th "
        "percentile; the defaults measure one draw in 10):",
        "",
        "| setting | log tc in | measured draws | median share | 90th percentile | batch |",
        "|---|---|---|---|---|---|",
    ]
    for label in labels:
        mine = [r for r in rows if r["run"].endswith(label)]
        for k, (lo, hi) in enumerate(BINS):
            cells = [r["local_noise_share"][k] for r in mine]
            lines.append(
                f"| {label} | [{lo:g}, {hi:g}) | {sum(c['measured'] for c in cells)} "
                f"| {np.nanmedian([c['median'] for c in cells]):.4f} "
                f"| {np.nanmedian([c['q90'] for c in cells]):.4f} "
                f"| {np.nanmedian([c['batch_median'] for c in cells]):,.0f} |"
            )
    return lines


def report(summary: dict, rows: list[dict], commit: str, labels: list[str]) -> str:
    """The results as markdown."""
    below = {t: summary["below"][str(t)] for t in THRESHOLDS}
    lines = [
        f"# `local_batch` on `log tc` of `three_level` (pymc_bigdata at {commit})",
        "",
        f"SGHMC on the non-centred model, 2 chains x {DRAWS:,} draws after 1,000 tuning "
        f"draws. Exact: sd {summary['sd']:.4f}, P(log tc < -2) {below[-2.0]:.4f}, "
        f"P(log tc < -3) {below[-3.0]:.4f}. Rows per draw: the draws' batch size over the "
        "chain's tuned one (the smallest it read), averaged.",
        "",
        "| setting | seed | sd ratio (per chain) | below -2 | below -3 | tuned batch "
        "| rows per draw | draws grown | alarms | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        chains = ", ".join(f"{c:.3f}" for c in r["chain_sd_ratios"])
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['sd_ratio']:.3f} ({chains}) "
            f"| {r['below']['-2.0']:.4f} | {r['below']['-3.0']:.4f} "
            f"| {', '.join(f'{b:,}' for b in r['tuned_batch'])} "
            f"| {r['rows_per_draw_ratio']:.2f} | {r['share_grown']:.2f} "
            f"| {len(r['alarms'])} | {r['seconds']:.0f} |"
        )
    lines += ["", "| setting | mean sd ratio | runs in [0.9, 1.1] | mean below -3 | mean s |"]
    lines.append("|---|---|---|---|---|")
    for label in labels:
        mine = [r for r in rows if r["run"].endswith(label)]
        ratios = np.array([r["sd_ratio"] for r in mine])
        lines.append(
            f"| {label} | {ratios.mean():.3f} | {np.sum((ratios >= 0.9) & (ratios <= 1.1))} "
            f"of {len(mine)} | {np.mean([r['below']['-3.0'] for r in mine]):.4f} "
            f"| {np.mean([r['seconds'] for r in mine]):.0f} |"
        )
    lines += ["", *bin_lines(rows, labels)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    parser.add_argument("--out", default="local_batch")
    labels = [label for label, _ in SETTINGS]
    parser.add_argument("--settings", nargs="+", choices=labels, default=labels)
    args = parser.parse_args(argv)
    commit = short_commit()
    grid, weights = exact.reference_marginals()["tc_log__"]
    summary = exact_summary(grid, weights, THRESHOLDS)
    rows = []
    for seed in args.seeds:
        for label, kwargs in SETTINGS:
            if label not in args.settings:
                continue
            rows.append(run_row(label, kwargs, seed, summary))
            print({k: rows[-1][k] for k in ("run", "seed", "sd_ratio", "seconds")}, flush=True)
    text = report(summary, rows, commit, args.settings)
    write_tail_results(args.out, text, {"commit": commit, "exact": summary, "runs": rows})


if __name__ == "__main__":
    main()
