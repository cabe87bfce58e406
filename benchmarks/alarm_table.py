"""The alarm table: are each sampler's alarms right both ways on the hard targets (issue 26)?

Reads the rows that ``benchmarks/hard_targets.py --seeds 1 2 3 --out alarm_table_<name>``
wrote (``pm.sample``'s defaults) and counts, per
sampler, the runs within their bars and those off them, and how many of each ended with an
alarm of ours (a ``BiasWarning``, or a diverging draw)::

    .venv/bin/python benchmarks/alarm_table.py   # writes results/alarm_table.md

A run is **within its bars** when its worst mean error is at most the sampler's bar in
reference sds and every sd ratio lies in the sampler's band (issue 25: SGHMC, HMC-ECS, SBPS,
EWSG 0.1 and [0.9, 1.1]; SGLD and Austerity 0.15 and [0.85, 1.2]). A second count widens the
bars by the run's Monte Carlo error as ``alarm_calibration.py`` does (min bulk ESS at least
100, error at most ``max(bar, 4 / sqrt(ESS))``, sd ratios within ``1 +- max(band,
4 / sqrt(2 ESS))``): a run off the fixed bars but within the widened ones is not shown to be
off target by that run alone. Last, the errors the seeds repeat (``consistent_errors``): a
coordinate on which one sampler's seeds err the same way, by at least half its bar with a
combined z-score of at least ``CONSISTENT_Z``, is a bias that no single run's bars show.
Runs re-run since (``--reruns``, default ``results/crawl_floor.json``: the low-ESS runs under
the crawl alarm's floor) replace their rows.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

#: sampler: (mean-error bar in sds, sd-ratio band); the rest: DEFAULT_BARS
BARS = {"SGLD": (0.15, (0.85, 1.2)), "AusterityMH": (0.15, (0.85, 1.2))}
DEFAULT_BARS = (0.1, (0.9, 1.1))

#: a run with fewer effective draws is no sample, whatever its errors
MIN_ESS = 100

#: a coordinate's error is consistent over seeds when its seeds' z-scores (error over MCSE)
#: sum to at least this times sqrt(seeds) and their mean error is at least half the bar
CONSISTENT_Z = 4.0


def bars(sampler: str) -> tuple[float, tuple[float, float]]:
    """The sampler's mean-error bar and sd-ratio band (a variant, ``SGLD-...``, its
    sampler's)."""
    return BARS.get(sampler.split("-")[0], DEFAULT_BARS)


def within_bars(row: dict) -> bool:
    """The run's worst mean error and sd ratios within the sampler's fixed bars."""
    bar, (low, high) = bars(row["sampler"])
    return row["max_err_sd"] <= bar and low <= row["sd_ratio_min"] and row["sd_ratio_max"] <= high


def within_widened_bars(row: dict) -> bool:
    """Within the bars widened by the run's Monte Carlo error (module docstring)."""
    bar, (low, high) = bars(row["sampler"])
    ess = max(row["min_bulk_ess"], 1.0)
    sd_band = 4 / math.sqrt(2 * ess)
    return (
        ess >= MIN_ESS
        and row["max_err_sd"] <= max(bar, 4 / math.sqrt(ess))
        and row["sd_ratio_min"] >= min(low, 1 - sd_band)
        and row["sd_ratio_max"] <= max(high, 1 + sd_band)
    )


def alarmed(row: dict) -> bool:
    """Our alarm: a ``BiasWarning`` or a diverging draw."""
    return bool(row["bias_alarm"]) or row["divergences"] > 0


def counts(rows: list[dict], judge) -> dict[str, int]:
    """Runs in and off band by ``judge``, and how many of each alarmed."""
    inside = [r for r in rows if judge(r)]
    outside = [r for r in rows if not judge(r)]
    return {
        "runs": len(rows),
        "in": len(inside),
        "false": sum(alarmed(r) for r in inside),
        "off": len(outside),
        "caught": sum(alarmed(r) for r in outside),
    }


def describe(row: dict) -> str:
    """One run, for the lists of disagreements."""
    recorded = row.get("pymc_warnings")
    pymc = "not recorded" if recorded is None else ", ".join(recorded) or "none"
    return (
        f"{row['model']}, seed {row.get('seed', 2026)}: {row['max_err_sd']:.3f} sd "
        f"({row.get('worst_mean_at', '?')}), sd ratios [{row['sd_ratio_min']:.3f}, "
        f"{row['sd_ratio_max']:.3f}] (worst {row.get('worst_sd_at', '?')}), "
        f"min ESS {row['min_bulk_ess']:,.0f}, "
        f"{row['divergences']} divergences, BiasWarning {'yes' if row['bias_alarm'] else 'no'}, "
        f"PyMC's warnings: {pymc}"
    )


def seed_mean_errors(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Per coordinate, over one sampler's seeds of one target: the mean signed error in
    reference sds and the combined z-score ``sum(z) / sqrt(seeds)`` (the reference's own
    error is shared by the seeds, and by every sampler)."""
    runs = [r for r in rows if "coordinates" in r]
    result = {}
    for name in runs[0]["coordinates"] if runs else ():
        coords = [r["coordinates"][name] for r in runs]
        signed = [math.copysign(c["err_sd"], c["mean_z"]) for c in coords]
        z = sum(c["mean_z"] for c in coords) / math.sqrt(len(coords))
        result[name] = (sum(signed) / len(signed), z)
    return result


def consistent_errors(rows: list[dict]) -> list[str]:
    """Sampler and target pairs whose seeds err the same way on a coordinate (mean error at
    least half the bar, combined z at least ``CONSISTENT_Z``), with the other samplers' mean
    errors there (a reference error would show in all of them) and the runs' alarms."""
    lines = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    for model in models:
        on_model = [r for r in rows if r["model"] == model]
        samplers = list(dict.fromkeys(r["sampler"] for r in on_model))
        errors = {s: seed_mean_errors([r for r in on_model if r["sampler"] == s]) for s in samplers}
        for sampler in samplers:
            own = [r for r in on_model if r["sampler"] == sampler]
            bar = bars(sampler)[0]
            worst = [
                (abs(z), name, err)
                for name, (err, z) in errors[sampler].items()
                if len(own) > 1 and abs(z) >= CONSISTENT_Z and abs(err) >= bar / 2
            ]
            if not worst:
                continue
            _, name, err = max(worst)
            others = ", ".join(
                f"{s} {errors[s][name][0]:+.3f}"
                for s in samplers
                if s != sampler and name in errors[s]
            )
            lines.append(
                f"- {sampler} on {model}: `{name}` {err:+.3f} sd over {len(own)} seeds "
                f"(combined z {errors[sampler][name][1]:+.1f}; others: {others or 'none'}); "
                f"alarmed {sum(alarmed(r) for r in own)} of {len(own)}, within the widened "
                f"bars {sum(within_widened_bars(r) for r in own)} of {len(own)}"
            )
    return lines or ["- none"]


def table(rows: list[dict]) -> str:
    """The markdown report: counts per sampler, then every run where the alarm and the
    bars disagree."""
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    lines = [
        "| sampler | runs | within bars: quiet / alarmed | off bars: alarmed / silent "
        "| widened bars: within (alarmed) / off (alarmed) |",
        "|---|---|---|---|---|",
    ]
    for sampler in samplers:
        own = [r for r in rows if r["sampler"] == sampler]
        fixed, widened = counts(own, within_bars), counts(own, within_widened_bars)
        lines.append(
            f"| {sampler} | {fixed['runs']} | {fixed['in'] - fixed['false']} / {fixed['false']} "
            f"| {fixed['caught']} / {fixed['off'] - fixed['caught']} "
            f"| {widened['in']} ({widened['false']}) / {widened['off']} ({widened['caught']}) |"
        )
    false_alarms = [r for r in rows if within_bars(r) and alarmed(r)]
    silent = [r for r in rows if not within_bars(r) and not alarmed(r)]
    lines += ["", "Alarms on runs within their bars:", ""]
    lines += [f"- {r['sampler']}, {describe(r)}" for r in false_alarms] or ["- none"]
    lines += ["", "Runs off their bars without an alarm of ours:", ""]
    for r in silent:
        widened = "within" if within_widened_bars(r) else "off"
        lines.append(f"- {r['sampler']}, {describe(r)}; {widened} the widened bars")
    if not silent:
        lines.append("- none")
    lines += [
        "",
        "Errors the seeds repeat (a bias that single runs' bars can hide; see "
        "`consistent_errors`):",
        "",
    ]
    lines += consistent_errors(rows)
    return "\n".join(lines)


def with_reruns(rows: list[dict], paths: list[Path]) -> tuple[list[dict], dict]:
    """``rows`` with each run that a file of ``paths`` re-ran (same sampler, target and seed)
    replaced by its re-run; and, per file, its commit and how many rows it replaced."""
    replaced = {}
    for path in paths:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        again = {(r["sampler"], r["model"], r["seed"]): r for r in data["rows"]}
        keys = [(r["sampler"], r["model"], r.get("seed")) for r in rows]
        rows = [again.get(key, row) for key, row in zip(keys, rows)]
        replaced[path.name] = (data["commit"], sum(key in again for key in keys))
    return rows, replaced


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", nargs="+", default=None, help="hard_targets json files")
    parser.add_argument("--out", default="alarm_table")
    parser.add_argument(
        "--reruns",
        nargs="*",
        default=["crawl_floor.json"],
        help="results files whose rows replace the same sampler, target and seed's",
    )
    args = parser.parse_args(argv)
    paths = (
        [Path(p) for p in args.inputs]
        if args.inputs
        else sorted(RESULTS.glob("alarm_table_*.json"))
    )
    rows, commits = [], {}
    for path in paths:
        data = json.loads(path.read_text())
        rows += data["rows"]
        commits[path.name] = data["commit"]
    rows, replaced = with_reruns(rows, [RESULTS / name for name in args.reruns])
    sources = ", ".join(f"`{name}` ({commit})" for name, commit in commits.items())
    sources += "".join(
        f"; {count} of those runs replaced by their re-runs in `{name}` ({commit})"
        for name, (commit, count) in replaced.items()
    )
    text = (
        "# The alarms on the hard targets, three seeds\n\n"
        f"From {sources}: `pm.sample` defaults (2 chains, 1,000 + 1,000 draws) on "
        f"{len({r['model'] for r in rows})} hard targets, seeds "
        f"{', '.join(map(str, sorted({r.get('seed', 2026) for r in rows})))}. "
        "Bars: SGHMC, HMC-ECS, SBPS, EWSG "
        "0.1 sd and [0.9, 1.1]; SGLD and AusterityMH 0.15 and [0.85, 1.2]. An alarm: a "
        "`BiasWarning` or a diverging draw. Widened bars: see `benchmarks/alarm_table.py`.\n\n"
        + table(rows)
        + "\n"
    )
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
