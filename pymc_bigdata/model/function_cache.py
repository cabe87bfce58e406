"""A process-wide cache of compiled PyTensor functions, keyed on what the graph computes.

Compiling is the slow part of building a sampler: PyTensor rewrites the graph (seconds for a
model's gradients and Hessians) and its Numba backend JIT-compiles the result. A model built
again with the same structure — the same ``pm.Model`` code run twice in a notebook, a test
suite's many models of one family — gives graphs that compute the same thing: equal ops on
equal inputs. Rows enter the package's functions as inputs, not constants, so other data of
the same shape give the same graphs too. :func:`graph_key` turns a graph into a hashable
key in which two graphs are equal exactly when PyTensor's own merge rewrite would call
them equal: the same ops (``Op.__eq__``) applied in the same pattern to the same inputs (by
position and type), constants (by type and value) and shared variables (by identity, since
a compiled function reads the shared variable it was compiled with). The cache keeps the
last :data:`MAX_FUNCTIONS` functions and the shared variables their keys name.

Each thread has its own functions: a PyTensor function holds its inputs' and outputs'
storage, so two threads calling one function at once would read each other's values (chains
in the threads of one Dask worker each unpickle their step and compile its graphs again).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np
from pytensor.compile import Function
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import io_toposort

__all__ = ["FunctionCache", "graph_key"]

#: how many compiled functions the process keeps (a model's layer compiles ~10-40)
MAX_FUNCTIONS = 256


def _constant_key(constant: Constant) -> tuple:
    data = np.asarray(constant.data)
    digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
    return ("constant", constant.type, data.dtype.str, data.shape, digest)


def graph_key(
    inputs: Sequence[Variable], outputs: Sequence[Variable], context: Hashable
) -> tuple[tuple, list[Variable]] | None:
    """A key equal for two graphs exactly when they compute the same outputs of their inputs.

    Parameters
    ----------
    inputs, outputs
        The function's inputs and outputs, in order.
    context
        What else the compiled result depends on (mode, output form), part of the key.

    Returns
    -------
    tuple or None
        The key and the root variables it names by identity (shared variables: they must
        outlive the key, or another variable could take their ``id``); ``None`` when an op
        cannot be hashed (the graph is then compiled without the cache).
    """
    names: dict[Variable, tuple] = {v: ("input", i, v.type) for i, v in enumerate(inputs)}
    held: list[Variable] = []

    def name(variable: Variable) -> tuple:
        if variable not in names:
            if isinstance(variable, Constant):
                names[variable] = _constant_key(variable)
            else:  # a shared variable (or another root): itself, held alive
                held.append(variable)
                names[variable] = ("root", id(variable), variable.type)
        return names[variable]

    nodes = []
    for position, node in enumerate(io_toposort(list(inputs), list(outputs))):
        nodes.append((node.op, tuple(name(v) for v in node.inputs)))
        for k, out in enumerate(node.outputs):
            names[out] = ("node", position, k, out.type)
    key = (context, tuple(names[v] for v in inputs), tuple(nodes), tuple(map(name, outputs)))
    try:
        hash(key)
    except TypeError:
        return None
    return key, held


class FunctionCache:
    """Compiled functions by :func:`graph_key` and thread, the least recently used dropped
    first."""

    def __init__(self, max_functions: int = MAX_FUNCTIONS):
        self.max_functions = max_functions
        self._functions: OrderedDict[tuple, tuple[Function, list[Variable]]] = OrderedDict()
        self._lock = threading.Lock()  # threads look up and evict in one dict
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._functions)

    def get(
        self,
        inputs: Sequence[Variable],
        outputs: Sequence[Variable],
        context: Hashable,
        compile_new: Callable[[], Function],
    ) -> Function:
        """The function this thread cached for this graph, else ``compile_new()`` (then
        cached)."""
        keyed = graph_key(inputs, outputs, context)
        if keyed is None:
            self.misses += 1
            return compile_new()
        key, held = (threading.get_ident(), keyed[0]), keyed[1]
        with self._lock:
            entry = self._functions.get(key)
            if entry is not None:
                self.hits += 1
                self._functions.move_to_end(key)
                return entry[0]
            self.misses += 1
        fn = compile_new()  # outside the lock: no other thread compiles this thread's key
        with self._lock:
            self._functions[key] = (fn, held)
            while len(self._functions) > self.max_functions:
                self._functions.popitem(last=False)
        return fn

    def clear(self) -> None:
        """Drop every cached function."""
        with self._lock:
            self._functions.clear()
