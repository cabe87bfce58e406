"""Compute the reference posteriors of ``tests/hard_models.py`` and store them small.

Run from the repository root (one process, one core; a few minutes per model)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/references/make_references.py [names...]
    .venv/bin/python tests/references/make_references.py --report [names...]

With no names it does every model of ``HARD_MODELS``; ``--report`` only prints the table
of the stored files. Each ``tests/references/<name>.npz`` holds, for every free variable,
every unconstrained value variable (``sigma_log__``, ``tau_log__``) and the Deterministic
``a`` of the non-centred model, flattened arrays ``<var>__mean``, ``<var>__sd`` (population
sd over all draws, or the weighted sd), ``<var>__mean_se`` and ``<var>__sd_se`` (Monte
Carlo standard errors of the reference itself), ``<var>__laplace_mean`` and
``<var>__laplace_sd`` for value variables and Deterministics (MAP and inverse-Hessian sd of
``model.logp(jacobian=True)`` in the unconstrained space; delta method for
Deterministics), and metadata (``method``, ``n_draws``, ``seed``, ``wall_time_s``, ...).

Methods:

* ``nuts``: ``pm.sample(draws, tune=2000, chains=4, cores=1, target_accept, random_seed)``,
  standard errors ``az.mcse(method="mean")`` and ``az.mcse(method="sd")``, value variables
  by transforming the draws (log for the positive scales).
* ``laplace_is`` (the 500,000-row rare-event model): self-normalised importance sampling
  from a multivariate Student-t (df 4) centred at the MAP with the Laplace covariance
  inflated by 1.5^2, the log posterior computed in numpy in row chunks; standard errors by
  the delta method, ``mean_se = max(sqrt(sum w^2 (x - m)^2), sd / sqrt(ESS))`` and
  ``sd_se = max(sqrt(sum w^2 ((x - m)^2 - sd^2)^2) / (2 sd), sd sqrt((kurt - 1) / (4 ESS)))``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import scipy.optimize
from pymc.blocking import DictToArrayBijection, RaveledVars
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import (  # noqa: E402
    HARD_MODELS,
    REFERENCE_DIR,
    load_reference,
    make_hier_logistic_data,
    make_rare_event_logistic_data,
    make_scale_regression_data,
    rare_event_logistic_model,
)

#: per model: method and its settings (NUTS draws are per chain, 4 chains)
SETTINGS: dict[str, dict] = {
    "skewed_logistic": {"method": "nuts", "draws": 15_000, "target_accept": 0.95, "seed": 101},
    "scale_regression": {"method": "nuts", "draws": 12_500, "target_accept": 0.95, "seed": 102},
    "scale_few_rows": {"method": "nuts", "draws": 15_000, "target_accept": 0.95, "seed": 103},
    "hier_logistic_centred": {
        "method": "nuts",
        "draws": 15_000,
        "target_accept": 0.99,
        "seed": 104,
    },
    "hier_logistic_noncentred": {
        "method": "nuts",
        "draws": 10_000,
        "target_accept": 0.95,
        "seed": 105,
    },
    "sbps_paper_logistic": {
        "method": "nuts",
        "draws": 15_000,
        "target_accept": 0.95,
        "seed": 107,
    },
    "rare_event_logistic": {
        "method": "laplace_is",
        "n_draws": 60_000,
        "df": 4.0,
        "inflation": 1.5,
        "seed": 106,
    },
}
TUNE = 2000
CHAINS = 4
#: the target on every reference sd: its Monte Carlo standard error below 0.7% of it
SD_SE_TARGET = 0.007


# ---------------------------------------------------------------------------------------------
# Laplace approximation in the unconstrained space


def laplace_fit(model: pm.Model) -> dict:
    """MAP and inverse negative Hessian of ``model.logp(jacobian=True)`` over the value
    variables (the unconstrained space PyMC samples in).

    Returns a dict with ``theta`` (flat MAP), ``cov``, ``precision``, ``grad_norm`` (at the
    MAP), ``slices`` (value-variable name -> (slice, shape)), ``point`` (MAP as a point
    dict) and ``unravel`` (flat vector -> point dict).
    """
    start = model.initial_point()
    names = [v.name for v in model.value_vars]
    x0 = DictToArrayBijection.map({n: start[n] for n in names})
    info = x0.point_map_info

    def unravel(x: np.ndarray) -> dict[str, np.ndarray]:
        return DictToArrayBijection.rmap(RaveledVars(x, info))

    logp = model.compile_logp(jacobian=True)
    dlogp = model.compile_dlogp(jacobian=True)
    hess_fn = model.compile_d2logp(jacobian=True, negate_output=False)

    def fun(x):
        return -float(logp(unravel(x)))

    def jac(x):
        return -np.asarray(dlogp(unravel(x)), dtype=float)

    def hess(x):
        return -np.asarray(hess_fn(unravel(x)), dtype=float)

    res = scipy.optimize.minimize(
        fun, x0.data, jac=jac, method="L-BFGS-B", options={"maxiter": 5000}
    )
    res = scipy.optimize.minimize(fun, res.x, jac=jac, hess=hess, method="trust-exact")
    theta = res.x
    for _ in range(5):  # Newton polish
        theta = theta - np.linalg.solve(hess(theta), jac(theta))
    precision = hess(theta)
    cov = np.linalg.inv(precision)
    slices, pos = {}, 0
    for name, shape, size, _ in info:
        slices[name] = (slice(pos, pos + size), shape)
        pos += size
    return {
        "theta": theta,
        "cov": cov,
        "precision": precision,
        "grad_norm": float(np.linalg.norm(jac(theta))),
        "slices": slices,
        "point": unravel(theta),
        "unravel": unravel,
    }


def laplace_summaries(model: pm.Model, fit: dict) -> dict[str, np.ndarray]:
    """``<var>__laplace_mean`` / ``__laplace_sd`` for value variables and Deterministics."""
    out = {}
    sd = np.sqrt(np.diag(fit["cov"]))
    for name, (sl, _) in fit["slices"].items():
        out[f"{name}__laplace_mean"] = fit["theta"][sl]
        out[f"{name}__laplace_sd"] = sd[sl]
    for det in model.deterministics:
        graph = model.replace_rvs_by_values([det])[0]
        fn = model.compile_fn(graph, inputs=model.value_vars, on_unused_input="ignore")
        value = np.ravel(fn(fit["point"]))
        step = 1e-5
        jac = np.empty((value.size, fit["theta"].size))
        for j in range(fit["theta"].size):
            e = np.zeros_like(fit["theta"])
            e[j] = step
            up = np.ravel(fn(fit["unravel"](fit["theta"] + e)))
            down = np.ravel(fn(fit["unravel"](fit["theta"] - e)))
            jac[:, j] = (up - down) / (2 * step)
        out[f"{det.name}__laplace_mean"] = value
        out[f"{det.name}__laplace_sd"] = np.sqrt(np.einsum("ij,jk,ik->i", jac, fit["cov"], jac))
    return out


# ---------------------------------------------------------------------------------------------
# cheaper models with the same posterior, for the long NUTS runs


class GroupedBernoulliLogit(Op):
    """``sum_i y_i eta_i - log(1 + exp(eta_i))``, ``eta = repeat(a, sizes) + slope * x``.

    Outputs the sum and its gradients in ``a`` and ``slope``, in one pass. ``log(1 + exp)``
    and the sigmoid are evaluated in float32 (numpy's float32 ``exp``/``log`` are SIMD,
    its float64 ones are not: about 4x cheaper than the PyTensor graph here) and summed in
    float64: the sum moves by ~1e-5, a change of the target density by a factor
    ``exp(1e-5)``. The gradient only steers the leapfrog steps (the accept step uses the
    sum), so its float32 rounding does not bias NUTS. Rows must be sorted by group.
    """

    def __init__(self, sizes: np.ndarray, x: np.ndarray, y: np.ndarray):
        self.sizes = np.asarray(sizes)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.x = np.asarray(x, dtype=float)
        self.x32 = self.x.astype(np.float32)
        self.y = np.asarray(y, dtype=float)
        self.y32 = self.y.astype(np.float32)

    def make_node(self, a, slope):
        a = pt.as_tensor_variable(a).astype("float64")
        slope = pt.as_tensor_variable(slope).astype("float64")
        return Apply(self, [a, slope], [pt.dscalar(), pt.dvector(), pt.dscalar()])

    def perform(self, node, inputs, outputs):
        a, slope = inputs
        eta = np.repeat(a, self.sizes) + slope * self.x
        yeta = self.y @ eta
        e = eta.astype(np.float32)
        if np.all(np.abs(e) < 60.0):
            np.exp(e, out=e)
            u = e + np.float32(1.0)
            logp = yeta - np.log(u).sum(dtype=np.float64)
            resid = self.y32 - e / u
        else:  # far tails (early warm-up): stable float64
            logp = yeta - np.logaddexp(0.0, eta).sum()
            resid = self.y - 1.0 / (1.0 + np.exp(-eta))
        outputs[0][0] = np.asarray(logp, dtype=np.float64)
        outputs[1][0] = np.add.reduceat(resid, self.starts, dtype=np.float64)
        outputs[2][0] = np.asarray(float(resid @ self.x32), dtype=np.float64)

    def pullback(self, inputs, outputs, output_grads):
        return [output_grads[0] * outputs[1], output_grads[0] * outputs[2]]


def scale_regression_equivalent() -> pm.Model:
    """``scale_regression`` with the likelihood from sufficient statistics
    (``X^T X``, ``X^T y``, ``y^T y``): the same log density up to a constant."""
    X, y = make_scale_regression_data()
    xtx, xty, yty, n = X.T @ X, X.T @ y, y @ y, len(y)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=X.shape[1])
        sigma = pm.HalfStudentT("sigma", nu=3, sigma=1.0)
        rss = yty - 2.0 * pt.dot(xty, b) + pt.dot(b, pt.dot(xtx, b))
        pm.Potential("y", -n * pt.log(sigma) - rss / (2.0 * sigma**2))
    return model


def hier_logistic_equivalent(centred: bool) -> pm.Model:
    """``hier_logistic`` with the Bernoulli likelihood as ``GroupedBernoulliLogit``."""
    group, x, y = make_hier_logistic_data()
    assert np.all(np.diff(group) >= 0), "rows must be sorted by group"
    sizes = np.bincount(group)
    like = GroupedBernoulliLogit(sizes, x, y)
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0)
        if centred:
            a = pm.Normal("a", mu_a, tau, shape=len(sizes))
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=len(sizes))
            a = pm.Deterministic("a", mu_a + tau * z)
        pm.Potential("y", like(a, slope)[0])
    return model


#: models sampled in place of the registry's (same free variables, same posterior)
EQUIVALENTS = {
    "scale_regression": (scale_regression_equivalent, "sufficient statistics"),
    "hier_logistic_centred": (
        lambda: hier_logistic_equivalent(True),
        "likelihood as a float32 numpy Op",
    ),
    "hier_logistic_noncentred": (
        lambda: hier_logistic_equivalent(False),
        "likelihood as a float32 numpy Op",
    ),
}
COMPILE: dict = {}  # default backend (Numba; the Op above runs in object mode)


def check_equivalent(model: pm.Model, other: pm.Model, fit: dict, seed: int) -> dict:
    """Compare ``logp`` (up to a constant) and ``dlogp`` of two models at 8 points drawn
    from the Laplace fit; raise if they differ by more than 1e-3."""
    rng = np.random.default_rng(seed)
    chol = np.linalg.cholesky(fit["cov"])
    probes = fit["theta"] + 2.0 * rng.standard_normal((8, len(fit["theta"]))) @ chol.T
    fns = [
        (m.compile_logp(jacobian=True, **kw), m.compile_dlogp(jacobian=True, **kw))
        for m, kw in ((model, {}), (other, COMPILE))
    ]
    lp = np.array([[f[0](fit["unravel"](t)) for t in probes] for f in fns])
    grads = np.array([[f[1](fit["unravel"](t)) for t in probes] for f in fns])
    out = {
        "logp_diff_ptp": float(np.ptp(lp[0] - lp[1])),
        "grad_max_diff": float(np.max(np.abs(grads[0] - grads[1]))),
        "grad_max": float(np.max(np.abs(grads[0]))),
    }
    print(f"equivalent model check: {out}", flush=True)
    assert out["logp_diff_ptp"] < 1e-3 and out["grad_max_diff"] < 1e-3 * (1 + out["grad_max"])
    return out


# ---------------------------------------------------------------------------------------------
# NUTS references


def value_var_draws(model: pm.Model, idata) -> dict[str, np.ndarray]:
    """Draws (chain, draw, *shape) of free RVs, their value variables and Deterministics."""
    post = idata.posterior
    out = {}
    for rv in model.free_RVs:
        draws = post[rv.name].values
        out[rv.name] = draws
        value = model.rvs_to_values[rv]
        transform = model.rvs_to_transforms.get(rv)
        if transform is None:
            continue
        if type(transform).__name__ != "LogTransform":
            raise NotImplementedError(f"{rv.name}: transform {transform} not supported")
        out[value.name] = np.log(draws)
    for det in model.deterministics:
        out[det.name] = post[det.name].values
    return out


def draw_summaries(draws: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Mean, sd (over all chains and draws) and their MCSEs, flattened per variable."""
    out = {}
    for name, x in draws.items():
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        out[f"{name}__mean"] = flat.mean(axis=(0, 1))
        out[f"{name}__sd"] = flat.std(axis=(0, 1))
        out[f"{name}__mean_se"] = np.atleast_1d(az.mcse(flat, method="mean"))
        out[f"{name}__sd_se"] = np.atleast_1d(az.mcse(flat, method="sd"))
        out[f"{name}__ess_bulk"] = np.atleast_1d(az.ess(flat, method="bulk"))
        out[f"{name}__rhat"] = np.atleast_1d(az.rhat(flat))
    return out


def nuts_reference(name: str, settings: dict) -> dict[str, np.ndarray]:
    model = HARD_MODELS[name]()
    fit = laplace_fit(model)
    sampled, check = model, {}
    if name in EQUIVALENTS:
        sampled = EQUIVALENTS[name][0]()
        check = check_equivalent(model, sampled, fit, settings["seed"])
    start = time.perf_counter()
    with sampled:
        idata = pm.sample(
            draws=settings["draws"],
            tune=TUNE,
            chains=CHAINS,
            cores=1,
            target_accept=settings["target_accept"],
            random_seed=settings["seed"],
            progressbar=False,
            compute_convergence_checks=False,
            compile_kwargs=COMPILE,
        )
    wall = time.perf_counter() - start
    stats = idata.sample_stats
    out = draw_summaries(value_var_draws(sampled, idata))
    out.update(laplace_summaries(model, fit))
    out.update(
        method=np.array("nuts"),
        n_draws=np.array(CHAINS * settings["draws"]),
        n_chains=np.array(CHAINS),
        tune=np.array(TUNE),
        seed=np.array(settings["seed"]),
        target_accept=np.array(settings["target_accept"]),
        divergences=np.array(int(stats["diverging"].values.sum())),
        max_tree_depth=np.array(int(stats["tree_depth"].values.max())),
        mean_tree_depth=np.array(float(stats["tree_depth"].values.mean())),
        step_size=np.array(stats["step_size"].values[:, -1]),
        laplace_grad_norm=np.array(fit["grad_norm"]),
        wall_time_s=np.array(wall),
        sampled_model=np.array(EQUIVALENTS[name][1] if name in EQUIVALENTS else "as built"),
        **{f"equivalence_{k}": np.array(v) for k, v in check.items()},
    )
    if name == "scale_regression":
        out.update(scale_regression_exact())
    return out


def scale_regression_exact(n_grid: int = 2001) -> dict[str, np.ndarray]:
    """Exact posterior moments of ``scale_regression`` by quadrature over ``log sigma``.

    Given ``sigma``, ``b`` is Gaussian (precision ``I + X^T X / sigma^2``) and the marginal
    likelihood is closed-form (eigenvalues of ``X^T X``), so the posterior of
    ``s = log sigma`` is one-dimensional: a fine grid gives the mean and sd of ``b``,
    ``sigma`` and ``sigma_log__`` to ~1e-10. Stored as ``<var>__exact_mean``/``__exact_sd``
    to check the NUTS reference.
    """
    X, y = make_scale_regression_data()
    n = len(y)
    lam, vecs = np.linalg.eigh(X.T @ X)
    c = vecs.T @ (X.T @ y)
    yty = y @ y

    def log_post(s):
        s2 = np.exp(2 * s)[:, None]
        loglik = (
            -n * s
            - 0.5 * np.log1p(lam / s2).sum(axis=1)
            - 0.5 * (yty / s2[:, 0] - (c**2 / (s2 * (s2 + lam))).sum(axis=1))
        )
        return loglik - 2.0 * np.log1p(np.exp(2 * s) / 3.0) + s  # HalfStudentT(3, 1), Jacobian

    coarse = np.linspace(-3.0, 3.0, 6001)
    lp = log_post(coarse)
    mode = coarse[np.argmax(lp)]
    grid = np.linspace(mode - 0.2, mode + 0.2, n_grid)
    lp = log_post(grid)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    assert w[0] < 1e-30 and w[-1] < 1e-30, "grid too narrow"
    s2 = np.exp(2 * grid)[:, None]
    mean_b = (c / (s2 + lam)) @ vecs.T  # (grid, k)
    var_b = (s2 / (s2 + lam)) @ (vecs.T**2)
    out = {}
    for name, x, var in (
        ("sigma_log__", grid[:, None], 0.0),
        ("sigma", np.exp(grid)[:, None], 0.0),
        ("b", mean_b, var_b),
    ):
        m = w @ x
        out[f"{name}__exact_mean"] = m
        out[f"{name}__exact_sd"] = np.sqrt(w @ (var + x**2) - m**2)
    return out


# ---------------------------------------------------------------------------------------------
# importance-sampling reference for the rare-event model


def rare_event_log_posterior(X: np.ndarray, y: np.ndarray, prior_sd: float = 5.0):
    """Exact (up to a constant) log posterior of ``rare_event_logistic_model``.

    ``sum_i y_i eta_i`` is ``(X^T y) . beta``; ``sum_i log(1 + exp(eta_i))`` is summed in
    chunks of 2,048 rows, in float32 (it is a sum of 500,000 terms ~1e-3, so float32
    rounding moves the total by ~1e-5 at most; ``check`` compares with float64
    ``np.logaddexp`` on a subset) and accumulated in float64. Where a chunk has an
    ``eta > 30`` it falls back to float64 ``np.logaddexp``.
    """
    Xty = X.T @ y
    X32 = X.astype(np.float32)
    chunk = 2048

    def log_post(thetas: np.ndarray, exact: bool = False) -> np.ndarray:
        thetas = np.atleast_2d(thetas)
        total = thetas @ Xty - 0.5 * np.sum((thetas / prior_sd) ** 2, axis=1)
        t32 = thetas.T.astype(np.float32)
        for lo in range(0, len(X), chunk):
            if exact:
                eta = X[lo : lo + chunk] @ thetas.T
                total -= np.logaddexp(0.0, eta).sum(axis=0)
                continue
            eta = X32[lo : lo + chunk] @ t32
            if eta.max() > 30.0:
                eta64 = X[lo : lo + chunk] @ thetas.T
                total -= np.logaddexp(0.0, eta64).sum(axis=0)
                continue
            np.exp(eta, out=eta)
            eta += 1.0
            np.log(eta, out=eta)
            total -= eta.sum(axis=0, dtype=np.float64)
        return total

    return log_post


def importance_reference(name: str, settings: dict) -> dict[str, np.ndarray]:
    X, y = make_rare_event_logistic_data()
    model = rare_event_logistic_model(X, y)
    fit = laplace_fit(model)
    log_post = rare_event_log_posterior(X, y)
    theta_map, d = fit["theta"], len(fit["theta"])
    df, inflation = settings["df"], settings["inflation"]
    chol = np.linalg.cholesky(fit["cov"]) * inflation

    # the numpy log posterior must equal PyMC's up to a constant
    logp = model.compile_logp(jacobian=True)
    rng = np.random.default_rng(settings["seed"] + 1)
    probe = theta_map + rng.standard_normal((4, d)) @ chol.T
    pymc_lp = np.array([logp(fit["unravel"](t)) for t in probe])
    diff = log_post(probe, exact=True) - pymc_lp
    assert np.ptp(diff) < 1e-6, f"numpy log posterior differs from PyMC's: {diff}"

    start = time.perf_counter()
    rng = np.random.default_rng(settings["seed"])
    n_draws, batch = settings["n_draws"], 1000
    draws = np.empty((n_draws, d))
    log_w = np.empty(n_draws)
    for lo in range(0, n_draws, batch):
        hi = min(lo + batch, n_draws)
        white = (
            rng.standard_normal((hi - lo, d)) * np.sqrt(df / rng.chisquare(df, hi - lo))[:, None]
        )
        draws[lo:hi] = theta_map + white @ chol.T
        log_q = -0.5 * (df + d) * np.log1p(np.sum(white**2, axis=1) / df)
        log_w[lo:hi] = log_post(draws[lo:hi]) - log_q
    wall = time.perf_counter() - start
    # float32 check on a subset
    sub = draws[:200]
    f32_err = log_post(sub) - log_post(sub, exact=True)
    f32_err = float(np.max(np.abs(f32_err - f32_err.mean())))

    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    ess = 1.0 / np.sum(w**2)
    mean = w @ draws
    dev = draws - mean
    var = w @ dev**2
    sd = np.sqrt(var)
    kurt = (w @ dev**4) / var**2
    mean_se = np.maximum(np.sqrt(w**2 @ dev**2), sd / np.sqrt(ess))
    sd_se = np.maximum(
        np.sqrt(w**2 @ (dev**2 - var) ** 2) / (2 * sd), sd * np.sqrt((kurt - 1) / (4 * ess))
    )
    try:
        from arviz_stats.base import array_stats

        khat = float(
            array_stats.pareto_khat(log_w, chain_axis=None, tail="right", log_weights=True)
        )
    except Exception:  # the diagnostic is optional
        khat = np.nan

    out = {"beta__mean": mean, "beta__sd": sd, "beta__mean_se": mean_se, "beta__sd_se": sd_se}
    out.update(laplace_summaries(model, fit))
    out.update(
        method=np.array("laplace_is"),
        n_draws=np.array(n_draws),
        seed=np.array(settings["seed"]),
        proposal_df=np.array(df),
        proposal_inflation=np.array(inflation),
        is_ess=np.array(ess),
        is_khat=np.array(khat),
        beta__kurtosis=kurt,
        float32_max_error=np.array(f32_err),
        laplace_grad_norm=np.array(fit["grad_norm"]),
        wall_time_s=np.array(wall),
    )
    return out


# ---------------------------------------------------------------------------------------------
# report


def value_names(ref: dict[str, np.ndarray]) -> list[str]:
    """Variables with a Laplace fit (value variables and Deterministics), file order."""
    return [k[: -len("__laplace_mean")] for k in ref if k.endswith("__laplace_mean")]


def report(name: str, ref: dict[str, np.ndarray], path: Path | None = None) -> str:
    lines = [f"== {name}  ({ref['method']}, {int(ref['n_draws']):,} draws"]
    if "divergences" in ref:
        lines[0] += f", {int(ref['divergences'])} divergences"
        lines[0] += f", mean tree depth {float(ref['mean_tree_depth']):.1f}"
    if "is_ess" in ref:
        lines[0] += f", weight ESS {float(ref['is_ess']):,.0f}, khat {float(ref['is_khat']):.2f}"
    lines[0] += f", {float(ref['wall_time_s']):.0f} s"
    if path is not None:
        lines[0] += f", {path.stat().st_size:,} bytes"
    worst = max(float(np.max(ref[k] / ref[k[:-3]])) for k in ref if k.endswith("__sd_se"))
    lines[0] += f", max sd_se/sd {100 * worst:.2f}%)"
    if worst > SD_SE_TARGET:
        lines.append(f"WARNING: a reference sd has MCSE above {100 * SD_SE_TARGET}% of it")
    lines.append(
        f"{'coordinate':<16}{'ref mean':>10}{'ref sd':>9}{'Lap mean':>10}{'Lap sd':>9}"
        f"{'|dmean|/sd':>11}{'sd ratio':>9}{'±2se':>7}"
    )
    for var in value_names(ref):
        m, s = ref[f"{var}__mean"], ref[f"{var}__sd"]
        lm, ls = ref[f"{var}__laplace_mean"], ref[f"{var}__laplace_sd"]
        m_se, s_se = ref[f"{var}__mean_se"], ref[f"{var}__sd_se"]
        for i in range(m.size):
            label = var if m.size == 1 else f"{var}[{i}]"
            dmean = abs(lm[i] - m[i]) / s[i]
            ratio = ls[i] / s[i]
            flag = " *" if dmean > 0.1 or abs(ratio - 1) > 0.05 else ""
            lines.append(
                f"{label:<16}{m[i]:>10.4f}{s[i]:>9.4f}{lm[i]:>10.4f}{ls[i]:>9.4f}"
                f"{dmean:>11.3f}{ratio:>9.3f}{2 * max(m_se[i], s_se[i]) / s[i]:>7.3f}{flag}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"default: all of {list(HARD_MODELS)}")
    parser.add_argument("--report", action="store_true", help="only print the stored files")
    parser.add_argument("--draws", type=int, help="override draws (per chain, or IS draws)")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR)
    args = parser.parse_args(argv)
    names = args.names or list(HARD_MODELS)
    for name in names:
        path = args.out / f"{name}.npz"
        if not args.report:
            settings = dict(SETTINGS[name])
            if args.draws:
                settings["n_draws" if settings["method"] == "laplace_is" else "draws"] = args.draws
            if settings["method"] == "nuts":
                ref = nuts_reference(name, settings)
            else:
                ref = importance_reference(name, settings)
            args.out.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(path, **ref)
        ref = load_reference(name) if args.out == REFERENCE_DIR else dict(np.load(path))
        print(report(name, ref, path), flush=True)


if __name__ == "__main__":
    main()
