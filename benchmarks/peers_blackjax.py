"""Peer: BlackJAX SGLD and SGHMC with control-variate gradients (when blackjax and jax import).

Minibatches of ``BATCH_SIZE`` rows drawn with replacement inside a ``lax.scan``; 2 chains
(``vmap``) from zero; second half kept, thinned to 1000 draws per chain.  The step size is
picked on :data:`PEER_GRID` (scaled by the largest eigenvalue of the Laplace precision, given
to the peers for free) by the error against the reference.  Reported twice: the best run
alone, and with the time of the whole scan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
from protocol import BATCH_SIZE, Config, Dataset
from reference import Reference
from scoring import MethodResult, failed, score_draws

#: step-size grid of the BlackJAX peers, as fractions of the stability limit scale
PEER_GRID = (0.03, 0.1, 0.2, 0.5, 1.0)
PEER_INSTALL_HINT = "pip install blackjax jax"
#: the two peers' names in the tables
NAMES = ("BlackJAX SGLD (CV)", "BlackJAX SGHMC (CV)")
#: leapfrog steps per SGHMC step
INNER_STEPS = 10
#: added to the run's seed
SEED_OFFSET = 53


def import_blackjax() -> SimpleNamespace | None:
    """``blackjax``, ``jax``, ``jax.numpy`` and BlackJAX's gradient estimators, if installed.

    Returns
    -------
    SimpleNamespace or None
        Attributes ``blackjax``, ``jax``, ``jnp`` and ``gradients``; None if an import fails.
    """
    try:
        import blackjax
        import jax
        import jax.numpy as jnp
        from blackjax.sgmcmc import gradients
    except ImportError:
        return None
    return SimpleNamespace(blackjax=blackjax, jax=jax, jnp=jnp, gradients=gradients)


@dataclass(frozen=True)
class Problem:
    """The data on JAX's device and the control-variate gradient estimator around the MAP."""

    X: Any
    y: Any
    n_rows: int
    dim: int
    cv_grad: Any
    cv_setup_s: float
    lam_max: float


@dataclass(frozen=True)
class PeerSpec:
    """One BlackJAX algorithm: its kernel, chain length and the unit of its step-size grid."""

    algorithm: Any
    n_steps: int
    grads_per_step: int
    unit: float


class GridRun(NamedTuple):
    """One step size of the grid: its score, factor, run time and kept draws."""

    score: float
    factor: float
    run_s: float
    draws: np.ndarray


def cv_problem(jx: SimpleNamespace, data: Dataset, ref: Reference) -> Problem:
    """Move the data to JAX (64-bit) and build the control-variate gradient at the MAP.

    Parameters
    ----------
    jx
        What :func:`import_blackjax` returned.
    data
        The data set.
    ref
        The reference posterior (its MAP and precision, given to the peers for free).

    Returns
    -------
    Problem
    """
    jax, jnp, gradients = jx.jax, jx.jnp, jx.gradients
    jax.config.update("jax_enable_x64", True)
    n_rows, dim = data.X.shape
    X, y = jnp.asarray(data.X), jnp.asarray(data.y, dtype=jnp.float64)
    lam_max = float(np.linalg.eigvalsh(ref.precision)[-1])

    def logprior(beta: Any) -> Any:
        return -0.5 * jnp.sum(beta**2)

    def loglik(beta: Any, row: tuple[Any, Any]) -> Any:
        x, yi = row
        eta = x @ beta
        return yi * eta - jnp.logaddexp(0.0, eta)

    make_estimator = getattr(gradients, "grad_estimator", None) or gradients.estimator
    t0 = time.perf_counter()
    centre = jnp.asarray(ref.map_theta)
    cv_grad = gradients.control_variates(make_estimator(logprior, loglik, n_rows), centre, (X, y))
    return Problem(X, y, n_rows, dim, cv_grad, time.perf_counter() - t0, lam_max)


def peer_specs(jx: SimpleNamespace, problem: Problem, config: Config) -> dict[str, PeerSpec]:
    """SGLD (``peer_steps`` steps) and SGHMC (as many gradients) by table name.

    Parameters
    ----------
    jx
        What :func:`import_blackjax` returned.
    problem
        The data and gradient estimator.
    config
        The benchmark's settings.

    Returns
    -------
    dict of str to PeerSpec
    """
    blackjax = jx.blackjax
    return {
        NAMES[0]: PeerSpec(
            blackjax.sgld(problem.cv_grad), config.peer_steps, 1, 1.0 / problem.lam_max
        ),
        NAMES[1]: PeerSpec(
            blackjax.sghmc(problem.cv_grad, num_integration_steps=INNER_STEPS),
            config.peer_steps // INNER_STEPS,
            INNER_STEPS,
            1.0 / math.sqrt(problem.lam_max),
        ),
    }


def chain_runner(jx: SimpleNamespace, problem: Problem, spec: PeerSpec) -> Callable[..., Any]:
    """``(keys, positions, step_size) -> traces`` of all chains (``vmap`` of a ``lax.scan``).

    Parameters
    ----------
    jx
        What :func:`import_blackjax` returned.
    problem
        The data and gradient estimator.
    spec
        The algorithm and its chain length.

    Returns
    -------
    callable
    """
    jax = jx.jax
    X, y, n_rows = problem.X, problem.y, problem.n_rows

    def run_chain(key: Any, position: Any, step_size: Any) -> Any:
        def body(pos: Any, k: Any) -> tuple[Any, Any]:
            k_rows, k_step = jax.random.split(k)
            idx = jax.random.randint(k_rows, (BATCH_SIZE,), 0, n_rows)
            pos = spec.algorithm.step(k_step, pos, (X[idx], y[idx]), step_size)
            return pos, pos

        _, trace = jax.lax.scan(body, position, jax.random.split(key, spec.n_steps))
        return trace

    return jax.vmap(run_chain, in_axes=(0, 0, None))


def grid_score(trial: MethodResult) -> float:
    """Worst of the mean error and the log sd ratios: what the grid search minimises.

    Parameters
    ----------
    trial
        A scored row.

    Returns
    -------
    float
    """
    return max(
        trial.max_mean_err,
        abs(math.log(trial.sd_ratio_min)),
        abs(math.log(trial.sd_ratio_max)),
    )


def scan_grid(
    compiled: Callable[..., Any], args: tuple[Any, Any], spec: PeerSpec, name: str, ref: Reference
) -> list[GridRun]:
    """Run the compiled chains at every step size of :data:`PEER_GRID` and score each.

    Parameters
    ----------
    compiled
        The compiled :func:`chain_runner`.
    args
        Its keys and initial positions.
    spec
        The algorithm, its chain length and step-size unit.
    name
        The peer's table name.
    ref
        The reference posterior.

    Returns
    -------
    list of GridRun
        Score ``inf`` where the draws are not finite.
    """
    keep = spec.n_steps // 2
    thin = max(1, keep // 1000)
    grid = []
    for factor in PEER_GRID:
        t0 = time.perf_counter()
        trace = np.asarray(compiled(*args, factor * spec.unit))
        run_s = time.perf_counter() - t0
        draws = trace[:, spec.n_steps - keep :: thin]
        score = math.inf
        if np.isfinite(draws).all():
            score = grid_score(score_draws(MethodResult(method=name), draws, ref))
        grid.append(GridRun(score, factor, run_s, draws))
    return grid


def peer_rows(
    name: str,
    spec: PeerSpec,
    problem: Problem,
    grid: list[GridRun],
    compile_s: float,
    ref: Reference,
    config: Config,
) -> list[MethodResult]:
    """The best step size's row, alone and with the time and passes of the whole grid.

    Parameters
    ----------
    name
        The peer's table name.
    spec, problem
        The algorithm and the data it ran on.
    grid
        What :func:`scan_grid` returned.
    compile_s
        Compilation time of the chains.
    ref, config
        The reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        Two rows.
    """
    best = min(grid, key=lambda g: g.score)
    scan_s = sum(g.run_s for g in grid)
    passes = config.chains * spec.n_steps * spec.grads_per_step * BATCH_SIZE / problem.n_rows
    thin = max(1, (spec.n_steps // 2) // 1000)
    results = []
    for with_scan in (False, True):
        out = MethodResult(
            method=name + (" incl. step-size scan" if with_scan else ""),
            cores=1,
            setup_s=problem.cv_setup_s,
            compile_s=compile_s,
            wall_s=(scan_s if with_scan else best.run_s) + problem.cv_setup_s,
            passes=passes * (len(grid) if with_scan else 1),
            setup_passes=1.0,
        )
        if math.isfinite(best.score):
            score_draws(out, best.draws, ref)
        else:
            out.status = "failed: every step size on the grid diverged"
        out.notes = f"step={best.factor:g}x{spec.unit:.3g}, {spec.n_steps} steps/chain" + (
            f", {len(grid)} grid runs" if with_scan else ""
        )
        out.extra = {
            "grid": [{"factor": g.factor, "score": g.score, "run_s": g.run_s} for g in grid],
            "step_size": best.factor * spec.unit,
            "n_steps": spec.n_steps,
            "thin": thin,
        }
        results.append(out)
    return results


def run_peer(
    jx: SimpleNamespace,
    name: str,
    spec: PeerSpec,
    problem: Problem,
    ref: Reference,
    config: Config,
) -> list[MethodResult]:
    """Compile one peer's chains, search its step size, and report the best.

    Parameters
    ----------
    jx
        What :func:`import_blackjax` returned.
    name, spec
        The peer's table name and algorithm.
    problem
        The data and gradient estimator.
    ref, config
        The reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        Two rows (:func:`peer_rows`), or one failed row.
    """
    jax, jnp = jx.jax, jx.jnp
    keys = jax.random.split(jax.random.PRNGKey(config.seed + SEED_OFFSET), config.chains)
    inits = jnp.zeros((config.chains, problem.dim))
    res = MethodResult(method=name, cores=1)
    try:
        t0 = time.perf_counter()
        compiled = jax.jit(chain_runner(jx, problem, spec)).lower(keys, inits, 1.0).compile()
        res.compile_s = time.perf_counter() - t0
        grid = scan_grid(compiled, (keys, inits), spec, name, ref)
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        return [failed(res, exc)]
    return peer_rows(name, spec, problem, grid, res.compile_s, ref, config)


def run_blackjax(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """BlackJAX SGLD and SGHMC with control-variate gradients, if blackjax and jax import.

    Parameters
    ----------
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        Two rows per peer, or a "not installed" row each.
    """
    jx = import_blackjax()
    if jx is None:
        print(f"  blackjax/jax not installed; to include them: {PEER_INSTALL_HINT}")
        return [
            MethodResult(method=n, status="not installed", notes=f"`{PEER_INSTALL_HINT}`")
            for n in NAMES
        ]
    problem = cv_problem(jx, data, ref)
    results = []
    for name, spec in peer_specs(jx, problem, config).items():
        results += run_peer(jx, name, spec, problem, ref, config)
    return results
