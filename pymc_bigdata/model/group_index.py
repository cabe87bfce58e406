"""Which rows read a loc-scale group effect: the group index ``g`` of the likelihood's reads
``a[g]`` (:mod:`pymc_bigdata.model.loc_scale`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from pytensor.compile.ops import ViewOp
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.sharedvar import TensorSharedVariable
from pytensor.tensor.subtensor import AdvancedSubtensor

from pymc_bigdata.data import row_column
from pymc_bigdata.model.row_data import data_value, strip_minibatch

__all__ = [
    "GroupIndex",
    "constant_value",
    "group_index",
    "other_uses",
    "peel",
    "row_index",
    "view_name",
    "walk",
]


def peel(var: Variable, broadcasts: bool = False) -> Variable:
    """``var`` without ``pm.Deterministic`` views (and broadcasting dimshuffles)."""
    while var.owner is not None:
        op = var.owner.op
        if isinstance(op, ViewOp) or (broadcasts and isinstance(op, DimShuffle)):
            var = var.owner.inputs[0]
        else:
            break
    return var


class GroupIndex(NamedTuple):
    """The group of each row (None where not read from memory), its data variable, and
    whether ``a[g]`` is the effect's only read."""

    rows: np.ndarray | None
    var: Variable | None
    indexed_only: bool


def row_index(index: Variable) -> GroupIndex:
    """The group index of an effect read per row as ``loc + scale * z[g]`` (``z`` reaches
    the likelihood only there, so ``z[g]`` is its only read)."""
    var = strip_minibatch(index)
    if not isinstance(var, Constant | TensorSharedVariable):
        return GroupIndex(None, None, False)
    if row_column(var) is not None:
        return GroupIndex(None, var, True)
    return GroupIndex(np.asarray(data_value(var)), var, True)


def group_index(effect: Variable, read: set[Variable]) -> GroupIndex:
    """The row data ``g`` of the likelihood's reads ``effect[g]``: its array (None where the
    effect is read any other way, or the data are a ``pmbd.Data`` column), its variable, and
    whether ``effect[g]`` is the only read."""
    data: set[Variable] = set()
    other_read = False
    for var in read:
        node = var.owner
        if node is None or isinstance(node.op, ViewOp):
            continue
        for position, inp in enumerate(node.inputs):
            if peel(inp) is not effect:
                continue
            index = node.inputs[1] if len(node.inputs) == 2 else None
            indexing = isinstance(node.op, AdvancedSubtensor)
            if indexing and position == 0 and index is not None and index.ndim == 1:
                data.add(strip_minibatch(index))
                continue
            other_read = True
    if len(data) != 1:
        return GroupIndex(None, None, False)
    [var] = data
    if not var.dtype.startswith(("int", "uint")):
        return GroupIndex(None, None, False)
    if not isinstance(var, Constant | TensorSharedVariable):
        return GroupIndex(None, None, False)
    if other_read:
        return GroupIndex(None, var, False)
    if row_column(var) is not None:
        return GroupIndex(None, var, True)
    return GroupIndex(np.asarray(data_value(var)), var, True)


def walk(outputs: list[Variable], blockers: set[Variable]) -> set[Variable]:
    """Every variable ``outputs`` read, not looking past ``blockers`` (which are included)."""
    seen: set[Variable] = set()
    stack = list(outputs)
    while stack:
        var = stack.pop()
        if var in seen:
            continue
        seen.add(var)
        if var.owner is not None and var not in blockers:
            stack.extend(var.owner.inputs)
    return seen


def other_uses(model, rv: Variable) -> list[Variable]:
    """The graphs of ``model`` (a ``pm.Model``) that may read ``rv``: the observed
    variables, the other free variables' parameters and the potentials."""
    params = [i for r in model.free_RVs if r is not rv for i in r.owner.inputs]
    return [*model.observed_RVs, *params, *model.potentials]


def constant_value(var: Variable) -> np.ndarray | None:
    """The value of a constant (through views and dimshuffles), else None."""
    var = peel(var, broadcasts=True)
    return np.asarray(var.data, dtype=np.float64) if isinstance(var, Constant) else None


def view_name(var: Variable, read: set[Variable]) -> str | None:
    """The name of a ``pm.Deterministic`` view of ``var`` among ``read`` (else ``var``'s)."""
    for view in sorted(read, key=id):
        if view is not var and view.name and view.owner is not None and peel(view) is var:
            return view.name
    return var.name
