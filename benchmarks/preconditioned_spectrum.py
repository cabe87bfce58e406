"""The posterior's curvature in the coordinates a sampler moves in: how far from the identity.

A step method samples ``z`` with ``theta = c + L z`` (its preconditioner). Where ``L L^T`` is
the posterior covariance, the Hessian of ``-log p`` in ``z``, ``H_z = L^T H L``, is the
identity, and a step size of about 1 moves every direction alike. With a diagonal ``L``
(``d > 200``: the crossed ratings' 4,004 coordinates) correlations stay in ``H_z``: its
smallest eigenvalue sets how slowly the chain moves along the flattest direction, its largest
how small the step must be. This script reads the extreme eigenvalues of ``H_z`` by Lanczos
(``scipy.sparse.linalg.eigsh``) on full-data Hessian-vector products at the preconditioner's
centre, for the Laplace preconditioner a step starts from and for the one its tuning windows
leave (one chain, ``tune`` tuning draws, ``random_seed``):

    .venv/bin/python benchmarks/preconditioned_spectrum.py            # about 3 minutes
    .venv/bin/python benchmarks/preconditioned_spectrum.py --low-rank 2 \
        --out preconditioned_spectrum_low_rank

Each row gives the 3 largest and 6 smallest eigenvalues, the condition number, what it would
be with the ``k`` flattest directions corrected (``lambda_max / lambda_(k+1)``: a low-rank
correction of ``L`` along those eigenvectors, not built), the Hessian-vector products the
Lanczos runs took, and the share of the flattest eigenvector on the model's small variables
(its global parameters; crossed ratings: ``mu``, ``s_r``, ``s_i``, ``sigma``).
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
import scipy.sparse.linalg as sla

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from hard_targets import MODELS  # noqa: E402

import pymc_bigdata as pmbd  # noqa: E402
from pymc_bigdata.step_methods.crawl import CRAWL_SMALL_VARIABLE  # noqa: E402
from pymc_bigdata.step_methods.low_rank import curvature_in_z  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

#: eigenvalues read at each end of the spectrum
LARGEST, SMALLEST = 3, 6

#: flattest directions a low-rank correction would fix, reported
CORRECTED = (1, 2, 4)


def spectrum(layer, precond) -> dict:
    """The extreme eigenvalues of ``H_z = L^T (-H) L`` at ``precond``'s centre.

    Parameters
    ----------
    layer
        The step's model layer (full-data Hessian-vector products, the prior's Hessian).
    precond
        The step's preconditioner (``direction`` is ``L v``, ``grad_z`` is ``L^T g``).

    Returns
    -------
    dict
        ``largest`` and ``smallest`` eigenvalues (ascending), the flattest eigenvector's
        weights (``flattest``) and the Hessian-vector products taken (``hvps``).
    """
    curvature_z, hvps = curvature_in_z(precond, layer)
    op = sla.LinearOperator((layer.dim, layer.dim), matvec=curvature_z, dtype=float)
    largest = sla.eigsh(op, k=LARGEST, which="LA", tol=1e-3, return_eigenvectors=False)
    smallest, vectors = sla.eigsh(op, k=SMALLEST, which="SA", tol=1e-3, maxiter=5000)
    order = np.argsort(smallest)
    return {
        "largest": np.sort(largest).tolist(),
        "smallest": smallest[order].tolist(),
        "flattest": vectors[:, order[0]],
        "hvps": hvps[0],
    }


def small_coordinates(layer) -> np.ndarray:
    """The raveled coordinates of the value variables of at most ``CRAWL_SMALL_VARIABLE``."""
    sizes = [int(size) for size in layer.var_sizes]
    ends = np.cumsum(sizes)
    small = [np.arange(e - s, e) for s, e in zip(sizes, ends) if s <= CRAWL_SMALL_VARIABLE]
    return np.concatenate(small) if small else np.empty(0, np.int64)


def row(model_name: str, sampler: str, stage: str, layer, precond, seconds: float) -> dict:
    """One table row: the spectrum of ``precond`` and what a correction would leave."""
    spec = spectrum(layer, precond)
    top, low = spec["largest"][-1], spec["smallest"]
    flattest = spec["flattest"]
    small = small_coordinates(layer)
    return {
        "model": model_name,
        "sampler": sampler,
        "stage": stage,
        "dim": layer.dim,
        "kind": precond.kind,
        "largest": spec["largest"],
        "smallest": low,
        "condition": top / low[0],
        "corrected": {k: top / low[k] for k in CORRECTED},
        "small_share": float((flattest[small] ** 2).sum()),
        "hvps": spec["hvps"],
        "seconds": seconds,
    }


def run(model_name: str, sampler: str, tune: int, seed: int, low_rank: int = 0) -> list[dict]:
    """The spectrum at the Laplace preconditioner and after ``tune`` tuning draws (the
    step's diagonal corrected along ``low_rank`` directions at each end; 0: the diagonal)."""
    build, batch_size = MODELS[model_name]
    model = build()
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    kwargs["low_rank"] = low_rank
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = getattr(pmbd, sampler)(**kwargs)
        layer = step.layer
        t0 = time.perf_counter()
        rows = [row(model_name, sampler, "laplace", layer, step.precond, 0.0)]
        rows[0]["seconds"] = time.perf_counter() - t0
        pm.sample(
            step=step,
            tune=tune,
            draws=10,
            chains=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
        t0 = time.perf_counter()
        rows.append(row(model_name, sampler, f"tuned ({tune})", layer, step.precond, 0.0))
        rows[-1]["seconds"] = time.perf_counter() - t0
    return rows


def table(rows: list[dict], commit: str, low_rank: int = 0) -> str:
    """The results as markdown (``low_rank``: the steps' correction, 0 for none)."""
    lines = [
        f"# The posterior's curvature in the samplers' coordinates (pymc_bigdata at {commit})",
        "",
        "`benchmarks/preconditioned_spectrum.py`: extreme eigenvalues of `H_z = L^T (-H) L` "
        "(1 where the preconditioner is the posterior's covariance), by Lanczos on full-data "
        "Hessian-vector products at the preconditioner's centre; the steps' "
        f"`low_rank={low_rank}`.",
        "",
        "| model | sampler | preconditioner | d | largest | smallest | condition | "
        "with the 1 / 2 / 4 flattest corrected | flattest on the small variables | HVPs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        corrected = " / ".join(f"{v:.1f}" for v in r["corrected"].values())
        lines.append(
            f"| {r['model']} | {r['sampler']} | {r['kind']}, {r['stage']} | {r['dim']} | "
            f"{', '.join(f'{v:.3g}' for v in r['largest'])} | "
            f"{', '.join(f'{v:.3g}' for v in r['smallest'])} | {r['condition']:.0f} | "
            f"{corrected} | {r['small_share']:.2f} | {r['hvps']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the spectra and write ``results/<out>.{md,json}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["crossed_ratings_centred", "crossed_ratings_noncentred"],
        choices=sorted(MODELS),
    )
    parser.add_argument("--samplers", nargs="+", default=["SGLD", "SGHMC"])
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--low-rank",
        type=int,
        default=0,
        help="the steps' low_rank (default 0: their diagonal uncorrected, as at 715b0b5)",
    )
    parser.add_argument("--out", default="preconditioned_spectrum")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    rows = []
    for model_name in args.models:
        for sampler in args.samplers:
            rows += run(model_name, sampler, args.tune, args.seed, args.low_rank)
            print(table(rows, commit, args.low_rank), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(table(rows, commit, args.low_rank))
    payload = {"commit": commit, "low_rank": args.low_rank, "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
