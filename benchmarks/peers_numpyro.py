"""Peer: NumPyro HMCECS (NUTS inner kernel, Taylor proxy at the MAP), when numpyro imports.

Compile is measured by a 5+5-draw warm-up call; wall is the full call after it (NumPyro
compiles inside ``run``; part of that compile may be cached from the warm-up call), and the
notes give ESS per second over wall + compile as well.  Passes ~ (leapfrog steps + one block
update per iteration) x subsample / N, with the tuning phase counted at the mean steps of
the kept draws.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from protocol import BATCH_SIZE, Config, Dataset
from reference import Reference
from scoring import MethodResult, failed, score_draws

HMCECS_INSTALL_HINT = "pip install numpyro jax"
#: the peer's name in the tables
NAME = "NumPyro HMCECS"
#: HMCECS's number of blocks of the subsample indices (NumPyro's example)
BLOCKS = 100
#: added to the run's seed
SEED_OFFSET = 71


def import_numpyro() -> SimpleNamespace | None:
    """``jax``, ``jax.numpy``, ``numpyro`` and the pieces of HMCECS, if installed.

    Returns
    -------
    SimpleNamespace or None
        Attributes ``jax``, ``jnp``, ``numpyro``, ``dist``, ``HMCECS``, ``MCMC`` and ``NUTS``;
        None if an import fails.
    """
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import HMCECS, MCMC, NUTS
    except ImportError:
        return None
    return SimpleNamespace(
        jax=jax, jnp=jnp, numpyro=numpyro, dist=dist, HMCECS=HMCECS, MCMC=MCMC, NUTS=NUTS
    )


def logistic_model(jx: SimpleNamespace, n_rows: int, dim: int) -> Callable[..., None]:
    """The benchmark's model in NumPyro, the likelihood in a subsampled plate.

    Parameters
    ----------
    jx
        What :func:`import_numpyro` returned.
    n_rows, dim
        Size of the data.

    Returns
    -------
    callable
        ``model(X, y, subsample_size)``.
    """
    jnp, numpyro, dist = jx.jnp, jx.numpyro, jx.dist

    def model(X: Any, y: Any, subsample_size: int) -> None:
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(dim), 1.0).to_event(1))
        with numpyro.plate("N", n_rows, subsample_size=subsample_size):
            xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            numpyro.sample("obs", dist.Bernoulli(logits=xb @ beta), obs=yb)

    return model


def hmcecs_sampler(
    jx: SimpleNamespace, data: Dataset, ref: Reference, config: Config
) -> Callable[[int, int], tuple[Any, float]]:
    """``sample(tune, draws) -> (mcmc, seconds)``: one timed NumPyro HMCECS run.

    Parameters
    ----------
    jx
        What :func:`import_numpyro` returned.
    data, ref, config
        The data set, its reference posterior (the proxy's centre) and the benchmark's
        settings.

    Returns
    -------
    callable
    """
    jax, jnp = jx.jax, jx.jnp
    taylor_proxy = jx.HMCECS.taylor_proxy  # second-order Taylor proxy around the reference point
    jax.config.update("jax_enable_x64", True)
    n_rows, dim = data.X.shape
    X, y = jnp.asarray(data.X), jnp.asarray(data.y, dtype=jnp.float64)
    model = logistic_model(jx, n_rows, dim)

    def sample(tune: int, draws: int) -> tuple[Any, float]:
        proxy = taylor_proxy({"beta": jnp.asarray(ref.map_theta)})
        kernel = jx.HMCECS(jx.NUTS(model), num_blocks=BLOCKS, proxy=proxy)
        mcmc = jx.MCMC(
            kernel,
            num_warmup=tune,
            num_samples=draws,
            num_chains=config.chains,
            chain_method="sequential",
            progress_bar=False,
        )
        t0 = time.perf_counter()
        mcmc.run(
            jax.random.PRNGKey(config.seed + SEED_OFFSET),
            X,
            y,
            BATCH_SIZE,
            extra_fields=("hmc_state.num_steps",),
        )
        return mcmc, time.perf_counter() - t0

    return sample


def run_hmcecs(data: Dataset, ref: Reference, config: Config) -> list[MethodResult]:
    """NumPyro HMCECS (NUTS inner kernel, Taylor proxy at the MAP), if numpyro imports.

    Parameters
    ----------
    data, ref, config
        The data set, its reference posterior and the benchmark's settings.

    Returns
    -------
    list of MethodResult
        One row.
    """
    jx = import_numpyro()
    if jx is None:
        print(f"  numpyro/jax not installed; to include HMCECS: {HMCECS_INSTALL_HINT}")
        return [MethodResult(method=NAME, status="not installed", notes=f"`{HMCECS_INSTALL_HINT}`")]
    sample = hmcecs_sampler(jx, data, ref, config)
    res = MethodResult(method=NAME, cores=1)
    tune, draws = config.ours_tune, config.ours_draws
    try:
        _, res.compile_s = sample(5, 5)
        mcmc, res.wall_s = sample(tune, draws)
        samples = np.asarray(mcmc.get_samples(group_by_chain=True)["beta"])
        steps = np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"])
    except Exception as exc:  # noqa: BLE001 - a failure is a result to report
        return [failed(res, exc)]
    iterations = config.chains * (tune + draws)
    res.passes = (float(steps.mean()) + 1.0) * iterations * BATCH_SIZE / data.n_rows
    res.setup_passes = 1.0
    score_draws(res, samples, ref)
    with_compile = res.min_ess / (res.wall_s + res.compile_s) if res.min_ess else math.nan
    res.extra = {"ess_per_s_with_compile": with_compile, "mean_steps": float(steps.mean())}
    res.notes = (
        f"{with_compile:.1f} ESS/s counting the warm-up call's compile as well; passes "
        f"approximate; {steps.mean():.0f} steps/draw; m={BATCH_SIZE}, G={BLOCKS}"
    )
    return [res]
