"""The exact reference posterior of ``tests/correlated_slopes.py::correlated_slopes``.

The residual sd is known, so given the covariance the posterior of ``(mu, ab)`` is Gaussian,
and the covariance's packed Cholesky factor (three unconstrained coordinates) has a marginal
density that ``correlated_slopes_exact`` reads on a 41^3 grid (a 51^3 grid moves no mean by
more than 2e-9 sd and no sd by more than 2e-7 of itself). Stored as
``tests/references/correlated_slopes.npz`` with the keys of the other references (Monte Carlo
errors 0). Run from the repository root (about 30 s)::

    .venv/bin/python tests/references/make_correlated_slopes_reference.py

``--check`` compares the grid once with PyMC's NUTS on a 10,000-row, 20-group version of the
model (a grid from -8 to 25 Laplace sds, -25 to 25 for ``L10``, 61 points a side), both forms,
2 x 3,000 draws (about a minute). On 2026-11-29: centred, every mean within 0.023 sd and every
sd within 3.4 % of the grid's; non-centred within 0.053 sd and 2.5 %; no divergence.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).parents[1]))
from correlated_slopes import (  # noqa: E402
    PACKED,
    correlated_slopes_exact,
    correlated_slopes_model,
    make_correlated_slopes_data,
)


def main() -> None:
    out = correlated_slopes_exact(*make_correlated_slopes_data())
    out |= {"method": np.array("exact (grid over the packed Cholesky factor)"), "divergences": 0}
    np.savez_compressed(Path(__file__).parent / "correlated_slopes.npz", **out)
    print(f"packed factor {out[f'{PACKED}__mean']} ± {out[f'{PACKED}__sd']}")


def check() -> None:
    """The grid against NUTS on a smaller version (module docstring)."""
    data = make_correlated_slopes_data(n_rows=10_000, n_groups=20, seed=5)
    extents = ((-8.0, 25.0), (-25.0, 25.0), (-8.0, 25.0))
    exact = correlated_slopes_exact(*data, extents=extents, n_grid=61, face_tolerance=1e-7)
    for centred in (True, False):
        model = correlated_slopes_model(*data, centred=centred)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(
                draws=3000, tune=1500, chains=2, random_seed=3, target_accept=0.95,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
        divergences = int(idata.sample_stats["diverging"].sum())
        for value in model.value_vars:
            if value.name == PACKED:  # the packed factor, its diagonal entries logged
                draws = idata.posterior["chol"].values.reshape(-1, 3).copy()
                draws[:, [0, 2]] = np.log(draws[:, [0, 2]])
            else:
                values = idata.posterior[value.name].values
                draws = values.reshape(values.shape[0] * values.shape[1], -1)
            sd = exact[f"{value.name}__sd"]
            err = np.abs(draws.mean(0) - exact[f"{value.name}__mean"]) / sd
            ratio = draws.std(0) / sd
            print(
                f"centred={centred} {value.name}: max |mean err| {err.max():.3f} sd, sd ratios "
                f"[{ratio.min():.3f}, {ratio.max():.3f}], {divergences} divergences"
            )


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()
