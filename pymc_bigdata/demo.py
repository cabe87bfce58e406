"""Demo: a 1,000,000-row, 30-coefficient logistic regression sampled with SGHMC defaults.

Run with ``python -m pymc_bigdata.demo`` (options: ``--rows``, ``--coefs``, ``--seed``).
Prints ``az.summary``, the wall time, and the error of the posterior mean and sd against
the Laplace approximation at the MAP (for 1e6 rows the Laplace approximation is accurate to
about 1/sqrt(N) posterior standard deviations, so it is a fair reference here).
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import numpy as np
import pymc as pm

import pymc_bigdata as pmbd


def make_data(
    n_rows: int, n_coefs: int, seed: int, coef_sd: float = 0.3
) -> tuple[np.ndarray, np.ndarray]:
    """Correlated Gaussian features (equicorrelation 0.5) and Bernoulli-logit outcomes."""
    rng = np.random.default_rng(seed)
    corr = 0.5 * np.ones((n_coefs, n_coefs)) + 0.5 * np.eye(n_coefs)
    features = rng.standard_normal((n_rows, n_coefs)) @ np.linalg.cholesky(corr).T
    true_beta = rng.normal(0.0, coef_sd, size=n_coefs)
    outcome = rng.binomial(1, 1.0 / (1.0 + np.exp(-features @ true_beta)))
    return features, outcome


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e6)
    parser.add_argument("--coefs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    features, outcome = make_data(int(args.rows), args.coefs, args.seed)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0, shape=args.coefs)
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=outcome)
        step = pmbd.SGHMC()
        setup = time.perf_counter()
        idata = pm.sample(step=step, random_seed=args.seed)
    done = time.perf_counter()

    print(az.summary(idata, var_names=["beta"]).to_string())
    laplace = step.layer.map_estimate()
    ref_sd = np.sqrt(np.diag(np.linalg.inv(laplace.hessian)))
    draws = idata.posterior["beta"].values.reshape(-1, args.coefs)
    mean_err = np.abs(draws.mean(axis=0) - laplace.theta) / ref_sd
    sd_ratio = draws.std(axis=0) / ref_sd
    ess = az.ess(idata, method="bulk")["beta"].values
    print(
        f"\nrows {int(args.rows):,}  coefficients {args.coefs}  "
        f"step size {step.step_size:.3g}  inner steps {step.inner_steps}  batch {step.batch_size}"
    )
    print(
        f"wall time {done - start:.1f} s (data + compile + MAP {setup - start:.1f} s, "
        f"sampling {done - setup:.1f} s)"
    )
    print(
        f"max |mean - Laplace| / sd = {mean_err.max():.3f};  "
        f"sd ratio in [{sd_ratio.min():.3f}, {sd_ratio.max():.3f}];  "
        f"min bulk ESS {ess.min():.0f}"
    )
    print(
        f"divergences {int(idata.sample_stats['diverging'].sum())};  data passes "
        f"{float(idata.sample_stats['data_fraction'].sum()):.1f} (after tuning)"
    )


if __name__ == "__main__":
    main()
