"""Full-data passes of the MAP search, with the exact-Hessian Newton stage and without it.

For each model: the passes ``find_map`` reports (``MapResult.n_evaluations``), the passes
the row source streamed (the search's check of the row factorisation reads one block, not
counted), the Newton decrement at the end and the distance to the exact mode in posterior
sds (Newton with the exact Hessian from the result, to a decrement below 1e-12). "default"
is ``find_map`` as it is (the exact-Hessian stage where the first stage saw a subsample,
N > 65,536 rows); "fixed Hessian only" is the search with ``newton_then_exact`` switched off:
Newton with the subsample's Hessian, then the gradient and Hessian at the mode (the search
before the exact stage); "exact first step" is the default with
``INEXACT_FIRST_STEP_RATIO`` out of reach (every exact-stage pass reads the Hessian; the
default's first step takes the subsample's where the rows are in memory and at least 8 times
the subsample's, here the 10^6-row model only). Seconds: the median of 3 searches after one
that compiled, each on a fresh layer::

    .venv/bin/python benchmarks/map_search.py     # writes results/map_search.md
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.demo import make_data
from pymc_bigdata.model import laplace, newton

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))

import hard_models as hm  # noqa: E402
from report import git_revision  # noqa: E402


def logistic_1e6() -> pm.Model:
    """The benchmark's 10^6-row, d = 30 logistic regression (``demo.make_data``)."""
    features, outcome = make_data(1_000_000, 30, 3, coef_sd=0.5)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=30)
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=outcome)
    return model


MODELS: dict[str, Callable[[], pm.Model]] = {
    "logistic, 10^6 rows, d = 30": logistic_1e6,
    "hier_logistic_noncentred (17,798 rows)": lambda: hm.hier_logistic(centred=False),
    "hier_logistic_centred": lambda: hm.hier_logistic(centred=True),
    "scale_regression": hm.scale_regression,
    "skewed_logistic": hm.skewed_logistic,
    "big_hier_logistic_noncentred (10^5 rows)": lambda: hm.big_hier_logistic(centred=False),
    "hier_poisson_centred (150,000 rows)": lambda: hm.hier_poisson(centred=True),
}


def search(model: pm.Model, repeats: int = 3) -> dict:
    """MAP searches on fresh layers after one that compiles: the passes, the median time of
    ``repeats``, the decrement and the distance to the mode of the last."""
    pmbd.MinibatchModel(model).find_map()  # compiles
    seconds = []
    for _ in range(repeats):
        layer = pmbd.MinibatchModel(model)
        streamed = layer.rows.rows_streamed
        start = time.perf_counter()
        result = layer.find_map()
        seconds.append(time.perf_counter() - start)
    passes = (layer.rows.rows_streamed - streamed) / layer.n_rows
    mode, _ = newton.fixed_hessian_newton(layer.passes, result.theta, result.hessian, max_iter=20)
    sd = np.sqrt(np.diag(np.linalg.inv(result.hessian)))
    return {
        "reported": result.n_evaluations,
        "streamed": passes,
        "seconds": float(np.median(seconds)),
        "decrement": result.newton_decrement,
        "off": float(np.max(np.abs(result.theta - mode) / sd)),
    }


def main() -> None:
    """The three searches on every model; the table to ``results/map_search.md``."""
    lines = [
        "| model | search | passes (reported / streamed) | seconds | Newton decrement "
        "| max distance to the mode (sds) |",
        "|---|---|---|---|---|---|",
    ]
    exact, ratio = laplace.newton_then_exact, newton.INEXACT_FIRST_STEP_RATIO
    variants = (("default", exact, ratio), ("exact first step", exact, np.inf))
    for name, build in MODELS.items():
        for label, stage, gate in (*variants, ("fixed Hessian only", None, ratio)):
            laplace.newton_then_exact = stage or (lambda passes, theta, rows: (None, 0, theta))
            newton.INEXACT_FIRST_STEP_RATIO = gate
            r = search(build())
            lines.append(
                f"| {name} | {label} | {r['reported']} / {r['streamed']:.1f} | "
                f"{r['seconds']:.2f} | {r['decrement']:.2g} | {r['off']:.2g} |"
            )
            print(lines[-1], flush=True)
    laplace.newton_then_exact, newton.INEXACT_FIRST_STEP_RATIO = exact, ratio
    text = "\n".join(
        [
            "# The MAP search's full-data passes",
            "",
            f"At {git_revision()}; `benchmarks/map_search.py` (in-memory rows; seconds: the "
            "median of 3 searches after one that compiled, each on a fresh layer).",
            "",
            *lines,
            "",
        ]
    )
    (ROOT / "results" / "map_search.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
