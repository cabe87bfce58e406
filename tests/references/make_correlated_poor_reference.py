"""The reference posterior of ``tests/correlated_slopes.py::correlated_poor_groups``.

Every group data-poor (40 groups of 3 to 8 rows), so the packed Cholesky factor's log
diagonal has a long left tail: the grid of ``correlated_slopes_exact`` still held 1.7e-6 of
the mass on its face 24 Laplace sds below the mode of ``log L00`` and went singular at 44.
Instead PyMC's NUTS (nothing of pymc_bigdata) on the non-centred form, where data-poor
groups leave no funnel: 4 chains of 5,000 draws after 2,000 tuning ones, ``target_accept``
0.99. Both forms' variables come from the same draws (``ab`` and ``z``). Stored as
``tests/references/correlated_poor_groups.npz`` with the keys of the other references
(``<var>__mean``, ``__sd``, ``__mean_se``, ``__sd_se``) and the run's metadata. Run from the
repository root (about 2 minutes)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/references/make_correlated_poor_reference.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from correlated_slopes import PACKED, correlated_poor_groups, packed_cholesky  # noqa: E402
from make_hier_references import summaries  # noqa: E402

DRAWS, TUNE, CHAINS, TARGET_ACCEPT, SEED = 5000, 2000, 4, 0.99, 11


def main() -> None:
    start = time.perf_counter()
    with correlated_poor_groups(centred=False):
        idata = pm.sample(
            draws=DRAWS, tune=TUNE, chains=CHAINS, target_accept=TARGET_ACCEPT,
            random_seed=SEED, progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    post = idata.posterior
    out = {}
    for name in ("mu", "ab", "z"):
        out |= summaries(name, post[name].values)
    out |= summaries(PACKED, packed_cholesky(post["chol"].values))
    divergences = int(idata.sample_stats["diverging"].sum())
    out |= {
        "method": np.array(f"NUTS (PyMC), non-centred, {CHAINS} x {DRAWS}, {TARGET_ACCEPT}"),
        "divergences": divergences,
        "seconds": time.perf_counter() - start,
    }
    np.savez_compressed(Path(__file__).parent / "correlated_poor_groups.npz", **out)
    print(
        f"divergences {divergences}; packed factor {out[f'{PACKED}__mean']} ± "
        f"{out[f'{PACKED}__sd']} (mcse of the sd {out[f'{PACKED}__sd_se']})"
    )


if __name__ == "__main__":
    main()
