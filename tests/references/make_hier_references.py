"""Reference posterior of ``big_hier_logistic`` (100,000 rows, 40 groups of 8 to 17,958 rows).

Full-data NUTS (PyMC's, no subsampling, nothing of pymc_bigdata), 4 chains, on the model
written partially centred by hand: ``w_j ~ Normal(c_j mu_a, tau^c_j)``,
``a_j = mu_a + tau^(1 - c_j) (w_j - c_j mu_a)`` with fixed ``c_j = h_j / (1 + h_j)``,
``h_j = 0.13 n_j`` (``n_j`` rows, ``p (1 - p) ~ 0.2`` at the mean intercept, ``tau^2 ~ 0.64``).
Any fixed ``c`` gives the same posterior of ``(mu_a, tau, slope, a)`` (a bijection with its
Jacobian in ``w``'s prior); this one spares NUTS both the funnel of the 8-row groups and the
ridge of the 18,000-row ones (in the non-centred form its trees ran to hundreds of steps).
Both parameterisations' variables come from the same draws (``a``, and
``z = (a - mu_a) / tau``). Stored as
``tests/references/big_hier_logistic.npz`` with the keys of the other references
(``<var>__mean``, ``__sd``, ``__mean_se``, ``__sd_se``) for ``mu_a``, ``tau_log__``,
``slope``, ``z`` and ``a``, and the run's metadata. Run from the repository root::

    OMP_NUM_THREADS=1 .venv/bin/python tests/references/make_big_hier_reference.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import REFERENCE_DIR, make_big_hier_logistic_data  # noqa: E402

DRAWS, TUNE, CHAINS, SEED, TARGET_ACCEPT = 2500, 1000, 4, 108, 0.9


def summaries(name: str, draws: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, sd and their Monte Carlo standard errors of ``draws`` (chain, draw, ...)."""
    data = az.convert_to_dataset({name: draws})
    mean_se = az.mcse(data, method="mean")[name].values
    sd_se = az.mcse(data, method="sd")[name].values
    flat = draws.reshape(-1, *draws.shape[2:])
    return {
        f"{name}__mean": np.ravel(flat.mean(axis=0)),
        f"{name}__sd": np.ravel(flat.std(axis=0)),
        f"{name}__mean_se": np.ravel(mean_se),
        f"{name}__sd_se": np.ravel(sd_se),
    }


def partially_centred_model() -> pm.Model:
    """``big_hier_logistic`` written with fixed centredness ``c_j`` (module docstring)."""
    group, X, y = make_big_hier_logistic_data()
    sizes = np.bincount(group)
    h = 0.13 * sizes
    c = h / (1.0 + h)
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=3)
        w = pm.Normal("w", c * mu_a, tau**c, shape=len(sizes))
        a = pm.Deterministic("a", mu_a + tau ** (1.0 - c) * (w - c * mu_a))
        pm.Deterministic("z", (a - mu_a) / tau)
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model


def main() -> None:
    model = partially_centred_model()
    start = time.time()
    with model:
        idata = pm.sample(
            DRAWS,
            tune=TUNE,
            chains=CHAINS,
            cores=1,
            target_accept=TARGET_ACCEPT,
            random_seed=SEED,
            progressbar=False,
        )
    wall = time.time() - start
    post = idata.posterior
    mu, tau, z, a = (post[v].values for v in ("mu_a", "tau", "z", "a"))
    out = {}
    out |= summaries("mu_a", mu)
    out |= summaries("tau_log__", np.log(tau))
    out |= summaries("slope", post["slope"].values)
    out |= summaries("z", z)
    out |= summaries("a", a)
    ess = az.ess(idata, method="bulk")
    min_ess = min(float(ess[v].values.min()) for v in ("mu_a", "tau", "slope", "z", "a"))
    divergences = int(idata.sample_stats["diverging"].values.sum())
    out |= {
        "method": np.array("nuts"),
        "n_draws": np.array(DRAWS * CHAINS),
        "seed": np.array(SEED),
        "target_accept": np.array(TARGET_ACCEPT),
        "wall_time_s": np.array(wall),
        "min_bulk_ess": np.array(min_ess),
        "divergences": np.array(divergences),
    }
    np.savez_compressed(REFERENCE_DIR / "big_hier_logistic.npz", **out)
    print(f"{wall:.0f} s, min bulk ESS {min_ess:.0f}, {divergences} divergences")


if __name__ == "__main__":
    main()
