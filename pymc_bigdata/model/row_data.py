"""Where a PyMC model keeps its rows: the observed values and covariates with a row axis.

The model layer reads the row data out of the model's graph once (:func:`find_row_data`);
these helpers see through ``pm.Minibatch`` and dtype casts to the full-data arrays, read a
``pm.Data`` container or a constant's value, and name each array for messages.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
from pymc.data import MinibatchOp
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.scalar import Cast
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.type import RandomType
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.data import row_column

__all__ = [
    "data_value",
    "data_vars",
    "find_row_data",
    "minibatch_replacements",
    "row_array",
    "row_count",
    "row_names",
    "strip_minibatch",
]


def data_value(var: Variable) -> np.ndarray:
    """The array a constant or a shared data container holds (not copied)."""
    if isinstance(var, Constant):
        return np.asarray(var.data)
    return np.asarray(var.get_value(borrow=True))


def row_count(var: Variable) -> int:
    """The length of ``var``'s leading (row) axis."""
    column = row_column(var)
    return column.n_rows if column is not None else int(data_value(var).shape[0])


def row_array(var: Variable):
    """What the row source reads for ``var``: a ``pmbd.Data`` column, or its array."""
    column = row_column(var)
    return column if column is not None else data_value(var)


def strip_minibatch(value: Variable) -> Variable:
    """Full-data variable behind a ``pm.Minibatch`` output or a dtype cast (or the value)."""
    while value.owner is not None:
        op = value.owner.op
        if isinstance(op, MinibatchOp):
            value = value.owner.inputs[value.owner.outputs.index(value)]
        elif isinstance(op, Elemwise) and isinstance(op.scalar_op, Cast):
            value = value.owner.inputs[0]  # pm.Data stores integers as int32; PyMC casts
        else:
            break
    return value


def minibatch_replacements(graph: Variable) -> dict[Variable, Variable]:
    """Replace every ``pm.Minibatch`` output in ``graph`` by its full-data input."""
    out = {}
    for var in ancestors([graph]):
        if var.owner is not None and isinstance(var.owner.op, MinibatchOp):
            for i, o in enumerate(var.owner.outputs[:-1]):
                out[o] = var.owner.inputs[i]
    return out


def data_vars(model: pm.Model) -> list[Variable]:
    """Every shared data container of the model (``pm.Data`` and observed shared values)."""
    found = list(model.data_vars)
    graphs = [rv.owner.inputs[i] for rv in model.observed_RVs for i in range(len(rv.owner.inputs))]
    graphs += [model.rvs_to_values[rv] for rv in model.observed_RVs]
    for var in ancestors(graphs):
        if isinstance(var, TensorSharedVariable) and var not in found:
            found.append(var)
    return found


def row_names(
    row_vars: list[Variable], observed: list[Variable], values: dict[Variable, Variable]
) -> list[str]:
    """Readable names: the variable's name, or the observed variable a plain array feeds."""
    names = []
    for var in row_vars:
        if var.name:
            names.append(var.name)
            continue
        owner = next((rv.name for rv in observed if values[rv] is var), None)
        if owner is not None:
            names.append(f"observed data of {owner!r}")
            continue
        users = [rv.name for rv in observed if var in set(ancestors(rv.owner.inputs))]
        names.append(f"unnamed covariate array of shape {data_value(var).shape} used by {users}")
    return names


def find_row_data(
    model: pm.Model,
    observed: list[Variable],
    values: dict[Variable, Variable],
    n_rows: int,
) -> tuple[list[Variable], dict[Variable, Variable]]:
    """Observed values and covariates with a leading row axis of length ``n_rows``.

    Returns the distinct row arrays and a map from every graph variable holding one of them
    to its canonical variable (plain arrays used twice become two equal constants).
    """
    full_graphs = [inp for rv in observed for inp in rv.owner.inputs]
    row_vars: list[Variable] = []
    canonical: dict[Variable, Variable] = {}

    def add(var):
        if var in canonical:
            return
        if row_column(var) is not None:  # a pmbd.Data array: never read it to compare
            row_vars.append(var)
            canonical[var] = var
            return
        data = data_value(var)
        for known in row_vars:
            if row_column(known) is not None:
                continue
            other = data_value(known)
            if (
                other.shape == data.shape
                and other.dtype == data.dtype
                and (other is data or np.array_equal(other, data, equal_nan=True))
            ):
                canonical[var] = known
                return
        row_vars.append(var)
        canonical[var] = var

    for rv in observed:
        add(values[rv])
    for var in ancestors(full_graphs):
        if var.owner is not None or isinstance(var.type, RandomType):
            continue
        if not isinstance(var, Constant | TensorSharedVariable):
            continue
        if getattr(var.type, "ndim", 0) < 1:
            continue
        if row_column(var) is not None or (n_rows > 1 and data_value(var).shape[0] == n_rows):
            add(var)
    return row_vars, canonical
