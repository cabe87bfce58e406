"""The measurements behind SBPS's default travel time and refreshment rate (docs/sbps.md).

A. The kernel alone on unit Gaussians (d = 2 ... 200, exact gradients): travel ``2 sqrt(d)``
   per draw, refreshment ``f / sqrt(d)`` for f = 0.5 and 1; min bulk ESS per draw of x and
   of x^2 over 2000 draws.
B. ``pmbd.SBPS`` on the benchmark's N = 1e6, d = 30 logistic regression (``run.py``'s data and
   reference), 2 chains x (1000 + 1000), seed 3, with refreshment factors 1, 0.5 (the
   default), 0.25 and 0: min bulk ESS of the coefficients and of their centred squares, the
   worst sd ratio and mean error against the reference::

    .venv/bin/python benchmarks/sbps_defaults.py   # writes results/sbps_defaults.md
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.kernels.sbps import Observation, SBPSSettings, sbps_advance, sbps_init

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from protocol import build_model, make_data  # noqa: E402
from reference import load_or_compute_reference  # noqa: E402
from report import git_revision  # noqa: E402


def _min_ess(draws: np.ndarray) -> float:
    """Min bulk ESS over coordinates of (chains, draws, d) values."""
    return float(min(az.ess(draws[..., j], method="bulk") for j in range(draws.shape[-1])))


def gaussian_row(dim: int, refresh_factor: float, draws: int = 2000) -> str:
    """Table A's row: the kernel alone on a unit Gaussian in ``dim`` dimensions.

    Parameters
    ----------
    dim
        Dimension d.
    refresh_factor
        Refreshment rate times ``sqrt(d)``.
    draws
        Number of draws (travel ``2 sqrt(d)`` each).

    Returns
    -------
    str
    """
    rng = np.random.default_rng(dim)

    def observe(x, direction):
        return Observation(float(direction @ x), 0.0, 1, lambda: x)

    travel = 2.0 * math.sqrt(dim)
    settings = SBPSSettings(k=3.0, refresh_rate=refresh_factor / math.sqrt(dim))
    state = sbps_init(rng.standard_normal(dim), rng, 1.0, 1.0)
    out = []
    for _ in range(draws):
        state, _ = sbps_advance(state, observe, travel, settings, rng, lambda x: x)
        out.append(state.position)
    x = np.array(out)[None]
    return (
        f"| {dim} | {refresh_factor} | {_min_ess(x) / draws:.2f} | {_min_ess(x**2) / draws:.2f} |"
    )


def logistic_rows() -> list[str]:
    """Table B's rows: ``pmbd.SBPS`` on the N = 1e6 benchmark at four refreshment factors.

    Returns
    -------
    list of str
    """
    data = make_data(1_000_000, 0)
    model = build_model(data)
    ref = load_or_compute_reference(data, model, 20_000, 10.0)
    layer = pmbd.MinibatchModel(model)
    rows = []
    for factor in (1.0, 0.5, 0.25, 0.0):
        step = pmbd.SBPS(model=model, layer=layer)
        rate = step.refresh_rate * factor / 0.5  # the default is factor 0.5
        step = pmbd.SBPS(model=model, layer=layer, refresh_rate=rate)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(
                step=step,
                tune=1000,
                draws=1000,
                chains=2,
                cores=1,
                random_seed=3,
                progressbar=False,
                compute_convergence_checks=False,
            )
        draws = idata.posterior["beta"].values
        centred = draws - draws.reshape(-1, draws.shape[-1]).mean(0)
        err = np.abs(draws.mean((0, 1)) - ref.mean) / ref.sd
        ratio = draws.std((0, 1)) / ref.sd
        rows.append(
            f"| {factor} | {rate:.3g} | {_min_ess(draws):,.0f} | {_min_ess(centred**2):,.0f} | "
            f"{err.max():.3f} | [{ratio.min():.3f}, {ratio.max():.3f}] | "
            f"{float(idata.posterior.attrs['sampling_time']):.1f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    """Measure both tables and write ``results/sbps_defaults.md``."""
    lines = [
        f"# SBPS defaults (pymc_bigdata at {git_revision()})",
        "",
        "## A. Kernel, unit Gaussians, exact gradients, travel 2 sqrt(d), 2000 draws",
        "",
        "| d | refresh factor | min bulk ESS / draw, x | min bulk ESS / draw, x^2 |",
        "|---|---|---|---|",
    ]
    for dim in (2, 5, 20, 50, 200):
        for factor in (0.5, 1.0):
            lines.append(gaussian_row(dim, factor))
            print(lines[-1], flush=True)
    lines += [
        "",
        "## B. pmbd.SBPS, N = 1e6 logistic regression (d = 30), 2 x (1000 + 1000), seed 3",
        "",
        "| refresh factor | rate | min bulk ESS | min bulk ESS of centred squares | "
        "max abs mean err / sd | sd ratio | sampling (s) |",
        "|---|---|---|---|---|---|---|",
        *logistic_rows(),
    ]
    out = ROOT / "results" / "sbps_defaults.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
