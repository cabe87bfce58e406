"""Exactness of :class:`pymc_bigdata.MinibatchModel` against the model's own log density.

Every quantity the layer computes is checked against an independent reference:

* the model's own ``compile_logp`` / ``compile_dlogp`` (compiled with PyTensor's Python
  backend, ``FAST_COMPILE``: a second implementation of the same graph that compiles in
  under a second, where the default Numba backend takes 20-30 s on a full-data graph);
* SciPy's per-row log densities;
* algebraic identities between the layer's own functions (minibatch estimates, control
  variates, per-row forward-mode derivatives, Hessian-vector products);
* central finite differences, with a tolerance derived from the Richardson estimate of the
  truncation error and a bound on the rounding error (see :func:`assert_matches_fd`);
* the analytic posterior of a conjugate model (for the MAP and the Laplace precision).

The four likelihoods (Normal, Bernoulli-logit, Poisson-log, Student-t) are built on
``N = 100_000`` rows and evaluated on ``m = 1_000`` rows.  Compilation is the slow part, so
each model and its layer are built once per module and shared by all tests.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cached_property

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_bigdata as pmbd
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.laplace import posterior_precision

N_ROWS = 100_000
N_COVARIATES = 3
BATCH_ROWS = 1_000
#: relative tolerance of exact identities (sums, products) against the scale of the terms
RTOL = 1e-9
#: central-difference step and relative tolerance of finite-difference checks
FD_STEP = 1e-5
FD_RTOL = 1e-5
#: the reference functions compile with the Python backend (independent of Numba, fast)
REFERENCE_MODE = "FAST_COMPILE"
EPS = np.finfo(np.float64).eps

CASE_NAMES = ["normal", "bernoulli", "poisson", "studentt"]


# ---------------------------------------------------------------------- helpers
def point_from_theta(layer: pmbd.MinibatchModel, theta: np.ndarray) -> dict[str, np.ndarray]:
    """Split a flat ``theta`` into the model's value variables (order of ``layer.value_vars``)."""
    point, start = {}, 0
    for var, shape, size in zip(layer.value_vars, layer.var_shapes, layer.var_sizes, strict=True):
        point[var.name] = theta[start : start + size].reshape(shape)
        start += size
    return point


def theta_from_point(layer: pmbd.MinibatchModel, point: dict[str, np.ndarray]) -> np.ndarray:
    """Flatten a point (value-variable names) in the order of ``layer.value_vars``."""
    return np.concatenate([np.ravel(point[v.name]) for v in layer.value_vars]).astype(np.float64)


def index_blocks(n_rows: int, sizes: list[int], seed: int) -> list[np.ndarray]:
    """A partition of a random permutation of ``range(n_rows)`` into blocks of the given sizes."""
    assert sum(sizes) == n_rows
    perm = np.random.default_rng(seed).permutation(n_rows)
    return np.split(perm, np.cumsum(sizes)[:-1])


def assert_close(actual, desired, scale, rtol: float = RTOL, what: str = "") -> None:
    """``|actual - desired| <= rtol * max(|desired|, scale)`` elementwise.

    ``scale`` is the magnitude of the terms summed into ``desired`` (e.g. the sum of their
    absolute values): rounding error is relative to it, not to a sum that may cancel.
    """
    actual, desired = np.asarray(actual, dtype=float), np.asarray(desired, dtype=float)
    assert actual.shape == desired.shape, (what, actual.shape, desired.shape)
    bound = rtol * np.maximum(np.abs(desired), scale)
    err = np.abs(actual - desired)
    assert np.all(err <= bound), (
        f"{what}: max error {err.max():.3e}, worst ratio to bound {np.max(err / bound):.3e}; "
        f"actual {actual}, desired {desired}"
    )


def central_difference(f: Callable, x: np.ndarray, direction: np.ndarray, h: float):
    """``(f(x + h u) - f(x - h u)) / (2 h)``."""
    return (np.asarray(f(x + h * direction)) - np.asarray(f(x - h * direction))) / (2.0 * h)


def assert_matches_fd(
    analytic, f: Callable, x: np.ndarray, direction: np.ndarray, f_scale, what: str = ""
) -> None:
    """The directional derivative ``analytic`` of ``f`` at ``x`` along ``direction``.

    Tolerance = ``FD_RTOL * |D(h)|`` + 10 x the Richardson estimate of the truncation error
    of ``D(h)`` (``|D(2h) - D(h)| / 3``, since the error is ``c h^2``) + 10 x a bound on the
    rounding error (``2 * 64 eps * f_scale / (2h)``, ``f_scale`` the magnitude of the terms
    summed into ``f``).  A wrong derivative (a missing term or factor) is off by far more.
    """
    d_h = central_difference(f, x, direction, FD_STEP)
    d_2h = central_difference(f, x, direction, 2 * FD_STEP)
    truncation = np.abs(d_2h - d_h) / 3.0
    rounding = 64 * EPS * np.asarray(f_scale) / FD_STEP
    tol = FD_RTOL * np.abs(d_h) + 10 * truncation + 10 * rounding
    err = np.abs(np.asarray(analytic) - d_h)
    assert np.all(err <= tol), (
        f"{what}: analytic {analytic} vs finite difference {d_h} (tolerance {tol})"
    )


# ---------------------------------------------------------------------- the models
def _covariates(rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    return scale * rng.standard_normal((N_ROWS, N_COVARIATES))


def build_normal(x, y, **observed_kwargs) -> pm.Model:
    """y ~ Normal(X beta + a, sigma); the Minibatch test rebuilds it on pm.Minibatch data."""
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_COVARIATES)
        a = pm.Normal("a", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", x @ beta + a, sigma, observed=y, **observed_kwargs)
    return model


def make_normal():
    """Normal regression with intercept and unknown sigma; data as plain arrays."""
    rng = np.random.default_rng(101)
    x = _covariates(rng)
    beta, a, sigma = np.array([0.5, -1.0, 0.3]), 0.7, 1.3
    y = x @ beta + a + sigma * rng.standard_normal(N_ROWS)
    truth = {"beta": beta, "a": np.array(a), "sigma_log__": np.array(np.log(sigma))}

    def rows(p, xi, yi):
        return stats.norm.logpdf(yi, xi @ p["beta"] + p["a"], np.exp(p["sigma_log__"]))

    return build_normal(x, y), x, y, truth, rows


def make_bernoulli():
    """Logistic regression; covariates as pm.Data, outcome as a plain array."""
    rng = np.random.default_rng(202)
    x = _covariates(rng)
    beta = np.array([0.8, -0.5, 0.25])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(x @ beta))))
    with pm.Model() as model:
        x_data = pm.Data("X", x)
        b = pm.Normal("beta", 0.0, 2.0, shape=N_COVARIATES)
        pm.Bernoulli("y", logit_p=x_data @ b, observed=y)
    truth = {"beta": beta}

    def rows(p, xi, yi):
        eta = xi @ p["beta"]
        return yi * eta - np.logaddexp(0.0, eta)

    return model, x, y, truth, rows


def make_poisson():
    """Poisson regression with a log link; data as plain arrays (integer counts)."""
    rng = np.random.default_rng(303)
    x = _covariates(rng, scale=0.5)
    beta = np.array([0.6, -0.4, 0.3])
    y = rng.poisson(np.exp(x @ beta))
    with pm.Model() as model:
        b = pm.Normal("beta", 0.0, 2.0, shape=N_COVARIATES)
        pm.Poisson("y", mu=pm.math.exp(x @ b), observed=y)
    truth = {"beta": beta}

    def rows(p, xi, yi):
        return stats.poisson.logpmf(yi, np.exp(xi @ p["beta"]))

    return model, x, y, truth, rows


def make_studentt():
    """Student-t regression (nu = 4 fixed, unknown sigma); covariates and outcome as pm.Data."""
    rng = np.random.default_rng(404)
    x = _covariates(rng)
    beta, sigma = np.array([-0.7, 0.2, 1.1]), 0.8
    y = x @ beta + sigma * rng.standard_t(4, size=N_ROWS)
    with pm.Model() as model:
        x_data = pm.Data("X", x)
        y_data = pm.Data("y_obs", y)
        b = pm.Normal("beta", 0.0, 2.0, shape=N_COVARIATES)
        s = pm.HalfNormal("sigma", 2.0)
        pm.StudentT("y", nu=4, mu=x_data @ b, sigma=s, observed=y_data)
    truth = {"beta": beta, "sigma_log__": np.array(np.log(sigma))}

    def rows(p, xi, yi):
        return stats.t.logpdf(yi, 4, loc=xi @ p["beta"], scale=np.exp(p["sigma_log__"]))

    return model, x, y, truth, rows


MAKERS = {
    "normal": make_normal,
    "bernoulli": make_bernoulli,
    "poisson": make_poisson,
    "studentt": make_studentt,
}


class Case:
    """One model, its layer, the raw data, an evaluation point and lazily built references."""

    def __init__(self, name: str):
        self.name = name
        self.model, self.x, self.y, truth, self._rows_reference = MAKERS[name]()
        self.layer = pmbd.MinibatchModel(self.model)
        rng = np.random.default_rng(7)
        self.truth = theta_from_point(self.layer, truth)
        # off the mode, so that gradients are far from zero
        self.theta = self.truth + 0.05 * rng.standard_normal(self.layer.dim)
        self.anchor_theta = self.truth + 0.03 * rng.standard_normal(self.layer.dim)
        self.direction = rng.standard_normal(self.layer.dim)
        self.batch_index = rng.choice(N_ROWS, BATCH_ROWS, replace=False)
        self.batch = self.layer.take_rows(self.batch_index)
        self.scale = N_ROWS / BATCH_ROWS

    def rows_reference(self, theta: np.ndarray, index: np.ndarray) -> np.ndarray:
        """SciPy's per-row log-likelihood at ``theta`` for the given row indices."""
        point = point_from_theta(self.layer, theta)
        return self._rows_reference(point, self.x[index], self.y[index])

    @cached_property
    def logp_reference(self):
        return self.model.compile_logp(mode=REFERENCE_MODE)

    @cached_property
    def dlogp_reference(self):
        names = [v.name for v in self.model.continuous_value_vars]
        assert names == [v.name for v in self.layer.value_vars]
        return self.model.compile_dlogp(mode=REFERENCE_MODE)

    @cached_property
    def anchor(self) -> Anchor:
        loglik, loglik_grad = self.layer.full_loglik_grad(self.anchor_theta)
        return Anchor(theta=self.anchor_theta, loglik=loglik, loglik_grad=loglik_grad)

    def abs_grad_sum(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Sum over the given rows of ``|grad l_i(theta)|`` (the rounding scale of a gradient)."""
        return np.abs(self.layer.row_gradients(theta, rows)).sum(axis=0)

    def full_abs_grad_sum(self, theta: np.ndarray) -> np.ndarray:
        """``abs_grad_sum`` over all rows plus ``|grad log prior|``."""
        total = np.abs(self.layer.prior_logp_grad(theta)[1])
        for rows in self.layer.rows.chunks(30_000):
            total = total + self.abs_grad_sum(theta, rows)
        return total


@pytest.fixture(scope="module")
def get_case():
    """Build each case at most once per module (the layers compile lazily, once)."""
    cache: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in cache:
            cache[name] = Case(name)
        return cache[name]

    return get


@pytest.fixture(scope="module", params=CASE_NAMES)
def case(request, get_case) -> Case:
    return get_case(request.param)


# ---------------------------------------------------------------------- per-row terms
def test_row_logp_matches_scipy(case):
    """row_logp on gathered rows equals SciPy's log density of exactly those rows.

    Proves take_rows keeps observed values and covariates aligned, in the order given, and
    that the rebuilt per-row likelihood is the model's own (parameters, link, transforms).
    """
    got = case.layer.row_logp(case.theta, case.batch)
    want = case.rows_reference(case.theta, case.batch_index)
    assert got.shape == (BATCH_ROWS,)
    assert_close(got, want, scale=np.abs(want), what="row_logp vs scipy")


def test_row_partition_plus_prior_equals_model_logp(case):
    """Summing row_logp over any partition of all N rows, plus the log prior, gives logp.

    Two partitions: the row source's contiguous chunks (uneven last chunk) and uneven blocks
    of a random permutation gathered with take_rows.  Reference: the model's compile_logp
    (log prior with transform Jacobians plus the full-data likelihood).
    """
    layer = case.layer
    prior, _ = layer.prior_logp_grad(case.theta)
    want = float(case.logp_reference(point_from_theta(layer, case.theta)))
    chunk_terms = [layer.row_logp(case.theta, rows) for rows in layer.rows.chunks(30_000)]
    assert sum(len(t) for t in chunk_terms) == N_ROWS
    block_terms = [
        layer.row_logp(case.theta, layer.take_rows(idx))
        for idx in index_blocks(N_ROWS, [1, 999, 37_000, 62_000], seed=3)
    ]
    magnitude = abs(prior) + sum(np.abs(t).sum() for t in chunk_terms)
    for terms in (chunk_terms, block_terms):
        total = prior + sum(float(t.sum()) for t in terms)
        assert_close(total, want, scale=magnitude, what="partition sum + prior vs model logp")


def test_full_logp_grad_matches_model(case):
    """full_logp_grad (chunked) equals the model's own logp and dlogp at the same point."""
    layer = case.layer
    point = point_from_theta(layer, case.theta)
    lp, g = layer.full_logp_grad(case.theta)
    want_lp = float(case.logp_reference(point))
    want_g = case.dlogp_reference(point)
    assert g.shape == (layer.dim,)
    assert_close(lp, want_lp, scale=abs(want_lp), what="full logp")
    assert_close(g, want_g, scale=case.full_abs_grad_sum(case.theta), what="full gradient")


# ---------------------------------------------------------------------- minibatch estimates
def test_estimate_logp_grad_is_scaled_sum_and_its_gradient(case):
    """estimate_logp_grad = prior + (N/n) sum_i l_i, and its gradient is that value's gradient.

    The value is checked against the prior plus the scaled sum of row_logp; the gradient
    against central finite differences of the value, coordinate by coordinate, and against
    prior gradient + (N/n) loglik_grad.  estimate_logp / estimate_grad without an anchor
    return the same value and gradient.
    """
    layer, theta, rows, scale = case.layer, case.theta, case.batch, case.scale
    lp, g = layer.estimate_logp_grad(theta, rows)
    prior, prior_g = layer.prior_logp_grad(theta)
    terms = layer.row_logp(theta, rows)
    magnitude = abs(prior) + scale * np.abs(terms).sum()
    assert_close(lp, prior + scale * terms.sum(), scale=magnitude, what="estimate value")
    g_scale = np.abs(prior_g) + scale * case.abs_grad_sum(theta, rows)
    assert_close(g, prior_g + scale * layer.loglik_grad(theta, rows)[1], g_scale, what="grad")
    assert_close(layer.estimate_logp(theta, rows), lp, scale=magnitude, what="estimate_logp")
    assert_close(layer.estimate_grad(theta, rows), g, scale=g_scale, what="estimate_grad")

    def value(t):
        return layer.estimate_logp_grad(t, rows)[0]

    for j, unit in enumerate(np.eye(layer.dim)):
        assert_matches_fd(g[j], value, theta, unit, magnitude, what=f"d estimate / d theta[{j}]")


def test_control_variate_estimates(case):
    """With an Anchor, estimate_grad / estimate_logp are the control-variate estimators.

    grad: grad prior(theta) + anchor.loglik_grad + (N/n) (sum_i grad l_i(theta) -
    sum_i grad l_i(theta*)); value: prior(theta) + anchor.loglik + (N/n) (sum_i l_i(theta) -
    sum_i l_i(theta*)), both from loglik_grad on the same rows.  On all N rows (scale 1) the
    control-variate estimates are exactly the full-data log posterior and gradient.
    """
    layer, theta, rows, scale, anchor = case.layer, case.theta, case.batch, case.scale, case.anchor
    prior, prior_g = layer.prior_logp_grad(theta)
    ll, ll_g = layer.loglik_grad(theta, rows)
    ll_star, ll_star_g = layer.loglik_grad(anchor.theta, rows)

    want_g = prior_g + anchor.loglik_grad + scale * (ll_g - ll_star_g)
    g_scale = (
        np.abs(prior_g)
        + np.abs(anchor.loglik_grad)
        + scale * (case.abs_grad_sum(theta, rows) + case.abs_grad_sum(anchor.theta, rows))
    )
    assert_close(layer.estimate_grad(theta, rows, anchor), want_g, g_scale, what="cv grad")

    want_lp = prior + anchor.loglik + scale * (ll - ll_star)
    magnitude = (
        abs(prior)
        + abs(anchor.loglik)
        + scale
        * (
            np.abs(layer.row_logp(theta, rows)).sum()
            + np.abs(layer.row_logp(anchor.theta, rows)).sum()
        )
    )
    assert_close(layer.estimate_logp(theta, rows, anchor), want_lp, magnitude, what="cv logp")

    all_rows = layer.take_rows(np.arange(N_ROWS))
    full_lp, full_g = layer.full_logp_grad(theta)
    full_scale = case.full_abs_grad_sum(theta) + case.full_abs_grad_sum(anchor.theta)
    assert_close(layer.estimate_grad(theta, all_rows, anchor), full_g, full_scale, what="cv all")
    assert_close(
        layer.estimate_logp(theta, all_rows, anchor), full_lp, 2 * abs(full_lp), what="cv logp all"
    )


def test_directional_parts_and_grad_in_one_call(case):
    """directional_parts_and_grad: the prior's and each row's directional derivative (minus
    the anchor's) from row gradients, and estimate_grad with the same rows and weights."""
    layer, theta, rows, v = case.layer, case.theta, case.batch, case.direction
    weights = np.random.default_rng(4).uniform(0.5, 2.0, BATCH_ROWS) * case.scale
    row_slopes = layer.row_gradients(theta, rows) @ v
    prior_slope = layer.prior_logp_grad(theta)[1] @ v
    for anchor in (None, case.anchor):
        prior, per_row, gradient = layer.directional_parts_and_grad(theta, v, rows, anchor, weights)
        want = row_slopes
        if anchor is not None:
            want = row_slopes - layer.row_gradients(anchor.theta, rows) @ v
        assert_close(prior, prior_slope, abs(prior_slope) + 1.0, what="prior slope")
        assert_close(per_row, want, np.abs(row_slopes) + np.abs(want), what="row slopes")
        want_g = layer.estimate_grad(theta, rows, anchor, weights)
        assert_close(gradient, want_g, np.abs(want_g) + 1.0, what="gradient")


# ---------------------------------------------------------------------- per-row derivatives
def test_row_directional_derivatives_equal_row_gradients_times_v(case):
    """row_directional_derivatives(theta, v) == row_gradients(theta) @ v for every row."""
    layer, theta, rows, v = case.layer, case.theta, case.batch, case.direction
    grads = layer.row_gradients(theta, rows)
    assert grads.shape == (BATCH_ROWS, layer.dim)
    jvp = layer.row_directional_derivatives(theta, v, rows)
    assert jvp.shape == (BATCH_ROWS,)
    assert_close(jvp, grads @ v, scale=np.abs(grads) @ np.abs(v), what="row jvp")


def test_row_gradients_match_finite_differences(case):
    """Each row of row_gradients is the gradient of that row's l_i (central differences).

    Checked on five rows, every coordinate; the rows' gradients summed equal loglik_grad.
    """
    layer, theta = case.layer, case.theta
    rows = layer.take_rows(case.batch_index[:5])
    grads = layer.row_gradients(theta, rows)
    f_scale = np.abs(layer.row_logp(theta, rows))
    for j, unit in enumerate(np.eye(layer.dim)):
        assert_matches_fd(
            grads[:, j],
            lambda t: layer.row_logp(t, rows),
            theta,
            unit,
            f_scale,
            what=f"row gradients, coordinate {j}",
        )
    assert_close(
        grads.sum(axis=0),
        layer.loglik_grad(theta, rows)[1],
        scale=np.abs(grads).sum(axis=0),
        what="sum of row gradients",
    )


# ---------------------------------------------------------------------- second derivatives
def test_hessian_vector_products(case):
    """loglik_hvp is the derivative of loglik_grad's gradient along v; the dense Hessian agrees.

    * loglik_hvp(theta, v, rows) vs central differences of loglik_grad(., rows)[1] along v;
    * loglik_hessian(theta, rows) is symmetric and loglik_hessian @ v == loglik_hvp;
    * full_loglik_hvp(theta, v) == the sum of loglik_hvp over a partition of all rows
      (random-permutation blocks, not the layer's own chunks), and == full_loglik_hessian @ v.
    """
    layer, theta, rows, v = case.layer, case.theta, case.batch, case.direction
    hvp = layer.loglik_hvp(theta, v, rows)
    assert hvp.shape == (layer.dim,)
    assert_matches_fd(
        hvp,
        lambda t: layer.loglik_grad(t, rows)[1],
        theta,
        v,
        case.abs_grad_sum(theta, rows),
        what="hvp",
    )
    hess = layer.loglik_hessian(theta, rows)
    assert hess.shape == (layer.dim, layer.dim)
    h_scale = np.abs(hess).max()
    assert_close(hess, hess.T, scale=h_scale, what="Hessian symmetry")
    assert_close(hess @ v, hvp, scale=np.abs(hess) @ np.abs(v), what="Hessian @ v")

    full = layer.full_loglik_hvp(theta, v)
    blocks = index_blocks(N_ROWS, [50_000, 30_000, 20_000], seed=5)
    parts = [layer.loglik_hvp(theta, v, layer.take_rows(idx)) for idx in blocks]
    assert_close(full, sum(parts), scale=sum(np.abs(p) for p in parts), what="full hvp")
    full_hess = layer.full_loglik_hessian(theta)
    assert_close(full_hess @ v, full, scale=np.abs(full_hess) @ np.abs(v), what="full H @ v")


# ---------------------------------------------------------------------- MAP
def test_find_map_is_a_mode_with_positive_definite_curvature(case):
    """find_map ends at a stationary point of the full-data log posterior, with its curvature.

    * Newton decrement g^T H^{-1} g < 1e-8 (distance to the mode < 1e-4 posterior sd), and
      every gradient component is < 1e-5 of the sum of |row gradients| there (the search's
      last Newton step is taken without a pass where it is predicted to land within 1e-8);
    * hessian is symmetric positive definite and equals -(full_loglik_hessian +
      prior_hessian) at ``hessian_point``; its product with v matches finite differences of
      full_logp_grad there;
    * loglik / loglik_grad are the full-data values at ``sums_point`` (theta where None),
      logp the log posterior at theta;
    * the mode lies within 6 posterior sd of the parameters that generated the data.
    """
    layer = case.layer
    result = layer.find_map()
    theta, hess = result.theta, result.hessian
    lp, g = layer.full_logp_grad(theta)
    assert_close(hess, hess.T, scale=np.abs(hess).max(), what="MAP hessian symmetry")
    eig = np.linalg.eigvalsh(hess)
    assert eig[0] > 0, f"MAP Hessian not positive definite: eigenvalues {eig}"
    decrement = float(g @ np.linalg.solve(hess, g))
    assert decrement < 1e-8, f"Newton decrement {decrement} at the MAP"
    assert np.all(np.abs(g) <= 1e-5 * case.full_abs_grad_sum(theta)), g

    at = result.hessian_point
    full_hess = layer.full_loglik_hessian(at) + layer.prior_hessian(at)
    assert_close(hess, -full_hess, scale=np.abs(hess).max(), what="MAP hessian")
    assert_matches_fd(
        -hess @ case.direction,
        lambda t: layer.full_logp_grad(t)[1],
        at,
        case.direction,
        case.full_abs_grad_sum(at),
        what="MAP hessian @ v",
    )
    at = theta if result.sums_point is None else result.sums_point
    loglik, loglik_grad = layer.full_loglik_grad(at)
    assert_close(result.logp, lp, scale=abs(lp), what="MAP logp")
    assert_close(result.loglik, loglik, scale=abs(loglik), what="MAP loglik")
    assert_close(result.loglik_grad, loglik_grad, case.full_abs_grad_sum(at), what="MAP grad")

    sd = np.sqrt(np.diag(np.linalg.inv(hess)))
    assert np.all(np.abs(theta - case.truth) < 6 * sd), (theta - case.truth) / sd


def test_find_map_and_hessian_are_exact_for_conjugate_normal_model():
    """For a Gaussian linear model with known sigma, MAP and inv(hessian) are the posterior's.

    beta ~ N(m0, s0^2 I), y ~ N(X beta, sigma^2), N = 100_000: the posterior is Gaussian with
    precision P = I / s0^2 + X^T X / sigma^2 and mean P^{-1} (m0 / s0^2 + X^T y / sigma^2).
    The MAP must equal the mean (to 1e-5 posterior sd), hessian must equal P and inv(hessian)
    the posterior covariance (relative 1e-9).
    """
    rng = np.random.default_rng(505)
    x = _covariates(rng)
    sigma, m0, s0 = 2.0, np.array([0.5, 0.0, -0.5]), 1.5
    y = x @ np.array([1.0, -2.0, 0.5]) + sigma * rng.standard_normal(N_ROWS)
    with pm.Model() as model:
        beta = pm.Normal("beta", m0, s0, shape=N_COVARIATES)
        pm.Normal("y", x @ beta, sigma, observed=y)
    layer = pmbd.MinibatchModel(model)
    precision = np.eye(N_COVARIATES) / s0**2 + x.T @ x / sigma**2
    cov = np.linalg.inv(precision)
    mean = cov @ (m0 / s0**2 + x.T @ y / sigma**2)

    result = layer.find_map()
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(result.theta - mean) < 1e-5 * sd), (result.theta - mean) / sd
    assert_close(result.hessian, precision, scale=np.abs(precision).max(), what="precision")
    assert_close(np.linalg.inv(result.hessian), cov, scale=np.abs(cov).max(), what="covariance")


def test_flat_priors_give_least_squares_and_sample():
    """Every coefficient ``pm.Flat``: the prior is constant in them, its gradient and Hessian
    are 0, the MAP is least squares with precision ``X^T X / sigma^2``, and SGHMC samples.

    Catches a prior graph with no path to the values (PyTensor's ``grad`` raised
    ``DisconnectedInputError`` when the layer was built or the MAP searched for).
    """
    rng = np.random.default_rng(506)
    x = _covariates(rng)[:10_000]
    sigma = 2.0
    y = x @ np.array([1.0, -2.0, 0.5]) + sigma * rng.standard_normal(len(x))
    with pm.Model() as model:
        beta = pm.Flat("beta", shape=N_COVARIATES)
        pm.Normal("y", x @ beta, sigma, observed=y)
    layer = pmbd.MinibatchModel(model)
    theta = np.array([0.3, -0.1, 2.0])
    lp, grad = layer.prior_logp_grad(theta)
    assert lp == 0.0 and np.all(grad == 0.0)
    assert np.all(layer.prior_hessian(theta) == 0.0)

    precision = x.T @ x / sigma**2
    cov = np.linalg.inv(precision)
    result = layer.find_map()
    sd = np.sqrt(np.diag(cov))
    least_squares = np.linalg.lstsq(x, y, rcond=None)[0]
    assert np.all(np.abs(result.theta - least_squares) < 1e-5 * sd)
    assert_close(result.hessian, precision, scale=np.abs(precision).max(), what="precision")
    with model:
        idata = pm.sample(
            tune=100, draws=100, chains=1, step=pmbd.SGHMC(layer=layer), random_seed=1,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    assert np.isfinite(idata.posterior["beta"].values).all()


# ---------------------------------------------------------------------- model variants
def test_minibatch_model_with_total_size_equals_full_data_model(get_case):
    """A model on pm.Minibatch(X, y) with total_size=N is the same layer as on full data.

    The layer strips pm.Minibatch back to the full arrays (N rows) and ignores total_size
    (it scales by N/n itself): row_logp on the same rows and full_logp_grad equal those of
    the identical model written on the full arrays.
    """
    _check_minibatch_model_equals_full(get_case("normal"), total_size=N_ROWS)


def test_minibatch_model_without_total_size_equals_full_data_model(get_case):
    """As above for pm.Minibatch without total_size (an unscaled observed variable)."""
    _check_minibatch_model_equals_full(get_case("normal"))


def _check_minibatch_model_equals_full(case: Case, **observed_kwargs) -> None:
    x_batch, y_batch = pm.Minibatch(case.x, case.y, batch_size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = build_normal(x_batch, y_batch, **observed_kwargs)
    layer = pmbd.MinibatchModel(model)
    assert layer.n_rows == N_ROWS
    assert [v.name for v in layer.value_vars] == [v.name for v in case.layer.value_vars]
    got = layer.row_logp(case.theta, layer.take_rows(case.batch_index))
    want = case.layer.row_logp(case.theta, case.batch)
    assert_close(got, want, scale=np.abs(want), what="Minibatch model row_logp")
    lp, g = layer.full_logp_grad(case.theta)
    want_lp, want_g = case.layer.full_logp_grad(case.theta)
    assert_close(lp, want_lp, scale=abs(want_lp), what="Minibatch model logp")
    assert_close(g, want_g, scale=case.full_abs_grad_sum(case.theta), what="Minibatch grad")


def test_discrete_likelihood_observed_as_pm_data(get_case):
    """Bernoulli with observed=pm.Data(...) equals the same model on a plain array."""
    case = get_case("bernoulli")
    with pm.Model() as model:
        x_data = pm.Data("X", case.x)
        y_data = pm.Data("y_obs", case.y)
        b = pm.Normal("beta", 0.0, 2.0, shape=N_COVARIATES)
        pm.Bernoulli("y", logit_p=x_data @ b, observed=y_data)
    layer = pmbd.MinibatchModel(model)
    got = layer.row_logp(case.theta, layer.take_rows(case.batch_index))
    want = case.layer.row_logp(case.theta, case.batch)
    assert_close(got, want, scale=np.abs(want), what="pm.Data Bernoulli row_logp")


def test_two_observed_variables_sharing_rows():
    """Two likelihoods on the same rows: row_logp is their sum, and the partition identity holds.

    y1 ~ Normal(X b, 1) and y2 ~ Bernoulli(logit_p = X c) share X and the row axis:
    row_logp of a row is the Normal plus the Bernoulli term (SciPy), the sum over all rows
    plus the prior equals the model's logp, and full_logp_grad equals the model's dlogp.
    """
    rng = np.random.default_rng(606)
    x = _covariates(rng)
    y1 = x @ np.array([0.3, 0.1, -0.2]) + rng.standard_normal(N_ROWS)
    y2 = rng.binomial(1, 1.0 / (1.0 + np.exp(-(x @ np.array([-0.5, 0.4, 0.9])))))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=N_COVARIATES)
        c = pm.Normal("c", 0.0, 1.0, shape=N_COVARIATES)
        pm.Normal("y1", x @ b, 1.0, observed=y1)
        pm.Bernoulli("y2", logit_p=x @ c, observed=y2)
    layer = pmbd.MinibatchModel(model)
    assert layer.n_rows == N_ROWS
    # y1, y2 and X (a plain array used twice is two constants, so it may be read twice)
    assert {"y1", "y2"} <= set(layer.rows.names)
    assert all(a.shape[0] == N_ROWS for a in layer.take_rows(np.arange(N_ROWS)))

    theta = np.random.default_rng(1).normal(0.0, 0.3, size=layer.dim)
    point = point_from_theta(layer, theta)
    index = np.random.default_rng(2).choice(N_ROWS, BATCH_ROWS, replace=False)
    eta1, eta2 = x[index] @ point["b"], x[index] @ point["c"]
    want = stats.norm.logpdf(y1[index], eta1, 1.0) + y2[index] * eta2 - np.logaddexp(0.0, eta2)
    got = layer.row_logp(theta, layer.take_rows(index))
    assert_close(got, want, scale=np.abs(want), what="two-likelihood row_logp")

    prior, _ = layer.prior_logp_grad(theta)
    terms = [layer.row_logp(theta, rows) for rows in layer.rows.chunks(40_000)]
    total = prior + sum(float(t.sum()) for t in terms)
    want_lp = float(model.compile_logp(mode=REFERENCE_MODE)(point))
    magnitude = abs(prior) + sum(np.abs(t).sum() for t in terms)
    assert_close(total, want_lp, scale=magnitude, what="two-likelihood partition sum")
    lp, g = layer.full_logp_grad(theta)
    want_g = model.compile_dlogp(mode=REFERENCE_MODE)(point)
    g_scale = sum(np.abs(layer.row_gradients(theta, r)).sum(0) for r in layer.rows.chunks(40_000))
    assert_close(lp, want_lp, scale=magnitude, what="two-likelihood logp")
    assert_close(g, want_g, scale=g_scale, what="two-likelihood gradient")


# ---------------------------------------------------------------------- second-order CVs
def _second_order_estimate(layer, theta, rows, anchor):
    _, first, row_curv = layer.estimate_second_order_parts(theta, rows, anchor)
    return anchor.second_order(theta, first, row_curv)


def test_second_order_estimate_is_exact_for_a_gaussian_linear_model():
    """y ~ N(X b, 1): every row's log-likelihood is quadratic, so the second-order estimate
    has no noise at all: any minibatch gives the full-data gradient (to rounding)."""
    rng = np.random.default_rng(40)
    x = rng.standard_normal((3_000, 3))
    y = x @ np.array([1.0, -0.5, 0.2]) + rng.standard_normal(3_000)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        pm.Normal("y", pm.math.dot(x, b), 1.0, observed=y)
    layer = pmbd.MinibatchModel(model)
    anchor = layer.map_anchor()
    theta = anchor.theta + np.array([0.3, -0.2, 0.5])
    _, full = layer.full_logp_grad(theta)
    for seed in range(3):
        rows = layer.take_rows(np.random.default_rng(seed).choice(3_000, 50, replace=False))
        estimate = _second_order_estimate(layer, theta, rows, anchor)
        assert_close(estimate, full, scale=np.abs(full).max() + 1.0, what="second order")
        first = layer.estimate_grad(theta, rows, anchor)
        assert np.abs(first - full).max() > 1e-3  # first order is noisy here


def test_second_order_estimate_is_unbiased_on_a_partition(small_logistic_layer):
    """Logistic rows are not quadratic; averaged over the blocks of a partition of the rows
    (each block scaled by N/n) the estimate equals the full-data gradient exactly, also with
    the anchor moved away from the curvature point (as tuning's re-centring does)."""
    layer = small_logistic_layer
    m = layer.map_estimate()
    anchor = layer.anchor_at(m.theta + 0.05, layer.map_anchor())
    assert np.array_equal(anchor.curvature_point, m.hessian_point)
    theta = m.theta + np.array([0.2, -0.1, 0.15])
    _, full = layer.full_logp_grad(theta)
    blocks = index_blocks(layer.n_rows, [1_000] * 5, seed=3)
    mean = np.mean(
        [_second_order_estimate(layer, theta, layer.take_rows(b), anchor) for b in blocks], axis=0
    )
    assert_close(mean, full, scale=np.abs(full).max() + 1.0, what="second-order partition mean")


@pytest.fixture(scope="module")
def small_logistic_layer():
    rng = np.random.default_rng(41)
    x = rng.standard_normal((5_000, 3))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ np.array([0.5, -1.0, 0.3]))))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, beta), observed=y)
    return pmbd.MinibatchModel(model)


# ---------------------------------------------------------------------- MAP usability
def test_regular_model_has_a_usable_mode(small_logistic_layer):
    fit = small_logistic_layer.map_estimate()
    assert fit.problem is None and fit.newton_decrement < 1e-6 and fit.min_curvature > 0


def test_map_search_reaches_a_mode_its_subsample_hessian_misses():
    """A Poisson hierarchy with groups of 3 to 3,000 rows and a 500-row search subsample: the
    small groups are barely in it, so Newton with the subsample's Hessian stops short of the
    mode (decrement 3.4); the exact Hessian where it stopped finishes the search.

    Mutation: the ``POLISH_STEPS`` Newton stage removed from ``find_map``: ``problem`` says
    no stationary point (decrement 3.35)."""
    rng = np.random.default_rng(0)
    sizes = np.unique(np.geomspace(3, 3000, 25).astype(int))
    group = np.repeat(np.arange(len(sizes)), sizes)
    y = rng.poisson(np.exp(0.5 + 0.6 * rng.standard_normal(len(sizes)))[group])
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=len(sizes))
        pm.Poisson("y", pm.math.exp(a[group]), observed=y)
    layer = pmbd.MinibatchModel(model)
    layer.chunk_rows = 500
    fit = layer.find_map()
    assert fit.problem is None and fit.newton_decrement < 1e-9


def test_centred_hierarchical_model_without_a_mode_is_detected():
    """Centred a_g ~ N(mu, tau) with 2 rows per group: the density grows without bound as
    tau -> 0 with every a_g = mu, so the search ends at no mode and says so."""
    rng = np.random.default_rng(42)
    groups = np.repeat(np.arange(30), 2)
    y = rng.normal(0.0, 1.0, size=60)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=30)
        pm.Normal("y", a[groups], 1.0, observed=y)
    fit = pmbd.MinibatchModel(model).find_map()
    assert fit.problem is not None


def test_posterior_precision_is_minus_the_symmetrised_hessian_sum(small_logistic_layer):
    """``-(H_loglik + H_prior)`` made exactly symmetric, and what the Laplace fit reports."""
    loglik = np.array([[-2.0, 1.0], [0.0, -3.0]])
    precision = posterior_precision(loglik, -np.eye(2))
    np.testing.assert_array_equal(precision, [[3.0, -0.5], [-0.5, 4.0]])
    layer = small_logistic_layer
    fit = layer.map_estimate()
    prior = layer.prior_hessian(fit.theta)
    np.testing.assert_array_equal(fit.hessian, posterior_precision(fit.loglik_hessian, prior))


def test_large_models_get_a_diagonal_curvature(monkeypatch, small_logistic_layer):
    """Beyond DENSE_HESSIAN_MAX_DIM no d x d matrix is built: L-BFGS on the full data and a
    Hutchinson diagonal (checked here against the dense Hessian's diagonal)."""
    import pymc_bigdata.model.laplace as laplace

    layer = small_logistic_layer
    dense = layer.map_estimate()
    monkeypatch.setattr(laplace, "DENSE_HESSIAN_MAX_DIM", 2)
    fit = layer.find_map()
    assert fit.loglik_hessian is None and fit.hessian.shape == (3,)
    assert_close(fit.theta, dense.theta, scale=1.0, rtol=1e-4, what="L-BFGS MAP")
    np.testing.assert_allclose(fit.hessian, np.diag(dense.hessian), rtol=0.5)


def test_set_data_makes_the_layer_stale():
    x = np.random.default_rng(43).standard_normal((200, 2))
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Normal("y", pm.math.dot(xd, b), 1.0, observed=x[:, 0])
    layer = pmbd.MinibatchModel(model)
    assert layer.data_is_current()
    with model:
        pm.set_data({"x": x + 1.0})
    assert not layer.data_is_current()


def test_held_variables_are_inputs_with_their_own_map():
    """A layer over the continuous variables of a model with a binary one holds it: the
    per-row terms follow the held value, and each held value gets its own MAP."""
    from pymc_bigdata.datasets import variable_selection_data, variable_selection_model

    X, y, _ = variable_selection_data(2_000, seed=3)
    model = variable_selection_model(X, y)
    layer = pmbd.MinibatchModel(model, vars=[model["beta"]])
    assert [v.name for v in layer.held_vars] == ["include"] and layer.dim == 6
    point = model.initial_point()
    point["include"] = np.array([1, 0, 1, 0, 1, 0])
    held = layer.held_from_point(point)
    assert layer.hold(held) and not layer.hold(held)
    rows = layer.take_rows(np.arange(50))
    beta = np.linspace(-0.1, 0.1, 6)
    mean = X[:50] @ (held * beta)
    np.testing.assert_allclose(
        layer.row_logp(beta, rows), -0.5 * (y[:50] - mean) ** 2 - 0.5 * np.log(2 * np.pi)
    )
    some = layer.map_estimate().theta.copy()
    layer.hold(np.ones(6))
    every = layer.map_estimate().theta
    assert np.all(some[held == 0] == pytest.approx(0.0, abs=1e-6))  # the prior's mode
    assert not np.allclose(every[held == 0], 0.0, atol=1e-4)
    layer.hold(held)
    np.testing.assert_array_equal(layer.map_estimate().theta, some)  # kept, not re-fitted
    with pytest.raises(pmbd.ModelNotSupportedError, match=r"'beta' is continuous"):
        pmbd.MinibatchModel(model, vars=[model["beta"]], discrete=True)


def test_influential_rows_stream_equals_thresholding_every_row(small_logistic):
    """The census's one-pass selection (bounded memory) picks the same rows as
    thresholding the N-entry influence: above factor x mean, the cap largest."""
    _, layer = small_logistic
    layer.chunk_rows, saved = 700, layer.chunk_rows  # several chunks
    try:
        rng = np.random.default_rng(3)
        theta = layer.map_estimate().theta
        directions = [0.05 * rng.standard_normal(layer.dim) for _ in range(3)]
        influence = layer.row_influence(theta, directions)
        for factor, cap in ((2.0, 10_000), (2.0, 7), (1.0, 50)):
            above = np.flatnonzero(influence > factor * influence.mean())
            expected = np.sort(above[np.argsort(influence[above])[::-1][:cap]])
            got = layer.influential_rows(theta, directions, factor, cap)
            np.testing.assert_array_equal(got, expected)
            assert len(got) > 0
    finally:
        layer.chunk_rows = saved
