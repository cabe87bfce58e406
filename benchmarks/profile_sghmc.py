"""Where one SGHMC chain spends its time at N = 1e6 (the benchmark's logistic regression).

Builds the model of ``benchmarks/run.py`` (1,000,000 rows, d = 30), warms the compiled
functions with a short run, then profiles one ``pm.sample`` chain of 1000 tuning and 1000
kept draws with cProfile and writes the 30 most expensive functions by own time::

    .venv/bin/python benchmarks/profile_sghmc.py   # writes results/profile_sghmc_n1e6.txt
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
import warnings
from pathlib import Path

import pymc as pm

import pymc_bigdata as pmbd

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from protocol import build_model, make_data  # noqa: E402
from report import git_revision  # noqa: E402


def main() -> None:
    """Profile one SGHMC chain and write the 30 most expensive functions."""
    data = make_data(1_000_000, 0)
    model = build_model(data)
    kwargs = dict(chains=1, progressbar=False, compute_convergence_checks=False)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC()
        pm.sample(step=step, tune=50, draws=50, random_seed=0, **kwargs)  # compile
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        pm.sample(step=step, tune=1000, draws=1000, random_seed=1, **kwargs)
        profile.disable()
        wall = time.perf_counter() - start
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    out = ROOT / "results" / "profile_sghmc_n1e6.txt"
    out.write_text(
        f"pymc_bigdata at {git_revision()}; one chain, 1000 + 1000 draws, "
        f"wall {wall:.2f} s under the profiler\n\n{text.getvalue()}"
    )
    print(out.read_text()[:3000])


if __name__ == "__main__":
    main()
