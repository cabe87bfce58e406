"""The log prior's dense Hessian by central differences of its compiled gradient.

:class:`~pymc_bigdata.model.compiled.CompiledModel` computes the prior's Hessian exactly, as a
compiled batch of Hessian-vector products (forward over reverse mode, vectorised over the
identity). For a prior whose graph holds linear algebra — ``pm.MvNormal`` (``Cholesky``,
``SolveTriangular``), ``pm.LKJCholeskyCov`` used as a covariance, anything PyMC writes as an
``OpFromGraph`` — that graph is slow to compile. On the centred correlated varying intercepts
and slopes of ``tests/correlated_slopes.py`` (``pm.MvNormal("ab", mu, chol=chol, shape=(40,
2))`` with an ``LKJCholeskyCov``, d = 85; one-off profile, warm compile cache) it took 32.5 s
of Numba compilation (PyTensor notes that it runs a ``Blockwise`` ``AllocDiag`` in object
mode), 45.6 s of the step's 50.5 s set-up; with the C backend 78 s, with ``FAST_COMPILE``
8.4 s. The prior's value and gradient are compiled anyway (the MAP search's), and the Hessian
is needed only a handful of times in the set-up (Newton steps, the Laplace fit, the
curvature readings), so for such priors it is read from ``2 d`` gradient calls instead: 2 ms
there, within ``2e-11`` of the exact Hessian relative to its largest entry (one-off). The
set-up's time before and after: ``benchmarks/results/prior_hessian_setup.md``.

Priors without such operations (every hard target of the tests) keep the exact Hessian: their
draws do not change.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import applys_between
from pytensor.tensor.blockwise import Blockwise

__all__ = ["RELATIVE_STEP", "hessian_by_differences", "holds_linear_algebra"]

#: the central differences' step, relative to ``max(1, |theta_j|)``: their error is
#: ``O(h^2)`` from the third derivatives and ``O(eps / h)`` from round-off, both about
#: ``1e-10`` of the Hessian's scale at ``1e-5`` (measured: ``2e-11`` and ``1e-10`` of the largest
#: entry on the two forms of the correlated-slopes model's prior)
RELATIVE_STEP = 1e-5


def holds_linear_algebra(prior: Variable, theta: Variable) -> bool:
    """Whether the log prior ``prior`` of ``theta`` holds an operation with a core signature
    (``Blockwise``: ``Cholesky``, ``SolveTriangular``, ``Dot`` of stacks ...) or an inner graph
    (``OpFromGraph``): then its exact Hessian graph is slow to compile (module docstring)."""
    return any(
        isinstance(node.op, Blockwise | OpFromGraph) for node in applys_between([theta], [prior])
    )


def hessian_by_differences(
    gradient: Callable[[np.ndarray], np.ndarray], theta: np.ndarray
) -> np.ndarray:
    """The dense Hessian (d, d) of a function at ``theta`` from its ``gradient``: column ``j``
    is ``[g(theta + h e_j) - g(theta - h e_j)] / (2 h)`` with ``h = RELATIVE_STEP max(1,
    |theta_j|)``, then symmetrised. A non-finite gradient gives non-finite entries, as the
    exact Hessian would."""
    theta = np.asarray(theta, dtype=np.float64)
    dim = theta.size
    hessian = np.empty((dim, dim))
    for j in range(dim):
        up, down = theta.copy(), theta.copy()
        step = RELATIVE_STEP * max(1.0, abs(theta[j]))
        up[j] += step
        down[j] -= step
        hessian[:, j] = (gradient(up) - gradient(down)) / (up[j] - down[j])
    return 0.5 * (hessian + hessian.T)
