"""A group effect's ``loc`` that is a regression on group-level covariates.

The varying-intercept model with a group-level predictor (Gelman & Hill's radon model, the
way PyMC's multilevel primer writes it) gives each group its own ``loc``::

    a_j ~ Normal(gamma_0 + gamma_1 u_j, scale)             (centred)
    a = gamma[0] + gamma[1] * u + scale * z                (non-centred)

with ``u`` a constant per group. :class:`LinearLoc` is such a ``loc``, any affine map
``loc_j = offset_j + sum_k design[j, k] x[coefficients[k]]`` of untransformed free entries of
the raveled value vector ``x``, in numpy (value, vector-Jacobian product, a weighted least
squares fit) and in PyTensor, so that the loc-scale machinery centres such groups as it
centres groups about a scalar ``loc``. :func:`linear_loc` reads it from a model's graph,
only where every operation between the free variables and the ``loc`` is affine (sums,
differences, negation, products and quotients with one constant side, ``dot`` with one
constant side, indexing with constant indices, reshapes): never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.ops import ViewOp
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace
from pytensor.scalar import Add, Cast, Identity, Mul, Neg, Sub, TrueDiv
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.subtensor import AdvancedSubtensor, Subtensor

__all__ = ["LinearLoc", "linear_loc", "per_group"]

#: most coefficients a group-level regression may have (a larger affine map is not read)
MAX_COEFFICIENTS = 200
#: most entries of the design read for a regression written per row (rows x coefficients)
MAX_DESIGN_ENTRIES = 20_000_000


@dataclass(frozen=True, eq=False)
class LinearLoc:
    """``loc_j = offset_j + sum_k design[j, k] x[coefficients[k]]``.

    Attributes
    ----------
    coefficients : ndarray of int, shape (p,)
        The entries of ``x`` the ``loc`` reads (distinct; untransformed free variables).
    design : ndarray, shape (J, p)
        The group-level covariates (a column of ones for an intercept).
    offset : ndarray, shape (J,)
        The constant part (0 without one).
    """

    coefficients: np.ndarray
    design: np.ndarray
    offset: np.ndarray

    @property
    def n_groups(self) -> int:
        """``J``."""
        return self.offset.shape[0]

    def slots(self) -> set[int]:
        """The entries of ``x`` that ``loc`` reads."""
        return {int(k) for k in self.coefficients}

    def value(self, x: np.ndarray) -> np.ndarray:
        """``loc_j`` at ``x`` (shape ``(..., d)``), shape ``(..., J)``."""
        return self.offset + np.asarray(x)[..., self.coefficients] @ self.design.T

    def symbolic(self, x: pt.TensorVariable) -> pt.TensorVariable:
        """``loc_j`` at the symbolic vector ``x``, shape (J,)."""
        return self.offset + pt.dot(self.design, x[self.coefficients])

    def add_pullback(self, x: np.ndarray, cotangent: np.ndarray, out: np.ndarray) -> None:
        """Add ``(d loc / d x)' cotangent`` to ``out`` (both ``(..., d)``; ``cotangent`` is
        ``(..., J)``)."""
        out[..., self.coefficients] += cotangent @ self.design

    def fit(self, estimate: np.ndarray, weight: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """The coefficients of the weighted least-squares fit of ``estimate - offset`` on the
        design over the groups ``seen`` (``weight``, ``estimate``: one per seen group); the
        minimum-norm solution where the seen groups do not fix them all."""
        root = np.sqrt(weight)
        design = self.design[seen] * root[:, None]
        target = (estimate - self.offset[seen]) * root
        return np.linalg.lstsq(design, target, rcond=None)[0]

    def with_coefficients(self, x: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
        """A copy of ``x`` (shape (d,)) with the coefficients set."""
        out = np.array(x, dtype=np.float64)
        out[self.coefficients] = coefficients
        return out


def linear_loc(
    var: Variable,
    n_groups: int,
    free_rvs: set[Variable],
    entries: Callable[[Variable], slice | None],
    rows: np.ndarray | None = None,
) -> LinearLoc | None:
    """``var`` (a vector) as a :class:`LinearLoc`, or None.

    Parameters
    ----------
    var
        The ``loc`` expression.
    n_groups
        ``J``: a ``loc`` of another length is not read (e.g. a row-level predictor).
    free_rvs
        The model's free random variables (the graph is read down to them).
    entries
        A free variable's slice of the raveled value vector where it is sampled and
        untransformed, else None.
    rows
        The group of each row where ``var`` is written per row
        (``g[0] + g[1] * u[group] + tau * z[group]``): read over the rows, then
        :func:`per_group`.
    """
    length = n_groups if rows is None else len(rows)
    if (
        var.ndim != 1
        or not var.dtype.startswith("float")
        or var.type.shape[0] not in (None, length)
    ):
        return None
    try:
        depends = _dependence(var, free_rvs)
        affine = _affine(var, depends, free_rvs)
    except RecursionError:  # a graph too deep to read here is not read
        return None
    inputs = sorted((v for v in depends if v in free_rvs), key=lambda v: v.name or "")
    slices = [entries(v) for v in inputs]
    if any(s is None for s in slices) or not affine:
        return None
    coefficients = np.concatenate([np.arange(s.start, s.stop) for s in slices]).astype(np.int64)
    if len(coefficients) > MAX_COEFFICIENTS or length * len(coefficients) > MAX_DESIGN_ENTRIES:
        return None
    try:
        regression = _read_affine_map(var, inputs, slices, coefficients, length)
    except Exception:  # noqa: BLE001 - a graph that cannot be evaluated here is not read
        return None
    if regression is None or rows is None:
        return regression
    return per_group(regression, rows, n_groups)


def per_group(per_row: LinearLoc, rows: np.ndarray, n_groups: int) -> LinearLoc | None:
    """A ``loc`` written per row as one per group: the rows of each group share their design
    and offset exactly and every group has a row; None otherwise."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= n_groups:
        return None
    groups, first = np.unique(rows, return_index=True)
    if len(groups) != n_groups:
        return None
    design, offset = per_row.design[first], per_row.offset[first]
    same = np.array_equal(per_row.design, design[rows])
    if not (same and np.array_equal(per_row.offset, offset[rows])):
        return None
    return LinearLoc(per_row.coefficients, design, offset)


def _read_affine_map(
    var: Variable,
    inputs: list[Variable],
    slices: list[slice],
    coefficients: np.ndarray,
    n_groups: int,
) -> LinearLoc | None:
    """The affine map's offset and design, read from its values at 0 and at unit vectors
    (None where it has not ``n_groups`` entries)."""
    flat = pt.vector("coefficients", dtype="float64")
    replacements, start = {}, 0
    for rv, sl in zip(inputs, slices):
        size = sl.stop - sl.start
        replacements[rv] = flat[start : start + size].reshape(rv.shape).astype(rv.dtype)
        start += size
    [out] = graph_replace([var], replacements, strict=False)
    evaluate = pytensor.function([flat], out, mode="FAST_COMPILE", on_unused_input="ignore")
    p = len(coefficients)
    offset = np.asarray(evaluate(np.zeros(p)), dtype=np.float64)
    if offset.shape != (n_groups,):
        return None
    design = np.stack([evaluate(np.eye(p)[k]) - offset for k in range(p)], axis=-1)
    return LinearLoc(coefficients, design.reshape(offset.shape[0], p), offset)


def _dependence(var: Variable, free_rvs: set[Variable]) -> set[Variable]:
    """The variables of ``var``'s graph, read down to the free variables, that depend on one."""
    depends: set[Variable] = set()
    seen: set[Variable] = set()

    def visit(v: Variable) -> bool:
        if v in seen:
            return v in depends
        seen.add(v)
        hit = v in free_rvs or (
            v.owner is not None and any([visit(i) for i in v.owner.inputs])  # noqa: C419
        )
        if hit:
            depends.add(v)
        return hit

    visit(var)
    return depends


_AFFINE_SCALARS = (Add, Sub, Neg, Identity, Cast)
_INDEXING = (Subtensor, AdvancedSubtensor)


def _affine(var: Variable, depends: set[Variable], free_rvs: set[Variable]) -> bool:
    """Whether ``var`` is affine in the free variables: each operation on a path from them
    keeps affinity (see the module docstring)."""
    if var not in depends or var in free_rvs:
        return True
    node = var.owner
    op = node.op
    first, rest = node.inputs[0], node.inputs[1:]
    if isinstance(op, ViewOp | DimShuffle):
        return _affine(first, depends, free_rvs)
    if isinstance(op, _INDEXING):
        return not any(i in depends for i in rest) and _affine(first, depends, free_rvs)
    varying = [i for i in node.inputs if i in depends]
    if isinstance(op, Dot) or (isinstance(op, Elemwise) and isinstance(op.scalar_op, Mul)):
        return len(varying) == 1 and _affine(varying[0], depends, free_rvs)
    if not isinstance(op, Elemwise):
        return False
    if isinstance(op.scalar_op, TrueDiv):
        return varying == [first] and _affine(first, depends, free_rvs)
    if isinstance(op.scalar_op, _AFFINE_SCALARS):
        return all(_affine(i, depends, free_rvs) for i in varying)
    return False
