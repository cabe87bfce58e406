"""Tests of :mod:`pymc_bigdata.model.function_cache`: a graph computing what an earlier one
computed gets its compiled function; any other graph gets its own."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import sample_two_chains
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

import pymc_bigdata as pmbd
from pymc_bigdata.model import compiled
from pymc_bigdata.model.compiled import compile_function
from pymc_bigdata.model.function_cache import FunctionCache, graph_key


def _affine(shift, scale: float = 2.0):
    x = pt.vector("x")
    return x, x * scale + shift


def test_a_rebuilt_graph_gets_the_compiled_function():
    cache = FunctionCache()
    first = cache.get(*map(lambda v: [v], _affine(1.0)), None, lambda: object())
    again = cache.get(*map(lambda v: [v], _affine(1.0)), None, lambda: object())
    assert again is first
    assert (cache.hits, cache.misses) == (1, 1)


@pytest.mark.parametrize(
    "other",
    [
        lambda: _affine(1.5),  # another constant value
        lambda: _affine(1.0, scale=3.0),
        lambda: (lambda x: (x, x * 2.0 - 1.0))(pt.vector("x")),  # another op
        lambda: (lambda x: (x, x * 2.0 + 1.0))(pt.matrix("x")),  # another input type
    ],
    ids=["constant", "scale", "op", "input-type"],
)
def test_a_graph_computing_something_else_gets_its_own(other):
    base = graph_key(*map(lambda v: [v], _affine(1.0)), None)[0]
    assert graph_key(*map(lambda v: [v], other()), None)[0] != base


def test_inputs_are_keyed_by_position():
    """``f(x, y) = x - y`` and ``f(y, x)`` are the same graph with the inputs swapped."""
    x, y = pt.scalar("x"), pt.scalar("y")
    assert graph_key([x, y], [x - y], None)[0] != graph_key([y, x], [x - y], None)[0]
    u, v = pt.scalar("u"), pt.scalar("v")
    assert graph_key([x, y], [x - y], None)[0] == graph_key([u, v], [u - v], None)[0]


def test_shared_variables_are_keyed_by_identity():
    """A compiled function reads the shared variable it was compiled with: equal-valued
    shared variables are other inputs, and each function returns its own's value."""
    first, second = pytensor.shared(np.array(1.0)), pytensor.shared(np.array(1.0))
    x = pt.scalar("x")
    f = compile_function([x], x + first, None)
    g = compile_function([x], x + second, None)
    assert f is not g
    second.set_value(np.array(5.0))
    assert float(f(np.array(0.0))) == 1.0
    assert float(g(np.array(0.0))) == 5.0
    key, held = graph_key([x], [x + first], None)
    assert held == [first]


def test_the_least_recently_used_function_goes_first():
    cache = FunctionCache(max_functions=2)
    graphs = [_affine(float(k)) for k in range(3)]
    for x, out in graphs:
        cache.get([x], [out], None, lambda: object())
    assert len(cache) == 2
    cache.get([graphs[0][0]], [graphs[0][1]], None, lambda: object())
    assert cache.misses == 4  # the first was dropped


class _Unhashable(Op):
    __hash__ = None

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0]


def test_an_unhashable_op_is_compiled_without_the_cache():
    x = pt.vector("x")
    assert graph_key([x], [_Unhashable()(x)], None) is None
    cache = FunctionCache()
    made = [cache.get([x], [_Unhashable()(x)], None, object) for _ in range(2)]
    assert made[0] is not made[1] and len(cache) == 0


def _regression(n_rows: int, seed: int) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, 2))
    y = x @ np.array([0.5, -0.3]) + rng.standard_normal(n_rows)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 1, shape=2)
        pm.Normal("y", pm.math.dot(x, beta), 1.0, observed=y)
    return model


def test_a_model_built_again_samples_as_if_compiled_anew(monkeypatch):
    """A second model of the same structure (other rows, another row count) is compiled
    from the cache only, and its draws are those of the same model compiled afresh."""

    def draws(model):
        with model:
            step = pmbd.SGLD()
        return sample_two_chains(model, step, seed=4, draws=30, tune=30).posterior["beta"].values

    cache = FunctionCache()
    monkeypatch.setattr(compiled, "FUNCTIONS", cache)
    draws(_regression(3_000, seed=1))
    misses = cache.misses
    cached = draws(_regression(5_000, seed=2))
    assert cache.hits >= misses and cache.misses == misses
    monkeypatch.setattr(compiled, "FUNCTIONS", FunctionCache())
    np.testing.assert_array_equal(draws(_regression(5_000, seed=2)), cached)


def test_each_thread_compiles_its_own_function(monkeypatch):
    """A compiled function holds its inputs' and outputs' storage: two threads (chains in one
    Dask worker's threads) must not call one function, so each gets its own, cached for it."""
    monkeypatch.setattr(compiled, "FUNCTIONS", FunctionCache())

    def compile_twice():
        graphs = [_affine(1.0) for _ in range(2)]
        return [compile_function([x], y, None) for x, y in graphs]

    here = compile_twice()
    with ThreadPoolExecutor(max_workers=1) as pool:
        there = pool.submit(compile_twice).result()
    assert here[1] is here[0] and there[1] is there[0]
    assert there[0] is not here[0]
    assert there[0](np.array([1.0, 2.0])).tolist() == here[0](np.array([1.0, 2.0])).tolist()
