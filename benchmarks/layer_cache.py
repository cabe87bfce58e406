"""What a second step on the same model costs to set up, with and without the kept layer.

For each model, in one fresh process: the first ``pmbd.SGHMC(model=model)`` (compiles the
graphs, searches the MAP, fits the groups), a second one after ``pmbd.clear_layer_cache()``
(the compiled functions come from ``function_cache.py``, the MAP search and group fits run
again: what every later step cost before the layer cache), and a third with the kept layer
(``model/layer_cache.py``). Then ``pm.sample`` (1 chain, 200 + 200 draws, ``random_seed=3``)
from the third step and from the second, which share a layer, and, as a control, from two
steps each given a layer of its own: where the control's draws differ, sampling itself is not
bit-reproducible within the process, whatever the layer.

    .venv/bin/python benchmarks/layer_cache.py              # results/layer_cache.{md,json}
    .venv/bin/python benchmarks/layer_cache.py --only hier_logistic_noncentred
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

import pymc_bigdata as pmbd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "tests"))

import hard_models as hm  # noqa: E402

MODELS = {
    "hier_logistic_noncentred": lambda: hm.hier_logistic(centred=False),
    "big_hier_logistic_noncentred": lambda: hm.big_hier_logistic(centred=False),
    "three_level_noncentred": lambda: hm.three_level(centred=False),
    "crossed_ratings_noncentred": lambda: hm.crossed_ratings(centred=False),
}


def timed_step(model: pm.Model) -> tuple[pmbd.SGHMC, float]:
    """``pmbd.SGHMC(model=model)`` and the seconds it took."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pmbd.SGHMC(model=model)
    return step, time.perf_counter() - start


def draws_of(model: pm.Model, step: pmbd.SGHMC) -> np.ndarray:
    """Every posterior value of a short seeded run, raveled."""
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(
            step=step,
            tune=200,
            draws=200,
            chains=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return np.concatenate([idata.posterior[v].values.ravel() for v in idata.posterior.data_vars])


def measure(name: str) -> dict:
    """The three set-up times on model ``name`` and whether the draws agree."""
    model = MODELS[name]()
    first, first_s = timed_step(model)
    pmbd.clear_layer_cache()
    rebuilt, rebuilt_s = timed_step(model)
    kept, kept_s = timed_step(model)
    same = bool(np.array_equal(draws_of(model, kept), draws_of(model, rebuilt)))
    # the control: two steps, each on a layer of its own, in the same process
    own = [pmbd.SGHMC(model=model, layer=pmbd.MinibatchModel(model)) for _ in range(2)]
    same_fresh = bool(np.array_equal(draws_of(model, own[0]), draws_of(model, own[1])))
    return {
        "model": name,
        "rows": first.layer.n_rows,
        "dim": first.layer.dim,
        "first_s": first_s,
        "rebuilt_s": rebuilt_s,
        "kept_s": kept_s,
        "kept_is_rebuilt": kept.layer is rebuilt.layer,
        "same_draws": same,
        "same_draws_fresh_layers": same_fresh,
    }


def table(rows: list[dict]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| model | rows | d | first step (s) | again, layer rebuilt (s) | again, layer kept (s) "
        "| same draws | control: two own layers, same draws |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['rows']:,} | {r['dim']:,} | {r['first_s']:.2f} | "
            f"{r['rebuilt_s']:.2f} | {r['kept_s']:.3f} | {'yes' if r['same_draws'] else 'NO'} | "
            f"{'yes' if r['same_draws_fresh_layers'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--out", default="layer_cache")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows = []
    for name in args.only:  # each model in a fresh process: its first step compiles
        out = (
            subprocess.run(
                [sys.executable, __file__, "--one", name],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        rows.append(json.loads(out))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (
        f"# A second step's set-up (pymc_bigdata at {commit})\n\n"
        "`pmbd.SGHMC(model=model)` three times in one fresh process per model: first; again "
        "after `pmbd.clear_layer_cache()` (compiled functions cached, MAP search and group fits "
        "run again); again with the kept layer. Same draws: `pm.sample` (1 chain, 200 + 200 "
        "draws, random_seed=3) from the last two steps; the control, from two steps given a "
        "layer each (`layer=pmbd.MinibatchModel(model)`) in the same process.\n\n"
        + table(rows)
        + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(text)
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps({"commit": commit, "rows": rows}, indent=1)
    )
    print(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
