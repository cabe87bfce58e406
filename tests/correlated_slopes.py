"""Correlated varying intercepts and slopes at big-data scale, and their exact posterior.

The model of PyMC's multilevel primer's last step ("correlations among levels"): per group an
intercept and a slope with a 2 x 2 covariance from ``pm.LKJCholeskyCov``, written centred
(``pm.MvNormal`` of the pairs) or non-centred (``mu + (chol @ z).T``); the residual sd is known,
so given the covariance the posterior is Gaussian and the covariance's three unconstrained
coordinates (the packed Cholesky factor ``[log L00, L10, log L11]``) have a marginal density
that a grid reads (:func:`correlated_slopes_exact`). The non-centred form's data-rich groups
are sampled centred (``pymc_bigdata/model/correlated_reparam.py``); the centred form is
sampled in its own coordinates.
"""

from __future__ import annotations

import itertools

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import scipy.optimize
from hard_models import _exact_moments, slopes_rows

#: the true covariance's sds and correlation, and the LKJ prior's eta
TRUE_SDS, TRUE_CORR, ETA = (0.4, 0.3), -0.6, 2.0
#: the grid of the packed factor, in its Laplace sds about the mode, per axis
GRID_EXTENTS = ((-7.0, 12.0), (-16.0, 10.0), (-7.0, 12.0))
#: the packed Cholesky factor's value variable
PACKED = "chol_cholesky-cov-packed__"


#: the value variable's suffix of a packed Cholesky factor (``pm.LKJCholeskyCov``)
PACKED_SUFFIX = "_cholesky-cov-packed__"


def packed_cholesky(packed: np.ndarray) -> np.ndarray:
    """A packed lower-triangular factor's draws (chain, draw, n (n + 1) / 2), row by row, in
    its unconstrained coordinates: the log of the diagonal entries."""
    size = packed.shape[-1]
    n = int(round((np.sqrt(8 * size + 1) - 1) / 2))
    diagonal = np.cumsum(np.arange(1, n + 1)) - 1
    out = packed.astype(np.float64, copy=True)
    out[..., diagonal] = np.log(out[..., diagonal])
    return out


def make_correlated_slopes_data(
    n_rows: int = 100_000, n_groups: int = 40, seed: int = 23
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (shuffled), a standard-normal
    covariate per row; true ``(a_j, b_j)`` about ``(0.5, -0.3)`` with sds ``TRUE_SDS`` and
    correlation ``TRUE_CORR``, and ``y = a[group] + b[group] x + e`` with standard normals.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    x, y : ndarray, shape (n_rows,)
    """

    def effects(e1: np.ndarray, e2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = 0.5 + TRUE_SDS[0] * e1
        b = -0.3 + TRUE_SDS[1] * (TRUE_CORR * e1 + np.sqrt(1.0 - TRUE_CORR**2) * e2)
        return a, b

    return slopes_rows(n_rows, n_groups, np.random.default_rng(seed), effects)


def make_poor_groups_data(n_groups: int = 40, seed: int = 5) -> tuple[np.ndarray, ...]:
    """Every group data-poor: ``n_groups`` groups of 3 to 8 rows (about 200 rows), the effects
    and rows as in :func:`make_correlated_slopes_data`. Each group's rows say less about its
    intercept and slope than the covariance's prior does (information about 0.3-0.9 of it at
    the true sds), so the centred form is a funnel and the model's MAP inflates ``L``
    (non-centred: its diagonal 2.1 and 2.0 against the bulk's 0.44 and 0.20)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 9, size=n_groups)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    e1, e2 = rng.standard_normal(n_groups), rng.standard_normal(n_groups)
    a = 0.5 + TRUE_SDS[0] * e1
    b = -0.3 + TRUE_SDS[1] * (TRUE_CORR * e1 + np.sqrt(1.0 - TRUE_CORR**2) * e2)
    x = rng.standard_normal(len(group))
    y = a[group] + b[group] * x + rng.standard_normal(len(group))
    return group, x, y


def _covariance_prior() -> pm.Distribution:
    """The covariance's prior, inside a model context: ``LKJCholeskyCov(n=2, eta=ETA)`` with
    ``HalfNormal(1)`` sds."""
    return pm.LKJCholeskyCov(
        "chol", n=2, eta=ETA, sd_dist=pm.HalfNormal.dist(1.0), compute_corr=True
    )


def correlated_slopes_model(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """``mu ~ Normal(0, 2)`` (2), the covariance's prior (:func:`_covariance_prior`), the pairs
    ``ab ~ MvNormal(mu, chol)`` (centred) or ``ab = mu + (chol @ z).T`` with ``z ~ Normal(0,
    1)`` of shape (2, J) (non-centred), ``y ~ Normal(ab[group, 0] + ab[group, 1] x, 1)``."""
    n_groups = int(group.max()) + 1
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=2)
        chol, _, _ = _covariance_prior()
        if centred:
            ab = pm.MvNormal("ab", mu, chol=chol, shape=(n_groups, 2))
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=(2, n_groups))
            ab = pm.Deterministic("ab", mu + pt.dot(chol, z).T)
        pm.Normal("y", ab[group, 0] + ab[group, 1] * x, 1.0, observed=y)
    return model


def correlated_slopes(centred: bool, seed: int = 23) -> pm.Model:
    """Correlated varying intercepts and slopes (see ``correlated_slopes_model``)."""
    return correlated_slopes_model(*make_correlated_slopes_data(seed=seed), centred=centred)


def correlated_poor_groups(centred: bool) -> pm.Model:
    """Correlated intercepts and slopes on the data-poor groups of
    :func:`make_poor_groups_data`."""
    return correlated_slopes_model(*make_poor_groups_data(), centred=centred)


def _packed_log_prior():
    """The covariance prior's log density (with its transform's Jacobian) as a function of the
    packed unconstrained value ``[log L00, L10, log L11]``."""
    with pm.Model() as prior:
        _covariance_prior()
    logp = prior.compile_logp(jacobian=True)
    return lambda packed: float(logp({PACKED: packed}))


class _Conditional:
    """Given the packed factor: the Gaussian posterior of ``(mu, ab)`` and the log marginal
    density of the packed factor (up to a constant)."""

    def __init__(self, group: np.ndarray, x: np.ndarray, y: np.ndarray):
        self.n_groups = int(group.max()) + 1
        j = self.n_groups
        n = np.bincount(group, minlength=j).astype(np.float64)
        sx, sxx = np.bincount(group, x, j), np.bincount(group, x * x, j)
        #: each group's data precision (2 x 2) and linear term
        self.data = np.stack([np.stack([n, sx], -1), np.stack([sx, sxx], -1)], -2)
        self.rhs = np.concatenate(
            [
                [0.0, 0.0],
                np.column_stack([np.bincount(group, y, j), np.bincount(group, x * y, j)]).ravel(),
            ]
        )
        self.log_prior = _packed_log_prior()

    @staticmethod
    def factor(packed: np.ndarray) -> np.ndarray:
        return np.array([[np.exp(packed[0]), 0.0], [packed[1], np.exp(packed[2])]])

    def __call__(self, packed: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        j, dim = self.n_groups, 2 + 2 * self.n_groups
        chol = self.factor(packed)
        inv = np.linalg.inv(chol @ chol.T)
        precision = np.zeros((dim, dim))
        precision[:2, :2] = np.eye(2) / 4.0 + j * inv
        for k in range(j):
            s = slice(2 + 2 * k, 4 + 2 * k)
            precision[:2, s] = precision[s, :2] = -inv
            precision[s, s] = inv + self.data[k]
        cov = np.linalg.inv(precision)
        mean = cov @ self.rhs
        log_det_sigma = 2.0 * (packed[0] + packed[2])
        log_density = (
            self.log_prior(packed)
            - 0.5 * j * log_det_sigma
            - 0.5 * np.linalg.slogdet(precision)[1]
            + 0.5 * self.rhs @ mean
        )
        return log_density, mean, cov


def correlated_slopes_exact(
    group: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    extents=GRID_EXTENTS,
    n_grid: int = 41,
    face_tolerance: float = 1e-9,
) -> dict[str, np.ndarray]:
    """The exact posterior moments of ``correlated_slopes_model`` in its unconstrained
    coordinates (both forms): the packed factor's marginal on an ``n_grid``^3 grid about its
    mode, from ``extents[k][0]`` to ``extents[k][1]`` of its Laplace sds along axis ``k`` (the
    log sds' right tails are the longer, and ``L10`` reaches far below its mode where ``L00``
    is large; the faces may hold at most ``face_tolerance`` of the mass), and given it
    the Gaussian moments of ``mu``, ``ab`` and ``z[:, j] = L^-1 (ab_j - mu)``."""
    conditional = _Conditional(group, x, y)
    j, dim = conditional.n_groups, 2 + 2 * conditional.n_groups
    mode = scipy.optimize.minimize(
        lambda p: -conditional(p)[0],
        np.array([np.log(0.4), 0.0, np.log(0.3)]),
        method="Nelder-Mead",
        options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000},
    ).x
    sds = _laplace_sds(lambda p: conditional(p)[0], mode)
    axes = [m + s * np.linspace(*e, n_grid) for m, s, e in zip(mode, sds, extents)]
    points = list(itertools.product(*axes))
    # the log densities first; the Gaussian moments again only where the weight counts (kept
    # for every point, the d x d covariances would fill gigabytes)
    log_w = np.array([conditional(np.array(p))[0] for p in points])
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    faces = w.reshape(n_grid, n_grid, n_grid)
    edge = max(faces[[0, -1]].sum(), faces[:, [0, -1]].sum(), faces[:, :, [0, -1]].sum())
    if edge > face_tolerance:
        raise RuntimeError(f"correlated_slopes_exact: the grid's faces hold {edge:.1e}")
    first: dict[str, np.ndarray] = {}
    second: dict[str, np.ndarray] = {}
    eye = np.eye(dim)
    for weight, point in zip(w, points):
        if weight < 1e-14:
            continue
        _, mean, cov = conditional(np.array(point))
        inv_chol = np.linalg.inv(conditional.factor(np.array(point)))
        # z[:, k] = L^-1 (ab_k - mu); z is (2, J) row-major
        to_z = np.zeros((2 * j, dim))
        for k in range(j):
            for r in range(2):
                to_z[r * j + k, 2 + 2 * k : 4 + 2 * k] = inv_chol[r]
                to_z[r * j + k, :2] = -inv_chol[r]
        for name, lin in (("mu", eye[:2]), ("ab", eye[2:]), ("z", to_z)):
            m = lin @ mean
            first[name] = first.get(name, 0.0) + weight * m
            moment = np.einsum("ij,jk,ik->i", lin, cov, lin) + m**2
            second[name] = second.get(name, 0.0) + weight * moment
        p = np.array(point)
        first[PACKED] = first.get(PACKED, 0.0) + weight * p
        second[PACKED] = second.get(PACKED, 0.0) + weight * p**2
    return _exact_moments(first, second)


def _laplace_sds(log_density, mode: np.ndarray, step: float = 1e-3) -> np.ndarray:
    """The sds of the Gaussian at ``mode`` from the log density's Hessian (central
    differences)."""
    dim = len(mode)
    hessian = np.empty((dim, dim))
    for a, b in itertools.product(range(dim), repeat=2):
        ea, eb = np.eye(dim)[a] * step, np.eye(dim)[b] * step
        hessian[a, b] = (
            log_density(mode + ea + eb)
            - log_density(mode + ea - eb)
            - log_density(mode - ea + eb)
            + log_density(mode - ea - eb)
        ) / (4 * step * step)
    return np.sqrt(np.diag(np.linalg.inv(-hessian)))
