"""Tests of :mod:`pymc_bigdata.model.compiled`: how the package compiles its graphs."""

import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytensor
import pytensor.tensor as pt

from pymc_bigdata.model.compiled import ChunkFunction, compile_function


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


def test_a_travelled_chunk_function_compiles_once_per_thread():
    """Unpickled (on a Dask worker, whose tasks run in threads), a chunk function compiles its
    graphs once for each thread that calls it, never sharing one function between threads."""
    x = pt.vector("x")
    chunk = pickle.loads(pickle.dumps(ChunkFunction.compile([x], [(x**2).sum()], None)))
    here = chunk(np.array([1.0, 2.0]))
    with ThreadPoolExecutor(max_workers=1) as pool:
        there = pool.submit(chunk, np.array([1.0, 2.0])).result()
    assert float(here) == float(there) == 5.0
    functions = list(chunk.compiled.values())
    assert len(functions) == 2 and functions[0] is not functions[1]
    chunk(np.array([3.0]))
    assert len(chunk.compiled) == 2
