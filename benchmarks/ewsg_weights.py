"""EWSG's index weights on toy targets: what each does to the stationary law (docs/ewsg.md).

Run from the repository root::

    .venv/bin/python benchmarks/ewsg_weights.py

Pure numpy (the kernel of :mod:`pymc_bigdata.kernels.ewsg`), no model:

1. **Unit Gaussian, noisy gradients.** Candidate gradients ``-z + e`` with ``e`` Gaussian or
   centred-exponential (skewness 2) at noise shares ``s`` of 0.077, 0.309 and 1.0; OBABO,
   ``h = 0.3``, ``gamma = 1``, 20,000 independent chains of 300 steps from ``(0, 0)``. The
   stationary position variance (Gaussian noise) and mean (skewed noise) for uniform
   minibatches (``M = 0``) and both weights with ``M`` in 1, 3, 20. Monte Carlo sd: about
   0.013 for a variance, 0.007 for a mean.
2. **The paper's Gaussian experiment** (Sec. 5.1): 20 data ``c_i ~ N(0, I_2)``, one datum per
   candidate, Euler-Maruyama with ``h = 0.05``, ``gamma = 10``, 30 data passes, 10,000
   realizations per dataset; KL of the fitted Gaussian from the posterior, mean over
   datasets 0-9 (the kernel test's code).

Writes ``benchmarks/results/ewsg_weights.md`` and ``.json`` (with the commit).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import numpy as np

from pymc_bigdata.kernels.ewsg import EWSGState, ewsg_steps, momentum_update

RESULTS = Path(__file__).resolve().parent / "results"
SHARES = (0.077, 0.309, 1.0)
SETTINGS = [("uniform", 0)] + [(w, m) for w in ("paper", "linear") for m in (1, 3, 20)]


def toy_moment(share: float, weights: str, n_proposals: int, skewed: bool, seed: int) -> float:
    """Stationary position variance (Gaussian noise) or mean (skewed noise) on a unit
    Gaussian with noise share ``share``."""
    rng = np.random.default_rng(seed)
    update = momentum_update(0.3, 1.0, "obabo")
    noise_sd = math.sqrt(share * update.noise_var) / update.kick

    def draw_candidate(z: np.ndarray) -> np.ndarray:
        e = rng.exponential(size=z.shape) - 1.0 if skewed else rng.standard_normal(z.shape)
        return -z + noise_sd * e

    start = EWSGState(np.zeros((20_000, 1)), np.zeros((20_000, 1)))
    weights = "linear" if weights == "uniform" else weights
    state, _ = ewsg_steps(start, draw_candidate, 0.3, 1.0, 300, n_proposals, rng, "obabo", weights)
    return float(state.position.mean() if skewed else state.position.var())


def paper_gaussian_kl(seed: int, n_proposals: int, weights: str) -> float:
    """Sec. 5.1's KL at 30 data passes for one dataset."""
    rng = np.random.default_rng(seed)
    n = 20
    centres = rng.standard_normal((n, 2))

    def draw_candidate(z: np.ndarray) -> np.ndarray:
        return -n * (z - centres[rng.integers(n, size=z.shape[0])])

    start = EWSGState(np.zeros((10_000, 2)), np.zeros((10_000, 2)))
    steps = 30 * n // (n_proposals + 1)
    state, _ = ewsg_steps(
        start, draw_candidate, 0.05, 10.0, steps, n_proposals, rng, "euler", weights
    )
    z = state.position
    cov, target_cov = np.cov(z.T), np.eye(2) / n
    diff = centres.mean(0) - z.mean(0)
    inv = np.linalg.inv(target_cov)
    logdet = np.linalg.slogdet(target_cov)[1] - np.linalg.slogdet(cov)[1]
    return float(0.5 * (np.trace(inv @ cov) + diff @ inv @ diff - 2 + logdet))


def main() -> None:
    t0 = time.perf_counter()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    toy = {
        kind: {
            f"{w} M={m}": [
                toy_moment(s, w, m, kind == "mean", 3 + 2 * (kind == "mean")) for s in SHARES
            ]
            for w, m in SETTINGS
        }
        for kind in ("variance", "mean")
    }
    gauss_settings = [("paper", 0), ("paper", 1), ("linear", 1), ("paper", 3), ("linear", 3)]
    gauss = {
        ("uniform M=0" if m == 0 else f"{w} M={m}"): [
            paper_gaussian_kl(seed, m, w) for seed in range(10)
        ]
        for w, m in gauss_settings
    }
    lines = [f"# EWSG index weights on toy targets (pymc_bigdata at {commit})", ""]
    for kind, label in (
        ("variance", "position variance, Gaussian noise (target 1)"),
        ("mean", "position mean, skewed noise (target 0)"),
    ):
        lines += [
            f"## Unit Gaussian: {label}",
            "",
            "| noise share | " + " | ".join(toy[kind]) + " |",
            "|---|" + "---|" * len(toy[kind]),
        ]
        for i, s in enumerate(SHARES):
            lines.append(
                f"| {s} | "
                + " | ".join(
                    f"{v[i]:+.3f}" if kind == "mean" else f"{v[i]:.3f}" for v in toy[kind].values()
                )
                + " |"
            )
        lines.append("")
    lines += [
        "## The paper's Gaussian experiment (Sec. 5.1): KL at 30 data passes",
        "",
        "| setting | mean over 10 datasets | s.e. | per dataset |",
        "|---|---|---|---|",
    ]
    for name, kls in gauss.items():
        arr = np.array(kls)
        lines.append(
            f"| {name} | {arr.mean():.3f} | {arr.std(ddof=1) / math.sqrt(len(arr)):.3f} | "
            + ", ".join(f"{k:.2f}" for k in arr)
            + " |"
        )
    lines += ["", f"Run time {time.perf_counter() - t0:.0f} s."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ewsg_weights.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "ewsg_weights.json").write_text(
        json.dumps(
            {"commit": commit, "shares": SHARES, "toy": toy, "paper_gaussian": gauss}, indent=1
        )
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
