"""The window gathers' copy of the rows: written into ``np.empty`` or into memory mapped at once.

``RowSource.rows_in_order`` writes a copy of the rows in a shuffled order, read afterwards
as windows (``pymc_bigdata/row_windows.py``). Each measurement runs in a fresh Python
process, as a sampling process makes its copy: it fills 10⁶ × 30 float64 rows and a float64
response (the benchmark's shape, ``protocol.py``) with standard normals, builds a
``RowSource`` on them and times (a) ``shuffled_rows().arrays``, the copy, with its arrays
from :func:`pymc_bigdata.memory.populated_empty` or, for the comparison, from ``np.empty``
(NumPy's lazily faulted, huge-page-advised memory), then (b) the reads of 16,000 random
1,000-row windows of the copy (a sum each; SGHMC's 2 chains × 2,000 draws × 4 steps read as
many). Processes alternate between the two allocations::

    .venv/bin/python benchmarks/window_copy_memory.py   # ~1 min; results/window_copy_memory.*
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from report import git_revision, write_results  # noqa: E402

ALLOCATIONS = ("np.empty", "populated_empty")
N_ROWS, DIM, WINDOWS, WINDOW_ROWS = 1_000_000, 30, 16_000, 1_000


def child(allocation: str) -> dict:
    """Copy the rows and read windows of the copy (run in its own process)."""
    import pymc_bigdata.rows as rows_module
    from pymc_bigdata.rows import RowSource

    if allocation == "np.empty":
        rows_module.populated_empty = lambda shape, dtype: np.empty(shape, dtype=dtype)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((N_ROWS, DIM)), rng.standard_normal(N_ROWS)
    shuffled = RowSource([X, y], ["X", "y"], progress=False).shuffled_rows()
    start = time.perf_counter()
    copy = shuffled.arrays
    copied = time.perf_counter() - start
    starts = rng.integers(N_ROWS - WINDOW_ROWS, size=WINDOWS)
    start = time.perf_counter()
    total = 0.0
    for first in starts:
        total += float(copy[0][first : first + WINDOW_ROWS].sum())
    read = time.perf_counter() - start
    return {"allocation": allocation, "copy_s": copied, "windows_s": read, "check": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="processes per allocation")
    parser.add_argument("--child", choices=ALLOCATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    runs = []
    for _ in range(args.repeats):
        for allocation in ALLOCATIONS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", allocation],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs.append(json.loads(out.splitlines()[-1]))
            print(runs[-1], flush=True)
    write(runs)


def write(runs: list[dict]) -> None:
    """The results table (median and range per allocation) and the raw runs."""
    lines = [
        "# The window gathers' copy: np.empty against populated_empty",
        "",
        f"pymc_bigdata at {git_revision()}; {N_ROWS:,} × {DIM} float64 rows and a float64 "
        f"response; {WINDOWS:,} reads of {WINDOW_ROWS:,}-row windows; one fresh process per "
        "run, the allocations alternating.",
        "",
        "| allocation | runs | copy s (median; range) | window reads s (median; range) |",
        "|---|---|---|---|",
    ]
    for allocation in ALLOCATIONS:
        mine = [r for r in runs if r["allocation"] == allocation]
        copy = [r["copy_s"] for r in mine]
        read = [r["windows_s"] for r in mine]
        lines.append(
            f"| {allocation} | {len(mine)} | {np.median(copy):.3f}; {min(copy):.3f}–"
            f"{max(copy):.3f} | {np.median(read):.3f}; {min(read):.3f}–{max(read):.3f} |"
        )
    write_results("window_copy_memory", lines, runs)


if __name__ == "__main__":
    main()
