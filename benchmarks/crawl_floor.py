"""The crawl alarm's floor (``CRAWL_MIN_ESS``): what it adds on the alarm table's runs.

Re-runs, at the current commit, every run of the alarm table (``results/alarm_table_*.json``,
``pm.sample``'s defaults at seeds 1, 2, 3) whose two-chain min bulk ESS was below
``--below`` (default 200), with ``hard_targets.run_one``, and reports for each: its errors,
whether it is within the sampler's bars widened by its Monte Carlo error
(``alarm_table.within_widened_bars``: min bulk ESS at least 100 among the rest), each chain's
smallest bulk ESS over the crawl watch's coordinates (the alarm's statistic), the crawl alarm
under the old rule (below 2 % of the draws) and the new one (also below 50), and every
``BiasWarning``'s first sentence::

    .venv/bin/python benchmarks/crawl_floor.py       # writes results/crawl_floor.{md,json}

Runs with a higher ESS need no re-run: at 1,000 draws a chain below the floor has at most 50
effective draws, so the two chains together at most ~100 plus what the other holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import alarm_table  # noqa: E402
import hard_targets  # noqa: E402
from report import git_revision  # noqa: E402

from pymc_bigdata.step_methods.crawl import CRAWL_ESS_SHARE, CRAWL_MIN_ESS  # noqa: E402

RESULTS = BENCHMARKS / "results"
DRAWS = 1000  # pm.sample's default, the table's


def low_ess_runs(below: float) -> list[dict]:
    """The alarm table's rows with a two-chain min bulk ESS below ``below``."""
    rows = []
    for path in sorted(RESULTS.glob("alarm_table_*.json")):
        rows += [r for r in json.loads(path.read_text())["rows"] if r["min_bulk_ess"] < below]
    return sorted(rows, key=lambda r: (r["model"], r["sampler"], r["seed"]))


def rerun(row: dict) -> dict:
    """``row``'s run again, with the crawl rules judged on its chains."""
    model, ref = hard_targets.reference(row["model"])
    out = hard_targets.run_one(row["model"], model, ref, row["sampler"], seed=row["seed"])
    out["table_ess"] = row["min_bulk_ess"]
    out["within_widened"] = alarm_table.within_widened_bars(out)
    out["crawl_old"] = min(out["crawl_ess"]) < CRAWL_ESS_SHARE * DRAWS
    out["crawl_new"] = min(out["crawl_ess"]) < max(CRAWL_ESS_SHARE * DRAWS, CRAWL_MIN_ESS)
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| model | sampler | seed | min bulk ESS (table → now) | max \\|Δmean\\|/sd | sd ratio "
        "| within widened bars | chains' crawl ESS | crawl: 2 % / with floor | BiasWarnings "
        "| PyMC |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        texts = "; ".join(r["alarm_texts"]) or "none"
        lines.append(
            f"| {r['model']} | {r['sampler']} | {r['seed']} | {r['table_ess']:.0f} → "
            f"{r['min_bulk_ess']:.0f} | {r['max_err_sd']:.3f} | [{r['sd_ratio_min']:.3f}, "
            f"{r['sd_ratio_max']:.3f}] | {'yes' if r['within_widened'] else 'no'} "
            f"| {', '.join(f'{e:.0f}' for e in r['crawl_ess'])} "
            f"| {'yes' if r['crawl_old'] else 'no'} / {'yes' if r['crawl_new'] else 'no'} "
            f"| {texts} | {', '.join(r['pymc_warnings']) or 'none'} |"
        )
    return "\n".join(lines)


def alarmed(row: dict, crawl: str) -> bool:
    """A divergence, a BiasWarning other than the crawl's, or the crawl rule ``crawl``."""
    other = row["divergences"] > 0 or any("crawls" not in t for t in row["alarm_texts"])
    return other or row[crawl]


def summary(rows: list[dict]) -> str:
    """Counts: runs within / off the widened bars with an alarm, under each crawl rule."""
    lines = []
    for within in (True, False):
        group = [r for r in rows if r["within_widened"] == within]
        old = sum(alarmed(r, "crawl_old") for r in group)
        new = sum(alarmed(r, "crawl_new") for r in group)
        lines.append(
            f"- {'within' if within else 'off'} the widened bars: {len(group)} runs, alarmed "
            f"(a BiasWarning or a divergence) {old} with the 2 % rule, {new} with the floor"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--below", type=float, default=200.0)
    parser.add_argument("--out", default="crawl_floor")
    args = parser.parse_args(argv)
    commit = git_revision()
    rows = []
    for row in low_ess_runs(args.below):
        rows.append(rerun(row))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (
        f"# The crawl alarm's floor (pymc_bigdata at {commit})\n\n"
        f"The alarm table's runs with a two-chain min bulk ESS below {args.below:.0f}, run "
        f"again at {commit} (`benchmarks/crawl_floor.py`). Crawl: a chain's smallest bulk ESS "
        f"below {CRAWL_ESS_SHARE:.0%} of its {DRAWS} draws (the old rule) or also below "
        f"{CRAWL_MIN_ESS} (the floor).\n\n{summary(rows)}\n\n{table(rows)}\n"
    )
    (RESULTS / f"{args.out}.md").write_text(text)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"commit": commit, "rows": rows}))
    print(text)


if __name__ == "__main__":
    main()
