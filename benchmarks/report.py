"""The benchmark's report: tables, the environment and revision, the output files.

``<stem>.md`` holds one markdown table per data size, ``<stem>.json`` every number (settings,
environment, references and each row's ``extra`` details), both under
``benchmarks/results/``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
from protocol import DIM, RESULTS_DIR, RHO, Config
from reference import Reference
from scoring import MethodResult

#: one data size's section: N, its reference posterior and the rows of every method
Section = tuple[int, Reference, list[MethodResult]]

TABLE_HEADER = (
    "| method | cores | setup (s) | compile (s) | wall (s) | data passes (setup) | min bulk ESS "
    "| ESS/s | ESS/pass | ESS/s vs NUTS | max \\|Δmean\\|/sd (z) | sd ratio [min, max] "
    "| notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


# ---------------------------------------------------------------------------- tables
def _fmt(value: float | None, digits: int = 3) -> str:
    """A table cell: ``digits`` significant digits, thousands separated, "—" if missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def format_row(r: MethodResult) -> str:
    """One method's row of the table (its status and notes only, if it did not run).

    Parameters
    ----------
    r
        The method's result.

    Returns
    -------
    str
    """
    if r.status != "ok":
        return f"| {r.method} | | | | | | | | | | | | {r.status} {r.notes} |"
    passes = _fmt(r.passes) + (f" ({_fmt(r.setup_passes)})" if r.setup_passes else "")
    err = f"{_fmt(r.max_mean_err, 2)} ({_fmt(r.max_mean_z, 2)})"
    ratio = f"[{r.sd_ratio_min:.3f}, {r.sd_ratio_max:.3f}]"
    return (
        f"| {r.method} | {r.cores or ''} | {_fmt(r.setup_s)} | {_fmt(r.compile_s)} "
        f"| {_fmt(r.wall_s)} | {passes} | {_fmt(r.min_ess)} | {_fmt(r.ess_per_s)} "
        f"| {_fmt(r.ess_per_pass)} | {_fmt(r.ess_per_s_vs_nuts)} | {err} | {ratio} "
        f"| {r.notes} |"
    )


def format_table(results: list[MethodResult]) -> str:
    """Markdown table of the results of one data set.

    Parameters
    ----------
    results
        The rows of every method.

    Returns
    -------
    str
    """
    return "\n".join([TABLE_HEADER, *(format_row(r) for r in results)])


def format_reference(n_rows: int, ref: Reference) -> str:
    """One line describing the reference posterior of a data set.

    Parameters
    ----------
    n_rows
        Number of rows N (unused; kept for the callers).
    ref
        The reference posterior.

    Returns
    -------
    str
    """
    source = "cached" if ref.cached else "computed"
    return (
        f"Reference: Laplace + Student-t(df={ref.df:g}) importance sampling, "
        f"{ref.n_samples:,} samples, weight ESS {ref.ess:,.0f} "
        f"({100 * ref.ess / ref.n_samples:.0f}%), {ref.seconds:.0f} s ({source}); "
        f"layer MAP vs numpy Newton: max diff {ref.map_check:.1e} Laplace sd."
    )


# ---------------------------------------------------------------------------- environment
def _git(*args: str, cwd: Path) -> str:
    """Output of one git command, stripped (raises if git fails)."""
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def git_revision() -> str:
    """Commit of the checkout, with ``+dirty`` if pymc_bigdata/ has uncommitted changes.

    Returns
    -------
    str
        ``"unknown"`` outside a git checkout.
    """
    root = Path(__file__).resolve().parent.parent
    try:
        commit = _git("rev-parse", "--short", "HEAD", cwd=root)
        dirty = _git("status", "--porcelain", "pymc_bigdata", cwd=root)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def environment(revision: str) -> dict[str, str]:
    """Versions and machine facts recorded with the results.

    Parameters
    ----------
    revision
        :func:`git_revision` at the start of the run: the code that was imported and ran
        (the revision now is recorded as well, to show if the checkout moved meanwhile).

    Returns
    -------
    dict of str to str
    """
    import arviz
    import pytensor

    return {
        "pymc_bigdata_commit": revision,
        "pymc_bigdata_commit_at_end": git_revision(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "pymc": pm.__version__,
        "pytensor": pytensor.__version__,
        "arviz": arviz.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": str(os.cpu_count()),
    }


# ---------------------------------------------------------------------------- outputs
def format_markdown(
    config: Config, sections: list[Section], env: dict[str, str], stamp: str
) -> str:
    """The markdown report: settings and environment, then one table per data size.

    Parameters
    ----------
    config
        The benchmark's settings.
    sections
        What every size gave.
    env
        What :func:`environment` returned.
    stamp
        Time of writing.

    Returns
    -------
    str
    """
    parts = [
        f"# pymc-bigdata benchmark ({stamp})",
        "",
        f"Logistic regression, d = {DIM}, equicorrelation {RHO}, seed {config.seed}; "
        f"pymc_bigdata at {env['pymc_bigdata_commit']}; python {env['python']}, "
        f"pymc {env['pymc']}, pytensor {env['pytensor']}, "
        f"{env['cpu_count']} CPUs.",
    ]
    if env["pymc_bigdata_commit_at_end"] != env["pymc_bigdata_commit"]:
        parts.append(
            f"(The checkout moved to {env['pymc_bigdata_commit_at_end']} during the run; the "
            "numbers are for the code imported at the start.)"
        )
    for n_rows, ref, results in sections:
        parts += [
            "",
            f"## N = {n_rows:,}",
            "",
            format_reference(n_rows, ref),
            "",
            format_table(results),
        ]
    return "\n".join(parts) + "\n"


def reference_summary(ref: Reference) -> dict[str, Any]:
    """The reference posterior as recorded in the JSON output.

    Parameters
    ----------
    ref
        The reference posterior.

    Returns
    -------
    dict
    """
    return {
        "mean": ref.mean.tolist(),
        "sd": ref.sd.tolist(),
        "ess": ref.ess,
        "n_samples": ref.n_samples,
        "df": ref.df,
        "seconds": ref.seconds,
        "map_check": ref.map_check,
        "cached": ref.cached,
    }


def output_path(config: Config, suffix: str) -> Path:
    """Where an output file of the run goes: ``benchmarks/results/<stem><suffix>``.

    Parameters
    ----------
    config
        The benchmark's settings (its ``out_stem``).
    suffix
        ``".md"`` or ``".json"``.

    Returns
    -------
    Path
    """
    return RESULTS_DIR / f"{config.out_stem}{suffix}"


def write_outputs(config: Config, sections: list[Section], revision: str) -> str:
    """Write ``<stem>.md`` and ``<stem>.json`` under benchmarks/results/; return the markdown.

    Parameters
    ----------
    config
        The benchmark's settings.
    sections
        What every size gave so far.
    revision
        :func:`git_revision` at the start of the run.

    Returns
    -------
    str
        The markdown report.
    """
    env = environment(revision)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    markdown = format_markdown(config, sections, env, stamp)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    output_path(config, ".md").write_text(markdown)
    payload = {
        "created": stamp,
        "config": asdict(config),
        "environment": env,
        "sizes": [
            {
                "n_rows": n_rows,
                "reference": reference_summary(ref),
                "results": [asdict(r) for r in results],
            }
            for n_rows, ref, results in sections
        ],
    }
    output_path(config, ".json").write_text(json.dumps(payload, indent=1))
    return markdown


def write_results(stem: str, lines: list[str], runs: list[dict]) -> None:
    """Write ``lines`` to ``results/<stem>.md`` and ``runs`` to ``results/<stem>.json``, and
    print the lines (a one-table benchmark's outputs)."""
    (RESULTS_DIR / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(runs, indent=1) + "\n")
    print("\n".join(lines))
