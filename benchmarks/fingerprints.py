"""Fingerprints of every sampler's draws at fixed seeds: does a refactor keep behaviour?

Each sampler runs one short chain (200 tuning draws, 200 draws) on small fast targets at a
fixed seed; the script records a SHA-256 of the draws (posterior and sample stats, bit for
bit) and their means. Run it at two commits and compare the JSON files: a sampler whose
algorithm did not change must give identical hashes — on the same machine and packages
(``"environment"``: another CPU or BLAS changes round-off, and long chains part ways).

    bash scripts/venv.sh benchmarks/fingerprints.py OUT.json
    bash scripts/venv.sh benchmarks/fingerprints.py --compare A.json B.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import platform
import sys
import warnings
from collections.abc import Callable

import numpy as np
import pymc as pm

import pymc_bigdata as pmbd
from pymc_bigdata.demo import make_data

TUNE, DRAWS, SEED = 200, 200, 20261124


def logistic_model() -> pm.Model:
    """A 4,000-row, 3-coefficient logistic regression."""
    features, outcome = make_data(4_000, 3, 11, coef_sd=0.5)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=outcome)
    return model


def hierarchical_model() -> pm.Model:
    """A non-centred varying-intercept Gaussian model: 3,000 rows in 8 uneven groups."""
    rng = np.random.default_rng(5)
    sizes = np.array([5, 20, 50, 100, 300, 600, 900, 1025])
    group = np.repeat(np.arange(8), sizes)
    effects = rng.normal(0.5, 0.7, size=8)
    x = rng.normal(size=group.size)
    y = effects[group] + 0.4 * x + rng.normal(size=group.size)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=8)
        slope = pm.Normal("slope", 0.0, 1.0)
        pm.Normal("y", mu + tau * z[group] + slope * x, 1.0, observed=y)
    return model


def selection_model() -> pm.Model:
    """Two binary inclusion indicators over a 2,000-row Gaussian regression."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2_000, 2))
    y = 0.8 * x[:, 0] + rng.normal(size=2_000)
    with pm.Model() as model:
        g = pm.Bernoulli("g", 0.5, shape=2)
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        pm.Normal("y", pm.math.dot(x, g * beta), 1.0, observed=y)
    return model


SAMPLERS: dict[str, Callable[[pm.Model], object]] = {
    "SGLD": lambda m: pmbd.SGLD(),
    "SGHMC": lambda m: pmbd.SGHMC(),
    "SBPS": lambda m: pmbd.SBPS(),
    "pSBPS": lambda m: pmbd.pSBPS(),
    "HMCECS-perturbed": lambda m: pmbd.HMCECS(),
    "HMCECS-signed": lambda m: pmbd.HMCECS(estimator="signed"),
    "EWSG": lambda m: pmbd.EWSG(),
    "AusterityMH": lambda m: pmbd.AusterityMH(),
}

TARGETS: dict[str, Callable[[], pm.Model]] = {
    "logistic": logistic_model,
    "hierarchical": hierarchical_model,
}


def fingerprint(idata) -> dict:
    """SHA-256 of the posterior and sample-stats arrays (bit for bit) and the draws' means."""
    digest = hashlib.sha256()
    means, arrays = {}, {}
    for group in ("posterior", "sample_stats"):
        data = idata[group]
        for name in sorted(data.data_vars):
            values = np.asarray(data[name].values)
            if values.dtype == object:
                continue
            raw = np.ascontiguousarray(values).tobytes()
            digest.update(name.encode())
            digest.update(raw)
            arrays[f"{group}/{name}"] = hashlib.sha256(raw).hexdigest()[:16]
            if group == "posterior":
                means[name] = np.round(values.mean(axis=(0, 1)), 6).tolist()
    return {"sha256": digest.hexdigest(), "means": means, "arrays": arrays}


def run_one(model: pm.Model, make_step: Callable) -> dict:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = make_step(model)
        idata = pm.sample(
            step=step,
            tune=TUNE,
            draws=DRAWS,
            chains=1,
            cores=1,
            random_seed=SEED,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return fingerprint(idata)


def run_all(only: list[str] | None) -> dict:
    results = {}
    for target, build in TARGETS.items():
        for name, make_step in SAMPLERS.items():
            key = f"{target}/{name}"
            if only and not any(o in key for o in only):
                continue
            results[key] = run_one(build(), make_step)
            print(key, results[key]["sha256"][:16], flush=True)
    if not only or any("selection" in o for o in only):
        model = selection_model()
        with model:
            cont = model["beta"]
            binary = model["g"]

        def compound(m):
            return [pmbd.AusterityGibbs([binary]), pmbd.SGHMC([cont])]

        results["selection/AusterityGibbs+SGHMC"] = run_one(model, compound)
        print("selection/AusterityGibbs+SGHMC", results["selection/AusterityGibbs+SGHMC"])
    return results


def environment() -> dict[str, str]:
    """The CPU and the numerical packages, which fix the draws' round-off with the code."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    packages = ("numpy", "scipy", "pytensor", "pymc", "numba")
    return {"cpu": cpu, **{name: importlib.metadata.version(name) for name in packages}}


def compare(first: dict, second: dict) -> int:
    """Print each run as same or changed (with the arrays that changed); the number changed."""
    env_a, env_b = first.get("environment"), second.get("environment")
    if env_a != env_b:
        print(f"other environments (draws may differ by round-off): {env_a} vs {env_b}")
    a = {k: v for k, v in first.items() if k != "environment"}
    b = {k: v for k, v in second.items() if k != "environment"}
    changed = 0
    for key in sorted(set(a) | set(b)):
        same = key in a and key in b and a[key]["sha256"] == b[key]["sha256"]
        changed += not same
        which = ""
        if not same and key in a and key in b and "arrays" in a[key] and "arrays" in b[key]:
            arrays_a, arrays_b = a[key]["arrays"], b[key]["arrays"]
            which = " ".join(k for k in sorted(arrays_a) if arrays_a[k] != arrays_b.get(k))
        print(f"{'same   ' if same else 'CHANGED'} {key} {which}")
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="JSON file to write")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument("--only", nargs="*", help="substrings of target/sampler keys to run")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as fa, open(args.compare[1]) as fb:
            return 1 if compare(json.load(fa), json.load(fb)) else 0
    results = run_all(args.only) | {"environment": environment()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
