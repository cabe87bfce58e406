"""Peak memory of a sampling process with window gathers and with uniform rows (issue 27).

Window gathers read minibatches as slices of a copy of the rows in a shuffled order
(``pymc_bigdata/row_windows.py``), which costs the rows' bytes again in memory. For each
gather, a fresh Python process generates the benchmark's logistic regression (``protocol.py``:
d = 30, float64, in memory), builds SGHMC with its defaults on ``pmbd.Data("X", X,
gather=...)`` and samples 2 chains of 1000 tuning and 1000 kept draws (``cores=1``); it
reports its peak resident memory (Linux's ``VmHWM``) after loading the data
(``.npy`` files the parent wrote, read into memory: no generation's temporaries) and after
sampling. One process per gather, so neither sees the other's memory::

    .venv/bin/python benchmarks/window_memory.py   # ~1 min; results/window_memory.{md,json}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from protocol import make_data  # noqa: E402
from report import git_revision  # noqa: E402

GATHERS = ("rows", "windows")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far, in bytes: Linux's ``VmHWM`` (not
    ``getrusage``'s ``ru_maxrss``, which a process started by ``subprocess`` inherits from
    its parent's at the fork)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def child(gather: str, folder: Path) -> dict:
    """Load the data, sample, and report the peaks (run in its own process)."""
    import numpy as np
    import pymc as pm

    import pymc_bigdata as pmbd

    X, y = np.load(folder / "X.npy"), np.load(folder / "y.npy")
    after_data = peak_rss_bytes()
    with pm.Model() as model:
        X_data = pmbd.Data("X", X, gather=gather)
        beta = pm.Normal("beta", 0.0, 1.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=X_data @ beta, observed=y)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC()
        pm.sample(
            step=step, tune=1000, draws=1000, chains=2, cores=1, random_seed=1,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    return {
        "gather": gather,
        "reads_windows": bool(step.minibatches.windows),
        "data_bytes": int(X.nbytes + y.nbytes),
        "peak_after_data": after_data,
        "peak_after_sampling": peak_rss_bytes(),
    }


def markdown(results: list[dict], n_rows: int, revision: str) -> str:
    """The results as a Markdown table (MB = 10^6 bytes)."""
    lines = [
        "# Peak memory: window gathers against uniform rows",
        "",
        f"pymc_bigdata at {revision}; logistic regression, {n_rows:,} rows, d = 30 float64 "
        "(`protocol.py`), SGHMC defaults, 2 chains x (1000 + 1000) draws, cores=1, one "
        "process per gather (`VmHWM`).",
        "",
        "| gather | reads windows | X and y (MB) | peak after loading the data (MB) | "
        "peak after sampling (MB) | sampling's increase (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        increase = r["peak_after_sampling"] - r["peak_after_data"]
        lines.append(
            f"| {r['gather']} | {'yes' if r['reads_windows'] else 'no'} | "
            f"{r['data_bytes'] / 1e6:,.0f} | {r['peak_after_data'] / 1e6:,.0f} | "
            f"{r['peak_after_sampling'] / 1e6:,.0f} | {increase / 1e6:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run one child process per gather and write ``results/window_memory.{md,json}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e6)
    parser.add_argument("--child", choices=GATHERS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="window_memory")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.folder)))
        return
    data = make_data(int(args.rows), 0)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        np.save(Path(folder) / "X.npy", data.X)
        np.save(Path(folder) / "y.npy", data.y)
        del data
        for gather in GATHERS:
            command = [sys.executable, __file__, "--child", gather, "--folder", folder]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(output.strip().splitlines()[-1]))
    revision = git_revision()
    out = ROOT / "results" / args.out
    out.with_suffix(".json").write_text(
        json.dumps({"revision": revision, "rows": int(args.rows), "results": results}, indent=1)
    )
    out.with_suffix(".md").write_text(markdown(results, int(args.rows), revision))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
