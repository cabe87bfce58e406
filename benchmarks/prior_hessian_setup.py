"""The set-up time of a model whose prior holds linear algebra, at two package trees.

The correlated varying intercepts and slopes of ``tests/correlated_slopes.py`` (100,000 rows,
40 groups, ``pm.LKJCholeskyCov``; centred: ``pm.MvNormal`` pairs, non-centred: ``mu + (chol @
z).T``): each package tree given builds SGHMC's defaults on each form in a fresh process
(the on-disk compile caches as they are; the first run of a tree fills them), alternately,
``--repeats`` times; the set-up is the step's construction (compilation, MAP search, Laplace
fit). Then, at the last tree, one ``pm.sample`` run per form (defaults, seed 2026) against
the exact reference::

    git worktree add /tmp/wt_before <commit>
    .venv/bin/python benchmarks/prior_hessian_setup.py --trees /tmp/wt_before . \\
        --out prior_hessian_setup        # writes results/prior_hessian_setup.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FORMS = ("centred", "noncentred")


def child(form: str) -> None:
    """Time SGHMC's construction on one form; print a json line."""
    import pymc_bigdata as pmbd

    sys.path.insert(0, str(ROOT / "tests"))
    import correlated_slopes as cs

    model = cs.correlated_slopes(centred=form == "centred")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        step = pmbd.SGHMC(model=model)
        setup = time.perf_counter() - start
    compiled = step.layer.compiled
    by_differences = getattr(compiled, "prior_hessian_by_differences", None)
    print(json.dumps({"form": form, "setup_s": setup, "by_differences": by_differences}))


def time_setup(tree: Path, form: str) -> dict:
    """One fresh process at ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, __file__, "--child", form],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def accuracy(form: str) -> dict:
    """SGHMC's defaults on one form against the exact reference (this process's package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import hard_targets as ht

    name = f"correlated_slopes_{form}"
    model, ref = ht.reference(name)
    return ht.run_one(name, model, ref, "SGHMC")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=FORMS)
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="prior_hessian_setup")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return
    rows = []
    for repeat in range(args.repeats):
        for tree in args.trees:
            revision = subprocess.run(
                ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            for form in FORMS:
                row = time_setup(tree.resolve(), form) | {"tree": revision, "repeat": repeat}
                print(row, flush=True)
                rows.append(row)
    runs = [accuracy(form) for form in FORMS]
    lines = [
        "# Set-up with a prior that holds linear algebra (correlated slopes, 100,000 rows)",
        "",
        "SGHMC's construction (compile, MAP search, Laplace fit) in a fresh process per row.",
        "",
        "| tree | form | repeat | set-up (s) | prior Hessian by differences |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['tree']} | {r['form']} | {r['repeat']} | {r['setup_s']:.1f} "
        f"| {r['by_differences']} |"
        for r in rows
    ]
    lines += ["", "SGHMC's defaults (seed 2026) against the exact reference, at the last tree:", ""]
    lines += [
        "| form | max \\|Δmean\\|/sd | sd ratio | min bulk ESS | alarm |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['max_err_sd']:.3f} | [{r['sd_ratio_min']:.3f}, "
        f"{r['sd_ratio_max']:.3f}] | {r['min_bulk_ess']:,.0f} | {r['bias_alarm']} |"
        for r in runs
    ]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"setup": rows, "runs": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
