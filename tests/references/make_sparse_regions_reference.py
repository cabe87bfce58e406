"""The exact reference posterior of ``tests/hard_models.py::sparse_regions``.

The model is linear and Gaussian given its two group scales, the residual scale and the
slope, so the reference is computed, not sampled. ``slope`` and ``sigma`` are pinned by the
22,646 rows (posterior sds 0.007 and 0.005 under full-data NUTS, ``make_hier_references.py
sparse_regions``); they are held at their NUTS posterior means, and their own moments are
NUTS's. Given them, ``(mu, b, a)`` is Gaussian for each ``(log tau_b, log tau_a)``, and
``log tau_b, log tau_a`` have the density of the groups' mean responses
``ybar ~ Normal(0, tau_b^2 S + tau_a^2 I + diag(sigma^2 / n_j) + 4 11')`` (``S_jk = 1``
where groups share a region, ``4 = 2^2`` from ``mu ~ Normal(0, 2)``) times their
``HalfNormal(1)`` priors. On a grid of the two log scales (spacing 0.025) every moment is a
mixture of Gaussian moments: ``mu``, ``b``, ``a``,
``z_b = (b - mu) / tau_b`` and ``z_a = (a - b[region]) / tau_a`` are linear in
``(mu, b, a)`` at each grid point. Stored as ``tests/references/sparse_regions.npz`` with
the keys of the other references (Monte Carlo errors 0 where computed).

The grid's ends are far out on purpose. As ``tau_b -> 0`` the rows' density tends to a
constant, so ``log tau_b``'s density falls only like ``tau_b`` (the prior's Jacobian): its
left tail is exponential, not Gaussian. A grid from -4 (about 7 sds of a Gaussian) left
0.2 % of the mass out and made the sd 0.436 instead of 0.477. :func:`check_tails` refuses a
grid whose outermost ``TAIL_WIDTH`` at either end holds more than ``TAIL_MASS`` of a
marginal. Run from the repository root (about 15 s)::

    .venv/bin/python tests/references/make_sparse_regions_reference.py /tmp/nuts.npz

where ``/tmp/nuts.npz`` is the NUTS run of ``make_hier_references.py sparse_regions``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import make_sparse_regions_data  # noqa: E402

LOG_TAU_B = np.linspace(-16.0, 1.5, 701)
LOG_TAU_A = np.linspace(-3.0, 1.5, 181)
MU_SD, SCALE_PRIOR_SD = 2.0, 1.0
#: the most a marginal may hold in the grid's outermost ``TAIL_WIDTH`` of log scale at either end
TAIL_MASS, TAIL_WIDTH = 1e-7, 0.25


def check_tails(weights: np.ndarray) -> None:
    """Refuse a grid that cuts off a scale's tail (see the module docstring)."""
    for name, grid, axis in (("log tau_b", LOG_TAU_B, 1), ("log tau_a", LOG_TAU_A, 0)):
        marginal = weights.sum(axis=axis)
        for end in (grid < grid[0] + TAIL_WIDTH, grid > grid[-1] - TAIL_WIDTH):
            if marginal[end].sum() > TAIL_MASS:
                raise ValueError(
                    f"{name}: {marginal[end].sum():.2g} of the mass within {TAIL_WIDTH} of "
                    f"the grid's end [{grid[0]}, {grid[-1]}]; widen the grid"
                )


def log_scales_density(ybar, n, region, sigma) -> np.ndarray:
    """Normalised weights of the ``(log tau_b, log tau_a)`` grid."""
    shared = (region[:, None] == region[None, :]).astype(float)
    base = np.diag(sigma**2 / n) + MU_SD**2
    out = np.empty((len(LOG_TAU_B), len(LOG_TAU_A)))
    for i, lb in enumerate(LOG_TAU_B):
        for j, la in enumerate(LOG_TAU_A):
            cov = base + np.exp(2 * lb) * shared + np.exp(2 * la) * np.eye(len(n))
            _, logdet = np.linalg.slogdet(cov)
            prior = -np.exp(2 * lb) / 2 + lb - np.exp(2 * la) / 2 + la
            out[i, j] = -0.5 * (logdet + ybar @ np.linalg.solve(cov, ybar)) + prior
    weights = np.exp(out - out.max())
    return weights / weights.sum()


def conditional(ybar, n, region, sigma, tau_b, tau_a):
    """Mean and covariance of ``(mu, b, a)`` given the scales."""
    n_regions, n_groups = region.max() + 1, len(n)
    dim = 1 + n_regions + n_groups
    b, a = slice(1, 1 + n_regions), slice(1 + n_regions, dim)
    # prior: mu ~ N(0, 2); b - mu ~ N(0, tau_b); a - b[region] ~ N(0, tau_a)
    diff_b = np.zeros((n_regions, dim))
    diff_b[:, 0] = -1.0
    diff_b[:, b] = np.eye(n_regions)
    diff_a = np.zeros((n_groups, dim))
    diff_a[np.arange(n_groups), 1 + region] = -1.0
    diff_a[:, a] = np.eye(n_groups)
    precision = diff_b.T @ diff_b / tau_b**2 + diff_a.T @ diff_a / tau_a**2
    precision[0, 0] += 1.0 / MU_SD**2
    precision[a, a] += np.diag(n / sigma**2)
    rhs = np.zeros(dim)
    rhs[a] = n * ybar / sigma**2
    cov = np.linalg.inv(precision)
    return cov @ rhs, cov, diff_b, diff_a


def main(nuts_path: str) -> None:
    group, region, x, y = make_sparse_regions_data()
    with np.load(nuts_path) as data:
        nuts = {k: data[k] for k in data.files}
    slope, sigma = float(nuts["slope__mean"][0]), float(np.exp(nuts["sigma_log____mean"][0]))
    n = np.bincount(group)
    ybar = np.bincount(group, weights=y - slope * x) / n
    weights = log_scales_density(ybar, n, region, sigma)
    check_tails(weights)
    n_regions = region.max() + 1
    sums: dict[str, list[np.ndarray]] = {}
    for i, lb in enumerate(LOG_TAU_B):
        for j, la in enumerate(LOG_TAU_A):
            w = weights[i, j]
            if w < 1e-14:
                continue
            mean, cov, diff_b, diff_a = conditional(ybar, n, region, sigma, np.exp(lb), np.exp(la))
            rows = {
                "mu": np.eye(len(mean))[:1],
                "b": np.eye(len(mean))[1 : 1 + n_regions],
                "a": np.eye(len(mean))[1 + n_regions :],
                "z_b": diff_b / np.exp(lb),
                "z_a": diff_a / np.exp(la),
            }
            for name, lin in rows.items():
                m = lin @ mean
                second = np.einsum("ij,jk,ik->i", lin, cov, lin) + m**2
                acc = sums.setdefault(name, [0.0, 0.0])
                acc[0] = acc[0] + w * m
                acc[1] = acc[1] + w * second
    out = {}
    for name, (first, second) in sums.items():
        out[f"{name}__mean"] = first
        out[f"{name}__sd"] = np.sqrt(second - first**2)
    for name, grid, axis in (("tau_b_log__", LOG_TAU_B, 1), ("tau_a_log__", LOG_TAU_A, 0)):
        marginal = weights.sum(axis=axis)
        m = np.sum(marginal * grid)
        out[f"{name}__mean"] = np.array([m])
        out[f"{name}__sd"] = np.array([np.sqrt(np.sum(marginal * (grid - m) ** 2))])
    for name in list(out):
        if name.endswith("__mean") or name.endswith("__sd"):
            out[f"{name}_se"] = np.zeros_like(out[name])
    for name in ("slope", "sigma_log__"):  # pinned by the rows: NUTS's moments
        for part in ("mean", "sd", "mean_se", "sd_se"):
            out[f"{name}__{part}"] = nuts[f"{name}__{part}"]
    out |= {"method": np.array("exact (grid over the two group scales)"), "divergences": 0}
    path = Path(__file__).parent / "sparse_regions.npz"
    np.savez_compressed(path, **out)
    print(f"log tau_b {out['tau_b_log____mean'][0]:.4f} ± {out['tau_b_log____sd'][0]:.4f}")
    print(f"log tau_a {out['tau_a_log____mean'][0]:.4f} ± {out['tau_a_log____sd'][0]:.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
