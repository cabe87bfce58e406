"""Correlated group effects with a Cholesky-factor scale: find them in a model's graph.

The last step of PyMC's multilevel primer gives each group ``j`` a vector of ``K`` effects
(an intercept and slopes) with a ``K x K`` covariance ``Sigma = L L'`` from
``pm.LKJCholeskyCov``. Written non-centred, the way the primer writes it::

    z = pm.Normal("z", 0, 1, shape=(K, J))
    ab = pm.Deterministic("ab", mu + pt.dot(chol, z).T)      # or (chol @ z).T, no mu

the likelihood reads group ``j``'s effects ``ab_j = mu + L z_j`` (``z_j`` the ``j``-th column).
At big-data scale a data-rich group pins ``ab_j`` down, so ``z_j`` is tied to ``(mu, L)``
along a narrow ridge, as for a scalar loc-scale effect (:mod:`pymc_bigdata.model.loc_scale`);
:mod:`pymc_bigdata.model.correlated_reparam` samples such groups centred, ``w_j = ab_j``.

:func:`find_correlated_effects` returns a :class:`CorrelatedEffect` per effect it is sure of,
and nothing else (never a guess): ``z`` a free, untransformed standard normal matrix of shape
``(K, J)`` that reaches the model only through ``L @ z``; ``L`` the lower-triangular matrix
``pm.expand_packed_triangular`` (or ``LKJCholeskyCov``'s ``chol``) builds from a free variable
with PyMC's ``CholeskyCovPacked`` transform (so its diagonal, ``exp`` of its value's, is
positive); ``mu`` absent, a constant, or a free untransformed vector of ``K`` entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pymc as pm
from pymc.distributions.transforms import CholeskyCovPacked
from pytensor.graph.basic import Variable
from pytensor.scalar import Add, Second
from pytensor.tensor.basic import Alloc
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.random.basic import MvNormalRV, NormalRV
from pytensor.tensor.subtensor import AdvancedIncSubtensor

from pymc_bigdata.model.group_index import constant_value as _constant
from pymc_bigdata.model.group_index import other_uses, peel, view_name, walk

__all__ = ["CorrelatedEffect", "find_correlated_effects"]


@dataclass(frozen=True, eq=False)
class CorrelatedEffect:
    """One non-centred correlated group effect ``ab_j = mu + L z_j``, in the raveled ``theta``.

    The field names follow :class:`~pymc_bigdata.model.loc_scale.LocScaleEffect` where they
    mean the same (``scale_slice`` holds ``L``'s packed value), so that
    :class:`~pymc_bigdata.model.reparam.LocScaleReparams` checks both kinds' slots alike.

    Attributes
    ----------
    name : str
        The ``pm.Deterministic`` holding ``mu + (L @ z).T`` (else the name of ``z``).
    effect : str
        Name of the value variable of ``z``.
    effect_slice : slice
        Its ``K * J`` entries in ``theta``, row-major: ``z[k, j]`` at ``start + k * J + j``.
    n_effects : int
        ``K``, the effects per group.
    loc_slice : slice or None
        The ``K`` entries of a free ``mu`` in ``theta``; None for a constant (or no) ``mu``.
    loc_value : ndarray, shape (K,)
        The constant ``mu`` (zeros without one); unused where :attr:`loc_slice` is set.
    scale_slice : slice
        The entries of ``L``'s packed value in ``theta`` (``CholeskyCovPacked``: the diagonal
        entries are logs).
    rows, cols : ndarray of int
        Where each packed entry sits in ``L`` (``rows >= cols``).
    log_entries : ndarray of int
        The packed entries whose value is a log (the diagonal's).
    """

    name: str
    effect: str
    effect_slice: slice
    n_effects: int
    loc_slice: slice | None
    loc_value: np.ndarray
    scale_slice: slice
    rows: np.ndarray
    cols: np.ndarray
    log_entries: np.ndarray
    #: whether the model writes it centred, ``ab ~ MvNormal(mu, chol=L)`` of shape ``(J,
    #: K)`` (its value variable then holds ``ab``, row-major: ``ab[j, k]`` at ``start + j * K
    #: + k``), rather than non-centred through ``z``
    centred: bool = False
    #: read by :class:`~pymc_bigdata.model.reparam.LocScaleReparams`' slot checks
    parent = None
    linear_loc = None

    @property
    def model_centredness(self) -> float:
        """1 where the model writes the effect centred, else 0."""
        return 1.0 if self.centred else 0.0

    @property
    def n_groups(self) -> int:
        """``J``, the number of groups."""
        return (self.effect_slice.stop - self.effect_slice.start) // self.n_effects

    def factor(self, x: np.ndarray) -> np.ndarray:
        """``L`` at the raveled ``x``, shape (..., K, K)."""
        packed = np.array(x[..., self.scale_slice], dtype=np.float64)
        packed[..., self.log_entries] = np.exp(packed[..., self.log_entries])
        chol = np.zeros(x.shape[:-1] + (self.n_effects, self.n_effects))
        chol[..., self.rows, self.cols] = packed
        return chol

    def matrix(self, x: np.ndarray) -> np.ndarray:
        """The effect's slots of the raveled ``x`` as ``(..., K, J)`` (column ``j`` is group
        ``j``'s ``z_j`` or, centred, ``ab_j``)."""
        values = x[..., self.effect_slice]
        if self.centred:
            shaped = values.reshape(x.shape[:-1] + (self.n_groups, self.n_effects))
            return np.swapaxes(shaped, -1, -2)
        return values.reshape(x.shape[:-1] + (self.n_effects, self.n_groups))

    def with_matrix(self, x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        """A copy of ``x`` with the effect's slots set from ``matrix`` (``(..., K, J)``)."""
        out = np.array(x, dtype=np.float64, copy=True)
        values = np.swapaxes(matrix, -1, -2) if self.centred else matrix
        out[..., self.effect_slice] = values.reshape(x.shape[:-1] + (-1,))
        return out

    def loc(self, x: np.ndarray) -> np.ndarray:
        """``mu`` at the raveled ``x``, shape (..., K)."""
        mu = self.loc_value if self.loc_slice is None else x[..., self.loc_slice]
        return np.broadcast_to(mu, x.shape[:-1] + (self.n_effects,))


def find_correlated_effects(
    model: pm.Model,
    value_vars: Sequence[Variable] | None = None,
    point: Mapping[str, np.ndarray] | None = None,
) -> list[CorrelatedEffect]:
    """The non-centred correlated group effects of ``model`` that its likelihood reads (see
    the module docstring for what is reported).

    Parameters
    ----------
    model
        The PyMC model.
    value_vars
        The value variables raveled into ``theta``, in order (default ``model.value_vars``).
    point
        A point giving each value variable's shape (default ``model.initial_point()``).

    Returns
    -------
    list of CorrelatedEffect
        In the order of the ``z`` variables in ``value_vars``.
    """
    value_vars = list(model.value_vars if value_vars is None else value_vars)
    point = model.initial_point() if point is None else point
    slices, shapes, start = {}, {}, 0
    for var in value_vars:
        rv, shape = model.values_to_rvs[var], np.shape(point[var.name])
        slices[rv], shapes[rv] = slice(start, start + int(np.prod(shape))), shape
        start += int(np.prod(shape))
    free = set(model.free_RVs)
    read = walk(list(model.observed_RVs), blockers=free)
    found: dict[Variable, CorrelatedEffect] = {}
    sums_first = sorted(read, key=lambda v: (v.owner is None or _add_terms(v) is None, id(v)))
    for var in sums_first:
        record = _match(var, model, slices, shapes, read)
        if record is not None and record[0] not in found:
            z, effect = record
            if z not in walk(other_uses(model, z), blockers=free | {var}):
                found[z] = effect
    for rv in model.free_RVs:
        effect = _match_centred(rv, model, slices, shapes)
        if effect is not None and rv in read:
            found[rv] = effect
    return sorted(found.values(), key=lambda e: e.effect_slice.start)


def _match(
    var: Variable, model: pm.Model, slices: dict, shapes: dict, read: set
) -> tuple[Variable, CorrelatedEffect] | None:
    """``(z, record)`` where ``var`` is ``mu + (L @ z).T`` or ``(L @ z).T``."""
    if getattr(var, "ndim", None) != 2 or var.owner is None:
        return None
    terms = _add_terms(var)
    candidates = [(None, var)] if terms is None else [terms, terms[::-1]]
    for loc_term, product in candidates:
        factors = _transposed_product(peel(product))
        if factors is None:
            continue
        chol, z = factors
        k = _standard_normal_rows(z, model, slices, shapes)
        packed = _packed_cholesky(chol, k, model, slices) if k else None
        loc = _loc(loc_term, k, model, slices) if packed is not None else None
        if loc is None:
            continue
        name = view_name(var, read) or z.name
        return z, _effect(name, z, model, slices, k, loc, packed)
    return None


def _effect(
    name: str,
    var: Variable,
    model: pm.Model,
    slices: dict,
    k: int,
    loc: slice | np.ndarray,
    packed: tuple,
    centred: bool = False,
) -> CorrelatedEffect:
    """The record of an effect whose value variable is ``var``'s (``z``, or a centred
    ``ab``), from :func:`_loc`'s and :func:`_packed_cholesky`'s findings."""
    return CorrelatedEffect(
        name=name,
        effect=model.rvs_to_values[var].name,
        effect_slice=slices[var],
        n_effects=k,
        loc_slice=loc if isinstance(loc, slice) else None,
        loc_value=np.zeros(k) if isinstance(loc, slice) else loc,
        scale_slice=slices[packed[0]],
        rows=packed[1],
        cols=packed[2],
        log_entries=packed[3],
        centred=centred,
    )


def _match_centred(
    rv: Variable, model: pm.Model, slices: dict, shapes: dict
) -> CorrelatedEffect | None:
    """The effect where ``rv`` is a centred ``ab ~ MvNormal(mu, chol=L)`` of shape ``(J,
    K)`` (no transform), ``L`` a packed Cholesky factor and ``mu`` as for ``z``'s form."""
    if rv not in slices or rv.owner is None or not isinstance(rv.owner.op, MvNormalRV):
        return None
    shape = shapes[rv]
    if model.rvs_to_transforms.get(rv) is not None or len(shape) != 2 or min(shape) < 2:
        return None
    k = int(shape[1])
    mu, cov = rv.owner.op.dist_params(rv.owner)
    chol = _gram_factor(peel(cov, broadcasts=True))
    packed = _packed_cholesky(chol, k, model, slices) if chol is not None else None
    loc = _loc(_broadcast_source(mu), k, model, slices) if packed is not None else None
    if loc is None:
        return None
    return _effect(rv.name, rv, model, slices, k, loc, packed, centred=True)


def _gram_factor(var: Variable) -> Variable | None:
    """``L`` where ``var`` is ``L @ L.T`` (how ``pm.MvNormal(..., chol=L)`` builds its
    covariance)."""
    node = var.owner
    if node is None or len(node.inputs) != 2:
        return None
    op = node.op.core_op if isinstance(node.op, Blockwise) else node.op
    if not isinstance(op, Dot):
        return None
    left, right = node.inputs
    transposed = right.owner
    if transposed is None or not isinstance(transposed.op, DimShuffle):
        return None
    if transposed.op.new_order != (1, 0) or transposed.inputs[0] is not left:
        return None
    return left


def _broadcast_source(var: Variable) -> Variable:
    """``mu`` where ``var`` broadcasts it (``pm.MvNormal`` writes ``second(cov[:, -1], mu)``
    and adds a leading axis)."""
    var = peel(var, broadcasts=True)
    node = var.owner
    if node is not None and isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Second):
        var = peel(node.inputs[1], broadcasts=True)
    return var


def _add_terms(var: Variable) -> list[Variable] | None:
    """The two terms of ``var`` where it is an elementwise sum of two."""
    node = var.owner
    if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Add):
        return list(node.inputs) if len(node.inputs) == 2 else None
    return None


def _transposed_product(var: Variable) -> tuple[Variable, Variable] | None:
    """``(L, z)`` where ``var`` is ``(L @ z).T`` (``pt.dot`` or ``@`` of two matrices)."""
    node = var.owner
    if node is None or not isinstance(node.op, DimShuffle) or node.op.new_order != (1, 0):
        return None
    inner = node.inputs[0].owner
    if inner is None or len(inner.inputs) != 2:
        return None
    op = inner.op.core_op if isinstance(inner.op, Blockwise) else inner.op
    if not isinstance(op, Dot) or any(i.ndim != 2 for i in inner.inputs):
        return None
    return inner.inputs[0], peel(inner.inputs[1])


def _standard_normal_rows(z: Variable, model: pm.Model, slices: dict, shapes: dict) -> int:
    """``K`` where ``z`` is a sampled untransformed ``Normal(0, 1)`` matrix ``(K, J)``, else 0."""
    if z not in slices or z.ndim != 2 or model.rvs_to_transforms.get(z) is not None:
        return 0
    if z.owner is None or type(z.owner.op) is not NormalRV:
        return 0
    mu, sigma = (_constant(p) for p in z.owner.op.dist_params(z.owner))
    if mu is None or sigma is None or np.any(mu != 0.0) or np.any(sigma != 1.0):
        return 0
    shape = shapes[z]
    return int(shape[0]) if len(shape) == 2 and shape[0] >= 2 else 0


def _packed_cholesky(
    chol: Variable, k: int, model: pm.Model, slices: dict
) -> tuple[Variable, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(packed, rows, cols, log_entries)`` where ``chol`` is a ``K x K`` lower-triangular
    matrix of zeros set at constant ``(rows, cols)`` to a free variable ``packed`` with the
    ``CholeskyCovPacked`` transform, every diagonal entry among its log entries."""
    node = peel(chol).owner
    if node is None or not isinstance(node.op, AdvancedIncSubtensor) or len(node.inputs) != 4:
        return None
    if not node.op.set_instead_of_inc:
        return None
    zeros, packed, rows, cols = node.inputs
    if not _zeros(zeros, k):
        return None
    packed = peel(packed)
    rows, cols = _constant(rows), _constant(cols)
    transform = model.rvs_to_transforms.get(packed)
    if rows is None or cols is None or packed not in slices or packed.ndim != 1:
        return None
    if not isinstance(transform, CholeskyCovPacked):
        return None
    rows, cols = rows.astype(np.int64), cols.astype(np.int64)
    log_entries = np.asarray(transform.diag_idxs.eval(), dtype=np.int64)
    size = slices[packed].stop - slices[packed].start
    positions = set(zip(rows.tolist(), cols.tolist()))
    diagonal = {int(p) for p in np.flatnonzero(rows == cols)}
    ok = (
        rows.shape == cols.shape == (size,)
        and len(positions) == size
        and np.all(rows >= cols)
        and np.all(rows < k)
        and set(range(k)) == {r for r, c in positions if r == c}
        and diagonal == set(log_entries.tolist())
    )
    return (packed, rows, cols, log_entries) if ok else None


def _zeros(var: Variable, k: int) -> bool:
    """``var`` is a ``K x K`` matrix of zeros (``pt.zeros`` or a constant)."""
    value = _constant(var)
    if value is not None:
        return value.shape == (k, k) and not np.any(value)
    node = var.owner
    if node is None or not isinstance(node.op, Alloc):
        return False
    fill, *shape = (_constant(i) for i in node.inputs)
    if fill is None or np.any(fill) or any(s is None for s in shape):
        return False
    return [int(s) for s in shape] == [k, k]


def _loc(var: Variable | None, k: int, model: pm.Model, slices: dict) -> slice | np.ndarray | None:
    """A free untransformed ``mu`` of ``K`` entries (its slice), a constant one or none (its
    value, broadcast to ``K``); None otherwise."""
    if var is None:
        return np.zeros(k)
    value = _constant(var)
    if value is not None:
        return np.broadcast_to(value.ravel(), (k,)).copy() if value.size in (1, k) else None
    rv = peel(var, broadcasts=True)
    sl = slices.get(rv)
    ok = sl is not None and sl.stop - sl.start == k and rv.ndim == 1
    return sl if ok and model.rvs_to_transforms.get(rv) is None else None
