"""What the model layer refuses, with a message that names the variable and what to do.

Every check raises :class:`~pymc_bigdata.ModelNotSupportedError` (or ``ValueError`` for
variables that are not the model's): discrete variables given to a continuous step and vice
versa, local latent variables, missing values, observed data without a common row axis,
Deterministics computed from the rows.  The check that needs the compiled log-likelihood
(does it factor over rows?) is :func:`pymc_bigdata.model.passes.check_row_factorisation`;
NaN and infinities in the rows are refused by the row source as it reads them
(:meth:`pymc_bigdata.rows.RowSource.check_finite`).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.model.row_data import data_value, row_count, strip_minibatch

__all__ = [
    "check_deterministics_not_per_row",
    "check_free_vars_not_per_row",
    "check_no_missing_values",
    "check_vars",
    "common_row_count",
    "is_discrete",
]


def is_discrete(var: Variable) -> bool:
    """Whether ``var`` holds integers or booleans."""
    return var.dtype.startswith(("int", "uint")) or var.dtype == "bool"


def check_vars(
    model: pm.Model, vars: list[Variable] | None, discrete: bool = False
) -> list[Variable]:
    """The sampled value variables, in the model's order.

    Default: every free variable, all continuous (or, with ``discrete``, every discrete
    one). Given ``vars`` may be a subset; the rest are held. Continuous steps refuse discrete
    variables in their ``vars`` and vice versa.
    """
    if vars is None:
        vars = [v for v in model.value_vars if is_discrete(v)] if discrete else model.value_vars
        if not vars:
            raise ModelNotSupportedError("The model has no discrete free variables to sample.")
    vars = [model.rvs_to_values.get(v, v) for v in vars]
    unknown = [getattr(v, "name", v) for v in vars if v not in model.value_vars]
    if unknown:
        raise ValueError(f"{unknown} are not free variables of the model.")
    for var in vars:
        name = model.values_to_rvs[var].name
        if is_discrete(var) and not discrete:
            raise ModelNotSupportedError(
                f"Free variable {name!r} is discrete ({var.dtype}); gradient-based "
                "subsampling samplers need continuous parameters. Marginalise it out "
                "(e.g. pymc_extras.marginalize), or sample it in a compound step: "
                "step=[pmbd.AusterityGibbs([binary vars]), pmbd.SGHMC([continuous vars])]."
            )
        if discrete and not is_discrete(var):
            raise ModelNotSupportedError(
                f"Free variable {name!r} is continuous ({var.dtype}); this step samples "
                "discrete variables only. Give it to a continuous step in a compound step."
            )
    if not discrete:
        loose = [
            model.values_to_rvs[v].name
            for v in model.value_vars
            if v not in vars and not is_discrete(v)
        ]
        if loose:
            raise ModelNotSupportedError(
                f"Subsampling samplers must update every continuous free variable together; "
                f"{loose} are not in the step's vars. Pass all continuous free variables (the "
                "default); only discrete ones may be left to another step."
            )
    return [v for v in model.value_vars if v in vars]


def check_deterministics_not_per_row(
    model: pm.Model,
    canonical: dict[Variable, Variable],
    row_names: list[str],
    row_vars: list[Variable],
    n_rows: int,
) -> None:
    """Refuse Deterministics computed from row data: PyMC's trace evaluates every
    Deterministic at every draw, which would read all N rows per draw."""
    name_of = {var: name for var, name in zip(row_vars, row_names)}
    for det in model.deterministics:
        used = {name_of[canonical[a]] for a in ancestors([det]) if a in canonical}
        if used:
            raise ModelNotSupportedError(
                f"Deterministic {det.name!r} is computed from the row data {sorted(used)}: "
                f"PyMC's trace would evaluate it on all N = {n_rows} rows at every draw. "
                "Remove it from the model (write the expression without pm.Deterministic) "
                "and compute it after sampling on the rows you need, e.g. with "
                "pm.compute_deterministics on a model built on a subsample."
            )


def common_row_count(values: dict[Variable, Variable]) -> int:
    """The row count N that every observed variable's data shares (refused otherwise)."""
    counts = {}
    for rv, value in values.items():
        if not isinstance(value, Constant | TensorSharedVariable):
            raise ModelNotSupportedError(
                f"Observed data of {rv.name!r} is a computed expression; pass the data "
                "array itself (or pm.Data) as observed."
            )
        if value.type.ndim < 1:
            raise ModelNotSupportedError(
                f"Observed variable {rv.name!r} is a scalar: there is no row axis to subsample."
            )
        counts[rv.name] = row_count(value)
    if len(set(counts.values())) != 1:
        raise ModelNotSupportedError(
            f"Observed variables have different row counts {counts}; subsampling needs every "
            "observed variable to share one leading row axis."
        )
    return next(iter(counts.values()))


def check_free_vars_not_per_row(model: pm.Model, n_rows: int) -> None:
    """Refuse a free variable with a per-row dimension (a local latent variable)."""
    init = model.initial_point()
    for rv in model.free_RVs:
        value = model.rvs_to_values[rv]
        shape = np.shape(init[value.name])
        if n_rows > 1 and len(shape) >= 1 and shape[0] == n_rows:
            raise ModelNotSupportedError(
                f"Free variable {rv.name!r} has a per-row dimension (shape {shape}, N = "
                f"{n_rows}): a local latent variable. Subsampling samplers need global "
                "parameters only; marginalise the local variables out."
            )


def check_no_missing_values(model: pm.Model) -> None:
    """Refuse imputed, NaN, infinite or masked observed values."""
    for rv in model.free_RVs:
        if rv.name.endswith("_unobserved") or rv.name.endswith("_missing"):
            raise ModelNotSupportedError(
                f"The model imputes missing observed values ({rv.name!r}): observed data "
                "contains NaN or masked entries. Drop those rows before building the model."
            )
    for rv in model.observed_RVs:
        value = strip_minibatch(model.rvs_to_values[rv])
        if isinstance(value, Constant | TensorSharedVariable):
            data = data_value(value)
            if np.ma.isMaskedArray(data) or (
                np.issubdtype(data.dtype, np.floating) and not np.isfinite(data).all()
            ):
                raise ModelNotSupportedError(
                    f"Observed variable {rv.name!r} has missing or non-finite values "
                    "(NaN/inf/masked). Drop those rows before building the model."
                )
