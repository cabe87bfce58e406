"""Tests of :mod:`pymc_bigdata.model.compiled`: how the package compiles its graphs."""

import numpy as np
import pytensor
import pytensor.tensor as pt

from pymc_bigdata.model.compiled import compile_function


def _sequential_sum(values: np.ndarray) -> float:
    total = 0.0
    for value in values:
        total += float(value)
    return total


def test_compiled_sums_keep_their_order_whatever_the_fast_math_default():
    """A compiled sum adds its terms in order, so its value cannot depend on how LLVM chose
    to vectorise it (which differed between a fresh compile and one read from the cache).

    ``1e16`` absorbs every ``1`` added after it in order; a reassociated (vectorised) sum
    keeps some of them. The default of PyTensor's Numba backend is fast-math on, so the
    test sets it explicitly and checks that the package overrides it.
    """
    x = pt.vector("x")
    values = np.ones(64)
    values[0], values[-1] = 1e16, -1e16
    with pytensor.config.change_flags(numba__fastmath=True):
        total = compile_function([x], (x * 1.0).sum(), None)(values)
    assert float(total) == _sequential_sum(values) == 0.0
