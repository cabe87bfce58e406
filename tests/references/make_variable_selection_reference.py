"""Store the exact inclusion probabilities of the variable-selection example, small.

Run from the repository root::

    .venv/bin/python tests/references/make_variable_selection_reference.py

``tests/references/variable_selection.npz`` holds ``inclusion`` (6,), the exact posterior
inclusion probabilities of ``variable_selection_model(*variable_selection_data(100_000,
seed=0)[:2])`` (slab sd 0.02, noise sd 1, prior inclusion 0.5) by enumerating the 64 subsets
with the coefficients integrated out (``variable_selection_exact``), and the data's
``n_rows`` and ``seed``. The slow test recomputes them and checks the stored copy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pymc_bigdata.datasets import variable_selection_data, variable_selection_exact

N_ROWS, SEED = 100_000, 0


def main() -> None:
    X, y, _ = variable_selection_data(N_ROWS, seed=SEED)
    inclusion = variable_selection_exact(X, y)
    path = Path(__file__).with_name("variable_selection.npz")
    np.savez(path, inclusion=inclusion, n_rows=N_ROWS, seed=SEED)
    print(path, np.round(inclusion, 4))


if __name__ == "__main__":
    main()
