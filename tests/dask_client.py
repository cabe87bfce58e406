"""A client process for tests/test_distributed.py: the test's model and slow SGHMC step,
sampled with sample_dask on a running cluster into a store; the test kills this process
midway and resumes the run from the store.

Usage: python tests/dask_client.py SCHEDULER_ADDRESS STORE
"""

from __future__ import annotations

import sys
from pathlib import Path

import pymc as pm

sys.path.insert(0, str(Path(__file__).parent))

from conftest import logistic_data  # noqa: E402

import pymc_bigdata as pmbd  # noqa: E402

#: four chains of a few seconds each (at inner_steps=30)
SAMPLE = {"draws": 600, "tune": 300, "chains": 4, "random_seed": 20261126}


def build_model() -> pm.Model:
    """2,000-row, 3-coefficient logistic regression, with a Deterministic."""
    features, outcome = logistic_data(2_000, 3, seed=5)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Deterministic("odds_ratio", pm.math.exp(beta))
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=outcome)
    return model


def main(address: str, store: str) -> None:
    import distributed

    model = build_model()
    with model:
        step = pmbd.SGHMC(inner_steps=30)
    with distributed.Client(address, set_as_default=False) as client:
        pmbd.sample_dask(client, **SAMPLE, step=step, model=model, store=store)


if __name__ == "__main__":
    main(*sys.argv[1:3])
