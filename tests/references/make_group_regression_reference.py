"""The exact reference posterior of ``tests/hard_models.py::group_regression``.

The residual sd is known, so given ``tau`` the posterior of ``(gamma, a)`` is Gaussian and
``log tau`` has a one-dimensional marginal: ``hard_models.group_regression_exact`` computes
every moment on a grid of ``log tau`` (checked once against PyMC's NUTS on a 3,000-row,
12-group version of the model: 2 x 3,000 draws, every mean within 0.03 sd and every sd
within 3 % of the grid's). Stored as ``tests/references/group_regression.npz`` with the
keys of the other references (Monte Carlo errors 0). Run from the repository root (a few
seconds)::

    .venv/bin/python tests/references/make_group_regression_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import group_regression_exact, make_group_regression_data  # noqa: E402


def main() -> None:
    out = group_regression_exact(*make_group_regression_data())
    out |= {"method": np.array("exact (grid over log tau)"), "divergences": 0}
    path = Path(__file__).parent / "group_regression.npz"
    np.savez_compressed(path, **out)
    print(f"log tau {out['tau_log____mean'][0]:.4f} ± {out['tau_log____sd'][0]:.4f}")


if __name__ == "__main__":
    main()
