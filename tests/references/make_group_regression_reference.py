"""The exact reference posteriors of ``tests/hard_models.py::group_regression`` and
``varying_slopes``.

The residual sd is known, so given ``tau`` the posterior of ``(gamma, a)`` is Gaussian and
``log tau`` has a one-dimensional marginal: ``hard_models.group_regression_exact`` computes
every moment on a grid of ``log tau`` (checked once against PyMC's NUTS on a 3,000-row,
12-group version of the model: 2 x 3,000 draws, every mean within 0.03 sd and every sd
within 3 % of the grid's). Stored as ``tests/references/group_regression.npz`` with the
keys of the other references (Monte Carlo errors 0). ``varying_slopes`` (two effects per
group, a known residual sd) likewise on a grid of both log scales
(``hard_models.varying_slopes_exact``; checked once against NUTS on a 3,000-row, 12-group
version: 2 x 3,000 draws, every mean within 0.041 sd and every sd within 3.1 % of the grid's,
whose half-width was 3.5 there), as ``tests/references/varying_slopes.npz``. Run from
the repository root (about a minute)::

    .venv/bin/python tests/references/make_group_regression_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import (  # noqa: E402
    group_regression_exact,
    make_group_regression_data,
    make_varying_slopes_data,
    varying_slopes_exact,
)


def main() -> None:
    out = group_regression_exact(*make_group_regression_data())
    out |= {"method": np.array("exact (grid over log tau)"), "divergences": 0}
    path = Path(__file__).parent / "group_regression.npz"
    np.savez_compressed(path, **out)
    print(f"log tau {out['tau_log____mean'][0]:.4f} ± {out['tau_log____sd'][0]:.4f}")
    slopes = varying_slopes_exact(*make_varying_slopes_data())
    slopes |= {"method": np.array("exact (grid over both log scales)"), "divergences": 0}
    np.savez_compressed(Path(__file__).parent / "varying_slopes.npz", **slopes)


if __name__ == "__main__":
    main()
