"""The exact marginals of the three group scales of ``tests/hard_models.py::three_level``.

The model is linear and Gaussian given its scales ``(tc, tr, tg)``, the residual scale and
the slope. ``slope`` and ``sigma`` are pinned by the 60,000 rows (posterior sds 0.004 and
0.003 under full-data NUTS, ``make_hier_references.py three_level``) and held at the
reference's means. Integrating ``mu``, the countries ``c``, the regions ``r`` and the groups
``a`` out, the groups' mean responses are
``ybar ~ Normal(0, 4 11' + tc^2 C + tr^2 R + tg^2 I + diag(sigma^2 / n_j))`` (``C_jk = 1``
where groups share a country, ``R_jk = 1`` where they share a region, ``4 = 2^2`` from
``mu ~ Normal(0, 2)``), and with the scales' ``HalfNormal(1)`` priors and the log
transform's Jacobian that is the density of ``(log tc, log tr, log tg)``, evaluated on a
grid.

With 4 countries ``log tc``'s left tail is exponential (as ``tc -> 0`` the rows' density
tends to a constant and the density falls like ``tc``), so its grid reaches -16 (``log tr``'s,
with 12 regions, -12), coarse where little mass is (cells weighted by their width);
:func:`check_tails` refuses a grid that cuts a marginal's tail. About 25 s::

    .venv/bin/python tests/references/three_level_scales.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import (  # noqa: E402
    THREE_LEVEL_COUNTRIES,
    THREE_LEVEL_GROUPS,
    THREE_LEVEL_REGIONS,
    make_three_level_data,
)

#: the grids of the three log scales: coarse (0.25) in the long left tails of ``log tc`` (below
#: -4) and ``log tr`` (below -3), fine (0.05) elsewhere
GRIDS = {
    "tc_log__": np.concatenate([np.arange(-16.0, -4.0, 0.25), np.arange(-4.0, 2.5 + 1e-9, 0.05)]),
    "tr_log__": np.concatenate([np.arange(-12.0, -3.0, 0.25), np.arange(-3.0, 1.2 + 1e-9, 0.05)]),
    "tg_log__": np.arange(-2.6, 0.2 + 1e-9, 0.05),
}
MU_SD = 2.0
#: the most a marginal may hold in its grid's outermost ``TAIL_WIDTH`` of log scale
TAIL_MASS, TAIL_WIDTH = 1e-6, 0.25


def cell_widths(grid: np.ndarray) -> np.ndarray:
    """The width of each grid point's cell (half the gaps to its neighbours)."""
    edges = np.concatenate([[grid[0]], (grid[1:] + grid[:-1]) / 2, [grid[-1]]])
    return np.diff(edges)


def log_scales_density(
    ybar: np.ndarray, n: np.ndarray, region: np.ndarray, country: np.ndarray, sigma: float
) -> np.ndarray:
    """Normalised weights (cell mass) on the grid of ``(log tc, log tr, log tg)``, given each
    group's mean response ``ybar``, rows ``n``, region and country."""
    ltc, ltr, ltg = GRIDS["tc_log__"], GRIDS["tr_log__"], GRIDS["tg_log__"]
    same_country = (country[:, None] == country[None, :]).astype(float)
    same_region = (region[:, None] == region[None, :]).astype(float)
    base = MU_SD**2 + np.diag(sigma**2 / n)
    lower = np.exp(2 * ltr)[:, None, None, None] * same_region + np.exp(2 * ltg)[
        None, :, None, None
    ] * np.eye(len(n))
    prior_rg = (-np.exp(2 * ltr) / 2 + ltr)[:, None] + (-np.exp(2 * ltg) / 2 + ltg)[None, :]
    out = np.empty((len(ltc), len(ltr), len(ltg)))
    for i, log_tc in enumerate(ltc):
        cov = base + np.exp(2 * log_tc) * same_country + lower
        chol = np.linalg.cholesky(cov)
        solved = np.linalg.solve(chol, np.broadcast_to(ybar[:, None], cov.shape[:-1] + (1,)))
        half_logdet = np.log(np.diagonal(chol, axis1=-2, axis2=-1)).sum(axis=-1)
        prior_tc = -np.exp(2 * log_tc) / 2 + log_tc
        out[i] = -half_logdet - 0.5 * (solved[..., 0] ** 2).sum(axis=-1) + prior_tc + prior_rg
    weights = np.exp(out - out.max()) * np.einsum(
        "i,j,k->ijk", *(cell_widths(GRIDS[k]) for k in ("tc_log__", "tr_log__", "tg_log__"))
    )
    return weights / weights.sum()


def check_tails(weights: np.ndarray) -> None:
    """Refuse a grid that cuts off a scale's tail."""
    for axis, (name, grid) in enumerate(GRIDS.items()):
        marginal = weights.sum(axis=tuple(a for a in range(3) if a != axis))
        for end in (grid < grid[0] + TAIL_WIDTH, grid > grid[-1] - TAIL_WIDTH):
            if marginal[end].sum() > TAIL_MASS:
                raise ValueError(
                    f"{name}: {marginal[end].sum():.2g} of the mass within {TAIL_WIDTH} of "
                    f"the grid's end [{grid[0]}, {grid[-1]}]; widen the grid"
                )


def exact_marginals(slope: float, sigma: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each log scale's grid and exact marginal weights, at ``slope`` and ``sigma``."""
    group, x, y = make_three_level_data()
    n = np.bincount(group, minlength=THREE_LEVEL_GROUPS)
    ybar = np.bincount(group, weights=y - slope * x, minlength=THREE_LEVEL_GROUPS) / n
    region = np.arange(THREE_LEVEL_GROUPS) % THREE_LEVEL_REGIONS
    weights = log_scales_density(ybar, n, region, region % THREE_LEVEL_COUNTRIES, sigma)
    check_tails(weights)
    return {
        name: (grid, weights.sum(axis=tuple(a for a in range(3) if a != axis)))
        for axis, (name, grid) in enumerate(GRIDS.items())
    }


def moments(grid: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Mean and sd of a marginal on its grid."""
    mean = float(weights @ grid)
    return mean, float(weights @ (grid - mean) ** 2) ** 0.5


def reference_marginals() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`exact_marginals` at the NUTS reference's ``slope`` and ``sigma`` means."""
    ref = np.load(Path(__file__).parent / "three_level.npz")
    return exact_marginals(float(ref["slope__mean"][0]), float(np.exp(ref["sigma_log____mean"][0])))


if __name__ == "__main__":
    for name, (grid, weights) in reference_marginals().items():
        mean, sd = moments(grid, weights)
        print(f"{name}: mean {mean:.4f}, sd {sd:.4f}")
